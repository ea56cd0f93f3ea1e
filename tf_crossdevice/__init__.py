"""tf_crossdevice: TensorFlow 1's cross-device reductions for TensorFlow 2.

Pass the single-worker classes as `cross_device_ops=` to
`tf.distribute.MirroredStrategy`, and the collective classes to
`tf_crossdevice.MultiWorkerMirroredStrategy` on every worker.
"""

from tf_crossdevice import cost_model
from tf_crossdevice import testing
from tf_crossdevice._autotune import autotune
from tf_crossdevice._collective_ops import CollectiveAllReduce
from tf_crossdevice._hierarchical_collective_ops import (
    HierarchicalCollectiveAllReduce,
)
from tf_crossdevice._ops import AllReduceCrossDeviceOps
from tf_crossdevice._ops import HierarchicalCopyAllReduce
from tf_crossdevice._ops import NcclAllReduce
from tf_crossdevice._multi_worker_ops import MultiWorkerAllReduce
from tf_crossdevice._ops import ReductionToOneDevice
from tf_crossdevice._selection import select_cross_device_ops
from tf_crossdevice._spec_ops import SpecAllReduce
from tf_crossdevice.collective_runtime import (
    CollectiveCluster,
    enable_collectives,
    wait_for_peers,
)
from tf_crossdevice.strategy import MultiWorkerMirroredStrategy

__all__ = [
    "AllReduceCrossDeviceOps",
    "CollectiveAllReduce",
    "CollectiveCluster",
    "HierarchicalCollectiveAllReduce",
    "HierarchicalCopyAllReduce",
    "MultiWorkerAllReduce",
    "MultiWorkerMirroredStrategy",
    "NcclAllReduce",
    "ReductionToOneDevice",
    "SpecAllReduce",
    "autotune",
    "cost_model",
    "enable_collectives",
    "select_cross_device_ops",
    "testing",
    "wait_for_peers",
]

__version__ = "0.1.0"
