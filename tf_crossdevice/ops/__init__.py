"""The single-process CrossDeviceOps classes and their shared boundary.

`_base` is what every class of the package shares (validation, the TF 2
hooks); `_single_host` holds ReductionToOneDevice, AllReduceCrossDeviceOps,
NcclAllReduce and HierarchicalCopyAllReduce; `_spec` SpecAllReduce;
`_multi_worker` MultiWorkerAllReduce (in-graph, across workers); `_default`
the class that suits a list of devices, by their links (`_links`). The
all-reduce classes validate their packing arguments and pack, all-reduce and
unpack with `packing._packed_all_reduce`, handing it their algorithm as a
callable.

Also public, for code that builds distributed values and destinations by
hand (the legacy layer `tf_crossdevice.compat` does):

- `PerReplica`, `Mirrored`: TensorFlow's value classes, whose own module is
  private to TensorFlow; the classes here take and return them.
- `resolve_destinations`: destinations as canonical device strings, by the
  rule every class here applies to its `destinations` argument.

May import: `_core`, `compression`, `packing`, `algorithms`.
"""

from tf_crossdevice._core.tf_internal import Mirrored, PerReplica
from tf_crossdevice.ops._base import resolve_destinations
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
    "HierarchicalCopyAllReduce",
    "Mirrored",
    "MultiWorkerAllReduce",
    "NcclAllReduce",
    "PerReplica",
    "ReductionToOneDevice",
    "SpecAllReduce",
    "resolve_destinations",
]
