"""Collectives with implementation NCCL between the GPUs of one worker.

CollectiveAllReduce and HierarchicalCollectiveAllReduce in one process (no
cluster): TensorFlow's collective ops run between the local GPUs with the
NCCL communication hint. NCCL needs distinct GPUs (it refuses two ranks on
one GPU), so these tests need 2 physical GPUs; RING between logical GPUs of
one GPU is checked by gpu_logical_gpus_test.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests.gpu import gpu_util

pytestmark = gpu_util.needs_gpus(2, physical=True)
NCCL_OPTIONS = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.NCCL
)
CLASSES = {
    "CollectiveAllReduce": lambda: tf_crossdevice.CollectiveAllReduce(
        options=NCCL_OPTIONS
    ),
    "HierarchicalCollectiveAllReduce": (
        lambda: tf_crossdevice.HierarchicalCollectiveAllReduce(
            options=NCCL_OPTIONS
        )
    ),
}


def num_gpus():
    return min(gpu_util.physical_gpu_count(), 8)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_the_contract_all_reduce_case_with_nccl(name):
    problem = gpu_util.all_reduce_problem(CLASSES[name], num_gpus())
    assert problem is None, problem


def test_the_collectives_ask_for_nccl():
    devices = gpu_util.gpu_names(num_gpus())
    ops = CLASSES["CollectiveAllReduce"]()

    placed = []

    @tf.function
    def step():
        value = tf_crossdevice.testing.per_replica(
            [tf.fill([4], float(i + 1)) for i in range(len(devices))], devices
        )
        out = list(ops.reduce("sum", value, value).values)
        placed[:] = [t.device for t in out]  # outputs do not say, later
        return out

    graph = step.get_concrete_function().graph
    hints = {
        op.get_attr("communication_hint")
        for op in graph.get_operations()
        if op.type == "CollectiveReduceV2"
    }
    assert hints == {b"nccl"}, hints
    total = sum(range(1, len(devices) + 1))
    results = step()
    assert [gpu_util.canonical(d) for d in placed] == devices
    for t in results:
        np.testing.assert_array_equal(t.numpy(), [total] * 4)


def test_mirrored_strategy_replicas_all_reduce_with_nccl():
    devices = gpu_util.gpu_names(num_gpus())
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=CLASSES["CollectiveAllReduce"]()
    )

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        x = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
        return ctx.all_reduce("mean", [x * tf.ones([3]), x * x])

    vectors, squares = strategy.run(step)
    n = len(devices)
    mean = (n + 1) / 2
    mean_square = (n + 1) * (2 * n + 1) / 6
    for v in strategy.experimental_local_results(vectors):
        np.testing.assert_allclose(v.numpy(), [mean] * 3)
    for s in strategy.experimental_local_results(squares):
        np.testing.assert_allclose(s.numpy(), mean_square)
