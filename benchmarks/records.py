"""The benchmark's records (dataclasses) and the figures taken from them.

A group is one workload on one set of replicas (n logical devices of one
process, or p worker processes). Its entries are candidates ("ours", "tf"),
rooflines, bounds and baselines, each with a `measure.Timing`. A result's
time is its median minus its baseline's median: the all-reduce's own cost,
as nccl-tests times it, without the cost of producing its inputs. JSON is
`dataclasses.asdict` of a `Run`; `Run.read` turns it back into records
(also the first format's, benchmarks/records/rest.json and small8.json: see
`upgraded_group`).

>>> def entry(name, family, baseline, seconds):
...     return entry_of(name, family, baseline, [seconds] * 3)
>>> group = Group("single_process", "w", "", 2, 1, 8, 2, "float32")
>>> add_results(group, [entry("base", "baseline", None, 1.0),
...     entry("roof", "roofline", None, 1.0),
...     entry("tf", "tf", "base", 5.0), entry("ours", "ours", "base", 3.0)])
>>> [(r.name, r.time_seconds, r.ratio_to_tf_best, r.roofline_fraction)
...  for r in group.results]
[('roof', 1.0, 4.0, 1.0), ('tf', 4.0, 1.0, 0.25), ('ours', 2.0, 2.0, 0.5)]
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import roofline as roofline_lib
from tf_crossdevice.tuning import measure

# The roofline of a group on emulated hosts: not an entry, a figure
# (`roofline.wire_seconds`).
WIRE_ROOFLINE = "roofline: wire, 2(p-1)/p*S at the link rate"


# The meta key saying what the collectives' own packing (bytes_per_pack=0)
# meant in a run: the default pack size in bytes. Older records lack it.
COLLECTIVE_PACK_KEY = "collective_pack_bytes"


@dataclasses.dataclass
class Result:
    """One entry of a group and its figures (None: no figure).

    Attributes:
        name, family: the entry ("ours", "tf", "roofline", "bound",
            "baseline").
        baseline: the entry whose median is subtracted, if any.
        timing: its check and samples.
        time_seconds: median net of the baseline (None: within noise).
        algbw_gbps: size / time. busbw_gbps: algbw * 2(n-1)/n.
        roofline_fraction: roofline time / time.
        ratio_to_tf_best: TF's best time / time (above 1: faster).
        sent_bytes_per_host, received_bytes_per_host: on emulated hosts,
            what each host's link carried per call while the entry was
            timed (headers included).
        cpu_ms_per_mib_per_host: on emulated hosts, the CPU milliseconds
            each host's processes used per MiB all-reduced (the group's
            `size_bytes` per call) while the entry was timed, its median
            over the rounds (`cpu_figures`). For in-graph entries the
            client, which is on no host, is not counted.
        cpu_ms_per_mib: the busiest host's, round by round, median over
            the rounds: what the entry costs the cores of a host.
    """

    name: str
    family: str
    baseline: str | None
    timing: measure.Timing
    time_seconds: float | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    roofline_fraction: float | None = None
    ratio_to_tf_best: float | None = None
    sent_bytes_per_host: list[float] | None = None
    received_bytes_per_host: list[float] | None = None
    cpu_ms_per_mib_per_host: list[float] | None = None
    cpu_ms_per_mib: float | None = None

    @property
    def ok(self) -> bool:
        return self.timing.error is None and self.timing.verified is not False

    @property
    def build_seconds(self) -> float:
        """Seconds from nothing to timing: both traces of the step
        (`measure.Step`), their first runs, the numpy check and the
        warm-up calls (`measure.prepare`); `benchmarks.build_time` times
        trace and first step alone."""
        return self.timing.build_seconds


@dataclasses.dataclass
class Group:
    """One workload on one set of replicas, and its results."""

    setting: str  # "single_process" or "multi_worker"
    workload: str
    description: str
    num_replicas: int
    num_tensors: int
    size_bytes: int
    count: int
    dtype: str
    rounds: int = 0
    error: str | None = None
    skipped: str | None = None
    roofline: str | None = None
    roofline_seconds: float | None = None
    tf_best: str | None = None
    tf_best_seconds: float | None = None
    ours_best: str | None = None
    ours_best_seconds: float | None = None
    baselines: list[Result] = dataclasses.field(default_factory=list)
    results: list[Result] = dataclasses.field(default_factory=list)
    # The finalists re-timed side by side: name -> net seconds.
    confirmed: dict[str, float | None] = dataclasses.field(default_factory=dict)
    confirmed_rounds: int = 0
    peak_rss_bytes: int | None = None
    note: str = ""
    # Across workers: each worker's local devices (replicas of ours; TF's
    # MultiWorkerMirroredStrategy keeps one, see groups.multi_worker).
    local_devices: int = 1
    # On emulated hosts (one per worker): their links' rate, as `tc` reads
    # it; the group's roofline is then the wire's (WIRE_ROOFLINE).
    link_rate: str | None = None

    @classmethod
    def of(cls, setting: str, workload: Any, n: int, **kw: Any) -> Group:
        w = workload
        sizes = (w.num_tensors, w.num_bytes, w.num_elements, w.dtype)
        return cls(setting, w.name, w.description, n, *sizes, **kw)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        if isinstance(data.get("baselines"), dict):  # the first format
            data = upgraded_group(data)

        def result(d: dict[str, Any]) -> Result:
            t = dict(d["timing"], samples=tuple(d["timing"]["samples"]))
            return Result(**{**d, "timing": measure.Timing(**t)})

        lists = ("baselines", "results")
        return cls(**data | {k: [result(r) for r in data[k]] for k in lists})

    @property
    def scope(self) -> str:
        n = self.num_replicas
        if self.setting == "single_process":
            return f"single process, {n} logical CPU devices"
        if self.link_rate is not None:
            local = f" x {self.local_devices} local CPU devices (TF MWMS: one "
            local = local + "replica each)" if self.local_devices > 1 else ""
            return (
                f"{n} emulated hosts at {self.link_rate}{local}, each a "
                "network namespace with an equal share of the cores"
            )
        if self.local_devices == 1:
            return f"{n} worker processes (one CPU replica each)"
        return (
            f"{n} worker processes x {self.local_devices} local CPU devices "
            "(TF MWMS: one replica each)"
        )

    def best_among(self, prefix: str) -> str | None:
        """The fastest verified result whose name starts with `prefix`."""
        timed = [
            (r.time_seconds, r.name)
            for r in self.results
            if r.name.startswith(prefix) and r.ok and r.time_seconds
        ]
        return min(timed)[1] if timed else None

    @property
    def wire_roofline_seconds(self) -> float | None:
        """2(p-1)/p*S at the link rate, on emulated hosts (else None)."""
        if self.link_rate is None:
            return None
        return roofline_lib.wire_seconds(
            self.size_bytes, self.num_replicas, self.link_rate
        )

    def time(self, name: str | None) -> float | None:
        """`name`'s net time from the confirmation rounds, else the rounds
        (WIRE_ROOFLINE: the figure)."""
        if name == WIRE_ROOFLINE and self.link_rate is not None:
            return self.wire_roofline_seconds
        if name in self.confirmed:
            return self.confirmed[name]
        r = next((r for r in self.results if r.name == name), None)
        return r.time_seconds if r is not None and r.ok else None


@dataclasses.dataclass
class Target:
    """One of the project's targets (see targets.py), as measured."""

    name: str
    measured: float | None
    threshold: float
    met: bool
    stand_in: bool
    note: str


@dataclasses.dataclass
class Job:
    """One run of the example job on emulated hosts (benchmarks.training),
    as its chief's summary reported it (None: not reported)."""

    name: str
    hosts: int
    link_rate: str
    command: str
    examples_per_second: float | None = None
    accuracy: float | None = None  # Held-out.
    # The training's median step, the same step on one host alone, the
    # all-reduce alone (--timing_steps).
    step_seconds: float | None = None
    alone_seconds: float | None = None
    all_reduce_seconds: float | None = None
    error: str = ""
    # The first host's cores kept busy (CPU time / wall time) during each
    # of the three, as the summary printed them.
    cores: list[float] | None = None
    # The forward pass alone on the first host (--timing_steps).
    forward_seconds: float | None = None

    @property
    def overlap(self) -> float | None:
        """step / max(alone, all-reduce): 1.0 when the shorter is hidden."""
        if not (self.step_seconds and self.alone_seconds):
            return None
        longer = max(self.alone_seconds, self.all_reduce_seconds or 0.0)
        return self.step_seconds / longer

    @property
    def scaling_efficiency(self) -> float | None:
        """alone / step: these hosts' examples/s over as many lone hosts'."""
        return ratio(self.alone_seconds, self.step_seconds)

    @property
    def core_bound_seconds(self) -> float | None:
        """The shortest step the first host's cores allow: the step alone,
        which keeps its core share busy, plus the all-reduce's CPU time at
        that rate (the all-reduce alone x its cores busy / the step
        alone's). Overlap hides the link's time, not CPU time on cores
        already busy."""
        alone, all_reduce = self.alone_seconds, self.all_reduce_seconds
        if not (self.cores and alone and all_reduce and self.cores[1]):
            return None
        return alone + all_reduce * self.cores[2] / self.cores[1]

    @property
    def dependency_bound_seconds(self) -> float | None:
        """The shortest step the step's order allows where the link bounds
        the all-reduce: the forward pass alone, before which no gradient
        exists, plus the all-reduce alone."""
        if self.forward_seconds is None or self.all_reduce_seconds is None:
            return None
        return self.forward_seconds + self.all_reduce_seconds

    @property
    def bound_seconds(self) -> float | None:
        """The larger of the core bound and the dependency bound."""
        bounds = [self.core_bound_seconds, self.dependency_bound_seconds]
        return max((b for b in bounds if b is not None), default=None)


@dataclasses.dataclass
class Run:
    """Everything a run wrote to results.json."""

    meta: dict[str, Any]
    skipped: dict[str, str]
    groups: list[Group]
    targets: list[Target]
    training: list[Job] = dataclasses.field(default_factory=list)

    def write(self, path: pathlib.Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=1) + "\n")

    @classmethod
    def read(cls, path: pathlib.Path) -> Run:
        data = json.loads(path.read_text())
        groups = [Group.from_dict(g) for g in data["groups"]]
        targets = [Target(**t) for t in data["targets"]]
        skipped = data["skipped"]
        if isinstance(skipped, list):  # the first format: name and reason
            skipped = {s["name"]: s["reason"] for s in skipped}
        training = [Job(**j) for j in data.get("training", [])]
        return cls(data["meta"], skipped, groups, targets, training)


def _upgraded_result(d: dict[str, Any]) -> dict[str, Any]:
    steps = d.get("step_seconds") or {}
    timing = measure.Timing(
        d["name"],
        d.get("verified"),
        d.get("error"),
        d.get("build_seconds", 0.0),
        d.get("reps", 0),
        tuple(steps.get("samples", ())),
        steps.get("median"),
        steps.get("q25"),
        steps.get("q75"),
    )
    return {
        "name": d["name"],
        "family": d["family"],
        "baseline": d.get("baseline"),
        "timing": dataclasses.asdict(timing),
        "time_seconds": d.get("time_seconds"),
        "algbw_gbps": d.get("algbw_GBps"),
        "busbw_gbps": d.get("busbw_GBps"),
        "roofline_fraction": d.get("roofline_fraction"),
        "ratio_to_tf_best": d.get("ratio_to_tf_best"),
    }


def upgraded_group(data: dict[str, Any]) -> dict[str, Any]:
    """A group of the first format as today's `Group.from_dict` reads it.

    That format kept each entry's timing flat (samples under
    "step_seconds"), its baselines by name, the confirmation rounds' net
    times under "times" (with their samples and figures, not kept) and
    each candidate with its result (not kept: `benchmarks.candidates`
    names them).

    >>> old = {"setting": "single_process", "workload": "w",
    ...     "description": "", "num_replicas": 2, "num_tensors": 1,
    ...     "size_bytes": 8, "count": 2, "dtype": "float32", "baselines": {},
    ...     "results": [{"name": "x", "family": "ours", "baseline": None,
    ...         "verified": True, "error": None, "build_seconds": 1.0,
    ...         "reps": 3, "step_seconds": {"median": 2.0, "q25": 1.0,
    ...         "q75": 3.0, "samples": [1.0, 2.0, 3.0]},
    ...         "time_seconds": 2.0, "candidate": {"name": "x"}}],
    ...     "confirmed": {"rounds": 5, "times": {"x": 1.5}, "samples": {}}}
    >>> g = Group.from_dict(old)
    >>> g.results[0].timing.samples, g.time("x"), g.confirmed_rounds
    ((1.0, 2.0, 3.0), 1.5, 5)
    """
    fields = {f.name for f in dataclasses.fields(Group)}
    out = {k: v for k, v in data.items() if k in fields}
    out["baselines"] = [_upgraded_result(b) for b in data["baselines"].values()]
    out["results"] = [_upgraded_result(r) for r in data["results"]]
    confirmed = data.get("confirmed") or {}
    out["confirmed"] = dict(confirmed.get("times", {}))
    out["confirmed_rounds"] = confirmed.get("rounds", 0)
    return out


def cpu_ms_per_mib(
    cpu_seconds: Sequence[float], calls: int, size_bytes: int
) -> list[float]:
    """Each host's CPU milliseconds per MiB all-reduced, from the CPU
    seconds each used over `calls` calls that each all-reduce `size_bytes`.

    >>> cpu_ms_per_mib([0.5, 0.25], 2, 100 * 2**20)
    [2.5, 1.25]
    """
    mib = calls * size_bytes / 2**20
    return [1e3 * seconds / mib for seconds in cpu_seconds]


def cpu_figures(rounds: Sequence[Sequence[float]]) -> tuple[list[float], float]:
    """From each round's CPU ms per MiB of every host: each host's median
    over the rounds, and the median over the rounds of the busiest host's
    (the busiest may change from round to round).

    >>> cpu_figures([[1.0, 3.0], [2.0, 1.0], [5.0, 4.0]])
    ([2.0, 3.0], 3.0)
    """
    per_host = [statistics.median(h) for h in zip(*rounds, strict=True)]
    return per_host, statistics.median(max(r) for r in rounds)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing (or b is 0)."""
    return a / b if a is not None and b else None


def entry_of(
    name: str, family: str, baseline: str | None, samples: Sequence[float]
) -> Result:
    """A verified entry with these samples (for examples and tests)."""
    prepared = measure.Prepared(family != "baseline" or None, None, 0.0, 0.0)
    return Result(
        name, family, baseline, measure.Timing.of(name, prepared, 1, samples)
    )


def _net(
    results: Sequence[Result],
    medians: dict[str, float | None],
    roofline_time: Callable[[float], float] | None,
) -> dict[str, float | None]:
    """Each result's median minus its baseline's (None: not above it), a
    roofline's turned into the workload's by `roofline_time`."""
    out: dict[str, float | None] = {}
    for r in results:
        median = medians.get(r.name)
        base = medians.get(r.baseline) if r.baseline else 0.0
        net = median - base if median is not None and base is not None else 0
        scale = roofline_time if r.family == "roofline" else None
        out[r.name] = None if net <= 0 else scale(net) if scale else net
    return out


def add_results(
    group: Group,
    entries: Sequence[Result],
    roofline_time: Callable[[float], float] | None = None,
) -> None:
    """Sets the group's results, bests and figures from its entries.

    `roofline_time` turns a roofline entry's net seconds into the roofline
    for the workload (across workers: a one-way copy into a ring's bytes).
    """
    medians = {e.name: e.timing.median_seconds for e in entries}
    group.rounds = max((len(e.timing.samples) for e in entries), default=0)
    group.baselines = [e for e in entries if e.family == "baseline"]
    group.results = [e for e in entries if e.family != "baseline"]
    net = _net(group.results, medians, roofline_time)
    for r in group.results:
        r.time_seconds = net[r.name]

    def best(family: str) -> tuple[str | None, float | None]:
        timed = [
            (r.time_seconds, r.name)
            for r in group.results
            if r.family == family and r.ok and r.time_seconds is not None
        ]
        seconds, name = min(timed) if timed else (None, None)
        return name, seconds

    group.roofline, group.roofline_seconds = best("roofline")
    if group.link_rate is not None:  # the wire, not a measured copy
        group.roofline = WIRE_ROOFLINE
        group.roofline_seconds = group.wire_roofline_seconds
    group.tf_best, group.tf_best_seconds = best("tf")
    group.ours_best, group.ours_best_seconds = best("ours")
    roof, tf_best = group.roofline_seconds, group.tf_best_seconds
    bus = 2 * (group.num_replicas - 1) / group.num_replicas
    for r in group.results:
        t = r.time_seconds
        if t:
            r.algbw_gbps = group.size_bytes / t / 1e9
            r.busbw_gbps = r.algbw_gbps * bus
            r.roofline_fraction = roof / t if roof else None
            r.ratio_to_tf_best = tf_best / t if tf_best else None


# Best of each family, bounds, references (not baselines): a multi-worker
# group with one device per worker asks for up to 15 (targets.references).
MAX_FINALISTS = 16


def timed_group(
    group: Group,
    entries: Sequence[tuple[str, str, str | None]],
    prepared: dict[str, measure.Prepared],
    timers: dict[str, measure.TimeFn],
    config: Any,
    references: Sequence[str] | Callable[[Group], Sequence[str]] = (),
    roofline_time: Callable[[float], float] | None = None,
) -> Group:
    """Times the prepared entries in rounds, then the finalists again.

    Args:
        group: the group to fill.
        entries: (name, family, baseline) of every entry.
        prepared: each entry's `measure.prepare` outcome.
        timers: the entries that can be timed.
        config: rounds, target_seconds, max_reps, seed.
        references: entries the targets compare with (re-timed too), or
            a function of the group (after the rounds) naming them.
        roofline_time: see `add_results`.
    """
    reps = {
        n: measure.reps_for(
            prepared[n].seconds_per_call, config.target_seconds, config.max_reps
        )
        for n in timers
    }
    samples, errors = measure.interleaved_rounds(
        timers, reps, config.rounds, config.seed
    )
    timings = {
        name: measure.Timing.of(
            name, p, reps.get(name, 0), samples.get(name, []), errors.get(name)
        )
        for name, p in prepared.items()
    }
    results = [Result(n, f, b, timings[n]) for n, f, b in entries]
    add_results(group, results, roofline_time)
    also = references(group) if callable(references) else references
    names = [n for n in finalists(group, also) if n in samples]
    confirm, _ = measure.interleaved_rounds(
        {n: timers[n] for n in names},
        reps,
        config.rounds,
        config.seed + 1,
    )
    add_confirmation(group, confirm, roofline_time)
    return group


def finalists(group: Group, also: Sequence[str] = ()) -> list[str]:
    """The entries the confirmation rounds re-time, with their baselines.

    The best of a family is a minimum over noisy medians, and the family
    with more candidates gets the luckier minimum; re-timing the chosen few
    side by side removes that bias. `also`: entries targets compare with.
    At most MAX_FINALISTS entries (in that order), and all their baselines.
    """
    by_name = {r.name: r for r in group.results}
    bounds = [r.name for r in group.results if r.family == "bound"]
    chosen = [group.ours_best, group.tf_best, group.roofline, *bounds, *also]
    names = list(dict.fromkeys(n for n in chosen if n in by_name))
    names = names[:MAX_FINALISTS]
    bases = [by_name[n].baseline for n in names if by_name[n].baseline]
    return names + list(dict.fromkeys(b for b in bases if b))


def add_confirmation(
    group: Group,
    samples: dict[str, list[float]],
    roofline_time: Callable[[float], float] | None = None,
) -> None:
    """Stores the finalists' net times from the confirmation rounds."""
    medians: dict[str, float | None] = {
        n: statistics.median(s) for n, s in samples.items()
    }
    group.confirmed_rounds = max(map(len, samples.values()), default=0)
    chosen = [r for r in group.results if r.name in samples]
    group.confirmed.update(_net(chosen, medians, roofline_time))
