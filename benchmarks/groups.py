"""Measures groups: one workload on n logical devices or p worker processes.

Each entry is built, checked against numpy and warmed up in the session
process that holds it (`sessions.py`), then every entry is timed once per
round, in interleaved rounds, and the finalists again
(`records.timed_group`). One process, n devices: a fresh session per group
runs the candidates, the rooflines (`roofline.py`), a bound (packing and
unpacking alone), the baselines and autotune's choice. p workers, one CPU
replica each: a session drives `tf_crossdevice.cluster` workers in one graph
(our in-graph candidates and autotune's choice among them), p
MultiWorkerMirroredStrategy sessions hold the same values, and p sessions
of tf_crossdevice's MultiWorkerMirroredStrategy run our collectives. p
workers with k > 1 local devices: ours with k replicas per worker against
TensorFlow's strategy holding each worker's sum of them (same global data,
same result: see `sessions.py`), and the rooflines. With a link rate, the
p workers run on p emulated hosts (`tf_crossdevice.cluster.hosts`): each
worker server and each between-graph session on its own host, the
in-graph client here, reaching them over the bridge; the group's roofline
is the wire's and each entry records the bytes each host's link carried
and the CPU time each host used per MiB all-reduced while it was timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import pathlib
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from benchmarks import candidates as candidates_lib
from benchmarks import records, roofline, sessions, targets
from benchmarks import workloads as workloads_lib
from tf_crossdevice import cluster, launch
from tf_crossdevice.cluster import hosts as hosts_lib
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.tuning import measure

ChildError = _processes.ChildError
# The checkout: sessions run `python -m benchmarks.sessions` from there.
_ROOT = pathlib.Path(__file__).resolve().parents[1]
ROOFLINE_TCP = "roofline: TCP loopback"
# (name, family, baseline) of the fixed entries.
SINGLE_PROCESS = (
    (sessions.INPUTS_BASELINE, "baseline", None),
    (sessions.FLAT_BASELINE, "baseline", None),
    (sessions.ROOFLINE_ADD_N, "roofline", sessions.FLAT_BASELINE),
    (sessions.ROOFLINE_ADD_N_PER_CORE, "roofline", sessions.FLAT_BASELINE),
    (sessions.ROOFLINE_NUMPY, "roofline", None),
    (sessions.ROOFLINE_NUMPY_PER_CORE, "roofline", None),
)
PACK_UNPACK = (sessions.PACK_UNPACK_BOUND, "bound", sessions.INPUTS_BASELINE)
# tf_crossdevice.autotune's choice (family "autotune"), searched in the
# group's session with Config.autotune_budget_seconds, then timed in the same
# rounds as the rest.
AUTOTUNE_FAMILY = "autotune"
MULTI_WORKER = (
    (sessions.INPUTS_BASELINE, "baseline", None),
    (sessions.IDLE_BASELINE, "baseline", None),
    (sessions.MWMS_BASELINE, "baseline", None),
    (sessions.ROOFLINE_GRPC, "roofline", sessions.IDLE_BASELINE),
    (sessions.GRPC_BF16_BOUND, "bound", sessions.IDLE_BASELINE),
    (sessions.SUM_COPY_BOUND, "bound", sessions.INPUTS_BASELINE),
    (sessions.SUM_COPY_BF16_BOUND, "bound", sessions.INPUTS_BASELINE),
    (ROOFLINE_TCP, "roofline", None),
)
Describe = Callable[[str], object]


@dataclasses.dataclass
class Config:
    """How long and how carefully to time (see the flags of __main__)."""

    rounds: int = 7
    target_seconds: float = 0.1
    max_reps: int = 200
    warmup: int = 2
    seed: int = 0
    cores: int = 2
    timeout_seconds: float = 900.0  # the longest a session may stay silent
    max_memory_bytes: int = 12 << 30  # single-process groups above: left out
    autotune_budget_seconds: float = 60.0  # the "autotune" entry's budget


class Sessions:
    """`sessions.py` processes that get every command and answer it once each.

    One per entry of `envs` (its extra environment variables), each holding
    `role` ("in_graph", "mwms" or "ours_mwms"), set up with `setup` and
    `config`'s seed and warmup (ChildError if a session cannot start or set up).
    With `hosts`, session i runs on emulated host i.
    """

    def __init__(
        self,
        role: str,
        setup: dict[str, Any],
        config: Config,
        envs: Sequence[Mapping[str, str]] = ({},),
        hosts: hosts_lib.EmulatedHosts | None = None,
    ):
        self.name, self.timeout = role, config.timeout_seconds
        self.dead: str | None = None  # Why it was stopped.
        self.children: list[_processes.Child] = []
        try:
            for i, env in enumerate(envs):
                argv = [sys.executable, "-m", "benchmarks.sessions"]
                argv.append(f"--role={role}")
                if hosts is not None:
                    argv = hosts.command(i, argv)
                self.children.append(
                    _processes.Child(
                        argv, name=f"{role} {i}", env=env, cwd=_ROOT
                    )
                )
            self.request(setup | {"seed": config.seed, "warmup": config.warmup})
        except BaseException:
            self.stop()
            raise

    def request(self, message: dict[str, Any]) -> list[Any]:
        """Every session's answer to `message`.

        Raises:
            ChildError: a session failed or was too slow (all are then
                stopped for good), or answered with an error.
        """
        if self.dead is not None:
            raise ChildError(f"{self.name} was stopped earlier: {self.dead}")
        try:
            for child in self.children:
                child.send(message)
            answers = [child.receive(self.timeout) for child in self.children]
        except ChildError as e:
            self.dead = str(e).splitlines()[0][:200]
            self.stop()
            raise
        errors = [a["error"] for a in answers if a.get("error")]
        if errors:
            raise ChildError(errors[0])
        return answers

    def prepare(
        self, name: str, candidate: Any, verifies: bool
    ) -> measure.Prepared:
        """The entry built, checked and warmed up in every session: the
        first error, else the slowest session's times."""
        command = {
            "cmd": "prepare",
            "name": name,
            "verifies": verifies,
            "candidate": dataclasses.asdict(candidate) if candidate else None,
        }
        try:
            answers = [measure.Prepared(**a) for a in self.request(command)]
        except ChildError as e:
            failed = False if verifies else None
            return measure.Prepared(failed, measure.first_line(str(e)), 0, 0)
        slowest = dataclasses.replace(
            answers[0],
            seconds_per_call=max(a.seconds_per_call for a in answers),
            build_seconds=max(a.build_seconds for a in answers),
        )
        return next((a for a in answers if a.error), slowest)

    def time(self, name: str, reps: int) -> float:
        """Seconds per call of `reps` calls of a prepared entry."""
        message = {"cmd": "time", "name": name, "reps": reps}
        # Collectives finish together; the slowest worker is the step time.
        return max(a["seconds"] for a in self.request(message))

    def stop(self) -> None:
        _processes.stop_all(self.children)

    def __enter__(self) -> Sessions:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def single_process(
    workload: workloads_lib.Workload,
    num_devices: int,
    candidates: Sequence[candidates_lib.Candidate],
    config: Config,
    describe: Describe = lambda s: None,
) -> records.Group:
    """Verifies and times `candidates` on `num_devices` logical CPU devices.

    A group that could not be measured says why (`error`, `skipped`).
    """
    group = records.Group.of("single_process", workload, num_devices)
    # About the peak memory with every candidate, as measured on this
    # repository's machine (inputs, results, intermediates, numpy's buffers,
    # what allocators keep).
    need = 0.6e9 + 5 * num_devices * workload.num_bytes
    if need > config.max_memory_bytes:
        group.skipped = (
            f"needs about {need / 2**30:.1f} GiB (over --max_memory_gib)"
        )
        return group
    setup = {
        "num_devices": num_devices,
        "cores": config.cores,
        "autotune_budget_seconds": config.autotune_budget_seconds,
    }
    with _failing_in([group]), Sessions("in_graph", setup, config) as session:
        fixed = SINGLE_PROCESS + (PACK_UNPACK,) * (workload.num_tensors > 1)
        fixed += (_autotune_entry(config),)
        entries = [(*e, session, None) for e in fixed] + [
            (c.name, c.family, sessions.INPUTS_BASELINE, session, c)
            for c in candidates
        ]
        _measure_group(group, workload, entries, config, describe)
    return group


def multi_worker(
    workloads: Sequence[workloads_lib.Workload],
    num_workers: int,
    config: Config,
    candidates_of: Callable[[workloads_lib.Workload], list[Any]],
    describe: Describe = lambda s: None,
    local_devices: Sequence[int] = (1,),
    link_rate: str | None = None,
) -> list[records.Group]:
    """Verifies and times each workload's candidates across workers, with
    each of `local_devices` devices per worker (k > 1: only the
    between-graph strategies and the rooflines); with `link_rate`, one
    worker per emulated host on links of that rate ('1gbit').

    Groups that could not be measured say why (`error`).
    """
    where = f"x{num_workers} {'hosts' if link_rate else 'workers'}"
    describe(f"{where}: starting processes")
    note = (
        "rooflines time a one-way copy of the workload's bytes; roofline "
        "time = that * 2(p-1)/p, a ring's bytes per worker"
    )
    if link_rate is not None:
        note = (
            "roofline: 2(p-1)/p*S, a bandwidth-optimal all-reduce's bytes "
            f"per host, at {link_rate}; sent, received: what each host's "
            "link carried per call (MiB, the most of any host), model: sent "
            "over the bytes the entry should send (roofline.bytes_sent_model)"
        )
    out = {
        (k, w.name): records.Group.of(
            "multi_worker",
            w,
            num_workers,
            note=note,
            local_devices=k,
            link_rate=link_rate,
        )
        for k in local_devices
        for w in workloads
    }
    with _failing_in(list(out.values())), contextlib.ExitStack() as stack:
        bed = None
        if link_rate is not None:
            bed = stack.enter_context(
                hosts_lib.EmulatedHosts(num_workers, link_rate)
            )
        addresses = [h.address for h in bed.hosts] if bed else "127.0.0.1"
        workers = stack.enter_context(
            cluster.start_local_cluster(
                num_workers,
                cpus_per_worker=1,
                timeout_seconds=config.timeout_seconds if bed else 60.0,
                hosts=bed,
            )
        )
        spec = workers.cluster_spec.as_dict()
        client = stack.enter_context(
            Sessions(
                "in_graph",
                {
                    "cluster": spec,
                    "autotune_budget_seconds": config.autotune_budget_seconds,
                },
                config,
            )
        )
        mwms = stack.enter_context(
            Sessions(
                "mwms",
                {},
                config,
                launch.tf_config_envs(num_workers, addresses),
                bed,
            )
        )
        for k in local_devices:
            groups = [out[k, w.name] for w in workloads]
            with _failing_in(groups), contextlib.ExitStack() as inner:
                ours = None
                if any(
                    c.kind == "ours_mwms"
                    for w in workloads
                    for c in candidates_of(w)
                ):
                    describe(f"{where}x{k}: our strategy")
                    ours = inner.enter_context(
                        Sessions(
                            "ours_mwms",
                            {"local_devices": k},
                            config,
                            launch.tf_config_envs(num_workers, addresses),
                            bed,
                        )
                    )
                for group, w in zip(groups, workloads, strict=True):
                    selected = candidates_of(w)
                    entries = _multi_worker_entries(
                        selected, k, client, mwms, ours, wire=bed is not None
                    )
                    # Autotune searches our in-graph candidates: only where
                    # they are measured (one device per worker).
                    if k == 1 and any(
                        c.kind == "ours_multi_worker" for c in selected
                    ):
                        entries.append((*_autotune_entry(config), client, None))
                    _measure_group(group, w, entries, config, describe, bed)
    return list(out.values())


def _autotune_entry(config: Config) -> tuple[str, str, str]:
    """(name, family, baseline) of autotune's choice: searched in-graph on
    the group's devices (in a multi-worker group, across the workers, with
    one device each) within the budget its name states."""
    return (
        f"{sessions.AUTOTUNE} ({config.autotune_budget_seconds:g} s budget)",
        AUTOTUNE_FAMILY,
        sessions.INPUTS_BASELINE,
    )


def _multi_worker_entries(
    candidates: Sequence[Any],
    local_devices: int,
    client: Sessions,
    mwms: Sessions,
    ours: Sessions | None,
    wire: bool = False,
) -> list[tuple[str, str, str | None, Sessions | None, Any]]:
    """A multi-worker group's entries: (name, family, baseline, sessions,
    candidate); with k > 1 local devices, the between-graph ones only; on
    emulated hosts (`wire`), no loopback roofline (it measures the cores)."""
    sides = {sessions.MWMS_BASELINE: mwms, ROOFLINE_TCP: None}
    entries = [
        (*e, sides.get(e[0], client), None)
        for e in MULTI_WORKER
        # In-graph entries on the inputs: one replica per worker only.
        if local_devices == 1 or sessions.INPUTS_BASELINE not in (e[0], e[2])
        if not (wire and e[0] == ROOFLINE_TCP)
    ]
    if ours is not None:
        entries.append(
            (sessions.OURS_MWMS_BASELINE, "baseline", None, ours, None)
        )
    for c in candidates:
        side: Sessions | None = client
        baseline = sessions.INPUTS_BASELINE
        if c.kind == "mwms":
            baseline, side = sessions.MWMS_BASELINE, mwms
        elif c.kind == "ours_mwms":
            baseline, side = sessions.OURS_MWMS_BASELINE, ours
        elif local_devices > 1:
            continue  # one replica per worker: not this group's setting
        entries.append((c.name, c.family, baseline, side, c))
    return entries


@contextlib.contextmanager
def _failing_in(groups: list[records.Group]) -> Iterator[None]:
    """Turns an exception into the `error` of the groups not measured yet."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - a row of the table says why.
        for group in groups:
            if not group.rounds:
                group.error = f"{type(e).__name__}: {e}"


def _measure_group(
    group: records.Group,
    workload: workloads_lib.Workload,
    entries: list[tuple[str, str, str | None, Sessions | None, Any]],
    config: Config,
    describe: Describe,
    hosts: hosts_lib.EmulatedHosts | None = None,
) -> records.Group:
    """Prepares every entry on its side (None: here), then times them all.

    Entries: (name, family, baseline, the sessions it runs in, candidate).
    With `hosts`, each entry also gets the bytes each host's link carried
    per call while it was timed (`LinkCounter`) and each host's CPU time
    per MiB all-reduced then (`CpuCounter`).
    """
    sides = list(dict.fromkeys(e[3] for e in entries if e[3] is not None))
    loaded: dict[Any, str | None] = {}
    for side in sides:
        command = {"cmd": "load", "shapes": workload.shapes}
        try:
            side.request(command | {"local_devices": group.local_devices})
            loaded[side] = None
        except ChildError as e:
            loaded[side] = f"could not load the workload: {e}"
    opened: list[roofline.TcpLoopback] = []
    prepared: dict[str, measure.Prepared] = {}
    timers: dict[str, measure.TimeFn] = {}
    for name, family, _, where, candidate in entries:
        describe(f"{workload.name} x{group.num_replicas}: {name}")
        verifies = family != "baseline"
        if where is None:  # TCP loopback, timed here
            prepared[name], call = measure.prepare(
                lambda: _tcp_entry(workload.num_bytes, opened), config.warmup
            )
            if call is not None:
                timers[name] = measure.timer(call)
        elif loaded[where] is not None:
            failed = False if verifies else None
            prepared[name] = measure.Prepared(failed, loaded[where], 0, 0)
        else:
            prepared[name] = where.prepare(name, candidate, verifies)
            if prepared[name].error is None:
                timers[name] = functools.partial(where.time, name)
    describe(f"{workload.name} x{group.num_replicas}: timing")
    factor = roofline.ring_bytes_per_worker(1, group.num_replicas)
    counters: list[LinkCounter | CpuCounter] = []
    if hosts is not None:
        counters.append(LinkCounter(hosts))
        if all(h.accounting is not None for h in hosts.hosts):
            counters.append(CpuCounter(hosts, group.size_bytes))
    for counter in counters:
        timers = {n: counter.wrap(n, t) for n, t in timers.items()}
    try:
        records.timed_group(
            group,
            [e[:3] for e in entries],
            prepared,
            timers,
            config,
            targets.references,
            (lambda s: s * factor) if group.setting == "multi_worker" else None,
        )
    finally:
        for loopback in opened:
            loopback.close()
    for counter in counters:
        counter.record(group)
    for side in sides:
        with contextlib.suppress(ChildError):
            answers = side.request({"cmd": "unload"})
            group.peak_rss_bytes = max(a["peak_rss_bytes"] for a in answers)
    return group


class LinkCounter:
    """Counts what each emulated host's link carries while each entry is
    timed: `wrap` a timer, then `record` the bytes per call into the
    group's results."""

    def __init__(self, hosts: hosts_lib.EmulatedHosts):
        self.hosts = hosts
        self.calls: dict[str, int] = {}
        self.sent: dict[str, list[int]] = {}
        self.received: dict[str, list[int]] = {}

    def wrap(self, name: str, timer: measure.TimeFn) -> measure.TimeFn:
        def timed(reps: int) -> float:
            before = self.hosts.link_bytes()
            seconds = timer(reps)
            after = self.hosts.link_bytes()
            self.add(name, reps, before, after)
            return seconds

        return timed

    def add(
        self,
        name: str,
        calls: int,
        before: Sequence[hosts_lib.LinkBytes],
        after: Sequence[hosts_lib.LinkBytes],
    ) -> None:
        """Adds `calls` calls of `name` and the counters around them."""
        pairs = list(zip(before, after, strict=True))
        sent = [a.sent - b.sent for b, a in pairs]
        received = [a.received - b.received for b, a in pairs]
        self.calls[name] = self.calls.get(name, 0) + calls
        old_sent = self.sent.get(name, [0] * len(pairs))
        old_received = self.received.get(name, [0] * len(pairs))
        self.sent[name] = [x + y for x, y in zip(old_sent, sent, strict=True)]
        self.received[name] = [
            x + y for x, y in zip(old_received, received, strict=True)
        ]

    def record(self, group: records.Group) -> None:
        """Each timed entry's bytes per call, per host, into `group`."""
        for r in [*group.baselines, *group.results]:
            calls = self.calls.get(r.name)
            if calls:
                r.sent_bytes_per_host = [n / calls for n in self.sent[r.name]]
                r.received_bytes_per_host = [
                    n / calls for n in self.received[r.name]
                ]


class CpuCounter:
    """Counts the CPU time each emulated host uses while each entry is
    timed, every process on it (`EmulatedHosts.cpu_seconds`): `wrap` a
    timer, then `record` into the group's results each host's CPU ms per
    MiB all-reduced (`size_bytes` a call), over the rounds
    (`records.cpu_figures`).

    Read just before and after each round's timed calls, in this process:
    builds, checks and warm-up calls fall outside, and so does reading the
    counters.
    """

    def __init__(self, hosts: hosts_lib.EmulatedHosts, size_bytes: int):
        self.hosts = hosts
        self.size_bytes = size_bytes
        self.rounds: dict[str, list[list[float]]] = {}

    def wrap(self, name: str, timer: measure.TimeFn) -> measure.TimeFn:
        def timed(reps: int) -> float:
            before = self.hosts.cpu_seconds()
            seconds = timer(reps)
            after = self.hosts.cpu_seconds()
            used = [a - b for a, b in zip(after, before, strict=True)]
            self.add(name, reps, used)
            return seconds

        return timed

    def add(self, name: str, calls: int, cpu_seconds: Sequence[float]) -> None:
        """Adds one round of `name`: `calls` calls, for which each host
        used `cpu_seconds`."""
        self.rounds.setdefault(name, []).append(
            records.cpu_ms_per_mib(cpu_seconds, calls, self.size_bytes)
        )

    def record(self, group: records.Group) -> None:
        """Each timed entry's CPU ms per MiB, per host and the busiest
        host's, into `group`."""
        for r in [*group.baselines, *group.results]:
            rounds = self.rounds.get(r.name)
            if rounds:
                per_host, busiest = records.cpu_figures(rounds)
                r.cpu_ms_per_mib_per_host, r.cpu_ms_per_mib = per_host, busiest


def _tcp_entry(num_bytes: int, opened: list[roofline.TcpLoopback]) -> Any:
    loopback = roofline.TcpLoopback(num_bytes)
    opened.append(loopback)
    # The check is one round: the receiver answers only after every byte.
    return loopback, loopback
