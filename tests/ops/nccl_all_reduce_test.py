"""NcclAllReduce: the contract on CPU devices, where it falls back.

TensorFlow registers NCCL for GPUs only. On CPU devices NcclAllReduce logs one
warning naming the devices and sums on the first device; these tests pin
that behaviour. Every test here runs on logical CPU devices: none of them
reaches TensorFlow's NCCL kernels.
"""

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

import tf_crossdevice
from tests import contract
from tf_crossdevice.algorithms import _nccl as nccl


class TestNcclAllReduce(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.NcclAllReduce()


def test_cpu_devices_are_not_nccl_devices():
    devices = tf_crossdevice.testing.cpu_devices(2)
    reason = nccl.nccl_unavailable_reason(devices)
    assert reason is not None and "not all GPUs" in reason
    assert devices[0] in reason


def test_gpu_strings_on_a_cpu_build_say_why():
    reason = nccl.nccl_unavailable_reason(["/gpu:0", "/gpu:1"])
    if tf.sysconfig.get_build_info().get("is_cuda_build"):
        assert reason is None
    else:
        assert "no NCCL kernel" in reason


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.int8, tf.complex64])
def test_dtypes_the_nccl_kernel_lacks_are_refused(dtype):
    reason = nccl.nccl_unavailable_reason(["/gpu:0", "/gpu:1"], dtype)
    assert reason == f"TensorFlow's NCCL kernel takes no {dtype.name}"


def test_nccl_dtypes_pass_the_dtype_check():
    for dtype in (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64):
        reason = nccl.nccl_unavailable_reason(["/gpu:0", "/gpu:1"], dtype)
        assert reason is None or "takes no" not in reason


def test_duplicate_gpus_are_refused():
    reason = nccl.nccl_unavailable_reason(["/gpu:0", "/device:GPU:0"])
    assert reason is not None


def test_gpus_of_two_workers_are_refused():
    reason = nccl.nccl_unavailable_reason(
        ["/job:worker/task:0/device:GPU:0", "/job:worker/task:1/device:GPU:0"]
    )
    if tf.sysconfig.get_build_info().get("is_cuda_build"):
        assert "inside one worker" in reason
    else:
        assert reason is not None


def test_fallback_logs_once_and_is_correct(monkeypatch):
    messages = []
    monkeypatch.setattr(
        absl_logging,
        "log_first_n",
        lambda level, msg, n, *args: messages.append(msg % args),
    )
    devices = tf_crossdevice.testing.cpu_devices(3)
    tensors = []
    for i, d in enumerate(devices):
        with tf.device(d):
            tensors.append(tf.constant([i, 2 * i], tf.int64))
    out = nccl.nccl_all_reduce(tensors)
    assert len(messages) == 1
    assert "summing on" in messages[0] and devices[0] in messages[0]
    for t, d in zip(out, devices, strict=True):
        assert t.device == d
        np.testing.assert_array_equal(t.numpy(), [3, 6])
