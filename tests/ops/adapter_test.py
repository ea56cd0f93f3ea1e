"""Every CrossDeviceOps class of the package is the adapter, configured.

The classes may check their arguments and build their reducer; none may
replace a method of the adapter (a reduction hook filled in by a subclass
is the ladder this design replaced).
"""

import inspect

import pytest

import tf_crossdevice
from tf_crossdevice.ops import CrossDeviceOpsAdapter

CLASSES = sorted(
    (
        cls
        for cls in vars(tf_crossdevice).values()
        if inspect.isclass(cls) and issubclass(cls, CrossDeviceOpsAdapter)
    ),
    key=lambda cls: cls.__name__,
)
ADAPTER_METHODS = {
    name
    for name, value in vars(CrossDeviceOpsAdapter).items()
    if callable(value) or isinstance(value, property)
} - {"__init__"}


def test_every_public_class_is_an_adapter():
    assert [cls.__name__ for cls in CLASSES] == [
        "AllReduceCrossDeviceOps",
        "CollectiveAllReduce",
        "HierarchicalCollectiveAllReduce",
        "HierarchicalCopyAllReduce",
        "MultiWorkerAllReduce",
        "NcclAllReduce",
        "ReductionToOneDevice",
        "SpecAllReduce",
    ]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_no_class_replaces_a_method_of_the_adapter(cls):
    replaced = {
        name
        for klass in cls.__mro__[: cls.__mro__.index(CrossDeviceOpsAdapter)]
        for name in vars(klass)
        if name in ADAPTER_METHODS
    }
    assert replaced == set()
