"""tf_crossdevice: TensorFlow 1's cross-device reductions for TensorFlow 2.

Pass any of these as `cross_device_ops=` to `tf.distribute.MirroredStrategy`.
"""

from tf_crossdevice import testing
from tf_crossdevice._ops import AllReduceCrossDeviceOps
from tf_crossdevice._ops import HierarchicalCopyAllReduce
from tf_crossdevice._ops import NcclAllReduce
from tf_crossdevice._multi_worker_ops import MultiWorkerAllReduce
from tf_crossdevice._ops import ReductionToOneDevice
from tf_crossdevice._selection import select_cross_device_ops
from tf_crossdevice._spec_ops import SpecAllReduce

__all__ = [
    "AllReduceCrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "MultiWorkerAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
    "SpecAllReduce",
    "select_cross_device_ops",
    "testing",
]

__version__ = "0.1.0"
