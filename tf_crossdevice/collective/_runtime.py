"""Turns on TensorFlow's collective ops between this process and its peers.

Between-graph training runs the same program in every worker process; the
processes meet in collective ops (all-reduce, all-gather, broadcast), which
TensorFlow's distributed runtime carries over gRPC. `enable_collectives`
does what TensorFlow's MultiWorkerMirroredStrategy constructor does for
that (the collective leader, a device filter that keeps this worker's graph
to its own devices, the gRPC server), with the same arguments, and nothing
else: no coordination service, whose registration barrier has no timeout
(TF 2.21's strategy blocks in its constructor for good, and ignores
SIGTERM, when a peer never starts). `wait_for_peers` is the bounded
replacement: it asks each peer's server whether it is up, and names those
that are not.

    cluster = tf_crossdevice.enable_collectives()  # reads TF_CONFIG
    tf_crossdevice.wait_for_peers(cluster, timeout_seconds=60)
    print(cluster.num_workers, cluster.task_id)  # e.g. 2 0

`tf_crossdevice.MultiWorkerMirroredStrategy` calls both; a custom program
that launches collectives itself may call them directly.
"""

from __future__ import annotations

import dataclasses
import time

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import checks, reprs, tf_internal
from tf_crossdevice._core import devices as devices_lib

_PEER_POLL_SECONDS = 0.2
_PEER_PROBE_MS = 1000
_WAITING_LOG_SECONDS = 30.0


# repr=False: ConstructorRepr writes the cluster spec as the tf. call.
@dataclasses.dataclass(frozen=True, repr=False)
class CollectiveCluster(reprs.ConstructorRepr):
    """This process's place in a collective cluster.

    >>> spec = tf.train.ClusterSpec(
    ...     {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]})
    >>> cluster = tf_crossdevice.CollectiveCluster(spec, "worker", 1, 2)
    >>> cluster.peers, cluster.address(cluster.peers[0])
    (['/job:worker/replica:0/task:0'], '127.0.0.1:2222')

    Attributes:
        cluster_spec: the normalized cluster (None for a single process
            without one).
        task_type: this task's job ("worker" or "chief").
        task_id: this task's index in its job.
        num_workers: the tasks that train: every "chief" and "worker" task.
    """

    cluster_spec: tf.train.ClusterSpec | None
    task_type: str
    task_id: int
    num_workers: int

    @property
    def worker_device(self) -> str:
        """This task's device prefix, e.g. '/job:worker/replica:0/task:1'."""
        if self.cluster_spec is None:
            return "/job:localhost/replica:0/task:0"
        return f"/job:{self.task_type}/replica:0/task:{self.task_id}"

    @property
    def tasks(self) -> list[str]:
        """Every training task, chief first: '/job:worker/replica:0/task:0'."""
        if self.cluster_spec is None:
            return [self.worker_device]
        return [
            f"/job:{job}/replica:0/task:{i}"
            for job in ("chief", "worker")
            if job in self.cluster_spec.jobs
            for i in range(self.cluster_spec.num_tasks(job))
        ]

    @property
    def peers(self) -> list[str]:
        """`tasks` but this one."""
        return [t for t in self.tasks if t != self.worker_device]

    def address(self, task: str) -> str:
        """host:port of `task` ('/job:worker/replica:0/task:1')."""
        if self.cluster_spec is None:
            return "this process"
        name = devices_lib.parse_device(task)
        return self.cluster_spec.task_address(name.job, name.task or 0)


# The cluster this process enabled collectives for: they can be enabled once
# per process, so a second call must describe the same cluster.
_enabled: CollectiveCluster | None = None


def enabled_cluster() -> CollectiveCluster | None:
    """What `enable_collectives` set up in this process, if it ran."""
    return _enabled


def enable_collectives(
    cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver
    | None = None,
) -> CollectiveCluster:
    """Starts this task's gRPC server and lets it run collective ops.

    Call it once per process, before any other TensorFlow op runs (like
    TensorFlow's strategy constructors); later calls with the same cluster
    return the same answer.

    Args:
        cluster_resolver: the cluster and this task's place in it; None reads
            the `TF_CONFIG` environment variable
            (`tf.distribute.cluster_resolver.TFConfigClusterResolver`). A
            resolver without a cluster spec means a single process: nothing is
            started and collectives run between this process's devices.

    >>> resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    ...     tf.train.ClusterSpec({}))  # no cluster: this process alone
    >>> tf_crossdevice.enable_collectives(resolver).num_workers
    1

    Returns:
        The CollectiveCluster.

    Raises:
        TypeError: `cluster_resolver` is not a ClusterResolver.
        ValueError: the cluster has no worker or chief task, this task is not
            one of them, or collectives were already enabled for another
            cluster.
    """
    global _enabled
    if cluster_resolver is None:
        cluster_resolver = (
            tf.distribute.cluster_resolver.TFConfigClusterResolver()
        )
    if not isinstance(
        cluster_resolver, tf.distribute.cluster_resolver.ClusterResolver
    ):
        raise TypeError(
            "cluster_resolver: expected None or a "
            "tf.distribute.cluster_resolver.ClusterResolver, got "
            f"{type(cluster_resolver).__name__} {cluster_resolver!r}"
        )
    cluster = describe_cluster(cluster_resolver)
    if _enabled is not None:
        if _enabled != cluster:
            raise ValueError(
                "cluster_resolver: collective ops are already enabled in this "
                f"process for {_enabled}; TensorFlow can enable them once per "
                f"process, so {cluster} needs a new process"
            )
        return cluster
    context = tf_internal.eager_context()
    if cluster.cluster_spec is None:
        _enabled = cluster
        return cluster
    util = tf_internal.multi_worker_util()
    context.configure_collective_ops(
        collective_leader=util.collective_leader(
            cluster.cluster_spec, cluster.task_type, cluster.task_id
        ),
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{cluster.task_type}/task:{cluster.task_id}",),
    )
    context.enable_collective_ops(
        tf_internal.server_def(
            cluster.cluster_spec,
            cluster.task_type,
            cluster.task_id,
            cluster_resolver.rpc_layer or "grpc",
            getattr(cluster_resolver, "port", 0) or 0,
        )
    )
    context.ensure_initialized()
    _enabled = cluster
    logging.info(
        "tf_crossdevice: collective ops enabled for %s (%d workers)",
        cluster.worker_device,
        cluster.num_workers,
    )
    return cluster


def describe_cluster(
    cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver,
) -> CollectiveCluster:
    """The CollectiveCluster a resolver describes; validates it."""
    spec = cluster_resolver.cluster_spec()
    if not spec.as_dict():
        return CollectiveCluster(None, "worker", 0, 1)
    util = tf_internal.multi_worker_util()
    spec = util.normalize_cluster_spec(spec)
    task_type, task_id = cluster_resolver.task_type, cluster_resolver.task_id
    if task_type not in ("chief", "worker"):
        raise ValueError(
            "cluster_resolver: this task's type must be 'chief' or 'worker' "
            f"(TF_CONFIG's task.type), got {task_type!r}"
        )
    if task_type not in spec.jobs:
        raise ValueError(
            f"cluster_resolver: the cluster {spec.as_dict()} has no "
            f"{task_type!r} job for this task"
        )
    task_id = checks.integer(task_id, "cluster_resolver.task_id", minimum=0)
    if task_id >= spec.num_tasks(task_type):
        raise ValueError(
            f"cluster_resolver.task_id: {task_id} is not a task of job "
            f"{task_type!r}, which has {spec.num_tasks(task_type)}"
        )
    num_workers = util.worker_count(spec, task_type)
    return CollectiveCluster(spec, task_type, task_id, num_workers)


def wait_for_peers(
    cluster: CollectiveCluster, timeout_seconds: float | None = None
) -> None:
    """Returns once every peer's server answers; raises if one does not.

    Each peer is asked through TensorFlow's collective peer-health check,
    which fails fast while the peer's server is not up. Without a timeout it
    waits as long as it takes, logging every 30 s which peers it waits for
    (and a SIGTERM or Ctrl-C ends it, unlike TensorFlow's registration
    barrier).

    >>> alone = tf_crossdevice.CollectiveCluster(None, "worker", 0, 1)
    >>> tf_crossdevice.wait_for_peers(alone, timeout_seconds=1)  # no peers

    Raises:
        tf.errors.DeadlineExceededError: a peer did not answer within
            `timeout_seconds`; the message names it and its address.
    """
    if timeout_seconds is not None:
        checks.positive_number(timeout_seconds, "timeout_seconds")
    context = tf_internal.eager_context()
    start = time.monotonic()
    waiting = list(cluster.peers)
    last_log = start
    while waiting:
        for task in list(waiting):
            try:
                context.check_collective_ops_peer_health(task, _PEER_PROBE_MS)
                waiting.remove(task)
            except (
                tf.errors.UnavailableError,
                tf.errors.DeadlineExceededError,
            ):
                pass
        if not waiting:
            return
        now = time.monotonic()
        missing = ", ".join(f"{t} ({cluster.address(t)})" for t in waiting)
        if timeout_seconds is not None and now - start >= timeout_seconds:
            raise tf.errors.DeadlineExceededError(
                None,
                None,
                f"{cluster.worker_device}: worker(s) {missing} did not start "
                f"within timeout_seconds={timeout_seconds:g} s; start every "
                "task of the cluster (same TF_CONFIG cluster, its own task "
                "index), or raise timeout_seconds",
            )
        if now - last_log >= _WAITING_LOG_SECONDS:
            logging.info(
                "tf_crossdevice: %s still waiting for %s after %.0f s",
                cluster.worker_device,
                missing,
                now - start,
            )
            last_log = now
        time.sleep(_PEER_POLL_SECONDS)
