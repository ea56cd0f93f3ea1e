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

from typing import TYPE_CHECKING, Any

from . import _names, _ops, _packers, _values
from ._warnings import warn_once

# The modules of this package that `_names.Legacy.home` names.
_MODULES = {
    module.__name__.rpartition(".")[2]: module
    for module in (_ops, _packers, _values)
}

__all__ = sorted(_names.LEGACY)


def __getattr__(name: str) -> Any:
    if name not in _names.LEGACY:
        raise AttributeError(
            f"module 'tf_crossdevice.compat' has no attribute {name!r}; its "
            f"legacy names are {', '.join(__all__)}"
        )
    module, _, attribute = _names.LEGACY[name].home.partition(".")
    value = getattr(_MODULES[module], attribute)
    # Python's warnings skip the import system's frames of
    # `from tf_crossdevice.compat import X`: the warning names that line.
    warn_once(name, _names.warning_text(name))
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_names.LEGACY))


# For type checkers only: a name bound at run time would never reach
# `__getattr__`, so it would not warn. compat_test checks these imports
# against `_names.LEGACY`.
if TYPE_CHECKING:
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
