"""Between-graph reductions on TensorFlow's collective ops, and our strategy.

`_runtime` turns collectives on between processes; `_group` is one
collective group and the ops its members launch; `_reducer` the reducer
both classes are built on (binding, options, groups, traced functions,
gather), with a step that sums: `_all_reduce` CollectiveAllReduce and its
flat step, `_hierarchical` HierarchicalCollectiveAllReduce and its
hierarchical step; `_sparse` IndexedSlices through collectives;
`_launch_order` the order of a step's collectives; `_strategy`
MultiWorkerMirroredStrategy, `_default` the collective it picks when given
none;
`_peers` names the peers a failed collective cannot reach; `_stall`
reports the slow or unreachable peers of a step that waits too long.

May import: `_core`, `compression`, `packing`, `algorithms`, `ops`.
"""

from tf_crossdevice.collective._all_reduce import CollectiveAllReduce
from tf_crossdevice.collective._hierarchical import (
    HierarchicalCollectiveAllReduce,
)
from tf_crossdevice.collective._peers import reporting_unreachable_peers
from tf_crossdevice.collective._runtime import (
    CollectiveCluster,
    enable_collectives,
    wait_for_peers,
)
from tf_crossdevice.collective._strategy import MultiWorkerMirroredStrategy

__all__ = [
    "CollectiveAllReduce",
    "CollectiveCluster",
    "HierarchicalCollectiveAllReduce",
    "MultiWorkerMirroredStrategy",
    "enable_collectives",
    "reporting_unreachable_peers",
    "wait_for_peers",
]
