"""The collective classes pass the contract in one process (one worker).

Between the logical CPUs of one process TensorFlow's collective ops run
without a cluster, so every case of the contract (dtypes, destinations,
sparse values, gather, eager / tf.function / TF 1 graph) checks the
collective code paths against numpy. Several workers: the multi-process
tests (collective_matrix_test.py and others).
"""

import tensorflow as tf

import tf_crossdevice
from tests import contract


class TestCollectiveAllReduce(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.CollectiveAllReduce()


class TestCollectiveAllReduceOneValuePerPack(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.CollectiveAllReduce(
            all_reduce_merge_scope=1,
            options=tf.distribute.experimental.CommunicationOptions(
                implementation="RING", timeout_seconds=120
            ),
        )


class TestHierarchicalCollectiveAllReduce(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.ReductionToOneDevice(),
            options=tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=64
            ),
        )
