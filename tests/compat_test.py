"""Legacy names keep working, warn, and name their replacement."""

import importlib
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing

REPLACEMENTS = {
    "CrossTowerOps": "tf.distribute.CrossDeviceOps",
    "ReductionToOneDeviceCrossTowerOps": "tf_crossdevice.ReductionToOneDevice",
    "AllReduceCrossTowerOps": "tf_crossdevice.AllReduceCrossDeviceOps",
    "choose_the_best": "tf_crossdevice.select_cross_device_ops",
    "CollectiveHints": "tf.distribute.experimental.CommunicationOptions",
}


def legacy(name):
    compat = importlib.import_module("tf_crossdevice.compat")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(compat, name)
    return value, caught


@pytest.mark.parametrize("name", sorted(REPLACEMENTS))
def test_each_name_warns_naming_its_replacement(name):
    _, caught = legacy(name)
    assert len(caught) == 1
    assert caught[0].category is DeprecationWarning
    assert REPLACEMENTS[name] in str(caught[0].message)


def test_unknown_name_is_an_attribute_error():
    compat = importlib.import_module("tf_crossdevice.compat")
    with pytest.raises(AttributeError, match="NoSuchOps"):
        compat.NoSuchOps  # noqa: B018


def value():
    return testing.per_replica(
        [tf.constant([1.0, 2.0]), tf.constant([3.0, 6.0])]
    )


@pytest.mark.parametrize(
    "aggregation, expected",
    [
        (tf.VariableAggregation.SUM, [4.0, 8.0]),
        (tf.VariableAggregation.MEAN, [2.0, 4.0]),
        (tf.distribute.ReduceOp.SUM, [4.0, 8.0]),
    ],
)
@pytest.mark.parametrize(
    "name", ["ReductionToOneDeviceCrossTowerOps", "AllReduceCrossTowerOps"]
)
def test_variable_aggregation_as_reduce_op(name, aggregation, expected):
    cls, _ = legacy(name)
    ops = cls()
    old_style = ops.reduce(
        aggregation=aggregation, per_device_value=value(), destinations=None
    )
    (to_one_device,) = ops.batch_reduce(aggregation, [(value(), "/cpu:3")])
    for component in [*old_style.values, to_one_device]:
        np.testing.assert_allclose(component.numpy(), expected)
    # One destination: the plain tensor, as TensorFlow returns it.
    assert isinstance(to_one_device, tf.Tensor)
    assert to_one_device.device.endswith("CPU:3")


def test_aggregation_none_is_refused():
    cls, _ = legacy("ReductionToOneDeviceCrossTowerOps")
    with pytest.raises(ValueError, match="aggregation: .*NONE"):
        cls().reduce(tf.VariableAggregation.NONE, value(), None)


def test_legacy_classes_are_the_new_ones():
    cls, _ = legacy("AllReduceCrossTowerOps")
    assert issubclass(cls, tf_crossdevice.AllReduceCrossDeviceOps)
    base, _ = legacy("CrossTowerOps")
    assert issubclass(cls, base)


def test_choose_the_best_matches_select():
    choose, _ = legacy("choose_the_best")
    devices = testing.cpu_devices(4)
    assert type(choose(devices, session_config=None)) is type(
        tf_crossdevice.select_cross_device_ops(devices)
    )


def test_collective_hints_become_communication_options():
    hints, _ = legacy("CollectiveHints")
    options = hints(bytes_per_pack=1024, timeout_seconds=5.0)
    assert options.bytes_per_pack == 1024
    assert options.timeout_seconds == 5.0
