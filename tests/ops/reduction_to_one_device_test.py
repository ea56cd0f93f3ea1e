"""ReductionToOneDevice: the contract, plus its two arguments."""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract


class TestReductionToOneDevice(contract.CrossDeviceOpsContract):
    # TensorFlow's default, cheap to run: the one class that runs every
    # case of the matrix tests (the others run a pairwise cover).
    EXHAUSTIVE = True

    def make_ops(self):
        return tf_crossdevice.ReductionToOneDevice()


class TestReductionToOneDeviceFixedDevice(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.ReductionToOneDevice(reduce_to_device="/cpu:7")


def test_sums_on_reduce_to_device():
    ops = tf_crossdevice.ReductionToOneDevice(reduce_to_device="/cpu:5")
    value = tf_crossdevice.testing.per_replica(
        [tf.constant([1.0]), tf.constant([2.0])]
    )

    @tf.function
    def fn():
        return list(ops.reduce("sum", value, None).values)

    graph = fn.get_concrete_function().graph
    add_devices = {
        op.device for op in graph.get_operations() if op.type == "AddN"
    }
    assert add_devices == {"/job:localhost/replica:0/task:0/device:CPU:5"}
    np.testing.assert_array_equal([t.numpy() for t in fn()], [[3.0], [3.0]])


def test_accumulation_fn_is_used():
    calls = []

    def accumulate(tensors):
        calls.append(len(tensors))
        return tf.math.add_n(tensors)

    ops = tf_crossdevice.ReductionToOneDevice(accumulation_fn=accumulate)
    value = tf_crossdevice.testing.per_replica(
        [tf.constant(1.0), tf.constant(2.0), tf.constant(4.0)]
    )
    result = ops.reduce("mean", value, "/cpu:0")
    assert calls == [3]
    np.testing.assert_allclose(result.numpy(), 7.0 / 3)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"reduce_to_device": 3}, TypeError, "reduce_to_device"),
        ({"reduce_to_device": "/cpu:zero"}, ValueError, "reduce_to_device"),
        ({"accumulation_fn": "add_n"}, TypeError, "accumulation_fn"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        tf_crossdevice.ReductionToOneDevice(**kwargs)


def test_reduce_to_device_that_does_not_exist():
    ops = tf_crossdevice.ReductionToOneDevice(reduce_to_device="/cpu:99")
    value = tf_crossdevice.testing.per_replica([tf.constant(1.0)] * 2)
    with pytest.raises(ValueError, match="reduce_to_device.*CPU:99"):
        ops.reduce("sum", value, None)
