"""Graph size of batched all-reduces, and that batching keeps
every sum: numpy's, and bit for bit the per-tensor builders' floats.

No timing asserts: the graph's op count stands in for build time (tracing
and the first step's placement and Grappler passes are linear in it).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice.algorithms import _halving_doubling as halving_doubling
from tf_crossdevice.algorithms import _ring as ring

DEVICES = 4
# Many tensors of a few shapes, as gradients are: ranks 0 to 3, sizes that
# are and are not multiples of the chunk counts, one empty tensor.
SHAPES = [(7,), (3, 5), (), (16,), (2, 3, 4), (1,), (0,), (33,), (4, 4)]
GROWTH_DEVICES = 3
GROWTH_SHAPES = [(7,), (3, 5), (16,), (2, 3, 4)]
ALGORITHMS = ["xring", "rechd#2", "pscpu#2", "psgpu", "hierarchical_copy"]
PACKINGS = {
    "none": {},
    "num_packs=3": {"num_packs": 3},
    "agg_small": {
        "agg_small_grads_max_bytes": 64,
        "agg_small_grads_max_group": 4,
    },
}


def _shapes(count: int) -> list[tuple[int, ...]]:
    return [SHAPES[k % len(SHAPES)] for k in range(count)]


def _values(shapes, dtype, devices, seed=0):
    """values[k][d] as numpy arrays: floats that round differently in each
    summation order (so a changed order shows), or small integers."""
    rng = np.random.default_rng(seed)
    np_dtype = dtype.as_numpy_dtype
    out = []
    for shape in shapes:
        per_device = []
        for _ in devices:
            if dtype.is_floating:
                x = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4)
            else:
                x = rng.integers(-1000, 1000, shape)
            per_device.append(np.asarray(x, np_dtype))
        out.append(per_device)
    return out


def _batch_reduce(ops, values, devices):
    """ops.batch_reduce(SUM) of `values` in a tf.function: numpy sums and
    the number of ops batch_reduce added to the traced graph."""
    counts: list[int] = []

    def body():
        per_replica = []
        for per_device in values:
            tensors = []
            for x, d in zip(per_device, devices, strict=True):
                with tf.device(d):
                    tensors.append(tf.constant(x))
            per_replica.append(testing.per_replica(tensors, devices))
        graph = tf.compat.v1.get_default_graph()
        before = len(graph.get_operations())
        reduced = ops.batch_reduce("sum", [(v, v) for v in per_replica])
        counts.append(len(graph.get_operations()) - before)
        return [list(r.values) for r in reduced]

    step = tf.function(body, autograph=False)
    concrete = step.get_concrete_function()
    return [[t.numpy() for t in per] for per in concrete()], counts[-1]


def _op_count(alg, packing, count):
    devices = testing.cpu_devices(GROWTH_DEVICES)
    shapes = [GROWTH_SHAPES[k % len(GROWTH_SHAPES)] for k in range(count)]
    values = _values(shapes, tf.float32, devices)
    ops = tf_crossdevice.SpecAllReduce(alg, **PACKINGS[packing])
    return _batch_reduce(ops, values, devices)[1]


@pytest.mark.parametrize(
    "alg, packing",
    [
        ("xring", "none"),
        ("rechd#2", "num_packs=3"),
        ("pscpu#2", "agg_small"),
        ("psgpu", "none"),
        ("hierarchical_copy", "none"),
    ],
)
def test_graph_grows_by_a_few_ops_per_tensor_not_per_step(alg, packing):
    # 5x the tensors, of the same 4 shapes, on 3 devices. Before batching,
    # each tensor added on each device 2 (n - 1) adds or copies for a ring
    # (or its share of add_n / identity ops) plus its split, pad, concat
    # and reshapes: ~10 ops. Now the layout grows with the distinct shapes
    # (per main device for hierarchical copy: 3 x 4 here, each seen twice
    # in the smaller batch already) and the algorithm with the batch's
    # ranges, so unpacked it stays flat. Packing keeps its per-tensor
    # reshape in and out and split output (< 2.5 per tensor and device);
    # small-tensor aggregation adds a pack per run of consecutive small
    # tensors (TF 1's ranges: here a run ends at each large shape), and
    # each pack is an all-reduce of its own, as packing means (pscpu#2 on
    # 3 devices: ~15 ops per pack, ~4 more per tensor and device).
    small, large = _op_count(alg, packing, 24), _op_count(alg, packing, 120)
    per_tensor_and_device = (large - small) / ((120 - 24) * GROWTH_DEVICES)
    limit = {"none": 0.25, "num_packs=3": 2.5, "agg_small": 8.0}[packing]
    assert per_tensor_and_device < limit, (small, large)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.int32])
@pytest.mark.parametrize("alg", ALGORITHMS)
def test_many_mixed_shapes_match_numpy(alg, dtype):
    devices = testing.cpu_devices(DEVICES)
    values = _values(_shapes(27), dtype, devices, seed=1)
    ops = tf_crossdevice.SpecAllReduce(alg)
    results, _ = _batch_reduce(ops, values, devices)
    for per_device, got in zip(values, results, strict=True):
        want = np.sum(np.stack(per_device).astype(np.float64), axis=0)
        for g in got:
            assert g.dtype == dtype.as_numpy_dtype and g.shape == want.shape
            if dtype.is_integer:
                np.testing.assert_array_equal(g, want.astype(g.dtype))
            else:
                tol = 1e-5 if dtype == tf.float32 else 1e-12
                np.testing.assert_allclose(
                    g, want, rtol=tol, atol=tol * np.abs(want).max(initial=1)
                )


@pytest.mark.parametrize(
    "alg, all_reduce",
    [
        ("xring#2", lambda ts: ring.ring_all_reduce(ts, 2)),
        (
            "rechd",
            lambda ts: halving_doubling.halving_doubling_all_reduce(ts, 1),
        ),
    ],
)
def test_batched_floats_are_bit_identical_to_one_ring_per_tensor(
    alg, all_reduce
):
    # The reference is the pre-batching graph: one ring (or halving-
    # doubling) per tensor. A chunk-major layout keeps each element in its
    # chunk, so it is summed in the same order: equal bits, not just close.
    devices = testing.cpu_devices(3)  # not a power of two: rechd folds in
    values = _values(_shapes(18), tf.float32, devices, seed=2)
    ops = tf_crossdevice.SpecAllReduce(alg)
    batched, _ = _batch_reduce(ops, values, devices)

    @tf.function(autograph=False)
    def one_by_one():
        out = []
        for per_device in values:
            tensors = []
            for x, d in zip(per_device, devices, strict=True):
                with tf.device(d):
                    tensors.append(tf.constant(x))
            out.append(all_reduce(tensors))
        return out

    for got, want in zip(batched, one_by_one(), strict=True):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(
                g.view(np.uint32), w.numpy().view(np.uint32)
            )
