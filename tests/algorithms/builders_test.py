"""Every registered all-reduce builder passes the builder contract.

The registry's algorithms run `builder_contract.BuilderContract` by name, as
SpecAllReduce and AllReduceCrossDeviceOps build them; so do TensorFlow 1's
two-level pairs and two pairs it did not have, over two fake workers of
local devices, and every other pair gets one exact sum. A naive all-to-all,
registered here and nowhere else, shows what adding an algorithm takes.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import builder_contract
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _registry as registry

SINGLE_LEVEL = sorted(registry.algorithm_names())
TF1_TWO_LEVEL = ["nccl/pscpu", "nccl/rechd", "nccl/xring", "pscpu/pscpu"]
NEW_TWO_LEVEL = ["hierarchical_copy/psgpu", "xring/rechd"]


def two_fake_workers(devices):
    """Splits local devices into two fake workers, so 'a/b' crosses them."""
    n = len(devices)
    if n == 1:
        return [[0]]
    half = (n + 1) // 2
    return [list(range(half)), list(range(half, n))]


def make(name):
    """`shards -> builder` for `name`, two-level over two fake workers."""
    group = two_fake_workers if "/" in name else None
    return functools.partial(registry.build, name, group_devices=group)


class TestRegisteredBuilders(builder_contract.BuilderContract):
    @pytest.fixture(params=SINGLE_LEVEL + TF1_TWO_LEVEL + NEW_TWO_LEVEL)
    def make_builder(self, request):
        return make(request.param)


@pytest.mark.parametrize(
    "inner, outer", list(itertools.product(SINGLE_LEVEL, repeat=2))
)
def test_every_two_level_pair_is_exact(inner, outer):
    devices = tf_crossdevice.testing.cpu_devices(5)
    arrays = builder_contract.integer_valued(
        np.random.default_rng(5), 5, (3, 7), tf.int64
    )
    summed = make(f"{inner}/{outer}")(2)(
        builder_contract.place(devices, arrays), 3
    )
    assert [t.device for t in summed] == devices
    for out in summed:
        np.testing.assert_array_equal(out.numpy(), np.sum(arrays, axis=0))


# The chunked builders take the dtypes of `_flat.SUPPORTED_DTYPES` only; the
# ones sharded by `protocol.shard_wise` sum any integer, float or complex.
SUMS_ANY_NUMBER = {"hierarchical_copy", "nccl"}


@pytest.mark.parametrize("name", SINGLE_LEVEL)
def test_int8(name):
    devices = tf_crossdevice.testing.cpu_devices(3)
    arrays = builder_contract.integer_valued(
        np.random.default_rng(8), 3, (5,), tf.int8
    )
    tensors = builder_contract.place(devices, arrays)
    if name not in SUMS_ANY_NUMBER:
        with pytest.raises(TypeError, match="dtype int8 is not supported"):
            registry.build(name, 2)(tensors, 0)
        return
    for out in registry.build(name, 2)(tensors, 0):
        assert out.dtype == tf.int8
        np.testing.assert_array_equal(out.numpy(), np.sum(arrays, axis=0))


def test_the_registered_names():
    assert SINGLE_LEVEL == [
        "hierarchical_copy",
        "nccl",
        "pscpu",
        "psgpu",
        "rechd",
        "xring",
    ]


# Adding an algorithm, as README.md says: a builder, a factory, one line.


def naive_all_to_all(tensors, index):
    """Every device fetches every tensor and sums them itself."""
    del index  # Every value is reduced alike.
    sums = []
    for t in tensors:
        with tf.device(t.device):
            sums.append(tf.math.add_n(list(tensors)))
    return sums


def naive_builder(shards=1):
    return protocol.shard_wise(naive_all_to_all, shards)


@pytest.fixture
def naive_registered():
    registry.register("naive", naive_builder)
    yield "naive"
    registry.unregister("naive")


class TestNaiveAllToAll(builder_contract.BuilderContract):
    @pytest.fixture(params=["naive", "naive/xring", "pscpu/naive"])
    def make_builder(self, request, naive_registered):
        return make(request.param)


def test_a_registered_algorithm_runs_in_the_cross_device_ops(
    naive_registered,
):
    devices = tf_crossdevice.testing.cpu_devices(4)
    ops = tf_crossdevice.SpecAllReduce("naive:1k:naive/xring#2")
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        x = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
        return ctx.all_reduce("sum", [x * tf.ones([3]), x * tf.ones([1000])])

    small, large = strategy.run(step)
    for v in strategy.experimental_local_results(small):
        np.testing.assert_array_equal(v.numpy(), np.full([3], 10.0))
    for v in strategy.experimental_local_results(large):
        np.testing.assert_array_equal(v.numpy(), np.full([1000], 10.0))
    value = tf_crossdevice.testing.per_replica(
        [tf.constant([1, 2], tf.int64) * (i + 1) for i in range(4)], devices
    )
    ops = tf_crossdevice.AllReduceCrossDeviceOps("naive", num_packs=0)
    for v in ops.reduce("sum", value).values:
        np.testing.assert_array_equal(v.numpy(), [10, 20])


def test_an_unregistered_algorithm_is_unknown_again(naive_registered):
    assert "naive" in registry.algorithm_names()
    registry.unregister("naive")
    try:
        assert "naive" not in registry.algorithm_names()
        with pytest.raises(ValueError, match="unknown algorithm 'naive'"):
            tf_crossdevice.SpecAllReduce("naive")
    finally:
        registry.register("naive", naive_builder)  # For the fixture.


# The registry's own checks; every message is generated from the names.

ALLOWED = (
    "expected one of hierarchical_copy, nccl, pscpu, psgpu, rechd, xring, "
    "or 'inner/outer' naming two of them (e.g. 'hierarchical_copy/xring')"
)


@pytest.mark.parametrize(
    "name, problem",
    [
        ("xrign", "unknown algorithm 'xrign'"),
        ("XRING", "unknown algorithm 'XRING'"),
        ("", "missing algorithm"),
        (7, "unknown algorithm 7"),
        ("nccl/xrign", "unknown algorithm 'xrign' (the outer part of"),
        ("ring/xring", "unknown algorithm 'ring' (the inner part of"),
        (
            "nccl/xring/rechd",
            "unknown algorithm 'nccl/xring/rechd' (more than two levels)",
        ),
    ],
    ids=repr,
)
def test_build_rejects_unknown_names(name, problem):
    with pytest.raises(ValueError) as info:
        registry.build(name)
    assert str(info.value).startswith(f"alg: {problem}")
    assert str(info.value).endswith(f"; {ALLOWED}")


def test_errors_name_the_callers_argument():
    with pytest.raises(ValueError, match=r"^all_reduce_alg: unknown .*'ring'"):
        tf_crossdevice.AllReduceCrossDeviceOps("ring")
    with pytest.raises(
        ValueError,
        match=r"all_reduce_spec 'pscpu:32k:nccl/xrign': unknown algorithm "
        r"'xrign' \(the outer part of 'nccl/xrign'\) in range 1 "
        r"\(character 15\)",
    ):
        tf_crossdevice.SpecAllReduce("pscpu:32k:nccl/xrign")


def test_group_devices_needs_two_levels():
    with pytest.raises(ValueError, match="group_devices: only 'inner/outer'"):
        registry.build("xring", group_devices=two_fake_workers)


@pytest.mark.parametrize(
    "name, factory, error, match",
    [
        ("Naive", naive_builder, ValueError, "name: expected lower-case"),
        ("a/b", naive_builder, ValueError, "name: expected lower-case"),
        ("", naive_builder, ValueError, "name: expected lower-case"),
        ("xring", naive_builder, ValueError, "'xring' is already registered"),
        ("naive2", "not callable", TypeError, "factory: expected a callable"),
    ],
    ids=["upper_case", "slash", "empty", "taken", "not_callable"],
)
def test_register_rejects(name, factory, error, match):
    with pytest.raises(error, match=match):
        registry.register(name, factory)
    assert sorted(registry.algorithm_names()) == SINGLE_LEVEL


def test_unregister_rejects_unknown_names():
    with pytest.raises(ValueError, match="name: 'naive' is not registered"):
        registry.unregister("naive")
