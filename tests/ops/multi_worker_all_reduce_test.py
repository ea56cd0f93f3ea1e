"""MultiWorkerAllReduce passes the contract on the local process's devices.

Its workers here are the local process ('/job:localhost/replica:0/task:0'),
so the two-level spec reduces inside it and then across one device; the
runs across real worker processes are in multi_worker_test.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract
from tf_crossdevice.compression import PowerSGD


class TestMultiWorkerAllReduceOnTheLocalWorker(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.MultiWorkerAllReduce(
            ["/job:localhost/replica:0/task:0"], 0, "pscpu/pscpu#2"
        )


def test_powersgd_is_taken_and_one_worker_sums_exactly():
    # One worker: nothing crosses a worker boundary, so the compressor is
    # left alone (as the collective classes do); the sums are numpy's.
    compressor = PowerSGD(rank=1, min_compression_size=0)
    ops = tf_crossdevice.MultiWorkerAllReduce(
        ["/job:localhost/replica:0/task:0"],
        0,
        "pscpu/pscpu#2",
        compression=compressor,
    )
    assert ops.compression is compressor
    rng = np.random.default_rng(3)
    arrays = [rng.integers(-8, 9, size=(6, 5)).astype(np.float32) for _ in "ab"]
    value = tf_crossdevice.testing.per_replica([tf.constant(a) for a in arrays])
    (summed,) = ops.batch_reduce("sum", [(value, None)])
    for component in summed.values:
        np.testing.assert_array_equal(component.numpy(), arrays[0] + arrays[1])
    assert int(compressor.step.numpy()) == 0  # Never used.


def test_an_unknown_compression_names_powersgd_too():
    with pytest.raises(
        ValueError,
        match=r"compression: unknown value 'powersgd'; expected one of None, "
        r"'bf16', 'fp16' or a tf_crossdevice\.compression\.PowerSGD",
    ):
        tf_crossdevice.MultiWorkerAllReduce(
            ["/job:localhost/replica:0/task:0"], 0, compression="powersgd"
        )
