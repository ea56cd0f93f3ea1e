"""The CrossDeviceOps contract with every replica on a GPU.

tests/contract.py places replicas on logical CPUs (`contract.device_names`);
here that function gives GPUs instead, so every case (reduce, batch_reduce,
broadcast, gather; SUM and MEAN; every destination kind; dense and
IndexedSlices; float16, bfloat16, float32, float64, int64; eager,
tf.function and a TF 1 graph) runs on GPUs and is checked against numpy.
Destinations given as CPU strings stay CPUs: values go from GPUs to a CPU.

The contract uses up to 8 replicas. On a machine with fewer GPUs,
gpu_logical_gpus_test.py runs this file in a pytest process whose GPU:0 is
split into 8 logical GPUs; NCCL, which refuses two ranks on one GPU, then
has to fall back as NcclAllReduce's docstring says. Collectives with NCCL
need 8 distinct GPUs.
"""

import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract
from tests.gpu import gpu_util

EIGHT = " (the contract places replicas on up to 8 devices)"
pytestmark = gpu_util.needs_gpus(8, why=EIGHT)
NCCL = tf.distribute.experimental.CommunicationImplementation.NCCL
RING = tf.distribute.experimental.CommunicationImplementation.RING


class GpuContract(contract.CrossDeviceOpsContract):
    @pytest.fixture(autouse=True)
    def _replicas_on_gpus(self, monkeypatch):
        monkeypatch.setattr(contract, "device_names", gpu_util.gpu_names)


class TestNcclAllReduce(GpuContract):
    def make_ops(self):
        return tf_crossdevice.NcclAllReduce()


class TestHierarchicalCopyAllReduce(GpuContract):
    def make_ops(self):
        return tf_crossdevice.HierarchicalCopyAllReduce()


class TestAllReduceCrossDeviceOpsPacked(GpuContract):
    def make_ops(self):
        return tf_crossdevice.AllReduceCrossDeviceOps("nccl", num_packs=2)


class TestSpecAllReducePsgpu(GpuContract):
    def make_ops(self):
        return tf_crossdevice.SpecAllReduce("psgpu")


class TestReductionToOneDevice(GpuContract):
    def make_ops(self):
        return tf_crossdevice.ReductionToOneDevice()


class TestCollectiveAllReduceRing(GpuContract):
    def make_ops(self):
        return tf_crossdevice.CollectiveAllReduce(
            options=tf.distribute.experimental.CommunicationOptions(
                implementation=RING
            )
        )


@gpu_util.needs_gpus(8, physical=True, why=EIGHT)
class TestCollectiveAllReduceNccl(GpuContract):
    def make_ops(self):
        return tf_crossdevice.CollectiveAllReduce(
            options=tf.distribute.experimental.CommunicationOptions(
                implementation=NCCL
            )
        )
