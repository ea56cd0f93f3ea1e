"""TensorFlow worker processes on this machine, and clients that drive them.

`start_local_cluster` starts gRPC worker servers as child processes (a
`LocalCluster`); `WorkerReplicas` drives replicas on remote workers from
one client, and a step that cannot reach a worker raises
`WorkerUnreachableError`; `serve` runs a worker server whose SIGTERM
becomes a preemption notice for that client. `processes` starts, watches
and stops every child process of the package (workers, local jobs, the
benchmark's sides, test clients); `hosts` builds emulated hosts (network
namespaces on shaped links). `heartbeat` tells a launcher that watches
for stalls that this worker makes progress (`end_heartbeats`: no more
steps); `HeartbeatWatch` is that watch, and `read_progress` what a
worker's heartbeat file says (a `Progress`: its step and collective).
The launcher's command line is `tf_crossdevice.launch`. On several
machines, `run_host_agent` is one host's launcher: the hosts meet in
rounds on an etcd server.
"""

from tf_crossdevice._core.heartbeat import (
    HEARTBEAT_VARIABLE,
    Progress,
    end_heartbeats,
    heartbeat,
    read_progress,
)
from tf_crossdevice.cluster import hosts, processes
from tf_crossdevice.cluster._agent import run_host_agent
from tf_crossdevice.cluster._in_graph import (
    WorkerReplicas,
    WorkerUnreachableError,
)
from tf_crossdevice.cluster._local import LocalCluster, start_local_cluster
from tf_crossdevice.cluster._notices import serve
from tf_crossdevice.cluster._stall_watch import HeartbeatWatch

__all__ = [
    "HEARTBEAT_VARIABLE",
    "HeartbeatWatch",
    "LocalCluster",
    "Progress",
    "WorkerReplicas",
    "WorkerUnreachableError",
    "end_heartbeats",
    "heartbeat",
    "hosts",
    "processes",
    "read_progress",
    "run_host_agent",
    "serve",
    "start_local_cluster",
]
