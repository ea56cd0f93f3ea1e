"""The adapter every CrossDeviceOps class is, and the single-process classes.

`ReductionToOneDevice`, `AllReduceCrossDeviceOps`, `NcclAllReduce`,
`HierarchicalCopyAllReduce` and `SpecAllReduce` reduce within one process;
`MultiWorkerAllReduce` reduces in-graph, across workers.
`default_cross_device_ops` is the class that suits a list of devices, by
their links (a `LinkMatrix`; `dgx1_link_matrix`, `check_link_matrix`).

Every class is a `CrossDeviceOpsAdapter`: TensorFlow's CrossDeviceOps
hooks on a reducer, the one place where arguments are checked,
destinations resolved, MEAN divided and results routed. `InProcessReducer`
is the reducer of one process or one graph; `wire_of` reads any class's
`tf_crossdevice.compression.WirePolicy`.

Also public, for code that builds distributed values and destinations by
hand (the legacy layer `tf_crossdevice.compat` does):

- `PerReplica`, `Mirrored`: TensorFlow's value classes, whose own module is
  private to TensorFlow; the classes here take and return them.
- `resolve_destinations`: destinations as canonical device strings, by the
  rule every class here applies to its `destinations` argument.
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
