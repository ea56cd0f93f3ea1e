"""Value components with no device, inside a tf.function.

A tensor built outside any `tf.device` scope inside a tf.function has device
''. Where the reduction needs the component's device (an all-reduce across
the components' own devices, destinations=None, MultiWorkerAllReduce) the
call raises a ValueError naming the value, the component and the remedy;
where one device sums and the destinations are given, the value is summed
as TensorFlow's own ReductionToOneDevice sums it.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice._core import tf_internal

SUM = tf.distribute.ReduceOp.SUM
LOCAL_WORKER = "/job:localhost/replica:0/task:0"
REMEDY = (
    "build each component under `with tf.device(...)`, or use strategy.run "
    "or tf_crossdevice.testing.per_replica"
)

ALL_REDUCE_CLASSES = {
    "nccl": tf_crossdevice.NcclAllReduce,
    "hierarchical_copy": tf_crossdevice.HierarchicalCopyAllReduce,
    "all_reduce_packed": lambda: tf_crossdevice.AllReduceCrossDeviceOps(
        "hierarchical_copy", num_packs=2
    ),
    "spec_xring": lambda: tf_crossdevice.SpecAllReduce("xring"),
    "multi_worker": lambda: tf_crossdevice.MultiWorkerAllReduce(
        [LOCAL_WORKER], 0, "pscpu/pscpu#2"
    ),
}
CLASSES = {
    "reduction_to_one_device": tf_crossdevice.ReductionToOneDevice,
    **ALL_REDUCE_CLASSES,
}
# Each replica's array; the sum is numpy's.
ARRAYS = [np.arange(4, dtype=np.float32) * (r + 1) for r in range(3)]
TOTAL = np.sum(ARRAYS, axis=0)


def value_of(placed: tuple[bool, ...]):
    """A PerReplica of ARRAYS; component r on CPU r where `placed[r]`.

    Call it inside a tf.function: eagerly every tensor has a device.
    """
    devices = testing.cpu_devices(len(placed))
    components = []
    for r, (array, on_device) in enumerate(zip(ARRAYS, placed, strict=True)):
        if on_device:
            with tf.device(devices[r]):
                components.append(tf.constant(array))
        else:
            components.append(tf.constant(array))
    return tf_internal.PerReplica(tuple(components))


UNPLACED = (False, False, False)
SECOND_UNPLACED = (True, False, True)
PLACED = (True, True, True)


def message(argument: str, component: int, reason: str) -> str:
    return re.escape(
        f"{argument}: component {component} of 3 has no device (it was built "
        f"outside any tf.device scope), but {reason}; {REMEDY}"
    )


def trace(fn):
    """Traces `fn` in a tf.function (raising what tracing raises)."""
    return tf.function(fn).get_concrete_function()


def all_reduce_reason(ops) -> str:
    if isinstance(ops, tf_crossdevice.MultiWorkerAllReduce):
        return "MultiWorkerAllReduce reduces each component on its own worker"
    return f"{type(ops).__name__} all-reduces on the components' own devices"


@pytest.mark.parametrize("name", sorted(ALL_REDUCE_CLASSES))
@pytest.mark.parametrize(
    ("placed", "component"),
    [
        pytest.param(UNPLACED, 0, id="unplaced"),
        pytest.param(SECOND_UNPLACED, 1, id="second_unplaced"),
    ],
)
def test_all_reduce_to_the_value_itself_names_the_component(
    name, placed, component
):
    ops = ALL_REDUCE_CLASSES[name]()

    def fn():
        value = value_of(placed)
        return ops.reduce(SUM, value, value).values

    with pytest.raises(ValueError) as raised:
        trace(fn)
    assert re.search(
        message("per_replica_value", component, all_reduce_reason(ops)),
        str(raised.value),
    ), str(raised.value)


@pytest.mark.parametrize("name", sorted(ALL_REDUCE_CLASSES))
def test_batch_reduce_names_the_pair_and_the_component(name):
    ops = ALL_REDUCE_CLASSES[name]()

    def fn():
        placed = value_of(PLACED)
        unplaced = value_of(SECOND_UNPLACED)
        pairs = [(placed, placed), (placed, placed), (unplaced, unplaced)]
        return ops.batch_reduce(SUM, pairs)[0].values

    with pytest.raises(
        ValueError,
        match=message("value_destination_pairs[2]", 1, all_reduce_reason(ops)),
    ):
        trace(fn)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_destinations_none_names_the_component(name):
    ops = CLASSES[name]()
    reason = "destinations=None means the value's own devices"

    with pytest.raises(
        ValueError, match=message("per_replica_value", 1, reason)
    ):
        trace(lambda: ops.reduce(SUM, value_of(SECOND_UNPLACED), None).values)
    with pytest.raises(
        ValueError, match=message("value_destination_pairs[1]", 0, reason)
    ):
        trace(
            lambda: (
                ops.batch_reduce(
                    SUM,
                    [(value_of(PLACED), None), (value_of(UNPLACED), None)],
                )[0].values
            )
        )
    with pytest.raises(
        ValueError, match=message("per_replica_value", 0, reason)
    ):
        trace(lambda: ops._gather(value_of(UNPLACED), None, 0).values)


def test_multi_worker_refuses_unplaced_components_for_any_destinations():
    """Unplaced, the components would be summed on the client's CPU."""
    ops = tf_crossdevice.MultiWorkerAllReduce([LOCAL_WORKER], 0)
    reason = "MultiWorkerAllReduce reduces each component on its own worker"

    with pytest.raises(
        ValueError, match=message("per_replica_value", 1, reason)
    ):
        trace(lambda: ops.reduce(SUM, value_of(SECOND_UNPLACED), "/cpu:0"))


def run_in_function(fn):
    """`fn`'s per-destination results, computed in a tf.function."""
    return [[t.numpy() for t in component] for component in tf.function(fn)()]


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_placed_components_reduce_to_the_numpy_sum(name):
    ops = CLASSES[name]()
    devices = testing.cpu_devices(3)

    def fn():
        value = value_of(PLACED)
        single = ops.reduce(SUM, value, None).values
        paired = ops.batch_reduce(SUM, [(value, value), (value, None)])
        return [single, *(r.values for r in paired)]

    for result in run_in_function(fn):
        assert len(result) == len(devices)
        for component in result:
            np.testing.assert_array_equal(component, TOTAL)


@pytest.mark.parametrize("name", sorted(set(CLASSES) - {"multi_worker"}))
def test_unplaced_components_to_a_given_device_sum_as_tensorflow_does(name):
    """One device sums: TensorFlow places the components, as its own
    ReductionToOneDevice does with these destinations."""
    ops = CLASSES[name]()
    theirs = tf.distribute.ReductionToOneDevice()

    def fn():
        value = value_of(UNPLACED)
        return [
            [ops.reduce(SUM, value, "/cpu:1")],
            [theirs.reduce(SUM, value, "/cpu:1")],
            [ops.reduce(SUM, value.values[0], None)],
        ]

    ours, tensorflow, one_replica = run_in_function(fn)
    np.testing.assert_array_equal(ours[0], TOTAL)
    np.testing.assert_array_equal(tensorflow[0], TOTAL)
    # One replica's unplaced tensor is copied where it is, as TensorFlow's
    # one-replica shortcut does.
    np.testing.assert_array_equal(one_replica[0], ARRAYS[0])


def test_reduction_to_one_device_to_the_unplaced_value_as_tensorflow():
    """TensorFlow's ReductionToOneDevice reduces to the value's own ('')
    devices; so does ours."""
    ours = tf_crossdevice.ReductionToOneDevice()
    theirs = tf.distribute.ReductionToOneDevice()

    def fn():
        value = value_of(UNPLACED)
        return [
            ours.reduce(SUM, value, value).values,
            theirs.reduce(SUM, value, value).values,
        ]

    for result in run_in_function(fn):
        assert len(result) == 3
        for component in result:
            np.testing.assert_array_equal(component, TOTAL)
