"""tf_crossdevice.tuning.measure: numbers against numpy, order of rounds."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice.tuning import measure

GRADIENTS = [((3,), "float32"), ((2, 5), "float64"), ((17,), "float32")]


def _numpy(fn):
    """Runs `fn` in a tf.function and returns its tensors as numpy arrays."""
    return [np.asarray(t) for t in tf.function(fn, autograph=False)()]


class _AddsOne(tf.distribute.ReductionToOneDevice):
    """Sums correctly, then adds 1 on every device: a wrong number."""

    def batch_reduce_implementation(self, reduce_op, pairs, options):
        return [
            testing.per_replica(
                [v + 1 for v in m.values], [v.device for v in m.values]
            )
            for m in super().batch_reduce_implementation(
                reduce_op, pairs, options
            )
        ]


class _AllOnFirstDevice(tf.distribute.ReductionToOneDevice):
    """Sums correctly but leaves every result on the first device."""

    def batch_reduce_implementation(self, reduce_op, pairs, options):
        reduced = super().batch_reduce_implementation(reduce_op, pairs, options)
        return [
            testing.per_replica(
                list(m.values), [m.values[0].device] * len(m.values)
            )
            for m in reduced
        ]


@pytest.mark.parametrize("num_devices", [2, 3, 4], ids=lambda n: f"{n}dev")
def test_inputs_expected_is_numpys_sum_of_the_replicas(num_devices):
    devices = testing.cpu_devices(num_devices)
    inputs = measure.Inputs(GRADIENTS, devices, seed=3)
    replicas = [
        _numpy(lambda i=i: inputs.tensors(i)) for i in range(num_devices)
    ]
    for k, (shape, dtype) in enumerate(GRADIENTS):
        values = [r[k] for r in replicas]
        assert all(v.shape == shape and v.dtype == dtype for v in values)
        np.testing.assert_array_equal(inputs.expected[k], np.sum(values, 0))
    # Replicas hold different values, the same in every process.
    assert not np.array_equal(replicas[0][1], replicas[1][1])
    again = measure.Inputs(GRADIENTS, devices, seed=3)
    np.testing.assert_array_equal(again.expected[1], inputs.expected[1])


EDGE_GRADIENTS = [
    ((), "float32"),
    ((0,), "float32"),
    ((16,), "float32"),
    ((2, 8), "float32"),
    ((7,), "bfloat16"),
    ((33,), "float16"),
    ((3, 1), "int32"),
    ((1000,), "float32"),
]


def test_tensors_cut_each_dtype_with_one_split_into_numpys_views():
    devices = testing.cpu_devices(2)
    inputs = measure.Inputs(EDGE_GRADIENTS, devices, seed=5)
    for i in range(2):
        fn = tf.function(lambda i=i: inputs.tensors(i), autograph=False)
        got = [np.asarray(t) for t in fn()]
        held = {
            d: np.asarray(v.value()) for d, v in inputs.variables[i].items()
        }
        for k, (shape, dtype) in enumerate(EDGE_GRADIENTS):
            # Numpy's own cut of the flat buffer at the layout's offset.
            (offset,) = [
                o for j, o, _ in inputs.layout[tf.as_dtype(dtype)] if j == k
            ]
            size = int(np.prod(shape))
            want = held[tf.as_dtype(dtype)][offset : offset + size].reshape(
                shape
            )
            assert got[k].dtype == want.dtype and got[k].shape == shape
            np.testing.assert_array_equal(got[k], want)
        ops = [
            op.type for op in fn.get_concrete_function().graph.get_operations()
        ]
        # Only float32 holds several gradients: one split, no slices of it.
        assert ops.count("SplitV") == 1 and "StridedSlice" not in ops


def test_measure_times_correct_ops_and_reports_numpys_statistics():
    devices = testing.cpu_devices(4)
    gradients = GRADIENTS + [((7,), "bfloat16"), ((5, 1), "float16")]
    timings = measure.measure_cross_device_ops(
        {
            "ours xring": tf_crossdevice.SpecAllReduce("xring"),
            "ours packed": tf_crossdevice.AllReduceCrossDeviceOps(
                "hierarchical_copy", num_packs=1
            ),
            "TF ReductionToOneDevice": tf.distribute.ReductionToOneDevice(),
        },
        devices,
        gradients,
        rounds=5,
        target_seconds=0.001,
    )
    assert [t.name for t in timings] == [
        "ours xring",
        "ours packed",
        "TF ReductionToOneDevice",
    ]
    for t in timings:
        assert (t.verified, t.error) == (True, None), t
        assert len(t.samples) == 5 and all(s > 0 for s in t.samples)
        assert t.reps >= 1 and t.build_seconds > 0
        assert t.median_seconds == pytest.approx(np.median(t.samples))
        assert t.q25_seconds == pytest.approx(np.percentile(t.samples, 25))
        assert t.q75_seconds == pytest.approx(np.percentile(t.samples, 75))


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        pytest.param(_AddsOne(), "elements differ from numpy", id="wrong_sum"),
        pytest.param(
            _AllOnFirstDevice(), "value 0 replica 1: on", id="wrong_device"
        ),
    ],
)
def test_a_wrong_cross_device_ops_is_rejected_and_not_timed(ops, message):
    devices = testing.cpu_devices(3)
    right = tf.distribute.ReductionToOneDevice()
    wrong, ok = measure.measure_cross_device_ops(
        {"wrong": ops, "right": right}, devices, GRADIENTS, rounds=2
    )
    assert wrong.verified is False
    assert message in wrong.error
    assert wrong.samples == () and wrong.median_seconds is None
    assert ok.verified is True and len(ok.samples) == 2


def test_check_inputs_accepts_the_inputs_and_rejects_a_sum():
    inputs = measure.Inputs(GRADIENTS, testing.cpu_devices(2))
    own = measure.Step(lambda: [list(v.values) for v in inputs.values()])
    assert own.verify(inputs.check_inputs) is None
    summed = measure.Step(
        measure.all_reduce_body(tf.distribute.ReductionToOneDevice(), inputs)
    )
    assert "differ from numpy" in summed.verify(inputs.check_inputs)


def test_the_timed_step_runs_the_reduction():
    # The sink keeps results alive: summing 4 x 32 MiB takes clearly longer
    # than only cutting the inputs.
    inputs = measure.Inputs([((8 << 20,), "float32")], testing.cpu_devices(4))
    cut = measure.Step(lambda: [list(v.values) for v in inputs.values()])

    def add_n():
        with tf.device(inputs.devices[0]):
            return [[tf.add_n(inputs.flats())]]

    summed = measure.Step(add_n)
    cut.timed()
    summed.timed()
    fast = min(measure.time_calls(cut.timed, 3) for _ in range(3))
    slow = min(measure.time_calls(summed.timed, 3) for _ in range(3))
    assert slow > fast + 2e-3, (fast, slow)


def test_rounds_interleave_every_entry_in_a_fresh_order():
    calls = []

    def timer(name, seconds):
        def time_reps(reps):
            calls.append((name, reps))
            return seconds

        return time_reps

    names = [f"e{i}" for i in range(6)]
    timers = {n: timer(n, 0.001 * (i + 1)) for i, n in enumerate(names)}
    reps = {n: i + 1 for i, n in enumerate(names)}
    samples, errors = measure.interleaved_rounds(timers, reps, 4, seed=1)
    assert errors == {}
    rounds = [calls[i : i + 6] for i in range(0, 24, 6)]
    for entries in rounds:
        # Each round times every entry once, with its own reps.
        assert sorted(entries) == sorted(reps.items())
    orders = [tuple(name for name, _ in entries) for entries in rounds]
    assert len(set(orders)) > 1
    assert samples == {n: [0.001 * (i + 1)] * 4 for i, n in enumerate(names)}
    # The order is the seed's: the same seed, the same order.
    calls.clear()
    measure.interleaved_rounds(timers, reps, 4, seed=1)
    assert [tuple(n for n, _ in calls[i : i + 6]) for i in (0, 6, 12, 18)] == (
        orders
    )


def test_an_entry_that_raises_leaves_the_rounds():
    count = {"bad": 0}

    def bad(reps):
        count["bad"] += 1
        if count["bad"] == 2:
            raise RuntimeError("Graph execution error:\n\nboom")
        return 1.0

    samples, errors = measure.interleaved_rounds(
        {"bad": bad, "good": lambda reps: 2.0}, {"bad": 1, "good": 1}, 3
    )
    assert samples == {"good": [2.0, 2.0, 2.0]}
    assert errors == {"bad": "RuntimeError: Graph execution error: boom"}
    assert count["bad"] == 2
    with pytest.raises(ValueError, match="rounds: expected an int >= 1"):
        measure.interleaved_rounds({}, {}, 0)


def test_sink_waits_for_every_tensor():
    # Ops whose results nothing reads are pruned from a tf.function; this
    # stateless one fails when it runs.
    @tf.function
    def f():
        bad = tf.gather(tf.constant([1.0, 2.0]), [1000])
        return measure.sink([tf.constant(1.0), bad])

    with pytest.raises(tf.errors.InvalidArgumentError, match="1000"):
        f()
