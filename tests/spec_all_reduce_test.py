"""SpecAllReduce: every all_reduce_spec algorithm as a CrossDeviceOps."""

import itertools

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import tf_crossdevice
from tests import contract
from tf_crossdevice._builders import by_spec
from tf_crossdevice._schedules import spec as spec_lib

ALGORITHMS = sorted(a.value for a in spec_lib.Algorithm)


# Three specs run the whole contract: a flat ring with packing, a two-level
# spec with NCCL's CPU substitute and small-tensor aggregation, and size
# ranges. The builders' own tests and the matrix below cover rechd, pscpu and
# psgpu.
class TestXring(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.SpecAllReduce("xring#2", num_packs=2)


class TestNcclRechdSmallTensorAggregation(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.SpecAllReduce(
            "nccl/rechd",
            num_packs=0,
            agg_small_grads_max_bytes=128,
            agg_small_grads_max_group=3,
        )


class TestSizeRanges(contract.CrossDeviceOpsContract):
    def make_ops(self):
        # Contract values are 10 x 3: 60 bytes in half precision (pscpu),
        # 120 or 240 bytes otherwise (xring).
        return tf_crossdevice.SpecAllReduce(
            [("pscpu/pscpu", 2, 100), ("xring", 3, -1)]
        )


# The matrix: algorithm x shards x device count x size x dtype.
DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)
SIZES = (1, 7, 1000)
# One size past a million elements, for float32: the builders' own tests
# cover it for every dtype; here it checks the routing keeps it whole.
LARGE = 1000003


def fake_workers(n):
    """Two fake workers of local devices, so two-level specs cross them."""
    if n == 1:
        return [[0]]
    half = (n + 1) // 2
    return [list(range(half)), list(range(half, n))]


@pytest.mark.parametrize("num_devices", range(1, 9))
@pytest.mark.parametrize("shards", [1, 2, 3])
@pytest.mark.parametrize("alg", ALGORITHMS)
def test_every_algorithm_matches_numpy(alg, shards, num_devices):
    devices = tf_crossdevice.testing.cpu_devices(num_devices)
    rng = np.random.default_rng(num_devices * 10 + shards)
    cases = [(d, s) for d, s in itertools.product(DTYPES, SIZES)]
    cases.append((tf.float32, LARGE))
    for dtype, size in cases:
        # Small integers: every partial sum is exact in every dtype.
        arrays = [rng.integers(-4, 5, size=size) for _ in devices]
        tensors = []
        for a, d in zip(arrays, devices, strict=True):
            with tf.device(d):
                tensors.append(tf.constant(a, dtype))
        out = by_spec.spec_all_reduce(
            tensors, alg, shards, groups=fake_workers(num_devices)
        )
        want = np.sum(arrays, axis=0)
        for t, d in zip(out, devices, strict=True):
            assert t.device == d
            assert t.dtype == dtype
            np.testing.assert_array_equal(
                t.numpy().astype(np.float64), want, err_msg=f"{dtype} {size}"
            )


@settings(max_examples=200, deadline=None)
@given(
    alg=st.sampled_from(ALGORITHMS),
    shards=st.integers(1, 3),
    num_devices=st.integers(1, 8),
    length=st.integers(1, 50),
    dtype=st.sampled_from([tf.int32, tf.int64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_exact_on_random_integer_tensors(
    alg, shards, num_devices, length, dtype, seed
):
    """Any algorithm, shards, devices and length: integer sums are exact."""
    devices = tf_crossdevice.testing.cpu_devices(num_devices)
    limit = 2**20 if dtype == tf.int32 else 2**40  # No overflow for n <= 8.
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(-limit, limit, size=length) for _ in devices]
    tensors = []
    for a, d in zip(arrays, devices, strict=True):
        with tf.device(d):
            tensors.append(tf.constant(a, dtype))
    out = by_spec.spec_all_reduce(
        tensors, alg, shards, groups=fake_workers(num_devices)
    )
    want = np.sum(arrays, axis=0)
    for t in out:
        np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_every_algorithm_under_mirrored_strategy(alg):
    devices = tf_crossdevice.testing.cpu_devices(4)
    ops = tf_crossdevice.SpecAllReduce((alg, 2))
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    calls = contract.count_batch_reduce_calls(ops)

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        x = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
        return ctx.all_reduce("mean", [x * tf.ones([5, 3]), x * x])

    vectors, squares = strategy.run(step)
    assert calls
    for v in strategy.experimental_local_results(vectors):
        np.testing.assert_allclose(v.numpy(), np.full([5, 3], 2.5))
    for s in strategy.experimental_local_results(squares):
        np.testing.assert_allclose(s.numpy(), 7.5)


def add_n_arities(ops, num_elements, num_devices=4):
    """Input counts of the AddN ops the spec builds for one float32 tensor."""
    devices = tf_crossdevice.testing.cpu_devices(num_devices)
    value = tf_crossdevice.testing.per_replica(
        [tf.ones([num_elements])] * num_devices, devices
    )

    @tf.function
    def fn():
        return list(ops.reduce("sum", value, None).values)

    graph = fn.get_concrete_function().graph
    return sorted(
        len(op.inputs) for op in graph.get_operations() if op.type == "AddN"
    )


def test_a_tensor_exactly_at_the_limit_goes_to_that_range():
    # pscpu sums all 4 devices in one AddN; xring adds pairs hop by hop.
    ops = tf_crossdevice.SpecAllReduce([("pscpu", 1, 40), ("xring", 1, -1)])
    assert add_n_arities(ops, 10) == [4]  # 40 bytes: pscpu.
    assert 4 not in add_n_arities(ops, 11)  # 44 bytes: xring.


def test_string_grammar_sizes_are_bytes():
    ops = tf_crossdevice.SpecAllReduce("pscpu:1k:xring")
    assert add_n_arities(ops, 256) == [4]  # 1024 bytes.
    assert 4 not in add_n_arities(ops, 257)


def test_spec_is_parsed_once_and_exposed():
    ops = tf_crossdevice.SpecAllReduce("pscpu:2k:pscpu#2:64k:xring")
    assert [(r.alg.value, r.shards, r.limit) for r in ops.all_reduce_spec] == [
        ("pscpu", 1, 2048),
        ("pscpu", 2, 65536),
        ("xring", 1, -1),
    ]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"all_reduce_spec": "pscpu:32k:xrign"},
            ValueError,
            r"all_reduce_spec 'pscpu:32k:xrign'.*'xrign'.*nccl",
        ),
        ({"all_reduce_spec": ("xring", 0)}, ValueError, "all_reduce_spec"),
        (
            {"all_reduce_spec": [("xring", 1, 100), ("pscpu", 1, 50)]},
            ValueError,
            "all_reduce_spec",
        ),
        ({"all_reduce_spec": 7}, TypeError, "all_reduce_spec"),
        ({"num_packs": -1}, ValueError, "num_packs"),
        (
            {"num_packs": 2, "agg_small_grads_max_bytes": 10},
            ValueError,
            "num_packs=0",
        ),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        tf_crossdevice.SpecAllReduce(**kwargs)
