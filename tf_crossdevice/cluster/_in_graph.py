"""Reduce across worker processes from one client, on TF's runtime.

TensorFlow 2.21 refuses in-graph multi-worker `MirroredStrategy`: eagerly it
raises RuntimeError, and in a TF 1 graph it accepts only TensorFlow's own
`ReductionToOneDevice`. The supported path is this one: a
client process connects to the cluster, builds per-replica values on the
workers' devices inside a `tf.function`, and calls a CrossDeviceOps (for
example `MultiWorkerAllReduce`) there. TensorFlow places each op on its
worker and moves tensors over gRPC; nothing here is a transport of its own.

    cluster = tf.train.ClusterSpec({"worker": ["host1:2222", "host2:2222"]})
    replicas = WorkerReplicas(cluster, replicas_per_worker=2)
    ops = tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices, 0, "pscpu/pscpu#2")

    @tf.function
    def step():
        grads = replicas.per_replica(lambda i: compute_gradient(i))
        return [r.values for r in ops.batch_reduce("sum", [(grads, None)])]

    results = replicas.run(step, timeout_seconds=60)

Workers are `tf.distribute.Server`s started with the same cluster spec
(`tf_crossdevice.cluster` starts them on this machine).

Failures: when a worker process dies, the operating system closes its
sockets and the step's next RPC to it fails; `run` turns TensorFlow's error
into `WorkerUnreachableError` naming the worker and its address, as soon as
the connection breaks (no timeout is involved, even in the middle of a large
all-reduce). A worker that hangs without dying (or a host that vanishes
without closing connections) sends no error at all: `run(...,
timeout_seconds=T)` bounds that case, raising `tf.errors.DeadlineExceededError`
after T seconds. TensorFlow cannot cancel the stuck step, so after either
error the client's TensorFlow context is unusable: restart the client.
"""

from __future__ import annotations

import gc
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal
from tf_crossdevice._core.network import ports_answer
from tf_crossdevice.cluster import _notices

# These search TensorFlow's error text for the tasks it names; parsing a
# device argument is `tf_crossdevice._core.devices`'s job.
_WORKER_RE = re.compile(r"/job:([A-Za-z][\w]*)/replica:(\d+)/task:(\d+)")
# gRPC's own words for the peer that failed; other task names in a TF error
# are often just where the step's ops ran.
_REMOTE_TARGET_RE = re.compile(
    r"remote target /job:([A-Za-z][\w]*)/replica:(\d+)/task:(\d+)"
)
_CONNECTION_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
    tf.errors.InternalError,
)


# How long a failed step's workers are probed for one that died: a killed
# process keeps its ports open until it has freed its memory.
_SETTLE_SECONDS = 2.0


class WorkerUnreachableError(tf.errors.UnavailableError):
    """A step failed because a worker could not be reached."""

    def __init__(self, message: str, workers: Sequence[str] = ()):
        super().__init__(None, None, message)
        self.workers = tuple(workers)


class WorkerReplicas:
    """Replicas on the devices of a cluster's workers, driven by this client.

    Args:
        cluster_spec: a `tf.train.ClusterSpec` or the dict it is made from.
        replicas_per_worker: replicas (devices) used on each worker, >= 1.
        device_type: "CPU" or "GPU".
        job_name: the job whose tasks are the workers.
        connect: call `tf.config.experimental_connect_to_cluster` (once per
            process; it changes process-wide TensorFlow state) and check that
            every replica device exists.

    Raises:
        ValueError: bad arguments, a job missing from the spec, or (after
            connecting) a replica device the workers do not have.
        TypeError: arguments of the wrong type.
    """

    def __init__(
        self,
        cluster_spec: tf.train.ClusterSpec | dict,
        replicas_per_worker: int = 1,
        device_type: str = "CPU",
        job_name: str = "worker",
        connect: bool = True,
    ):
        if isinstance(cluster_spec, dict):
            cluster_spec = tf.train.ClusterSpec(cluster_spec)
        if not isinstance(cluster_spec, tf.train.ClusterSpec):
            raise TypeError(
                "cluster_spec: expected a tf.train.ClusterSpec or a dict "
                "such as {'worker': ['127.0.0.1:2222']}, got "
                f"{cluster_spec!r}"
            )
        if job_name not in cluster_spec.jobs:
            raise ValueError(
                f"job_name: {job_name!r} is not a job of the cluster spec; it "
                f"has {sorted(cluster_spec.jobs)}"
            )
        checks.positive_int(replicas_per_worker, "replicas_per_worker")
        checks.one_of(device_type, "device_type", ("CPU", "GPU"))
        self._cluster_spec = cluster_spec
        self._job_name = job_name
        self._addresses = list(cluster_spec.job_tasks(job_name))
        self._worker_devices = [
            f"/job:{job_name}/replica:0/task:{task}"
            for task in range(len(self._addresses))
        ]
        self._devices = [
            f"{worker}/device:{device_type}:{i}"
            for worker in self._worker_devices
            for i in range(replicas_per_worker)
        ]
        if connect:
            tf.config.experimental_connect_to_cluster(cluster_spec)
            self._check_devices_exist()

    @property
    def cluster_spec(self) -> tf.train.ClusterSpec:
        return self._cluster_spec

    @property
    def worker_devices(self) -> list[str]:
        """One '/job:J/replica:0/task:T' per worker, in task order."""
        return list(self._worker_devices)

    @property
    def devices(self) -> list[str]:
        """Every replica's device, worker by worker."""
        return list(self._devices)

    @property
    def num_replicas(self) -> int:
        return len(self._devices)

    @tf.autograph.experimental.do_not_convert
    def per_replica(self, fn: Callable[[int], Any]) -> Any:
        """A PerReplica of `fn(i)`, each built on replica i's device."""
        values = []
        for i, device in enumerate(self._devices):
            with tf.device(device):
                values.append(fn(i))
        return tf_internal.PerReplica(tuple(values))

    def run(
        self,
        fn: Callable[..., Any],
        *args: Any,
        timeout_seconds: float | None = None,
        **kwargs: Any,
    ) -> Any:
        """Calls `fn(*args, **kwargs)` (usually a tf.function step).

        Raises:
            WorkerUnreachableError: a worker could not be reached; the
                message names it and its address.
            tf.errors.DeadlineExceededError: `timeout_seconds` passed first.
        """
        if timeout_seconds is not None and not timeout_seconds > 0:
            raise ValueError(
                f"timeout_seconds: expected None or > 0, got {timeout_seconds}"
            )
        start = time.monotonic()
        if timeout_seconds is None:
            try:
                return fn(*args, **kwargs)
            except _CONNECTION_ERRORS as e:
                raise self._explain(e, time.monotonic() - start) from e
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = fn(*args, **kwargs)
            except BaseException as e:  # Re-raised in the caller's thread.
                outcome["error"] = e

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        thread.join(timeout_seconds)
        if thread.is_alive():
            dead = self._dead_workers()
            everyone = ", ".join(self._describe(range(len(self._addresses))))
            if dead:
                who = f"Unreachable: {', '.join(dead)}."
            else:
                who = f"All workers answer; one may hang: {everyone}."
            raise tf.errors.DeadlineExceededError(
                None,
                None,
                f"the step did not finish within {timeout_seconds} s "
                f"(timeout_seconds). {who} TensorFlow cannot cancel the "
                "step: restart this client.",
            )
        if "error" in outcome:
            error = outcome["error"]
            if isinstance(error, _CONNECTION_ERRORS):
                raise self._explain(error, time.monotonic() - start) from error
            raise error
        return outcome["value"]

    def release(self) -> None:
        """Frees what this client no longer references on the workers
        (functions, variables) and waits until every worker has freed it.

        Call it before the workers stop. TensorFlow tells each worker to
        free a collected function without waiting for the answer; a worker
        that stops first makes TensorFlow log an error line for each one.

        Raises:
            WorkerUnreachableError: a worker could not be reached.
        """
        gc.collect()  # Functions in reference cycles, the steps' usually.
        # One round trip to each worker: its answer comes behind the
        # release requests sent before it.
        for worker in self._worker_devices:
            with tf.device(f"{worker}/device:CPU:0"):
                self.run(lambda: tf.identity(0).numpy())

    def preempted_workers(self) -> list[str]:
        """The workers whose server has recorded a preemption notice (a
        SIGTERM to a server started by `tf_crossdevice.cluster` or the
        example job; see `_notices`), as '/job:worker/replica:0/task:1
        (host:port)'. Each worker looks for its own notice on its own host:
        one small op per worker.
        """
        found = []
        for task, address in enumerate(self._addresses):
            path = _notices.notice_path(
                self._job_name, task, _notices.port_of(address)
            )
            with tf.device(f"{self._worker_devices[task]}/device:CPU:0"):
                matches = tf.io.matching_files(path)
            if matches.shape[0]:
                found.append(task)
        return self._describe(found)

    def _describe(self, tasks: Iterable[int]) -> list[str]:
        return [
            f"{self._worker_devices[t]} ({self._addresses[t]})" for t in tasks
        ]

    def _dead_workers(self) -> list[str]:
        return self._describe(self._refusing_tasks(settle=False))

    def _refusing_tasks(self, settle: bool) -> list[int]:
        """The tasks whose port refuses connections (or does not answer).

        A worker killed a moment ago still accepts connections while its
        process exits (the kernel closes its sockets only after freeing
        its memory), and its peers' connections may already have failed
        the step. With `settle`, ports that all answer are asked again for
        up to _SETTLE_SECONDS, so that the dead worker, not every worker
        the error text names, is the one reported.
        """
        deadline = time.monotonic() + (_SETTLE_SECONDS if settle else 0)
        while True:
            answers = ports_answer(self._addresses)
            dead = [t for t, ok in enumerate(answers) if not ok]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.1)

    def _explain(self, error: Exception, elapsed: float) -> Exception:
        text = str(error)
        named = self._tasks_in(_REMOTE_TARGET_RE, text) or (
            self._tasks_in(_WORKER_RE, text)
            | {t for t, a in enumerate(self._addresses) if a in text}
        )
        dead = self._refusing_tasks(
            settle=isinstance(error, _CONNECTION_ERRORS)
        )
        if not dead and not isinstance(error, tf.errors.UnavailableError):
            return error  # A healthy worker's op failed: TF's error says why.
        culprits = sorted(set(dead) or named)
        if not culprits:
            return error
        first_line = text.strip().splitlines()[0] if text.strip() else ""
        detail = next(
            (
                line.strip()
                for line in text.splitlines()
                if "UNAVAILABLE" in line
            ),
            first_line,
        )
        return WorkerUnreachableError(
            f"worker {', '.join(self._describe(culprits))} is unreachable"
            f"{' (its port refuses connections)' if dead else ''}; the step "
            f"failed after {elapsed:.1f} s: {detail}",
            [self._worker_devices[t] for t in culprits],
        )

    def _tasks_in(self, pattern: re.Pattern[str], text: str) -> set[int]:
        return {
            int(m.group(3))
            for m in pattern.finditer(text)
            if m.group(1) == self._job_name
        }

    def _check_devices_exist(self) -> None:
        known = {
            tf_internal.canonicalize_device(d.name)
            for d in tf.config.list_logical_devices()
        }
        missing = [
            d
            for d in self._devices
            if tf_internal.canonicalize_device(d) not in known
        ]
        if missing:
            raise ValueError(
                f"replicas_per_worker: the workers lack {', '.join(missing)}; "
                "start each worker with enough logical devices (e.g. "
                "tf_crossdevice.cluster cpus_per_worker)"
            )
