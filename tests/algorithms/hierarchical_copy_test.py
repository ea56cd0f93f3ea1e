"""HierarchicalCopyAllReduce: the contract, and the schedule it builds."""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract
from tf_crossdevice.algorithms import _hierarchical_copy as hierarchical_copy
from tf_crossdevice.algorithms import _hierarchical_copy_schedule as schedule


class TestHierarchicalCopyAllReduce(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.HierarchicalCopyAllReduce(num_packs=1)


class TestHierarchicalCopyUnpacked(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.HierarchicalCopyAllReduce(num_packs=0)


@pytest.mark.parametrize("n", range(1, 17))
def test_every_device_is_in_exactly_one_group(n):
    first, second = schedule.split_groups(n)
    assert sorted(first + second) == list(range(n))
    assert len(first) - len(second) in (0, 1)
    for index in range(2 * n):
        plan = schedule.hierarchical_copy_plan(n, index)
        assert plan.main_root == index % n
        assert plan.main_root in plan.main_group
        if n > 1:
            assert plan.other_root in plan.other_group
        assert {plan.root_of(d) for d in range(n)} <= {
            plan.main_root,
            plan.other_root,
        }


def test_dgx1_pairs_gpu_i_with_i_plus_4():
    for index in range(8):
        plan = schedule.hierarchical_copy_plan(8, index)
        assert plan.other_root == (index + 4) % 8


@pytest.mark.parametrize(
    "args, error",
    [((0, 0), ValueError), ((3, -1), ValueError), ((2.0, 0), TypeError)],
)
def test_schedule_rejects_bad_input(args, error):
    with pytest.raises(error):
        schedule.hierarchical_copy_plan(*args)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_sums_run_on_the_two_roots(n):
    devices = tf_crossdevice.testing.cpu_devices(n)
    index = n + 1  # Main device 1: the rotation is visible.
    plan = schedule.hierarchical_copy_plan(n, index)
    rng = np.random.default_rng(n)
    arrays = [rng.integers(-9, 9, size=5).astype(np.float32) for _ in devices]

    placed = []

    @tf.function
    def fn():
        tensors = []
        for a, d in zip(arrays, devices, strict=True):
            with tf.device(d):
                tensors.append(tf.constant(a))
        out = hierarchical_copy.hierarchical_copy_all_reduce(tensors, index)
        placed[:] = [t.device for t in out]
        return out

    graph = fn.get_concrete_function().graph
    sum_devices = {
        op.device
        for op in graph.get_operations()
        if op.type in ("AddN", "AddV2")
    }
    # A group of one device adds nothing: its "sum" is a copy.
    want = {devices[plan.main_root]}
    if len(plan.other_group) > 1:
        want.add(devices[plan.other_root])
    assert sum_devices == want
    assert placed == devices
    for out in fn():
        np.testing.assert_array_equal(out.numpy(), sum(arrays))
