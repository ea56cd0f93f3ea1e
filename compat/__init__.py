"""Legacy names from TF 1's `tf.contrib.distribute` and early TF 2.

Code written for `tf.contrib.distribute` (2018) runs with one changed
import, `from tf_crossdevice import compat as distribute`; code for
`tf.compat.v1.distribute` and TF 2.2 finds its names here too. Each name
warns once per process with a DeprecationWarning that names its replacement
and what changed on purpose (Python's warning filters can silence it), and
`python -m tf_crossdevice.compat.upgrade` rewrites the code for good.

The legacy classes also take TF 1's arguments: `aggregation=` (a
`tf.VariableAggregation`: SUM, MEAN, ONLY_FIRST_REPLICA or ONLY_FIRST_TOWER),
`per_device_value=`, destinations None (the value's devices), the strings
"sum" and "mean" in any case, and TF 2.2's `experimental_hints=`.

Each name keeps its TensorFlow's value contract. TF 1's classes (the
`*CrossTowerOps` names, `MultiWorkerAllReduce`, `CollectiveAllReduce`) return
a TF 1 `Mirrored` from reduce, broadcast and (a list of them) batch_reduce,
one destination included, read with `get(device=None)`, `devices` and
`on_device(device)`; it is a subclass of TF 2's Mirrored. The tf.compat.v1
and TF 2.2 names return what TF 2 does: a plain tensor for one destination.

The first use of a name warns, for instance
"tf_crossdevice.compat.ReductionToOneDeviceCrossTowerOps is deprecated; use
tf_crossdevice.ReductionToOneDevice instead (...)". Old code, warnings
silenced:

>>> import warnings
>>> from tf_crossdevice import compat
>>> value = tf_crossdevice.testing.per_replica(
...     [tf.constant(1.0), tf.constant(3.0)])
>>> with warnings.catch_warnings():
...     warnings.simplefilter("ignore", DeprecationWarning)
...     ops = compat.ReductionToOneDeviceCrossTowerOps()
...     mean = ops.reduce(aggregation=tf.VariableAggregation.MEAN,
...                       per_device_value=value, destinations="/cpu:0")
>>> float(mean.get("/cpu:0")), mean.devices
(2.0, ('/job:localhost/replica:0/task:0/device:CPU:0',))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _names
from ._warnings import warn_once

# Legacy name -> (module of this package, attribute).
_WHERE: dict[str, tuple[str, str]] = {
    "CrossTowerOps": ("_ops", "CrossTowerOps"),
    "CrossDeviceOps": ("_ops", "CrossDeviceOps"),
    "ReductionToOneDeviceCrossTowerOps": (
        "_ops",
        "ReductionToOneDeviceCrossTowerOps",
    ),
    "ReductionToOneDevice": ("_ops", "ReductionToOneDevice"),
    "AllReduceCrossTowerOps": ("_ops", "AllReduceCrossTowerOps"),
    "NcclAllReduce": ("_ops", "NcclAllReduce"),
    "HierarchicalCopyAllReduce": ("_ops", "HierarchicalCopyAllReduce"),
    "MultiWorkerAllReduce": ("_ops", "MultiWorkerAllReduce"),
    "CollectiveAllReduce": ("_ops", "CollectiveAllReduce"),
    "AllReduceSpecTuple": ("_ops", "AllReduceSpecTuple"),
    "choose_the_best": ("_ops", "choose_the_best"),
    "CollectiveHints": ("_ops", "collective_hints"),
    "MirroredStrategy": ("_ops", "mirrored_strategy"),
    "ReduceOp": ("_ops", "ReduceOp"),
    "ConcatAndSplitPacker": ("_packers", "ConcatAndSplitPacker"),
    "AggregateSmallTensorPacker": ("_packers", "AggregateSmallTensorPacker"),
    "PerDevice": ("_values", "per_device"),
    "Mirrored": ("_values", "Mirrored"),
    "check_destinations": ("_values", "check_destinations"),
    "validate_destinations": ("_values", "validate_destinations"),
    "get_devices_from": ("_values", "get_devices_from"),
}
assert set(_WHERE) == set(_names.LEGACY), set(_WHERE) ^ set(_names.LEGACY)

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(
            f"module 'tf_crossdevice.compat' has no attribute {name!r}; its "
            f"legacy names are {', '.join(__all__)}"
        )
    module, attribute = _WHERE[name]
    value = getattr(importlib.import_module(f".{module}", __name__), attribute)
    # Python's warnings skip the import system's frames of
    # `from tf_crossdevice.compat import X`: the warning names that line.
    warn_once(name, _names.warning_text(name))
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if TYPE_CHECKING:  # Type checkers see the names without the warning.
    from ._ops import (  # noqa: F401
        AllReduceCrossTowerOps,
        AllReduceSpecTuple,
        CollectiveAllReduce,
        CrossDeviceOps,
        CrossTowerOps,
        HierarchicalCopyAllReduce,
        MultiWorkerAllReduce,
        NcclAllReduce,
        ReduceOp,
        ReductionToOneDevice,
        ReductionToOneDeviceCrossTowerOps,
        choose_the_best,
    )
    from ._ops import collective_hints as CollectiveHints  # noqa: F401, N812
    from ._ops import mirrored_strategy as MirroredStrategy  # noqa: F401, N812
    from ._packers import (  # noqa: F401
        AggregateSmallTensorPacker,
        ConcatAndSplitPacker,
    )
    from ._values import (  # noqa: F401
        Mirrored,
        check_destinations,
        get_devices_from,
        validate_destinations,
    )
    from ._values import per_device as PerDevice  # noqa: F401, N812
