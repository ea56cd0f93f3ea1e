"""Starts TensorFlow gRPC worker servers on this machine, for tests and demos.

Each worker is a separate Python process running
`tf.distribute.Server(cluster_spec, job_name="worker", task_index=i)` with
its CPU split into `cpus_per_worker` devices. A client process connects with
`tf.config.experimental_connect_to_cluster(cluster.cluster_spec)` and places
ops with `tf.device(cluster.worker_devices()[k])`; a `tf.function` may span
workers. Connecting changes process-wide TensorFlow state, so do it in the
process that runs the multi-worker computation, not in a test runner shared
with other tests.

Workers always go away: `LocalCluster.stop()` runs on leaving a `with` block
(also on exceptions), each worker is stopped at interpreter exit, and every
worker exits by itself when the launching process dies (it watches a pipe
the parent holds and its parent's pid). Processes are started, watched and
stopped by `tf_crossdevice.cluster.processes`.

Caveat: TensorFlow's gRPC server listens on every interface (`0.0.0.0`,
hard-coded in TF 2.21's grpc_server_lib.cc) whatever `host` says; `host` is
the address written into the cluster spec, which clients dial. The server
runs any graph it is sent, without authentication, so start clusters only on
machines whose ports are not reachable by untrusted hosts.

Command line (prints the cluster spec as one JSON line, runs until SIGINT or
SIGTERM, then stops the workers and exits 0):

    python -m tf_crossdevice.cluster --num_workers=2 --cpus_per_worker=2
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types

import tensorflow as tf
from absl import flags, logging

from tf_crossdevice._core import checks
from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core.network import port_answers
from tf_crossdevice.cluster import _notices, _worker_main
from tf_crossdevice.cluster import hosts as _hosts
from tf_crossdevice.cluster import processes as _processes

_WORKER_MODULE = "tf_crossdevice.cluster._worker_main"
_MAX_START_ATTEMPTS = 3
_POLL_SECONDS = 0.05
_STDERR_TAIL_CHARS = 2000
_DEVICE_TYPES = ("CPU", "GPU")


class _PortTakenError(Exception):
    """A worker could not bind its port; the launch is retried elsewhere."""


@dataclasses.dataclass
class _Worker:
    task_index: int
    host: str
    port: int
    child: _processes.Child
    devices: dict[str, int] | None = None  # From the readiness reply.
    accepting: bool = False

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def stderr_tail(self) -> str:
        tail = self.child.stderr_text(_STDERR_TAIL_CHARS).strip()
        return tail or "<stderr empty>"


class LocalCluster:
    """TensorFlow worker servers running as child processes of this one.

    Create one with `start_local_cluster`, which waits until every worker
    serves; see its docstring for an example. Use it as a context manager or
    call `stop()`; the workers are also stopped at interpreter exit and die
    by themselves if this process dies.

    Attributes:
        cluster_spec: `tf.train.ClusterSpec` with one job (`job_name`) whose
            tasks are the workers' `host:port` addresses, in task order; on
            emulated hosts also the client's own job, "localhost", at an
            address on the hosts' bridge.
        num_workers: how many workers were started.
    """

    def __init__(
        self,
        job_name: str,
        workers: list[_Worker],
        client_address: str | None = None,
    ) -> None:
        """Takes ownership of started worker processes (internal).

        Args:
            job_name: the job the workers serve.
            workers: the processes, in task order.
            client_address: where the workers reach a connected client, if
                not where TensorFlow says by default (its own loopback).
        """
        self._job_name = job_name
        self._workers = workers
        self._client_address = client_address
        self._lock = threading.Lock()
        self._stopped = False

    @property
    def num_workers(self) -> int:
        return len(self._workers)

    @property
    def cluster_spec(self) -> tf.train.ClusterSpec:
        jobs = {self._job_name: self.addresses}
        if self._client_address is not None:
            # A connecting client is "localhost" at localhost:port unless
            # the spec names it: a worker on an emulated host would dial
            # its own loopback to pull a tensor from the client.
            jobs["localhost"] = [self._client_address]
        return tf.train.ClusterSpec(jobs)

    @property
    def addresses(self) -> list[str]:
        """The workers' `host:port` addresses, in task order."""
        return [w.address for w in self._workers]

    def cpu_seconds(self, task: int) -> float:
        """CPU seconds worker `task`'s process has used so far: on an
        emulated host, what that host's core share went to."""
        task = checks.index(task, "task", len(self._workers), "a task")
        return self._workers[task].child.cpu_seconds()

    @property
    def processes(self) -> list[subprocess.Popen[str]]:
        """The worker processes, in task order (read `returncode`, `pid`)."""
        return [w.child.process for w in self._workers]

    def worker_devices(self, device_type: str = "CPU") -> list[str]:
        """Returns the canonical names of the workers' devices of one type.

        Args:
            device_type: "CPU" (each worker has `cpus_per_worker`) or "GPU"
                (each worker sees every GPU of the machine; none on a
                CPU-only machine).

        Returns:
            Names like '/job:worker/replica:0/task:1/device:CPU:0', task by
            task, and within a task by device index.

        Raises:
            ValueError: `device_type` is not "CPU" or "GPU".
        """
        checks.one_of(device_type, "device_type", _DEVICE_TYPES)
        names = []
        for w in self._workers:
            assert w.devices is not None, "worker_devices before readiness"
            for k in range(w.devices.get(device_type, 0)):
                names.append(
                    f"/job:{self._job_name}/replica:0/task:{w.task_index}"
                    f"/device:{device_type}:{k}"
                )
        return names

    def kill_worker(self, task_index: int) -> None:
        """Kills one worker with SIGKILL and waits for it to exit.

        Meant for failure tests; the other workers keep running, and `stop()`
        still cleans up. Killing a worker that already exited does nothing.

        Args:
            task_index: which worker, 0 <= task_index < num_workers.

        Raises:
            ValueError: `task_index` is not a valid task index.
        """
        if not 0 <= checks.integer(task_index, "task_index") < self.num_workers:
            raise ValueError(
                f"task_index: expected an int in [0, {self.num_workers}), "
                f"got {task_index!r}"
            )
        self._workers[task_index].child.kill()

    def stop(self) -> None:
        """Stops every worker and frees its port; safe to call repeatedly.

        Closes each worker's stdin and sends SIGTERM to its process tree,
        waits up to 5 s, then sends SIGKILL, and reaps the processes:
        afterwards no worker process is left and every `returncode` is
        set. The preemption notices that SIGTERM recorded are removed.
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        _processes.stop_all([w.child for w in self._workers])
        for w in self._workers:
            _notices.clear_notice(self._job_name, w.task_index, w.port)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "running"
        return (
            f"LocalCluster(job_name={self._job_name!r}, "
            f"addresses={self.addresses!r}, {state})"
        )

    def _wait_until_ready(self, timeout_seconds: float) -> None:
        """Waits for every readiness line and open port.

        Raises:
            _PortTakenError: a worker could not bind its port.
            RuntimeError: a worker exited, or the timeout passed.
        """
        deadline = time.monotonic() + timeout_seconds
        while True:
            for w in self._workers:
                _check_worker(w)
            if all(w.accepting for w in self._workers):
                return
            if time.monotonic() > deadline:
                break
            time.sleep(_POLL_SECONDS)
        problems = []
        for w in self._workers:
            if w.accepting:
                continue
            what = (
                "sent no readiness reply"
                if w.devices is None
                else "port does not accept connections"
            )
            problems.append(
                f"task {w.task_index} ({w.address}) {what}; stderr tail:\n"
                f"{w.stderr_tail()}"
            )
        raise RuntimeError(
            f"local cluster not ready after {timeout_seconds} s:\n"
            + "\n".join(problems)
        )


def start_local_cluster(
    num_workers: int,
    cpus_per_worker: int = 1,
    host: str = "127.0.0.1",
    timeout_seconds: float = 60.0,
    job_name: str = "worker",
    hosts: _hosts.EmulatedHosts | None = None,
) -> LocalCluster:
    """Starts `num_workers` TensorFlow worker processes and waits for them.

    Workers start in parallel (each spends a few seconds importing
    TensorFlow). A worker counts as ready when it has replied that it serves
    and its port accepts TCP connections. Ports are picked free; when a
    worker finds its port taken in the meantime, the whole cluster is
    restarted on new ports (up to 3 attempts).

    Args:
        num_workers: how many workers, at least 1.
        cpus_per_worker: logical CPU devices per worker, at least 1.
        host: address written into the cluster spec, which clients dial (the
            servers themselves listen on all interfaces; see the module
            docstring).
        timeout_seconds: how long one attempt may wait for all workers.
        job_name: the job name in the cluster spec and device names.
        hosts: built `EmulatedHosts`, one per worker: worker i runs on host
            i and the cluster spec names the hosts' addresses (`host` is
            then unused).

    Returns:
        A running `LocalCluster`; stop it with `stop()` or a `with` block.

    Raises:
        ValueError: an argument has a bad type or value.
        RuntimeError: a worker exited early, was not ready in time, or no
            free ports could be bound; the message names the task and shows
            the tail of its stderr. Every started worker is stopped first.

    Example:

    >>> from tf_crossdevice.cluster import start_local_cluster
    >>> with start_local_cluster(2, cpus_per_worker=2) as cluster:
    ...     print(len(cluster.cluster_spec.as_dict()["worker"]))
    ...     for name in cluster.worker_devices("CPU"):
    ...         print(name)
    ...     cluster.kill_worker(1)
    ...     print(cluster.processes[1].returncode)
    2
    /job:worker/replica:0/task:0/device:CPU:0
    /job:worker/replica:0/task:0/device:CPU:1
    /job:worker/replica:0/task:1/device:CPU:0
    /job:worker/replica:0/task:1/device:CPU:1
    -9
    >>> [p.returncode is not None for p in cluster.processes]
    [True, True]
    """
    checks.positive_int(num_workers, "num_workers")
    checks.positive_int(cpus_per_worker, "cpus_per_worker")
    if not isinstance(host, str) or not host:
        raise ValueError(f"host: expected a non-empty string, got {host!r}")
    checks.positive_number(timeout_seconds, "timeout_seconds")
    if hosts is not None and len(hosts.hosts) != num_workers:
        raise ValueError(
            f"hosts: {len(hosts.hosts)} emulated hosts (built?) for "
            f"num_workers={num_workers}; expected one per worker"
        )
    if not devices_lib.is_job_name(job_name):
        raise ValueError(
            "job_name: expected a letter followed by letters, digits or _, "
            f"got {job_name!r}"
        )
    taken = []
    for _ in range(_MAX_START_ATTEMPTS):
        ports = _processes.free_ports(num_workers)
        cluster = _launch(host, ports, cpus_per_worker, job_name, hosts)
        try:
            cluster._wait_until_ready(timeout_seconds)
        except _PortTakenError as e:
            cluster.stop()
            taken.append(str(e))
            continue
        except BaseException:
            cluster.stop()
            raise
        return cluster
    raise RuntimeError(
        f"could not start {num_workers} workers on {host} in "
        f"{_MAX_START_ATTEMPTS} attempts, ports were taken each time:\n"
        + "\n".join(taken)
    )


def _launch(
    host: str,
    ports: list[int],
    cpus_per_worker: int,
    job_name: str,
    hosts: _hosts.EmulatedHosts | None,
) -> LocalCluster:
    """Starts one worker process per port; does not wait for them."""
    names = [host] * len(ports) if hosts is None else [
        h.address for h in hosts.hosts
    ]  # fmt: skip
    addresses = [
        f"[{h}]:{p}" if ":" in h else f"{h}:{p}"
        for h, p in zip(names, ports, strict=True)
    ]
    spec = json.dumps({job_name: addresses})
    workers: list[_Worker] = []
    # Owns the list from the start, so that a failed start stops the
    # workers already started.
    client = None
    if hosts is not None:
        client = f"{hosts.client_address}:{_processes.free_ports(1)[0]}"
    cluster = LocalCluster(job_name, workers, client)
    for task_index, port in enumerate(ports):
        command = _worker_command(spec, job_name, task_index, cpus_per_worker)
        if hosts is not None:
            command = hosts.command(task_index, command)
        try:
            child = _processes.Child(command, name=f"worker task {task_index}")
        except BaseException:
            cluster.stop()
            raise
        workers.append(_Worker(task_index, names[task_index], port, child))
    return cluster


def _worker_command(
    spec: str, job_name: str, task_index: int, cpus_per_worker: int
) -> list[str]:
    """The command line of one worker process."""
    return [
        sys.executable,
        "-m",
        _WORKER_MODULE,
        f"--cluster_spec={spec}",
        f"--job_name={job_name}",
        f"--task_index={task_index}",
        f"--cpus_per_worker={cpus_per_worker}",
    ]


def _check_worker(w: _Worker) -> None:
    """Updates `w`'s readiness; raises if it exited."""
    try:
        code = w.child.process.poll()
        if code is not None:
            raise _processes.ChildError("exited", code)
        if w.devices is None:
            ready = w.child.poll()
            if ready is not None:
                w.devices = ready["devices"]
    except _processes.ChildError as e:
        if e.returncode == _worker_main.EXIT_BIND_FAILED:
            raise _PortTakenError(
                f"task {w.task_index}: port {w.port} in use: {w.stderr_tail()}"
            ) from None
        how = (
            "closed its stdout"
            if e.returncode is None
            else f"exited with code {e.returncode}"
        )
        raise RuntimeError(
            f"worker task {w.task_index} ({w.address}) {how} before it was "
            f"ready; stderr tail:\n{w.stderr_tail()}"
        ) from None
    if w.devices is not None and not w.accepting:
        w.accepting = port_answers(w.address)


def _define_flags() -> None:
    flags.DEFINE_integer("num_workers", 2, "How many workers.", lower_bound=1)
    flags.DEFINE_integer(
        "cpus_per_worker", 1, "Logical CPU devices per worker.", lower_bound=1
    )
    flags.DEFINE_string("host", "127.0.0.1", "Address in the cluster spec.")
    flags.DEFINE_float(
        "timeout_seconds", 60.0, "How long to wait for the workers to start."
    )
    flags.DEFINE_float(
        "run_seconds",
        None,
        "Stop after this many seconds (default: run until SIGINT/SIGTERM).",
        lower_bound=0,
    )


class _StopSignalError(Exception):
    """SIGINT or SIGTERM arrived; unwinds the command line's main loop."""


def _request_stop(signum: int, frame: types.FrameType | None) -> None:
    # Later signals are ignored so that they cannot interrupt the teardown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _StopSignalError(signal.Signals(signum).name)


def _main(argv: list[str]) -> int:
    del argv
    FLAGS = flags.FLAGS  # noqa: N806
    signal.signal(signal.SIGINT, _request_stop)
    signal.signal(signal.SIGTERM, _request_stop)
    try:
        with start_local_cluster(
            FLAGS.num_workers,
            cpus_per_worker=FLAGS.cpus_per_worker,
            host=FLAGS.host,
            timeout_seconds=FLAGS.timeout_seconds,
        ) as cluster:
            print(json.dumps({"worker": cluster.addresses}), flush=True)
            print(
                f"Cluster running; stop it with Ctrl-C or "
                f"`kill -TERM {os.getpid()}`.",
                flush=True,
            )
            if FLAGS.run_seconds is None:
                while True:
                    time.sleep(3600)
            time.sleep(FLAGS.run_seconds)
    except _StopSignalError as e:
        logging.info("%s received; workers stopped", e)
    return 0
