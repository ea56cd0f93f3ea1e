"""The adapter every CrossDeviceOps class is, and the single-process classes.

`_adapter` is `CrossDeviceOpsAdapter`: TensorFlow's CrossDeviceOps hooks on
a reducer (`_core.reducer`), the one place where arguments are checked,
destinations resolved, MEAN divided and results routed. `_in_process` is
the reducer of one process or one graph. `_single_host` holds
ReductionToOneDevice, AllReduceCrossDeviceOps, NcclAllReduce and
HierarchicalCopyAllReduce; `_spec` SpecAllReduce; `_multi_worker`
MultiWorkerAllReduce (in-graph, across workers); `_default` the class that
suits a list of devices, by their links (`_links`).

Also public, for code that builds distributed values and destinations by
hand (the legacy layer `tf_crossdevice.compat` does):

- `PerReplica`, `Mirrored`: TensorFlow's value classes, whose own module is
  private to TensorFlow; the classes here take and return them.
- `resolve_destinations`: destinations as canonical device strings, by the
  rule every class here applies to its `destinations` argument.

May import: `_core`, `compression`, `packing`, `algorithms`.
"""

from tf_crossdevice._core.tf_internal import Mirrored, PerReplica
from tf_crossdevice._core.values import resolve_destinations
from tf_crossdevice.ops._adapter import CrossDeviceOpsAdapter, wire_of
from tf_crossdevice.ops._default import default_cross_device_ops
from tf_crossdevice.ops._in_process import InProcessReducer
from tf_crossdevice.ops._links import (
    LinkMatrix,
    check_link_matrix,
    dgx1_link_matrix,
)
from tf_crossdevice.ops._multi_worker import MultiWorkerAllReduce
from tf_crossdevice.ops._single_host import (
    AllReduceCrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from tf_crossdevice.ops._spec import SpecAllReduce

__all__ = [
    "AllReduceCrossDeviceOps",
    "CrossDeviceOpsAdapter",
    "InProcessReducer",
    "LinkMatrix",
    "HierarchicalCopyAllReduce",
    "Mirrored",
    "MultiWorkerAllReduce",
    "NcclAllReduce",
    "PerReplica",
    "ReductionToOneDevice",
    "SpecAllReduce",
    "check_link_matrix",
    "default_cross_device_ops",
    "dgx1_link_matrix",
    "resolve_destinations",
    "wire_of",
]
