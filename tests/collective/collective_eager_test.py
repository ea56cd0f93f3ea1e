"""Eager calls of the collective classes: traced once, empty values.

One process, 2 logical CPUs (one worker): the collectives run between the
local devices. Repeated eager calls with one signature reuse one traced
function (before, every call traced a new one, and the non-chief worker
of examples/train.py logged "keeps retracing"); 0-element values reduce
to empty results without a collective.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice

DEVICES = tf_crossdevice.testing.cpu_devices(2)


def _collective_ops():
    return [
        tf_crossdevice.CollectiveAllReduce(),
        tf_crossdevice.CollectiveAllReduce(compression="bf16"),
        tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.ReductionToOneDevice()
        ),
    ]


_IDS = ["collective", "collective_bf16", "hierarchical"]


def _per_replica(arrays):
    return tf_crossdevice.testing.per_replica(
        [tf.constant(a) for a in arrays], DEVICES
    )


def _tracing_count(ops):
    return sum(
        f.experimental_get_tracing_count() for f in ops.reducer.traced.values()
    )


@pytest.mark.parametrize("ops", _collective_ops(), ids=_IDS)
def test_repeated_eager_reduce_traces_once_and_follows_inputs(ops):
    rng = np.random.default_rng(0)
    for _ in range(4):
        a = rng.standard_normal([3, 2]).astype(np.float32)
        b = rng.standard_normal([3, 2]).astype(np.float32)
        result = ops.reduce("sum", _per_replica([a, b]), DEVICES)
        for value in result.values:
            np.testing.assert_allclose(value.numpy(), a + b, rtol=1e-6)
        mean = ops.batch_reduce("mean", [(_per_replica([a, b]), DEVICES)])
        np.testing.assert_allclose(
            mean[0].values[1].numpy(), (a + b) / 2, rtol=1e-6
        )
        # One trace for reduce, one for batch_reduce's MEAN, whatever the
        # number of calls.
        assert len(ops.reducer.traced) == 2
        assert _tracing_count(ops) == 2


def test_new_signature_traces_anew_and_gather_is_cached():
    ops = tf_crossdevice.CollectiveAllReduce()
    ops.reduce("sum", _per_replica([np.ones([2], np.float32)] * 2), DEVICES)
    result = ops.reduce(
        "sum", _per_replica([np.arange(3.0), np.arange(3.0) * 2]), DEVICES
    )
    np.testing.assert_array_equal(result.values[0].numpy(), [0.0, 3.0, 6.0])
    assert _tracing_count(ops) == 2
    for call in range(3):
        arrays = [np.full([call + 1], d + call, np.float32) for d in range(2)]
        gathered = ops._gather(_per_replica(arrays), DEVICES, axis=0)
        np.testing.assert_array_equal(
            gathered.values[0].numpy(), np.concatenate(arrays)
        )
    # Three shapes: three gather traces.
    assert _tracing_count(ops) == 5
    before = _tracing_count(ops)
    ops._gather(_per_replica([np.ones([2], np.float32)] * 2), DEVICES, axis=0)
    assert _tracing_count(ops) == before


def test_bound_copy_keeps_its_own_traced_functions():
    ops = tf_crossdevice.CollectiveAllReduce()
    ops.reduce("sum", _per_replica([np.ones([2], np.float32)] * 2), DEVICES)
    bound = ops.reducer.bound(DEVICES, 1, ops.reducer.options(None))
    assert bound.traced == {}
    assert len(ops.reducer.traced) == 1


def test_bound_copy_chooses_its_own_local_reduction():
    """The hierarchical step picks its local reduction for the devices it
    first meets: a bound copy's choice stays the copy's."""
    ops = tf_crossdevice.HierarchicalCollectiveAllReduce()
    reducer = ops.reducer
    bound = ops.with_reducer(reducer.bound(DEVICES, 1, reducer.options(None)))
    arrays = [np.arange(3, dtype=np.float32) * (d + 1) for d in range(2)]
    result = bound.reduce("sum", _per_replica(arrays), DEVICES)
    np.testing.assert_array_equal(result.values[1].numpy(), [0.0, 3.0, 6.0])
    assert type(bound.reducer.step.local_ops).__name__ == "SpecAllReduce"
    assert reducer.step.local_ops is None


@pytest.mark.parametrize("ops", _collective_ops(), ids=_IDS)
@pytest.mark.parametrize("shape", [[0], [3, 0]])
@pytest.mark.parametrize("reduce_op", ["sum", "mean"])
def test_empty_values_reduce_to_empty_results(ops, shape, reduce_op):
    empty = np.zeros(shape, np.float32)
    full = np.array([1.0, 2.0], np.float32)
    to_all = ops.reduce(reduce_op, _per_replica([empty, empty]), DEVICES)
    to_one = ops.reduce(reduce_op, _per_replica([empty, empty]), "/cpu:0")
    mixed = ops.batch_reduce(
        reduce_op,
        [
            (_per_replica([empty, empty]), DEVICES),
            (_per_replica([full, 3 * full]), DEVICES),
        ],
    )
    for value in [*to_all.values, to_one, *mixed[0].values]:
        assert value.shape == tuple(shape)
        assert value.dtype == tf.float32
    expected = 4 * full if reduce_op == "sum" else 2 * full
    np.testing.assert_allclose(mixed[1].values[0].numpy(), expected)


def test_empty_all_reduce_launches_no_collective():
    @tf.function
    def step(a, b):
        return (
            tf_crossdevice.CollectiveAllReduce()
            .batch_reduce(
                "sum",
                [
                    (
                        tf_crossdevice.testing.per_replica([a, b], DEVICES),
                        DEVICES,
                    )
                ],
            )[0]
            .values
        )

    spec = tf.TensorSpec([3, 0], tf.float32)
    graph = step.get_concrete_function(spec, spec).graph
    types = {op.type for op in graph.get_operations()}
    assert not types & {"CollectiveReduceV2", "CollectiveGatherV2"}


def test_cached_calls_draw_fresh_instance_keys_at_call_time(monkeypatch):
    """Each call draws one new key per device, as a fresh trace would: so
    every worker, calling alike, draws the same keys in the same order."""
    ops = tf_crossdevice.CollectiveAllReduce()
    keys = ops.reducer.keys
    drawn = []
    original = keys.get_instance_key

    def spy(group_key, device):
        drawn.append(original(group_key, device))
        return drawn[-1]

    monkeypatch.setattr(keys, "get_instance_key", spy)
    per_call = []
    for call in range(3):
        value = _per_replica([np.full([2], call, np.float32)] * 2)
        ops.reduce("sum", value, DEVICES)
        per_call.append(drawn[len(drawn) - 2 :])
    assert len(drawn) == 6
    for first, second in zip(per_call, per_call[1:], strict=False):
        assert second == [k + 1 for k in first]
