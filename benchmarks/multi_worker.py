"""Times all-reduces across local worker processes, ours against MWMS.

Two sets of processes hold the same replicas' values (replica i = worker
task i, one CPU replica per worker):

- ours: `tf_crossdevice.cluster` worker servers, driven by one client
  process (`--role=client` below) that connects to them and runs
  `MultiWorkerAllReduce` (and TensorFlow's `ReductionToOneDevice`) inside a
  `tf.function` spanning the workers;
- TensorFlow's: p processes (`--role=mwms`), each with `TF_CONFIG`, running
  `MultiWorkerMirroredStrategy`'s collective all-reduce between-graph.

The benchmark process drives both over pipes, one JSON line per command, so
their measurements interleave round by round. It also times TCP loopback
itself, and the client times TensorFlow's gRPC copy between two workers:
the roofline is the time a ring needs to move 2(p-1)/p of the bytes at the
faster of the two rates. Every child process exits when its stdin closes or
its parent dies; the benchmark kills their process groups when it is done.

Child command line (internal): `python -m benchmarks.multi_worker
--role=client|mwms --parent_pid=PID`, a setup JSON line on stdin, then one
command per line.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import candidates as candidates_lib
from benchmarks import (
    records,
    roofline,
    steps,
    processes,
    timing,
)
from benchmarks import workloads as workloads_lib

_MODULE = "benchmarks.multi_worker"
ChildError = processes.ChildError

INPUTS_BASELINE = "baseline: inputs only (client)"
IDLE_BASELINE = "baseline: two workers, no transfer (client)"
MWMS_BASELINE = "baseline: inputs only (MWMS)"
ROOFLINE_GRPC = "roofline: TF gRPC copy worker 0 -> 1"
ROOFLINE_TCP = "roofline: TCP loopback"
# The multi-worker target compares against this one; the confirmation
# rounds re-time it with the best of each family (records.finalists).
TARGET_REFERENCES = ("TF MWMS default",)
# Best ours, TF's and roofline, the reference, three baselines.
MAX_FINALISTS = 8


# ---- The benchmark process's side ------------------------------------------


class _Group:
    """Children that get every command; each answers once per command."""

    def __init__(self, name: str, children: list[processes.Child]):
        self.name = name
        self.children = children
        self.dead: str | None = None

    def request(
        self, message: dict[str, Any], timeout: float
    ) -> list[dict[str, Any]]:
        """Sends `message` to every child and returns their answers.

        Raises:
            ChildError: a child failed or was too slow (the group is
                stopped and every later request fails at once), or
                answered with an error.
        """
        if self.dead is not None:
            raise ChildError(f"{self.name} was stopped earlier: {self.dead}")
        try:
            for child in self.children:
                child.send(message)
            answers = [child.receive(timeout) for child in self.children]
        except ChildError as e:
            self.dead = timing.first_line(str(e), 200)
            self.stop()
            raise
        errors = [a["error"] for a in answers if a.get("error")]
        if errors:
            raise ChildError(errors[0])
        return answers

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def _child_argv(role: str) -> list[str]:
    return processes.module_argv(_MODULE, f"--role={role}")


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now.

    >>> len(set(free_ports(3)))
    3
    """
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)  # Held until all are picked: distinct.
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@contextlib.contextmanager
def _started(group: _Group, setup: dict[str, Any], timeout: float):
    """Sends the setup line, waits for every child's readiness, stops later."""
    try:
        group.request(setup, timeout)
        yield group
    finally:
        group.stop()


def _start_client(cluster_spec: dict[str, Any], setup: dict[str, Any]):
    child = processes.Child(
        "client", _child_argv("client"), processes.child_env({})
    )
    return _Group("our client", [child]), {**setup, "cluster": cluster_spec}


def _start_mwms(num_workers: int, setup: dict[str, Any]):
    addresses = [f"127.0.0.1:{p}" for p in free_ports(num_workers)]
    children = []
    for task in range(num_workers):
        tf_config = {
            "cluster": {"worker": addresses},
            "task": {"type": "worker", "index": task},
        }
        env = processes.child_env({"TF_CONFIG": json.dumps(tf_config)})
        env.pop("TF_GRPC_REUSE_PORT", None)
        children.append(
            processes.Child(f"MWMS task {task}", _child_argv("mwms"), env)
        )
    return _Group("MWMS", children), setup


def units(num_candidates: int, rounds: int) -> int:
    """Progress units one workload reports (plus the fixed entries).

    >>> units(3, 5)
    88
    """
    return (num_candidates + 5) * (1 + rounds) + MAX_FINALISTS * rounds


def run(
    workloads: Sequence[workloads_lib.Workload],
    num_workers: int,
    config: Any,
    quick: bool,
    timeout_seconds: float = 300.0,
    advance: Callable[[int], object] = lambda n: None,
    describe: Callable[[str], object] = lambda s: None,
    candidate_filter: Callable[[list[Any]], list[Any]] = lambda c: c,
) -> list[dict[str, Any]]:
    """Verifies and times the multi-worker candidates on every workload.

    Args:
        workloads: what each worker holds, one group each.
        num_workers: worker processes (p >= 2).
        config: a `single_process.Config` (rounds, timing targets, seed).
        quick: the small candidate set.
        timeout_seconds: the longest any one command may take.
        advance: progress callback (see `single_process.run`).
        describe: status callback.
        candidate_filter: narrows each workload's candidate list.

    Returns:
        One group record per workload.

    Raises:
        ChildError: the processes could not be started.

    Example (starts 2p + 1 processes; tests/benchmark_test.py runs it):

    >>> from benchmarks import single_process, workloads
    >>> groups = run([workloads.many_small(8)], 2,  # doctest: +SKIP
    ...              single_process.Config(rounds=5), quick=True)
    """
    from tf_crossdevice import cluster as cluster_lib

    setup = {"seed": config.seed, "warmup": config.warmup}
    describe(f"x{num_workers} workers: starting processes")
    with contextlib.ExitStack() as stack:
        local = stack.enter_context(
            cluster_lib.start_local_cluster(num_workers, cpus_per_worker=1)
        )
        client, client_setup = _start_client(
            local.cluster_spec.as_dict(), setup
        )
        stack.enter_context(_started(client, client_setup, timeout_seconds))
        mwms, mwms_setup = _start_mwms(num_workers, setup)
        stack.enter_context(_started(mwms, mwms_setup, timeout_seconds))
        return [
            _run_workload(
                w,
                num_workers,
                client,
                mwms,
                config,
                quick,
                timeout_seconds,
                advance,
                describe,
                candidate_filter,
            )
            for w in workloads
        ]


def _run_workload(
    workload: workloads_lib.Workload,
    p: int,
    client: _Group,
    mwms: _Group,
    config: Any,
    quick: bool,
    timeout: float,
    advance: Callable[[int], object],
    describe: Callable[[str], object],
    candidate_filter: Callable[[list[Any]], list[Any]],
) -> dict[str, Any]:
    label = f"{workload.name} x{p} workers"
    entries: list[dict[str, Any]] = [
        {"name": INPUTS_BASELINE, "family": "baseline", "baseline": None},
        {"name": IDLE_BASELINE, "family": "baseline", "baseline": None},
        {"name": MWMS_BASELINE, "family": "baseline", "baseline": None},
        {
            "name": ROOFLINE_GRPC,
            "family": "roofline",
            "baseline": IDLE_BASELINE,
        },
        {"name": ROOFLINE_TCP, "family": "roofline", "baseline": None},
    ]
    for c in candidate_filter(
        candidates_lib.multi_worker_candidates(workload, quick)
    ):
        entries.append(
            {
                "name": c.name,
                "family": c.family,
                "baseline": MWMS_BASELINE
                if c.kind == "mwms"
                else INPUTS_BASELINE,
                "candidate": c.as_dict(),
            }
        )
    load = {
        "cmd": "load",
        "name": workload.name,
        "shapes": [list(s) for s in workload.shapes],
    }
    loaded: dict[str, str | None] = {}
    for group in (client, mwms):
        try:
            group.request(load, timeout)
            loaded[group.name] = None
        except ChildError as e:
            loaded[group.name] = f"could not load the workload: {e}"
    opened: list[roofline.TcpLoopback] = []
    timers: dict[str, timing.TimeFn] = {}
    reps: dict[str, int] = {}
    for entry in entries:
        describe(f"{label}: {entry['name']}")
        group = mwms if entry["name"] == MWMS_BASELINE else client
        if entry.get("candidate", {}).get("kind") == "mwms":
            group = mwms
        if entry["name"] == ROOFLINE_TCP:
            prepared, call = steps.prepare(
                lambda: _tcp_entry(workload.num_bytes, opened), config.warmup
            )
            if call is not None:
                timers[entry["name"]] = _local_timer(call)
        elif loaded[group.name] is not None:
            prepared = steps.Prepared(
                False if entry["family"] != "baseline" else None,
                loaded[group.name],
                0.0,
                0.0,
            )
        else:
            prepared = _prepare_remote(group, entry, timeout)
            if prepared.error is None:
                timers[entry["name"]] = _remote_timer(
                    group, entry["name"], timeout
                )
        entry.update(prepared.as_dict())
        if entry["name"] in timers:
            reps[entry["name"]] = timing.reps_for(
                prepared.seconds_per_call,
                config.target_seconds,
                config.max_reps,
            )
        entry["reps"] = reps.get(entry["name"], 0)
        advance(1)
    describe(f"{label}: timing {len(timers)} entries")
    factor = roofline.ring_bytes_per_worker(1, p)
    try:
        samples, errors = timing.interleaved_rounds(
            timers,
            reps,
            config.rounds,
            seed=config.seed,
            on_measurement=lambda name: advance(1),
        )
        advance((len(entries) - len(timers)) * config.rounds)
        records.attach_samples(entries, samples, errors)
        record = records.make_group_record(
            setting="multi_worker",
            workload=workload,
            num_replicas=p,
            entries=entries,
            rounds=config.rounds,
            roofline_time=lambda seconds: seconds * factor,
            extra={
                "roofline_note": "rooflines time a one-way transfer of the "
                "workload's bytes; roofline time = that time * 2(p-1)/p, the "
                "bytes a ring moves through each worker"
            },
        )
        names = [
            n
            for n in records.finalists(record, TARGET_REFERENCES)
            if n in timers and n not in errors
        ][:MAX_FINALISTS]
        describe(f"{label}: confirming {len(names)}")
        confirm, confirm_errors = timing.interleaved_rounds(
            {name: timers[name] for name in names},
            reps,
            config.rounds,
            seed=config.seed + 1,
            on_measurement=lambda name: advance(1),
        )
        advance((MAX_FINALISTS - len(names)) * config.rounds)
        records.add_confirmation(
            record,
            confirm,
            confirm_errors,
            roofline_time=lambda seconds: seconds * factor,
        )
    finally:
        for loopback in opened:
            loopback.close()
    for group in (client, mwms):
        with contextlib.suppress(ChildError):
            group.request({"cmd": "unload"}, timeout)
    return record


def _prepare_remote(
    group: _Group, entry: dict[str, Any], timeout: float
) -> steps.Prepared:
    verifies = entry["family"] != "baseline"
    try:
        answers = group.request({"cmd": "prepare", "entry": entry}, timeout)
    except ChildError as e:
        return steps.Prepared(
            False if verifies else None, timing.first_line(str(e)), 0.0, 0.0
        )
    failed = [a for a in answers if a["error"] is not None]
    if failed:
        return steps.Prepared(
            False if verifies else None,
            failed[0]["error"],
            0.0,
            max(a["build_seconds"] for a in answers),
        )
    return steps.Prepared(
        True if verifies else None,
        None,
        max(a["seconds_per_call"] for a in answers),
        max(a["build_seconds"] for a in answers),
    )


def _remote_timer(group: _Group, name: str, timeout: float) -> timing.TimeFn:
    def time_remote(reps: int) -> float:
        answers = group.request(
            {"cmd": "time", "name": name, "reps": reps}, timeout
        )
        # Collectives finish together; the slowest worker is the step time.
        return max(a["seconds"] for a in answers)

    return time_remote


def _local_timer(call: Callable[[], Any]) -> timing.TimeFn:
    return lambda reps: timing.time_calls(call, reps)


def _tcp_entry(
    num_bytes: int, opened: list[roofline.TcpLoopback]
) -> tuple[Callable[[], None], Callable[[], str | None]]:
    loopback = roofline.TcpLoopback(num_bytes)
    opened.append(loopback)

    def check() -> str | None:
        loopback()  # The receiver answers only after counting every byte.
        return None

    return loopback, check


# ---- The child processes' side ---------------------------------------------


class _Session:
    """What a child holds between commands: the replicas and built entries."""

    def __init__(self, setup: dict[str, Any]):
        self.seed = setup["seed"]
        self.warmup = setup["warmup"]
        self.replicas: steps.Replicas | None = None
        self.calls: dict[str, Callable[[], Any]] = {}

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        cmd = command["cmd"]
        if cmd == "load":
            workload = workloads_lib.Workload(
                command["name"], tuple(tuple(s) for s in command["shapes"])
            )
            self.calls = {}
            self.replicas = None
            self.replicas = self.load(workload)
            return {}
        if cmd == "prepare":
            entry = command["entry"]
            prepared, call = steps.prepare(
                lambda: self.build(entry),
                self.warmup,
                verifies=entry["family"] != "baseline",
            )
            if call is not None:
                self.calls[entry["name"]] = call
            return prepared.as_dict()
        if cmd == "time":
            seconds = timing.time_calls(
                self.calls[command["name"]], command["reps"]
            )
            return {"seconds": seconds}
        if cmd == "unload":
            self.calls = {}
            self.replicas = None
            return {}
        raise ValueError(f"command: unknown {cmd!r}")

    def load(self, workload: workloads_lib.Workload) -> steps.Replicas:
        raise NotImplementedError

    def build(self, entry: dict[str, Any]):
        raise NotImplementedError


class _ClientSession(_Session):
    """Our side: one client driving the cluster's workers in one graph."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        from tf_crossdevice import multi_worker

        self.workers = multi_worker.WorkerReplicas(
            setup["cluster"], replicas_per_worker=1
        )

    def load(self, workload: workloads_lib.Workload) -> steps.Replicas:
        return steps.Replicas(workload, self.workers.devices, self.seed)

    def build(self, entry: dict[str, Any]):
        import numpy as np
        import tensorflow as tf

        replicas = self.replicas
        assert replicas is not None
        name = entry["name"]
        if name == INPUTS_BASELINE:
            pair = steps.StepPair(
                lambda: [list(v.values) for v in replicas.values()]
            )
            return pair.timed, lambda: pair.verify(replicas.check_inputs)
        if name == IDLE_BASELINE:
            pair = steps.StepPair(lambda: [replicas.flats()[:2]])
            return pair.timed, lambda: None
        if name == ROOFLINE_GRPC:

            def copy() -> steps.Results:
                source = replicas.flats()[0]
                with tf.device(replicas.devices[1]):
                    return [[tf.identity(source)]]

            pair = steps.StepPair(copy)
            return pair.timed, lambda: pair.verify(
                lambda results, _: steps.mismatch(
                    np.asarray(results[0][0]),
                    np.asarray(replicas.variables[0].value()),
                )
            )
        candidate = candidates_lib.Candidate.from_dict(entry["candidate"])
        reduce_fn = candidates_lib.build(candidate, replicas.devices)

        def body() -> steps.Results:
            return [list(v.values) for v in reduce_fn(replicas.values())]

        pair = steps.StepPair(body)
        return pair.timed, lambda: pair.verify(replicas.check)


class _MwmsSession(_Session):
    """TensorFlow's side: one of p MultiWorkerMirroredStrategy processes."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        import tensorflow as tf

        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        resolver = self.strategy.cluster_resolver
        self.task = resolver.task_id
        self.num_workers = len(resolver.cluster_spec().as_dict()["worker"])
        self.device = self.strategy.extended.worker_devices[0]

    def load(self, workload: workloads_lib.Workload) -> steps.Replicas:
        return steps.Replicas(
            workload,
            [self.device],
            self.seed,
            first_replica=self.task,
            total_replicas=self.num_workers,
        )

    def build(self, entry: dict[str, Any]):
        import tensorflow as tf

        replicas = self.replicas
        assert replicas is not None
        if entry["name"] == MWMS_BASELINE:

            def inputs() -> steps.Results:
                tensors = self.strategy.run(lambda: replicas.tensors(0))
                return [[t] for t in tensors]

            pair = steps.StepPair(inputs)
            return pair.timed, lambda: pair.verify(replicas.check_inputs)
        kwargs = dict(entry["candidate"]["kwargs"])
        options = None
        if kwargs:
            implementation = kwargs.pop("implementation", "AUTO")
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=getattr(
                    tf.distribute.experimental.CommunicationImplementation,
                    implementation,
                ),
                **kwargs,
            )

        def replica_fn() -> list[tf.Tensor]:
            tensors = replicas.tensors(0)
            context = tf.distribute.get_replica_context()
            if options is None:
                return context.all_reduce(tf.distribute.ReduceOp.SUM, tensors)
            return context.all_reduce(
                tf.distribute.ReduceOp.SUM, tensors, options=options
            )

        def body() -> steps.Results:
            return [[t] for t in self.strategy.run(replica_fn)]

        pair = steps.StepPair(body)
        return pair.timed, lambda: pair.verify(replicas.check)


def _child_main(argv: list[str]) -> int:
    args, setup = processes.start(
        argv,
        __doc__,
        lambda parser: parser.add_argument(
            "--role", choices=("client", "mwms"), required=True
        ),
    )
    if setup is None:
        return 0
    try:
        session: _Session = (
            _ClientSession(setup)
            if args.role == "client"
            else _MwmsSession(setup)
        )
    except Exception as e:  # noqa: BLE001 - sent to the parent.
        processes.reply(
            {"error": f"{args.role} setup: {type(e).__name__}: {e}"}
        )
        return 1
    processes.reply({"ready": True})
    for command in processes.commands():
        try:
            answer = session.handle(command)
        except Exception as e:  # noqa: BLE001 - sent to the parent.
            answer = {
                "error": f"{type(e).__name__}: {timing.first_line(str(e))}"
            }
        processes.reply(answer)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
