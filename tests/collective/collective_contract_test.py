"""The collective classes pass the contract in one process (one worker).

Between the logical CPUs of one process TensorFlow's collective ops run
without a cluster, so every case of the contract (dtypes, destinations,
sparse values, gather, eager / tf.function / TF 1 graph) checks the
collective code paths against numpy. Several workers: the multi-process
tests (collective_matrix_test.py and others).
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract
from tf_crossdevice._core import tf_internal


class CollectiveContract(contract.CrossDeviceOpsContract):
    """Every case of the collective classes traces thousands of ops (an
    IndexedSlices is two all-gathers per device), so the every-count test
    stops at 4 devices (8 cost over a minute per class on two cores and
    exercise no code of ours that 3 and 4 do not: TensorFlow's kernels see
    the size)."""

    DEVICE_COUNTS = (1, 2, 3, 4)


class TestCollectiveAllReduce(CollectiveContract):
    def make_ops(self):
        return tf_crossdevice.CollectiveAllReduce()


class TestHierarchicalCollectiveAllReduce(CollectiveContract):
    def make_ops(self):
        return tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.ReductionToOneDevice(),
            options=tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=64
            ),
        )


def _collectives_per_device(ops, values):
    """Reduces in a tf.function; counts its all-reduce ops per device."""

    @tf.function
    def step():
        pairs = [(v, v) for v in values]
        return [r.values for r in ops.batch_reduce("sum", pairs)]

    graph = step.get_concrete_function().graph
    counts = {}
    for op in graph.get_operations():
        if op.type == "CollectiveReduceV2":
            counts[op.device] = counts.get(op.device, 0) + 1
    results = step()
    return counts, [[t.numpy() for t in r] for r in results]


def test_all_reduce_merge_scope_counts_values_per_collective():
    devices = tf_crossdevice.testing.cpu_devices(2)
    values = [
        tf_crossdevice.testing.per_replica(
            [tf.fill([2], float(10 * i + d)) for d in range(2)], devices
        )
        for i in range(5)
    ]
    for scope, packs in ((1, 5), (2, 3), (32, 1)):
        ops = tf_crossdevice.CollectiveAllReduce(all_reduce_merge_scope=scope)
        counts, results = _collectives_per_device(ops, values)
        assert sorted(counts.values()) == [packs, packs], (scope, counts)
        for i, per_device in enumerate(results):
            for got in per_device:
                np.testing.assert_array_equal(got, [20.0 * i + 1] * 2)


def test_bytes_per_pack_overrides_the_merge_scope():
    devices = tf_crossdevice.testing.cpu_devices(2)
    values = [
        tf_crossdevice.testing.per_replica(
            [tf.ones([256]) for _ in range(2)], devices
        )
        for _ in range(4)
    ]
    # 1 KiB values: a pack closes once over 1500 bytes, so 2 values each.
    ops = tf_crossdevice.CollectiveAllReduce(
        all_reduce_merge_scope=1,
        options=tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=1500
        ),
    )
    counts, _ = _collectives_per_device(ops, values)
    assert sorted(counts.values()) == [2, 2]


def test_objects_sharing_collective_keys_never_share_a_key():
    # Keys of its own: drawing an instance key for one device of the
    # process's shared keys would leave that device a key ahead of its peer,
    # and every later collective of the group in this process would hang.
    keys = tf_internal.collective_keys()
    a = tf_crossdevice.CollectiveAllReduce(collective_keys=keys)
    b = tf_crossdevice.CollectiveAllReduce(collective_keys=keys)
    devices = tf_crossdevice.testing.cpu_devices(2)
    group_a = a.reducer.group(devices, 2, "a")
    group_b = b.reducer.group(devices, 2, "b")
    # Same devices and size: one group (TensorFlow binds a key to one
    # membership), and instance keys drawn from one counter.
    assert group_a.key == group_b.key
    first = keys.get_instance_key(group_a.key, devices[0])
    second = keys.get_instance_key(group_b.key, devices[0])
    assert second == first + 1
    # Another size is another group.
    assert a.reducer.group(devices, 4, "a").key != group_a.key


def test_collective_keys_must_be_tensorflows():
    with pytest.raises(TypeError, match="collective_keys"):
        tf_crossdevice.CollectiveAllReduce(collective_keys=7)
    with pytest.raises(ValueError, match="all_reduce_merge_scope"):
        tf_crossdevice.CollectiveAllReduce(all_reduce_merge_scope=0)
    with pytest.raises(TypeError, match="options"):
        tf_crossdevice.CollectiveAllReduce(options={"bytes_per_pack": 1})
    with pytest.raises(ValueError, match="local_cross_device_ops"):
        tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.CollectiveAllReduce()
        )
