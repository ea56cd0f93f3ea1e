"""NcclAllReduce on real GPUs: TensorFlow's NCCL kernels against numpy, and
the fallback where NCCL cannot run (one GPU and a CPU).

Logical GPUs of one GPU (where NCCL must fall back too) are checked by
gpu_logical_gpus_test.py, in child processes.
"""

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

import tf_crossdevice
from tests.gpu import gpu_util
from tf_crossdevice.algorithms import _nccl as nccl

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN
# The dtypes TensorFlow's NcclAllReduce kernel takes.
NCCL_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)
SHAPES = ((), (7,), (3, 5), (1000,), (65, 33))


def replica_arrays(n, shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(-8, 9, size=shape) for _ in range(n)]


def all_reduce(ops, devices, dtype, mode, reduce_op=SUM):
    """(numpy's sums, per shape the results as (device, numpy array)).

    In "function" mode the devices are read while tracing: a function's
    outputs do not say where the ops that made them ran.
    """
    cases = [replica_arrays(len(devices), s, i) for i, s in enumerate(SHAPES)]
    placed = []

    def build():
        values = [
            tf_crossdevice.testing.per_replica(
                [tf.constant(a, dtype) for a in arrays], devices
            )
            for arrays in cases
        ]
        reduced = ops.batch_reduce(reduce_op, [(v, v) for v in values])
        out = [list(getattr(r, "values", [r])) for r in reduced]
        placed[:] = [[c.device for c in components] for components in out]
        return out

    results = tf.function(build)() if mode == "function" else build()
    wants = [sum(np.asarray(a, np.float64) for a in arrays) for arrays in cases]
    if reduce_op == MEAN:
        wants = [w / len(devices) for w in wants]
    return wants, [
        [(d, c.numpy()) for d, c in zip(ds, cs, strict=True)]
        for ds, cs in zip(placed, results, strict=True)
    ]


def assert_all_reduced(wants, results, devices):
    for want, components in zip(wants, results, strict=True):
        assert len(components) == len(devices)
        for (placed, array), device in zip(components, devices, strict=True):
            assert gpu_util.canonical(placed) == device, (placed, device)
            # Sums of small integers are exact; a 16-bit MEAN rounds.
            rtol = 1e-2 if array.dtype.itemsize == 2 else 1e-6
            np.testing.assert_allclose(
                array.astype(np.float64), want, rtol=rtol, atol=rtol
            )


@gpu_util.needs_gpus(2, physical=True)
@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("dtype", NCCL_DTYPES, ids=lambda d: d.name)
def test_nccl_sums_like_numpy_and_like_tensorflow(dtype, mode):
    n = min(gpu_util.physical_gpu_count(), 8)
    devices = gpu_util.gpu_names(n)
    assert nccl.nccl_unavailable_reason(devices) is None  # NCCL really runs
    wants, ours = all_reduce(
        tf_crossdevice.NcclAllReduce(), devices, dtype, mode
    )
    assert_all_reduced(wants, ours, devices)
    _, theirs = all_reduce(tf.distribute.NcclAllReduce(), devices, dtype, mode)
    for a, b in zip(ours, theirs, strict=True):
        for (_, x), (_, y) in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)


@gpu_util.needs_gpus(2, physical=True)
@pytest.mark.parametrize("num_packs", [0, 1, 3])
def test_nccl_mean_with_packs(num_packs):
    devices = gpu_util.gpu_names(min(gpu_util.physical_gpu_count(), 8))
    ops = tf_crossdevice.NcclAllReduce(num_packs=num_packs)
    wants, results = all_reduce(ops, devices, tf.float32, "function", MEAN)
    assert_all_reduced(wants, results, devices)


@gpu_util.needs_gpus(2, physical=True)
def test_nccl_bfloat16_sums_like_numpy():
    """TensorFlow's NCCL kernel takes no bfloat16: ours must still sum it
    (the contract's dtypes include it)."""
    devices = gpu_util.gpu_names(2)
    ops = tf_crossdevice.NcclAllReduce()
    wants, results = all_reduce(ops, devices, tf.bfloat16, "function")
    assert_all_reduced(wants, results, devices)


@gpu_util.needs_gpus(1)
@pytest.mark.parametrize("mode", ["eager", "function"])
def test_one_gpu_alone_keeps_its_value(mode):
    """One replica: nothing to exchange, NCCL is not called."""
    devices = gpu_util.gpu_names(1)
    for reduce_op in (SUM, MEAN):
        for dtype in NCCL_DTYPES:
            wants, results = all_reduce(
                tf_crossdevice.NcclAllReduce(), devices, dtype, mode, reduce_op
            )
            assert_all_reduced(wants, results, devices)


@gpu_util.needs_gpus(1)
def test_one_gpu_under_mirrored_strategy():
    gpu = gpu_util.gpu_names(1)
    strategy = tf.distribute.MirroredStrategy(
        gpu, cross_device_ops=tf_crossdevice.NcclAllReduce()
    )

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce(SUM, [tf.constant([1.5, 2.5]), tf.ones([3, 2])])

    vector, matrix = strategy.run(step)
    np.testing.assert_array_equal(vector.numpy(), [1.5, 2.5])
    np.testing.assert_array_equal(matrix.numpy(), np.ones([3, 2]))


@gpu_util.needs_gpus(1)
def test_a_gpu_and_a_cpu_fall_back_once(monkeypatch):
    messages = []
    monkeypatch.setattr(
        absl_logging,
        "log_first_n",
        lambda level, msg, n, *args: messages.append(msg % args),
    )
    devices = [
        gpu_util.gpu_names(1)[0],
        tf_crossdevice.testing.cpu_devices(1)[0],
    ]
    assert "not all GPUs" in nccl.nccl_unavailable_reason(devices)
    for dtype in (*NCCL_DTYPES, tf.bfloat16):
        wants, results = all_reduce(
            tf_crossdevice.NcclAllReduce(), devices, dtype, "function"
        )
        assert_all_reduced(wants, results, devices)
    assert any("summing on" in m for m in messages), messages
