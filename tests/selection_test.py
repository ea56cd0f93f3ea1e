"""select_cross_device_ops: the choice follows devices and links."""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice._schedules import topology

GPUS = [f"/gpu:{i}" for i in range(8)]


def test_cpu_devices_get_a_packed_configuration():
    """The benchmark's best on CPUs packs small tensors (issue #12)."""
    devices = tf_crossdevice.testing.cpu_devices(4)
    ops = tf_crossdevice.select_cross_device_ops(devices)
    assert type(ops) is tf_crossdevice.SpecAllReduce
    assert [r.alg for r in ops.all_reduce_spec] == ["pscpu"]
    assert ops._agg_small_grads_max_bytes == 64 * 1024
    assert ops._agg_small_grads_max_group == 1024
    # Packed means fewer all-reduces than tensors: 50 small tensors go
    # through the spec algorithm as one pack, and the sums are numpy's.
    calls = []
    original = ops._reduce_pack
    ops._reduce_pack = lambda t, i: calls.append(i) or original(t, i)
    arrays = [np.arange(10, dtype=np.float32) * (k + 1) for k in range(50)]
    pairs = [
        (
            tf_crossdevice.testing.per_replica([tf.constant(a)] * 4, devices),
            None,
        )
        for a in arrays
    ]
    results = ops.batch_reduce("sum", pairs)
    assert len(calls) == 1
    for array, result in zip(arrays, results, strict=True):
        for component in result.values:
            np.testing.assert_array_equal(component.numpy(), 4 * array)


def test_a_mix_of_cpu_and_gpu_is_treated_as_cpu():
    ops = tf_crossdevice.select_cross_device_ops(["/cpu:0", "/gpu:0"])
    assert type(ops) is tf_crossdevice.SpecAllReduce


def test_dgx1_links_get_hierarchical_copy_with_8_packs():
    ops = tf_crossdevice.select_cross_device_ops(
        GPUS, link_matrix=topology.dgx1_link_matrix()
    )
    assert type(ops) is tf_crossdevice.HierarchicalCopyAllReduce
    assert ops._num_packs == 8


def test_fully_connected_gpus_count_as_dgx1_like():
    full = [[i != j for j in range(8)] for i in range(8)]
    ops = tf_crossdevice.select_cross_device_ops(GPUS, link_matrix=full)
    assert type(ops) is tf_crossdevice.HierarchicalCopyAllReduce


def test_dgx1_missing_one_link_gets_nccl():
    links = topology.dgx1_link_matrix()
    links[0][4] = links[4][0] = False
    ops = tf_crossdevice.select_cross_device_ops(GPUS, link_matrix=links)
    assert type(ops) is tf_crossdevice.NcclAllReduce


def test_four_gpus_get_nccl():
    full = [[i != j for j in range(4)] for i in range(4)]
    ops = tf_crossdevice.select_cross_device_ops(GPUS[:4], link_matrix=full)
    assert type(ops) is tf_crossdevice.NcclAllReduce
    assert ops._num_packs == 1


def test_gpus_of_several_workers_never_get_nccl():
    devices = [
        f"/job:worker/task:{t}/device:GPU:{i}" for t in (0, 1) for i in (0, 1)
    ]
    full = [[True] * 4 for _ in range(4)]
    ops = tf_crossdevice.select_cross_device_ops(devices, link_matrix=full)
    assert type(ops) is tf_crossdevice.HierarchicalCopyAllReduce
    assert ops._num_packs == 1


@pytest.mark.parametrize(
    "devices, link_matrix, error, message",
    [
        ([], None, ValueError, "devices"),
        ("/cpu:0", None, TypeError, "devices"),
        (["/cpu:0", 1], None, TypeError, "devices"),
        (["/bogus:0:1:2"], None, ValueError, "devices"),
        (GPUS, [[True] * 8] * 7, ValueError, "link_matrix.*8 rows"),
        (GPUS[:2], [[True], [True]], ValueError, "link_matrix: row 0"),
    ],
)
def test_bad_arguments(devices, link_matrix, error, message):
    with pytest.raises(error, match=message):
        tf_crossdevice.select_cross_device_ops(devices, link_matrix)
