"""SpecAllReduce: every all_reduce_spec algorithm as a CrossDeviceOps."""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract
from tf_crossdevice.algorithms import _registry as registry

# Every registered algorithm and TensorFlow 1's two-level ones; every
# builder's numbers are checked by tests/algorithms/builders_test.py.
ALGORITHMS = sorted(registry.algorithm_names()) + [
    "nccl/pscpu",
    "nccl/rechd",
    "nccl/xring",
    "pscpu/pscpu",
]


# Three specs run the whole contract: a flat ring with packing, a two-level
# spec with NCCL's CPU substitute and small-tensor aggregation, and size
# ranges. tests/algorithms/builders_test.py covers every algorithm's numbers.
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
    assert [(r.alg, r.shards, r.limit) for r in ops.all_reduce_spec] == [
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


def test_powersgd_is_refused_naming_the_class_and_where_it_goes():
    powersgd = tf_crossdevice.compression.PowerSGD(rank=2)
    with pytest.raises(ValueError) as e:
        tf_crossdevice.SpecAllReduce(compression=powersgd)
    assert str(e.value) == (
        "compression: SpecAllReduce cannot carry PowerSGD(rank=2, "
        "start_step=0, min_compression_size=4096, seed=0, "
        "bucket_bytes=26214400, min_compression_rate=2.0); expected None, "
        "'bf16' or 'fp16' "
        "(PowerSGD goes to MultiWorkerAllReduce or the collective classes)"
    )
