"""Times all-reduces across local worker processes, ours against MWMS.

Two sets of processes hold the same replicas' values (replica i = worker
task i, one CPU replica per worker):

- ours: `tf_crossdevice.cluster` worker servers driven by one client
  (`--role=client`) that runs `MultiWorkerAllReduce` (and TensorFlow's
  `ReductionToOneDevice`) in a `tf.function` spanning the workers;
- TensorFlow's: p processes (`--role=mwms`) with `TF_CONFIG`, running
  `MultiWorkerMirroredStrategy`'s collective all-reduce between-graph.

The benchmark process drives both over pipes (`processes.py`), so their
measurements interleave round by round. It times TCP loopback itself, and
the client times TensorFlow's gRPC copy between two workers: the roofline
is the time a ring needs to move 2(p-1)/p of the bytes at the faster rate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from benchmarks import candidates as candidates_lib
from benchmarks import processes, records, roofline, targets
from benchmarks import workloads as workloads_lib
from tf_crossdevice import _measure

ChildError = processes.ChildError
INPUTS_BASELINE = "baseline: inputs only (client)"
IDLE_BASELINE = "baseline: two workers, no transfer (client)"
MWMS_BASELINE = "baseline: inputs only (MWMS)"
ROOFLINE_GRPC = "roofline: TF gRPC copy worker 0 -> 1"
ROOFLINE_TCP = "roofline: TCP loopback"
_FIXED = (
    (INPUTS_BASELINE, "baseline", None, None),
    (IDLE_BASELINE, "baseline", None, None),
    (MWMS_BASELINE, "baseline", None, None),
    (ROOFLINE_GRPC, "roofline", IDLE_BASELINE, None),
    (ROOFLINE_TCP, "roofline", None, None),
)


def _argv(role: str) -> list[str]:
    return processes.module_argv("benchmarks.multi_worker", role)


@contextlib.contextmanager
def _processes(p: int, setup: dict[str, Any], timeout: float) -> Iterator[Any]:
    """(our client, the MWMS processes), set up; stopped on leaving."""
    with processes.worker_cluster(p) as cluster_spec:
        client = processes.ChildGroup(
            "our client", [processes.Child("client", _argv("client"))]
        )
        mwms = processes.ChildGroup(
            "MWMS",
            [
                processes.Child(f"MWMS task {task}", _argv("mwms"), env)
                for task, env in enumerate(processes.tf_config_envs(p))
            ],
        )
        try:
            client.request({**setup, "cluster": cluster_spec}, timeout)
            mwms.request(setup, timeout)
            yield client, mwms
        finally:
            client.stop()
            mwms.stop()


def run(
    workloads: Sequence[workloads_lib.Workload],
    num_workers: int,
    config: Any,
    quick: bool,
    timeout_seconds: float = 300.0,
    describe: Callable[[str], object] = lambda s: None,
    candidate_filter: Callable[[list[Any]], list[Any]] = lambda c: c,
) -> list[records.Group]:
    """Verifies and times the multi-worker candidates, one group per workload.

    `config` is a `single_process.Config`; the callbacks are as for
    `single_process.run`; `candidate_filter` narrows each candidate list.

    Raises:
        ChildError: the processes could not be started.
    """
    describe(f"x{num_workers} workers: starting processes")
    setup = {"seed": config.seed, "warmup": config.warmup}
    with _processes(num_workers, setup, timeout_seconds) as (client, mwms):
        return [
            _run_workload(
                w,
                num_workers,
                client,
                mwms,
                config,
                candidate_filter(
                    candidates_lib.multi_worker_candidates(w, quick)
                ),
                timeout_seconds,
                describe,
            )
            for w in workloads
        ]


def _run_workload(
    workload: workloads_lib.Workload,
    p: int,
    client: processes.ChildGroup,
    mwms: processes.ChildGroup,
    config: Any,
    candidates: list[candidates_lib.Candidate],
    timeout: float,
    describe: Callable[[str], object],
) -> records.Group:
    label = f"{workload.name} x{p} workers"
    entries = list(_FIXED) + [
        (
            c.name,
            c.family,
            MWMS_BASELINE if c.kind == "mwms" else INPUTS_BASELINE,
            c,
        )
        for c in candidates
    ]
    load = {"cmd": "load", "workload": dataclasses.asdict(workload)}
    loaded: dict[str, str | None] = {}
    for group in (client, mwms):
        try:
            group.request(load, timeout)
            loaded[group.name] = None
        except ChildError as e:
            loaded[group.name] = f"could not load the workload: {e}"
    opened: list[roofline.TcpLoopback] = []
    prepared: dict[str, _measure.Prepared] = {}
    timers: dict[str, _measure.TimeFn] = {}
    for name, family, _, c in entries:
        describe(f"{label}: {name}")
        verifies = family != "baseline"
        on_mwms = name == MWMS_BASELINE or (c is not None and c.kind == "mwms")
        group = mwms if on_mwms else client
        if name == ROOFLINE_TCP:
            prepared[name], call = _measure.prepare(
                lambda: _tcp_entry(workload.num_bytes, opened), config.warmup
            )
            if call is not None:
                timers[name] = _measure.timer(call)
        elif loaded[group.name] is not None:
            failed = False if verifies else None
            prepared[name] = _measure.Prepared(failed, loaded[group.name], 0, 0)
        else:
            prepared[name] = _prepare_remote(group, name, c, verifies, timeout)
            if prepared[name].error is None:
                timers[name] = _remote_timer(group, name, timeout)
    describe(f"{label}: timing {len(timers)} entries")
    factor = roofline.ring_bytes_per_worker(1, p)
    try:
        record = records.timed_group(
            records.Group.of(
                "multi_worker",
                workload,
                p,
                note="rooflines time a one-way copy of the workload's bytes; "
                "roofline time = that * 2(p-1)/p, a ring's bytes per worker",
            ),
            [e[:3] for e in entries],
            prepared,
            timers,
            config,
            targets.REFERENCES,
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
    group: processes.ChildGroup,
    name: str,
    candidate: candidates_lib.Candidate | None,
    verifies: bool,
    timeout: float,
) -> _measure.Prepared:
    failed = False if verifies else None
    command = {
        "cmd": "prepare",
        "name": name,
        "verifies": verifies,
        "candidate": dataclasses.asdict(candidate) if candidate else None,
    }
    try:
        answers = [
            _measure.Prepared(**a) for a in group.request(command, timeout)
        ]
    except ChildError as e:
        return _measure.Prepared(failed, _measure.first_line(str(e)), 0, 0)
    build = max(a.build_seconds for a in answers)
    error = next((a.error for a in answers if a.error), None)
    if error is not None:
        return _measure.Prepared(failed, error, 0, build)
    per_call = max(a.seconds_per_call for a in answers)
    return _measure.Prepared(True if verifies else None, None, per_call, build)


def _remote_timer(
    group: processes.ChildGroup, name: str, timeout: float
) -> _measure.TimeFn:
    def time_remote(reps: int) -> float:
        message = {"cmd": "time", "name": name, "reps": reps}
        # Collectives finish together; the slowest worker is the step time.
        return max(a["seconds"] for a in group.request(message, timeout))

    return time_remote


def _tcp_entry(num_bytes: int, opened: list[roofline.TcpLoopback]) -> Any:
    loopback = roofline.TcpLoopback(num_bytes)
    opened.append(loopback)

    def check() -> None:
        loopback()  # The receiver answers only after counting every byte.

    return loopback, check


# ---- The child processes' side ------------------------------------------


class _Session:
    """What a child holds between commands: its inputs and built entries."""

    def __init__(self, setup: dict[str, Any]):
        self.seed, self.warmup = setup["seed"], setup["warmup"]
        self.inputs: _measure.Inputs | None = None
        self.calls: dict[str, Callable[[], Any]] = {}

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        cmd = command["cmd"]
        if cmd in ("load", "unload"):
            self.calls, self.inputs = {}, None
            if cmd == "load":
                w = command["workload"]
                shapes = [(tuple(s), "float32") for s in w["shapes"]]
                self.inputs = self.load(shapes)
            return {}
        if cmd == "prepare":
            prepared, call = _measure.prepare(
                lambda: self.build(command["name"], command["candidate"]),
                self.warmup,
                command["verifies"],
            )
            if call is not None:
                self.calls[command["name"]] = call
            return dataclasses.asdict(prepared)
        if cmd == "time":
            call = self.calls[command["name"]]
            return {"seconds": _measure.time_calls(call, command["reps"])}
        raise ValueError(f"command: unknown {cmd!r}")

    def load(self, gradients: Any) -> _measure.Inputs:
        raise NotImplementedError

    def build(self, name: str, candidate: dict[str, Any] | None) -> Any:
        raise NotImplementedError


def _step(body: Callable[[], Any], check: Any) -> Any:
    step = _measure.Step(body)
    return step.timed, lambda: step.verify(check) if check else None


class _ClientSession(_Session):
    """Our side: one client driving the cluster's workers in one graph."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        from tf_crossdevice import multi_worker

        self.workers = multi_worker.WorkerReplicas(
            setup["cluster"], replicas_per_worker=1
        )

    def load(self, gradients: Any) -> _measure.Inputs:
        return _measure.Inputs(gradients, self.workers.devices, self.seed)

    def build(self, name: str, candidate: dict[str, Any] | None) -> Any:
        import numpy as np
        import tensorflow as tf

        inputs = self.inputs
        assert inputs is not None
        if name == INPUTS_BASELINE:
            body = lambda: [list(v.values) for v in inputs.values()]  # noqa: E731
            return _step(body, inputs.check_inputs)
        if name == IDLE_BASELINE:
            return _step(lambda: [inputs.flats()[:2]], None)
        if name == ROOFLINE_GRPC:

            def copy() -> _measure.Results:
                source = inputs.flats()[0]
                with tf.device(inputs.devices[1]):
                    return [[tf.identity(source)]]

            sent = next(iter(inputs.variables[0].values())).numpy()
            return _step(
                copy,
                lambda results, _: _measure.mismatch(
                    np.asarray(results[0][0]), sent
                ),
            )
        assert candidate is not None
        ops = candidates_lib.build(
            candidates_lib.Candidate(**candidate), inputs.devices
        )
        return _step(_measure.all_reduce_body(ops, inputs), inputs.check)


class _MwmsSession(_Session):
    """TensorFlow's side: one of p MultiWorkerMirroredStrategy processes."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        import tensorflow as tf

        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        resolver = self.strategy.cluster_resolver
        self.task = resolver.task_id
        self.num_workers = len(resolver.cluster_spec().as_dict()["worker"])

    def load(self, gradients: Any) -> _measure.Inputs:
        return _measure.Inputs(
            gradients,
            self.strategy.extended.worker_devices[:1],
            self.seed,
            first_replica=self.task,
            total_replicas=self.num_workers,
        )

    def build(self, name: str, candidate: dict[str, Any] | None) -> Any:
        import tensorflow as tf

        inputs = self.inputs
        assert inputs is not None
        if name == MWMS_BASELINE:
            return _step(
                lambda: [
                    [t] for t in self.strategy.run(lambda: inputs.tensors(0))
                ],
                inputs.check_inputs,
            )
        assert candidate is not None
        kwargs = dict(candidate["kwargs"])
        implementation = kwargs.pop("implementation", "AUTO")
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(
                tf.distribute.experimental.CommunicationImplementation,
                implementation,
            ),
            **kwargs,
        )

        def replica_fn() -> list[Any]:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(
                tf.distribute.ReduceOp.SUM, inputs.tensors(0), options=options
            )

        return _step(
            lambda: [[t] for t in self.strategy.run(replica_fn)], inputs.check
        )


def _child_main(argv: list[str]) -> int:
    role, setup = argv[0], processes.child_start(argv)
    if setup is None:
        return 0
    try:
        session = (_ClientSession if role == "client" else _MwmsSession)(setup)
    except Exception as e:  # noqa: BLE001 - sent to the parent.
        processes.reply({"error": f"{role} setup: {type(e).__name__}: {e}"})
        return 1
    processes.reply({"ready": True})
    for command in processes.commands():
        try:
            answer = session.handle(command)
        except Exception as e:  # noqa: BLE001 - sent to the parent.
            answer = {
                "error": f"{type(e).__name__}: {_measure.first_line(str(e))}"
            }
        processes.reply(answer)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
