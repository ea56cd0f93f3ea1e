"""Between-graph reductions on TensorFlow's collective ops, and our strategy.

`CollectiveAllReduce` sums every replica's value in one collective group;
`HierarchicalCollectiveAllReduce` reduces locally, runs one collective per
worker and copies the sums back to the local devices.
`MultiWorkerMirroredStrategy` is our between-graph strategy (given no
`cross_device_ops`, it picks one of the two), and `CollectiveCluster` is
this process's place in its cluster. `enable_collectives` starts this
task's gRPC server and lets it run collective ops, `wait_for_peers`
returns once every peer's server answers, and `reporting_unreachable_peers`
names the peers a failed collective cannot reach and reports a step that
waits too long.
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
