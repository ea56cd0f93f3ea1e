"""AllReduceCrossDeviceOps: the contract with packing on, and bad input."""

import pytest

import tf_crossdevice
from tests import contract


class TestConcatAndSplitPacking(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.AllReduceCrossDeviceOps(
            "hierarchical_copy", num_packs=3
        )


class TestSmallTensorAggregation(contract.CrossDeviceOpsContract):
    def make_ops(self):
        # 10 x 3 float64 is 240 bytes: every contract value is "small".
        return tf_crossdevice.AllReduceCrossDeviceOps(
            "nccl",
            num_packs=0,
            agg_small_grads_max_bytes=256,
            agg_small_grads_max_group=2,
        )


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (
            {"all_reduce_alg": "ring"},
            ValueError,
            "all_reduce_alg.*'ring'.*nccl",
        ),
        ({"all_reduce_alg": "NCCL"}, ValueError, "all_reduce_alg"),
        ({"num_packs": -1}, ValueError, "num_packs.*>= 0"),
        ({"num_packs": 1.5}, TypeError, "num_packs"),
        ({"num_packs": True}, TypeError, "num_packs"),
        ({"agg_small_grads_max_bytes": -4}, ValueError, "max_bytes"),
        ({"agg_small_grads_max_group": -1}, ValueError, "max_group"),
        (
            {
                "num_packs": 0,
                "agg_small_grads_max_bytes": 8,
                "agg_small_grads_max_group": 0,
            },
            ValueError,
            "agg_small_grads_max_group",
        ),
        (
            {"agg_small_grads_max_bytes": 1024},
            ValueError,
            "num_packs=0 to aggregate",
        ),
    ],
)
def test_bad_constructor_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        tf_crossdevice.AllReduceCrossDeviceOps(**kwargs)


@pytest.mark.parametrize(
    "cls",
    [tf_crossdevice.NcclAllReduce, tf_crossdevice.HierarchicalCopyAllReduce],
)
def test_subclasses_validate_num_packs(cls):
    with pytest.raises(ValueError, match="num_packs"):
        cls(num_packs=-2)
