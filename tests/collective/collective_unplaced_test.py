"""Collective classes and value components with no device (tf.function).

One process, 3 logical CPUs (one worker). Outside a strategy a collective
object runs one collective on each component's device, so a component
built outside any `tf.device` scope (device '') is refused with a
ValueError naming the value, the component and the remedy. Under a
strategy the collectives launch on its devices by position, as
TensorFlow's CollectiveAllReduce does, and such a value reduces.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice._core import tf_internal

SUM = tf.distribute.ReduceOp.SUM
DEVICES = testing.cpu_devices(3)
REMEDY = (
    "build each component under `with tf.device(...)`, or use strategy.run "
    "or tf_crossdevice.testing.per_replica"
)
ARRAYS = [np.arange(4, dtype=np.float32) * (r + 1) for r in range(3)]
TOTAL = np.sum(ARRAYS, axis=0)

CLASSES = {
    "collective": tf_crossdevice.CollectiveAllReduce,
    "hierarchical": lambda: tf_crossdevice.HierarchicalCollectiveAllReduce(
        tf_crossdevice.ReductionToOneDevice()
    ),
}


def value_of(placed: tuple[bool, ...]):
    """A PerReplica of ARRAYS; component r on DEVICES[r] where `placed[r]`.

    Call it inside a tf.function: eagerly every tensor has a device.
    """
    components = []
    for array, device, on_device in zip(ARRAYS, DEVICES, placed, strict=True):
        with tf.device(device if on_device else None):
            components.append(tf.constant(array))
    return tf_internal.PerReplica(tuple(components))


UNPLACED = (False, False, False)
LAST_UNPLACED = (True, True, False)
PLACED = (True, True, True)


def message(ops, argument: str, component: int) -> str:
    return re.escape(
        f"{argument}: component {component} of 3 has no device (it was built "
        "outside any tf.device scope), but outside a strategy "
        f"{type(ops).__name__} runs one collective on each component's "
        f"device; {REMEDY}"
    )


def trace(fn):
    """Traces `fn` in a tf.function (raising what tracing raises)."""
    return tf.function(fn).get_concrete_function()


@pytest.mark.parametrize("name", sorted(CLASSES))
@pytest.mark.parametrize(
    ("placed", "component"),
    [
        pytest.param(UNPLACED, 0, id="unplaced"),
        pytest.param(LAST_UNPLACED, 2, id="last_unplaced"),
    ],
)
def test_reduce_names_the_component(name, placed, component):
    ops = CLASSES[name]()
    with pytest.raises(
        ValueError, match=message(ops, "per_replica_value", component)
    ):
        trace(lambda: ops.reduce(SUM, value_of(placed), DEVICES[0]))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_batch_reduce_names_the_pair_and_the_component(name):
    ops = CLASSES[name]()

    def fn():
        placed = value_of(PLACED)
        pairs = [(placed, placed), (value_of(LAST_UNPLACED), DEVICES[0])]
        return ops.batch_reduce(SUM, pairs)[0].values

    with pytest.raises(
        ValueError, match=message(ops, "value_destination_pairs[1]", 2)
    ):
        trace(fn)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_gather_names_the_component(name):
    ops = CLASSES[name]()
    with pytest.raises(ValueError, match=message(ops, "per_replica_value", 0)):
        trace(lambda: ops._gather(value_of(UNPLACED), DEVICES[0], 0))


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_placed_components_reduce_to_the_numpy_sum(name):
    ops = CLASSES[name]()

    @tf.function
    def fn():
        value = value_of(PLACED)
        mirrored, one_device = ops.batch_reduce(
            SUM, [(value, value), (value, DEVICES[1])]
        )
        return ops.reduce(SUM, value, None).values, mirrored.values, one_device

    every_device, again, one_device = fn()
    for result in (every_device, again):
        assert len(result) == len(DEVICES)
        for component in result:
            np.testing.assert_array_equal(component.numpy(), TOTAL)
    np.testing.assert_array_equal(one_device.numpy(), TOTAL)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_under_a_strategy_unplaced_components_reduce_by_position(name):
    """The strategy's devices are the members, as TensorFlow's
    CollectiveAllReduce launches by position."""
    ops = CLASSES[name]()
    strategy = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=ops)

    @tf.function
    def fn():
        return ops.reduce(SUM, value_of(UNPLACED), DEVICES[2])

    with strategy.scope():
        np.testing.assert_array_equal(fn().numpy(), TOTAL)
