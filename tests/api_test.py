"""The public face: what __all__ says is exported, nothing private."""

import inspect
import types

import tensorflow as tf

import tf_crossdevice

PUBLIC_SUBMODULES = {
    "algorithms",
    "cluster",
    "collective",
    "compat",
    "compression",
    "cost_model",
    "launch",
    "ops",
    "packing",
    "testing",
    "tuning",
}
# Public classes that are not CrossDeviceOps.
OTHER_CLASSES = {"MultiWorkerMirroredStrategy", "CollectiveCluster"}


def test_all_names_exist_and_are_public():
    for name in tf_crossdevice.__all__:
        assert not name.startswith("_"), name
        assert hasattr(tf_crossdevice, name), name


def test_nothing_private_leaks():
    for name in dir(tf_crossdevice):
        if name.startswith("_"):
            continue
        value = getattr(tf_crossdevice, name)
        if isinstance(value, types.ModuleType):
            assert name in PUBLIC_SUBMODULES, f"module {name} leaks"
        else:
            assert name in tf_crossdevice.__all__, f"{name} is not in __all__"


def test_every_class_is_a_cross_device_ops_with_a_docstring_example():
    for name in tf_crossdevice.__all__:
        value = getattr(tf_crossdevice, name)
        if inspect.isclass(value) and name not in OTHER_CLASSES:
            assert issubclass(value, tf.distribute.CrossDeviceOps), name
        if callable(value):
            assert ">>>" in (value.__doc__ or ""), f"{name} has no example"
