"""Legacy names from TF 1's `tf.contrib.distribute` and early TF 2.

Each name still works and warns with a DeprecationWarning naming its
replacement (PEP 562 module `__getattr__`, as Optax does); Python's warning
filters show it once per call site:

>>> import warnings
>>> from tf_crossdevice import compat
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     ops = compat.ReductionToOneDeviceCrossTowerOps()
>>> print(caught[0].message)
tf_crossdevice.compat.ReductionToOneDeviceCrossTowerOps is deprecated; use \
tf_crossdevice.ReductionToOneDevice instead.
>>> value = tf_crossdevice.testing.per_replica(
...     [tf.constant(1.0), tf.constant(3.0)])
>>> float(ops.reduce(aggregation=tf.VariableAggregation.MEAN,
...                  per_device_value=value, destinations="/cpu:0"))
2.0
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from . import _legacy

# Old name -> (object, replacement to name in the warning).
_DEPRECATED: dict[str, tuple[Any, str]] = {
    "CrossTowerOps": (
        tf.distribute.CrossDeviceOps,
        "tf.distribute.CrossDeviceOps",
    ),
    "ReductionToOneDeviceCrossTowerOps": (
        _legacy.ReductionToOneDeviceCrossTowerOps,
        "tf_crossdevice.ReductionToOneDevice",
    ),
    "AllReduceCrossTowerOps": (
        _legacy.AllReduceCrossTowerOps,
        "tf_crossdevice.AllReduceCrossDeviceOps",
    ),
    "choose_the_best": (
        _legacy.choose_the_best,
        "tf_crossdevice.select_cross_device_ops",
    ),
    "CollectiveHints": (
        _legacy.collective_hints,
        "tf.distribute.experimental.CommunicationOptions",
    ),
}

__all__ = sorted(_DEPRECATED)


def __getattr__(name: str) -> Any:
    if name not in _DEPRECATED:
        raise AttributeError(
            f"module 'tf_crossdevice.compat' has no attribute {name!r}"
        )
    value, replacement = _DEPRECATED[name]
    warnings.warn(
        f"tf_crossdevice.compat.{name} is deprecated; use {replacement} "
        "instead.",
        DeprecationWarning,
        stacklevel=2,
    )
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_DEPRECATED))


if TYPE_CHECKING:  # Type checkers see the names without the warning.
    from ._legacy import (  # noqa: F401
        AllReduceCrossTowerOps,
        ReductionToOneDeviceCrossTowerOps,
        choose_the_best,
    )

    CollectiveHints = _legacy.collective_hints
    CrossTowerOps = tf.distribute.CrossDeviceOps
