"""tf_crossdevice: TensorFlow 1's cross-device reductions for TensorFlow 2.

Pass the single-worker classes as `cross_device_ops=` to
`tf.distribute.MirroredStrategy`, and the collective classes to
`tf_crossdevice.MultiWorkerMirroredStrategy` on every worker.

The subpackages: `ops` (the single-process classes), `collective` (the
between-graph classes and the strategy), `tuning` (measuring, autotune,
cost model, selection), `training` (gradient accumulation: one all-reduce
per `k` micro-batches; preemption; a step's timeline), `cluster` (worker
processes on this machine), and what the classes are built from:
`algorithms`, `packing` and `compression`. `testing` gives tests and
examples several devices on one host, `launch` starts a job's workers on
this machine, and `compat` holds the legacy names.
"""

from tf_crossdevice._core import requirements as _requirements

__version__ = _requirements.__version__

# Before any module imports TensorFlow, so that a missing or wrong one fails
# here, saying what to install.
_requirements.require_tensorflow()

from tf_crossdevice import testing  # noqa: E402
from tf_crossdevice.collective import CollectiveAllReduce  # noqa: E402
from tf_crossdevice.collective import CollectiveCluster  # noqa: E402
from tf_crossdevice.collective import (  # noqa: E402
    HierarchicalCollectiveAllReduce,
)
from tf_crossdevice.collective import MultiWorkerMirroredStrategy  # noqa: E402
from tf_crossdevice.collective import enable_collectives  # noqa: E402
from tf_crossdevice.collective import (  # noqa: E402
    reporting_unreachable_peers,
)
from tf_crossdevice.collective import wait_for_peers  # noqa: E402
from tf_crossdevice.ops import AllReduceCrossDeviceOps  # noqa: E402
from tf_crossdevice.ops import HierarchicalCopyAllReduce  # noqa: E402
from tf_crossdevice.ops import MultiWorkerAllReduce  # noqa: E402
from tf_crossdevice.ops import NcclAllReduce  # noqa: E402
from tf_crossdevice.ops import ReductionToOneDevice  # noqa: E402
from tf_crossdevice.ops import SpecAllReduce  # noqa: E402
from tf_crossdevice.training import GradientAccumulator  # noqa: E402
from tf_crossdevice.tuning import autotune  # noqa: E402
from tf_crossdevice.tuning import cost_model  # noqa: E402
from tf_crossdevice.tuning import select_cross_device_ops  # noqa: E402

__all__ = [
    "AllReduceCrossDeviceOps",
    "CollectiveAllReduce",
    "CollectiveCluster",
    "GradientAccumulator",
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
    "reporting_unreachable_peers",
    "select_cross_device_ops",
    "testing",
    "wait_for_peers",
]
