"""The single-process CrossDeviceOps classes and their shared boundary.

`_base` is what every class of the package shares (validation, the TF 2
hooks); `_single_host` holds ReductionToOneDevice, AllReduceCrossDeviceOps,
NcclAllReduce and HierarchicalCopyAllReduce; `_spec` SpecAllReduce;
`_multi_worker` MultiWorkerAllReduce (in-graph, across workers).

May import: `_core`, `compression`, `packing`, `algorithms`.
"""

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
    "MultiWorkerAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
    "SpecAllReduce",
]
