"""Tests for PowerSGD (tf_crossdevice.compression.PowerSGD) against numpy.

The compressor gets a fake all-reduce that adds the replicas' values of one
process (every replica is a simulated worker), and every number it returns
or keeps is compared with `powersgd_reference.NumpyPowerSGD`, the
algorithm written again in numpy from the paper.

Most tests compress small matrices whose factors are smaller than them,
but not twice smaller: they pass `min_compression_rate=1`, as the
default rate (2) would sum them exactly (the rate has tests of its own).
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np
import pytest
import tensorflow as tf

from tests.compression.powersgd_reference import (
    NumpyPowerSGD as _NumpyPowerSGD,
)
from tests.compression.powersgd_reference import initial_q, orthonormal
from tf_crossdevice import testing
from tf_crossdevice.compression import PowerSGD

REPLICAS = 3


def NumpyPowerSGD(shapes, rank, seed=0, start_step=0):  # noqa: N802
    return _NumpyPowerSGD(shapes, rank, REPLICAS, seed, start_step)


class RecordingSum:
    """A fake all-reduce over this process's replicas that records calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, batch):
        if tf.executing_eagerly():
            self.calls.append([[_numpy(t) for t in v] for v in batch])
        else:
            self.calls.append(batch)
        out = []
        for value in batch:
            if isinstance(value[0], tf.IndexedSlices):
                total = tf.IndexedSlices(
                    tf.concat([v.values for v in value], 0),
                    tf.concat([v.indices for v in value], 0),
                    value[0].dense_shape,
                )
            else:
                total = tf.add_n(list(value))
            out.append([total] * len(value))
        return out


def _numpy(value):
    if isinstance(value, tf.IndexedSlices):
        return tf.convert_to_tensor(value).numpy()
    return value.numpy()


def batch_of(grads):
    """{k: [replica arrays]} -> batch[k][i] of constants."""
    return [[tf.constant(g) for g in grads[k]] for k in sorted(grads)]


def random_grads(rng, shapes, dtype=np.float64):
    return {
        k: [rng.standard_normal(shape).astype(dtype) for _ in range(REPLICAS)]
        for k, shape in shapes.items()
    }


# Two compressed tensors (a Dense-like kernel and a conv-like one) and a
# vector between them.
SHAPES = {0: (6, 5), 1: (7,), 2: (2, 3, 4)}
COMPRESSED = {0: (6, 5), 2: (2, 3, 4)}


def test_one_step_matches_numpy():
    rng = np.random.default_rng(0)
    grads = random_grads(rng, SHAPES)
    compressor = PowerSGD(
        rank=2, min_compression_size=0, min_compression_rate=1, seed=7
    )
    reference = NumpyPowerSGD(COMPRESSED, rank=2, seed=7)
    fake_sum = RecordingSum()

    sums = compressor.sum(batch_of(grads), fake_sum)
    expected = reference.sum(grads)

    for k in SHAPES:
        for i in range(REPLICAS):
            np.testing.assert_allclose(
                sums[k][i].numpy(), expected[k], rtol=1e-10, atol=1e-12
            )
    # Compressed sums are approximations here (rank 2 of random 6×5).
    assert np.abs(sums[0][0].numpy() - np.sum(grads[0], 0)).max() > 0.1
    np.testing.assert_array_equal(sums[1][0].numpy(), np.sum(grads[1], 0))

    # The messages: one P of all compressed tensors per replica (one
    # bucket), 6·2 + 6·2 values; then one Q, 5·2 + 4·2; then the vector
    # exactly.
    ps, qs, exact = fake_sum.calls
    assert [np.shape(v[0]) for v in exact] == [(7,)]
    q_of = {
        k: orthonormal(initial_q(7, k, s[-1], 2)) for k, s in COMPRESSED.items()
    }
    for i in range(REPLICAS):
        local_p = [
            grads[k][i].reshape(6, -1) @ q_of[k] for k in sorted(COMPRESSED)
        ]
        np.testing.assert_allclose(
            ps[0][i], np.concatenate([p.ravel() for p in local_p]), rtol=1e-12
        )
    assert [len(v) for v in ps] == [REPLICAS] and ps[0][0].shape == (24,)
    assert [len(v) for v in qs] == [REPLICAS] and qs[0][0].shape == (18,)
    p_hat = {k: reference.last[k]["p_hat"] for k in COMPRESSED}
    np.testing.assert_allclose(p_hat[0].T @ p_hat[0], np.eye(2), atol=1e-12)
    for i in range(REPLICAS):
        local_q = [
            grads[k][i].reshape(6, -1).T @ p_hat[k] for k in sorted(COMPRESSED)
        ]
        np.testing.assert_allclose(
            qs[0][i], np.concatenate([q.ravel() for q in local_q]), rtol=1e-10
        )

    for k in COMPRESSED:
        state = compressor.state(k)
        assert state.matrix_shape == (6, SHAPES[k][-1]) and state.rank == 2
        np.testing.assert_allclose(
            state.q.numpy(), reference.q[k], rtol=1e-10, atol=1e-12
        )
        for i in range(REPLICAS):
            np.testing.assert_allclose(
                state.errors[i].numpy(),
                reference.errors[k][i],
                rtol=1e-9,
                atol=1e-12,
            )
    # The errors add up to what the sum left out.
    left_out = np.sum(grads[0], 0) - sums[0][0].numpy()
    np.testing.assert_allclose(
        sum(e.numpy() for e in compressor.state(0).errors), left_out, atol=1e-12
    )
    assert int(compressor.step.numpy()) == 1
    with pytest.raises(KeyError, match="compressed positions: \\[0, 2\\]"):
        compressor.state(1)


def test_float32_matches_numpy():
    rng = np.random.default_rng(1)
    grads = random_grads(rng, {0: (16, 8)}, np.float32)
    compressor = PowerSGD(
        rank=3, min_compression_size=0, min_compression_rate=1
    )
    reference = _NumpyPowerSGD({0: (16, 8)}, 3, REPLICAS, dtype=tf.float32)
    sums = compressor.sum(batch_of(grads), RecordingSum())
    expected = reference.sum({0: [g.astype(np.float64) for g in grads[0]]})
    assert sums[0][0].dtype == tf.float32
    np.testing.assert_allclose(sums[0][0].numpy(), expected[0], atol=2e-5)


def test_warm_start_and_error_feedback_across_steps():
    rng = np.random.default_rng(2)
    compressor = PowerSGD(rank=1, min_compression_size=0)
    reference = NumpyPowerSGD(COMPRESSED, rank=1)
    errors_before = None
    for step in range(3):
        grads = random_grads(rng, SHAPES)
        q_before = compressor.state(0).q.numpy() if step else None
        sums = compressor.sum(batch_of(grads), RecordingSum())
        expected = reference.sum(grads)
        for k in SHAPES:
            np.testing.assert_allclose(
                sums[k][2].numpy(), expected[k], rtol=1e-9, atol=1e-11
            )
        if step:
            # Warm start: this step's P was M·orth(last step's Q).
            ms = [g + e for g, e in zip(grads[0], errors_before, strict=True)]
            p = sum(m @ orthonormal(q_before) for m in ms)
            np.testing.assert_allclose(
                p, reference.last[0]["p"], rtol=1e-9, atol=1e-11
            )
        errors_before = [e.numpy() for e in compressor.state(0).errors]
        assert any(np.abs(e).max() > 1e-3 for e in errors_before)


def test_error_feedback_running_sum_converges_to_true_sum():
    """Σ applied + Σ errors held = Σ true gradients, every step; so with the
    errors bounded the running sums' relative gap falls like 1/steps."""
    rng = np.random.default_rng(3)
    drift = rng.standard_normal((10, 8))
    compressor = PowerSGD(rank=1, min_compression_size=0)
    applied = np.zeros((10, 8))
    true = np.zeros((10, 8))
    gaps, held_norms = {}, []
    for step in range(1, 121):
        grads = {
            0: [
                drift + 0.5 * rng.standard_normal((10, 8))
                for _ in range(REPLICAS)
            ]
        }
        sums = compressor.sum(batch_of(grads), RecordingSum())
        applied += sums[0][0].numpy()
        true += np.sum(grads[0], 0)
        held = sum(e.numpy() for e in compressor.state(0).errors)
        np.testing.assert_allclose(applied + held, true, atol=1e-9)
        gaps[step] = np.linalg.norm(applied - true) / np.linalg.norm(true)
        held_norms.append(np.linalg.norm(held))
    # The errors stay bounded (a few steps' worth of gradient) ...
    assert max(held_norms) < 8 * np.linalg.norm(REPLICAS * drift)
    # ... so the running sums meet, though one rank-1 step of a 10×8 sum
    # misses most of it.
    assert gaps[1] > 0.5
    assert gaps[120] < 0.05
    assert gaps[120] < gaps[20] < gaps[1]


@pytest.mark.parametrize(
    "shape,dtype,min_size",
    [
        pytest.param((10, 10), np.float32, 101, id="below_min_size"),
        pytest.param((64,), np.float32, 0, id="vector"),
        pytest.param((), np.float64, 0, id="scalar"),
        pytest.param((16, 8), np.int32, 0, id="int32"),
        pytest.param((16, 8), np.int64, 0, id="int64"),
        pytest.param((16, 8), np.float16, 0, id="float16"),
        pytest.param((300, 2), np.float32, 0, id="factors_not_smaller"),
        # Factors (10 + 6)·2 = 32 values for 60: not twice smaller.
        pytest.param((10, 6), np.float32, 0, id="factors_not_half"),
    ],
)
def test_exact_when_not_compressed(shape, dtype, min_size):
    rng = np.random.default_rng(4)
    grads = {
        0: [
            (rng.standard_normal(shape) * 100).astype(dtype)
            for _ in range(REPLICAS)
        ]
    }
    compressor = PowerSGD(rank=2, min_compression_size=min_size)
    fake_sum = RecordingSum()
    sums = compressor.sum(batch_of(grads), fake_sum)
    for i in range(REPLICAS):
        np.testing.assert_array_equal(
            sums[0][i].numpy(), tf.add_n([tf.constant(g) for g in grads[0]])
        )
    assert len(fake_sum.calls) == 1
    assert int(compressor.step.numpy()) == 0  # Nothing to compress: no step.
    assert not compressor.variables[1:]  # Only the step counter.


def test_indexed_slices_exact_beside_compressed():
    rng = np.random.default_rng(5)
    dense = random_grads(rng, {0: (8, 6)})
    rows = [rng.standard_normal((2, 6)) for _ in range(REPLICAS)]
    slices = [
        tf.IndexedSlices(
            tf.constant(r), tf.constant([i, 4]), tf.constant([9, 6])
        )
        for i, r in enumerate(rows)
    ]
    compressor = PowerSGD(rank=1, min_compression_size=0)
    sums = compressor.sum(
        [[tf.constant(g) for g in dense[0]], slices], RecordingSum()
    )
    expected = np.zeros((9, 6))
    for i, r in enumerate(rows):
        expected[[i, 4]] += r
    for i in range(REPLICAS):
        assert isinstance(sums[1][i], tf.IndexedSlices)
        np.testing.assert_allclose(
            tf.convert_to_tensor(sums[1][i]).numpy(), expected, atol=1e-12
        )
    np.testing.assert_allclose(
        sums[0][0].numpy(),
        NumpyPowerSGD({0: (8, 6)}, rank=1).sum(dense)[0],
        rtol=1e-9,
        atol=1e-11,
    )


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_exact_before_start_step(traced):
    # A compressed matrix, a bias and rows of an IndexedSlices: inside a
    # tf.function, one trace takes both branches of the start_step
    # condition, and the exact sums come out of either.
    rng = np.random.default_rng(6)
    shapes = {0: (12, 5), 1: (5,), 2: (1, 5)}
    compressor = PowerSGD(rank=1, start_step=2, min_compression_size=0)
    reference = NumpyPowerSGD({0: (12, 5)}, rank=1, start_step=2)

    def step(batch):
        return compressor.sum(batch, RecordingSum())

    if traced:
        step = tf.function(step)
    for n in range(4):
        grads = random_grads(rng, shapes)
        batch = batch_of(grads)
        batch[2] = [
            tf.IndexedSlices(rows, tf.constant([n % 3]), tf.constant([3, 5]))
            for rows in batch[2]
        ]
        sums = step(batch)
        expected = reference.sum(grads)
        got = sums[0][1].numpy()
        want = np.sum(grads[0], 0)
        errors = [e.numpy() for e in compressor.state(0).errors]
        if n < 2:
            np.testing.assert_array_equal(got, want)
            for error in errors:
                np.testing.assert_array_equal(error, 0.0)
        else:
            assert np.abs(got - want).max() > 0.1
        if n == 2:  # The first compressed step, from zero error.
            np.testing.assert_allclose(got + sum(errors), want, atol=1e-12)
        np.testing.assert_allclose(got, expected[0], rtol=1e-9, atol=1e-11)
        np.testing.assert_array_equal(sums[1][2].numpy(), np.sum(grads[1], 0))
        rows = np.zeros((3, 5))
        rows[n % 3] = np.sum(grads[2], 0)[0]
        assert isinstance(sums[2][1], tf.IndexedSlices)
        np.testing.assert_allclose(
            tf.convert_to_tensor(sums[2][1]).numpy(), rows, rtol=1e-12
        )
        assert int(compressor.step.numpy()) == n + 1
    if traced:
        assert step.experimental_get_tracing_count() == 1


def test_tf_function_matches_eager():
    rng = np.random.default_rng(7)
    steps = [random_grads(rng, SHAPES) for _ in range(3)]
    eager = PowerSGD(rank=2, min_compression_size=0, min_compression_rate=1)
    traced = PowerSGD(rank=2, min_compression_size=0, min_compression_rate=1)
    run = tf.function(lambda batch: traced.sum(batch, RecordingSum()))
    for grads in steps:
        a = eager.sum(batch_of(grads), RecordingSum())
        b = run(batch_of(grads))
        for k in SHAPES:
            np.testing.assert_allclose(
                a[k][0].numpy(), b[k][0].numpy(), rtol=1e-12, atol=1e-12
            )
    assert run.experimental_get_tracing_count() == 1
    np.testing.assert_allclose(
        eager.state(2).q.numpy(), traced.state(2).q.numpy(), rtol=1e-12
    )


def test_every_replica_and_worker_gets_the_same_sum():
    """Two compressors with one seed (two workers) start from one Q and
    give every replica the same bits."""
    rng = np.random.default_rng(8)
    grads = random_grads(rng, {0: (9, 7)}, np.float32)
    a, b = (
        PowerSGD(rank=2, min_compression_size=0, min_compression_rate=1, seed=3)
        for _ in "ab"
    )
    sums_a = a.sum(batch_of(grads), RecordingSum())
    sums_b = b.sum(batch_of(grads), RecordingSum())
    for i in range(REPLICAS):
        np.testing.assert_array_equal(sums_a[0][i].numpy(), sums_a[0][0])
        np.testing.assert_array_equal(sums_b[0][i].numpy(), sums_a[0][0])
    c = PowerSGD(rank=2, min_compression_size=0, min_compression_rate=1, seed=4)
    c.sum(batch_of(grads), RecordingSum())
    assert not np.allclose(c.state(0).q.numpy(), a.state(0).q.numpy())


def test_state_on_each_replica_device():
    devices = testing.cpu_devices(REPLICAS)
    rng = np.random.default_rng(9)
    grads = random_grads(rng, {0: (8, 8)})
    batch = []
    for k in sorted(grads):
        value = []
        for g, d in zip(grads[k], devices, strict=True):
            with tf.device(d):
                value.append(tf.constant(g))
        batch.append(value)
    compressor = PowerSGD(
        rank=2, min_compression_size=0, min_compression_rate=1
    )
    sums = compressor.sum(batch, RecordingSum(), devices=devices)
    state = compressor.state(0)
    assert [e.device for e in state.errors] == devices
    assert state.q.device == devices[0]
    assert [q.device for q in state.q_replicas] == devices
    assert state.q_replicas[0] is state.q
    for copy in state.q_replicas[1:]:
        np.testing.assert_array_equal(copy.numpy(), state.q.numpy())
    assert [s.device for s in sums[0]] == devices
    # Optimizer state, not weights: nothing a tape or an optimizer trains.
    assert compressor.variables
    assert not compressor.trainable_variables


def test_each_replica_computes_from_its_own_tensors():
    # In-graph, a replica that read another's tensor would read it across
    # the wire: every product, difference and update of replica i takes
    # only inputs on replica i's device (the fake sum, which adds across
    # devices, is the only exception).
    devices = testing.cpu_devices(REPLICAS)
    rng = np.random.default_rng(10)
    # Two matrices whose factors are orthogonalised together, and a third.
    grads = random_grads(rng, {0: (8, 8), 1: (8, 6), 2: (12, 6)})
    compressor = PowerSGD(
        rank=2, min_compression_size=0, min_compression_rate=1
    )

    @tf.function
    def step():
        batch = [
            [
                _on(d, tf.constant, g)
                for g, d in zip(grads[k], devices, strict=True)
            ]
            for k in sorted(grads)
        ]
        return compressor.sum(batch, RecordingSum(), devices=devices)

    graph = step.get_concrete_function().graph
    checked = 0
    for op in graph.get_operations():
        if op.type not in ("MatMul", "Sub", "Switch", "AssignVariableOp"):
            continue
        assert op.device in devices, op.name
        for tensor in op.inputs:
            assert tensor.op.device == op.device, (op.name, tensor.op.name)
        checked += 1
    # Per replica and matrix: 4 products, 1 difference, 2 switched updates.
    assert checked >= REPLICAS * 3 * (4 + 1 + 2 + 2)


def _on(device, fn, *args):
    with tf.device(device):
        return fn(*args)


def test_checkpoint_round_trip(tmp_path):
    rng = np.random.default_rng(10)
    steps = [random_grads(rng, SHAPES) for _ in range(4)]
    original = PowerSGD(
        rank=2, start_step=1, min_compression_size=0, min_compression_rate=1
    )
    for grads in steps[:3]:
        original.sum(batch_of(grads), RecordingSum())
    path = tf.train.Checkpoint(compression=original).save(str(tmp_path / "c"))
    expected = original.sum(batch_of(steps[3]), RecordingSum())

    # Restored before the state exists (a resumed job): the variables take
    # the saved values when the first sum creates them.
    resumed = PowerSGD(
        rank=2, start_step=1, min_compression_size=0, min_compression_rate=1
    )
    status = tf.train.Checkpoint(compression=resumed).restore(path)
    assert int(resumed.step.numpy()) == 3
    got = resumed.sum(batch_of(steps[3]), RecordingSum())
    status.assert_consumed()
    for k in SHAPES:
        np.testing.assert_array_equal(got[k][0].numpy(), expected[k][0])

    # Restored over existing state.
    used = PowerSGD(
        rank=2, start_step=1, min_compression_size=0, min_compression_rate=1
    )
    used.sum(batch_of(steps[0]), RecordingSum())
    used.sum(batch_of(steps[3]), RecordingSum())
    tf.train.Checkpoint(compression=used).restore(path).assert_consumed()
    got = used.sum(batch_of(steps[3]), RecordingSum())
    for k in SHAPES:
        np.testing.assert_array_equal(got[k][0].numpy(), expected[k][0])
    for i in range(REPLICAS):
        np.testing.assert_array_equal(
            used.state(2).errors[i].numpy(), original.state(2).errors[i]
        )


def test_a_different_batch_raises():
    rng = np.random.default_rng(11)
    compressor = PowerSGD(
        rank=2, min_compression_size=0, min_compression_rate=1
    )
    compressor.sum(batch_of(random_grads(rng, SHAPES)), RecordingSum())
    with pytest.raises(ValueError, match="expects the same batch every step"):
        compressor.sum(
            batch_of(random_grads(rng, {0: (6, 5), 1: (8,)})), RecordingSum()
        )
    # A scalar loss summed beside the gradients is no new batch.
    loss = [[tf.constant(1.0)] * REPLICAS]
    assert compressor.sum(loss, RecordingSum())[0][0].numpy() == 3.0


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"rank": 0}, ValueError, "rank: expected an int >= 1, got 0"),
        ({"rank": 2.0}, TypeError, "rank: expected an int >= 1, got float"),
        ({"rank": True}, TypeError, "rank: expected an int >= 1, got bool"),
        (
            {"start_step": -1},
            ValueError,
            "start_step: expected an int >= 0, got -1",
        ),
        (
            {"min_compression_size": -5},
            ValueError,
            "min_compression_size: expected an int >= 0, got -5",
        ),
        ({"seed": "0"}, TypeError, "seed: expected an int, got str '0'"),
        (
            {"min_compression_rate": 0.5},
            ValueError,
            "min_compression_rate: expected a number >= 1, got 0.5",
        ),
        (
            {"min_compression_rate": float("nan")},
            ValueError,
            "min_compression_rate: expected a number >= 1, got nan",
        ),
        (
            {"min_compression_rate": "2"},
            TypeError,
            "min_compression_rate: expected a number >= 1, got str '2'",
        ),
    ],
)
def test_constructor_validates(kwargs, error, message):
    with pytest.raises(error, match=f"^{message}"):
        PowerSGD(**kwargs)


def test_min_compression_rate_is_pytorchs_rule():
    # A 10×6 matrix at rank 2 sends (10 + 6)·2 = 32 values for 60: it is
    # compressed if 32·rate < 60, PyTorch's rule.
    default = PowerSGD(rank=2, min_compression_size=0)
    assert default.min_compression_rate == 2.0
    assert not default.compresses((10, 6), tf.float32)  # 64 >= 60
    assert default.elements_sent((10, 6)) == 60
    at_1 = PowerSGD(rank=2, min_compression_size=0, min_compression_rate=1)
    assert at_1.min_compression_rate == 1.0
    assert at_1.compresses((10, 6), tf.float32)
    assert at_1.elements_sent((10, 6)) == 32
    for rate, compresses in ((1.85, True), (1.875, False)):  # 59.2, 60
        c = PowerSGD(rank=2, min_compression_size=0, min_compression_rate=rate)
        assert c.compresses((10, 6), tf.float32) is compresses, rate
    # 20×20 at rank 4: 160 values for 400, compressed at 2 but not at 2.5.
    assert PowerSGD(rank=4, min_compression_size=0).compresses(
        (20, 20), "float32"
    )
    assert not PowerSGD(
        rank=4, min_compression_size=0, min_compression_rate=2.5
    ).compresses((20, 20), "float32")
    assert repr(default) == (
        "PowerSGD(rank=2, start_step=0, min_compression_size=0, seed=0, "
        "bucket_bytes=26214400, min_compression_rate=2.0)"
    )


def test_batch_validation():
    compressor = PowerSGD(min_compression_size=0)
    with pytest.raises(ValueError, match="one component per replica"):
        compressor.sum(
            [[tf.ones((8, 8))] * 2, [tf.ones((8, 8))] * 3], RecordingSum()
        )
    with pytest.raises(ValueError, match="devices: expected 2 devices"):
        compressor.sum([[tf.ones((8, 8))] * 2], RecordingSum(), ["/cpu:0"])


@pytest.mark.parametrize(
    "shape,rank,sent",
    [
        # Conv2D (h, w, in, out) -> (h·w·in, out): (2304 + 256)·4.
        pytest.param((3, 3, 256, 256), 4, (2304 + 256) * 4, id="conv3x3"),
        pytest.param((2048, 1000), 1, 3048, id="dense_rank1"),
        pytest.param((7, 7, 3, 64), 8, (147 + 64) * 8, id="conv7x7"),
        pytest.param((1000,), 4, 1000, id="bias"),
        pytest.param((32, 32), 4, 1024, id="below_min_size"),
        pytest.param((5000, 3), 4, 15000, id="factors_not_smaller"),
    ],
)
def test_elements_sent(shape, rank, sent):
    assert PowerSGD(rank=rank).elements_sent(shape) == sent


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_a_non_finite_step_returns_non_finite_and_leaves_the_state(traced):
    rng = np.random.default_rng(12)
    # Two compressed matrices of different row counts: the nan is in one,
    # and the other's state is left alone too.
    shapes = {0: (6, 5), 1: (7,), 2: (9, 4)}
    first, bad, last = (random_grads(rng, shapes) for _ in range(3))
    bad[2][1][2, 3] = np.nan
    compressor = PowerSGD(
        rank=2, min_compression_size=0, min_compression_rate=1
    )
    reference = NumpyPowerSGD({0: (6, 5), 2: (9, 4)}, rank=2)

    def step(batch):
        return compressor.sum(batch, RecordingSum())

    if traced:
        step = tf.function(step)
    step(batch_of(first))
    reference.sum(first)
    kept = [
        v
        for k in (0, 2)
        for v in (*compressor.state(k).q_replicas, *compressor.state(k).errors)
    ]
    before = [v.numpy() for v in kept]
    sums = step(batch_of(bad))
    assert np.isnan(sums[2][0].numpy()).any()  # Not hidden from the optimizer.
    np.testing.assert_array_equal(sums[1][0].numpy(), np.sum(bad[1], 0))
    for value, saved in zip(kept, before, strict=True):
        np.testing.assert_array_equal(value.numpy(), saved)
    # The next step goes on as if the bad one never happened.
    sums = step(batch_of(last))
    expected = reference.sum(last)
    for k in (0, 2):
        np.testing.assert_allclose(
            sums[k][0].numpy(), expected[k], rtol=1e-9, atol=1e-11
        )
    for value, saved in zip(kept, before, strict=True):
        assert not np.array_equal(value.numpy(), saved)


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf_function"])
def test_a_nan_in_a_value_summed_exactly_leaves_the_state(traced, sparse):
    # A compressed 8×6 matrix, a bias summed exactly (dense, or as the
    # rows of an IndexedSlices) and an int32 value (no nan to look for).
    # The bias of one replica holds a nan, the matrix none.
    rng = np.random.default_rng(13)
    first, bad, last = (random_grads(rng, {0: (8, 6), 1: (6,)}) for _ in "abc")
    bad[1][1][3] = np.nan
    compressor = PowerSGD(rank=1, min_compression_size=0)
    reference = NumpyPowerSGD({0: (8, 6)}, rank=1)

    def batch(grads):
        values = batch_of(grads)
        if sparse:
            values[1] = [
                tf.IndexedSlices(b[None], tf.constant([1]), tf.constant([2, 6]))
                for b in values[1]
            ]
        return [*values, [tf.constant([i, 2]) for i in range(REPLICAS)]]

    def step(values):
        return compressor.sum(values, RecordingSum())

    if traced:
        step = tf.function(step)
    step(batch(first))
    reference.sum(first)
    state = compressor.state(0)
    kept = [*state.q_replicas, *state.errors]
    before = [v.numpy() for v in kept]

    sums = step(batch(bad))
    bias = tf.convert_to_tensor(sums[1][0]).numpy().reshape(-1, 6)[-1]
    assert np.isnan(bias[3]) and np.isfinite(np.delete(bias, 3)).all()
    # The matrix's sum is still the step's approximation.
    skipped = deepcopy(reference).sum(bad)[0]
    np.testing.assert_allclose(
        sums[0][0].numpy(), skipped, rtol=1e-9, atol=1e-11
    )
    np.testing.assert_array_equal(sums[2][0].numpy(), [3, 6])
    for value, saved in zip(kept, before, strict=True):
        np.testing.assert_array_equal(value.numpy(), saved)
    assert int(compressor.step.numpy()) == 2  # It counts batches.

    # The same batch without the nan updates the state, as numpy's does.
    sums = step(batch(last))
    np.testing.assert_allclose(
        sums[0][0].numpy(), reference.sum(last)[0], rtol=1e-9, atol=1e-11
    )
    for i, error in enumerate(state.errors):
        np.testing.assert_allclose(
            error.numpy(), reference.errors[0][i], rtol=1e-9, atol=1e-11
        )
    np.testing.assert_allclose(
        state.q.numpy(), reference.q[0], rtol=1e-9, atol=1e-11
    )
    assert int(compressor.step.numpy()) == 3


def test_buckets_send_each_bucket_in_turn_with_the_same_sums():
    # 6x5 and 2x(3x4) float64: 240 and 192 bytes. 100-byte buckets: one
    # tensor each, last first.
    rng = np.random.default_rng(3)
    grads = random_grads(rng, SHAPES)
    compressor = PowerSGD(
        rank=2,
        min_compression_size=0,
        min_compression_rate=1,
        seed=7,
        bucket_bytes=100,
    )
    reference = NumpyPowerSGD(COMPRESSED, rank=2, seed=7)
    fake_sum = RecordingSum()
    for _ in range(2):  # the second step uses the first one's errors and Q
        sums = compressor.sum(batch_of(grads), fake_sum)
        expected = reference.sum(grads)
        for k in SHAPES:
            for i in range(REPLICAS):
                np.testing.assert_allclose(
                    sums[k][i].numpy(), expected[k], rtol=1e-10, atol=1e-12
                )
    # Per step: tensor 2's P (as a 6x4 matrix: 6·2) and Q (4·2), then
    # tensor 0's P (6·2) and Q (5·2), then the vector.
    shapes = [[np.shape(v[0]) for v in call] for call in fake_sum.calls[:5]]
    assert shapes == [[(12,)], [(8,)], [(12,)], [(10,)], [(7,)]]
