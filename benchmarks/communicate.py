"""Held-out accuracy against training time when hosts communicate less.

    # -> benchmarks/records/communicate_4hosts.json
    python -m benchmarks.communicate
    # 1 rate, 2 methods, 64 steps: that it runs, not a measurement
    python -m benchmarks.communicate --smoke

Runs examples/train.py (one launcher, `--mode=collective`, which starts
its 4 workers on emulated hosts itself: a network namespace each, links
shaped to `--link_rate` both ways, an equal share of the machine's cores)
with four ways of meeting (METHODS) at three link rates (RATES): every
step's gradients all-reduced (`--sync=every_step`), the same with
PowerSGD rank 4, DiLoCo with H=32 local steps between syncs, and DiLoCo
with PowerSGD on its outer step. Every run trains the same model on the
same examples (STEPS global batches of BATCH_SIZE drawn from NUM_EXAMPLES
examples), with the same seed, custom loop and cosine learning rate, one
replica per host, and the chief scores the same EVAL_EXAMPLES held-out
examples every EVAL_EVERY steps (on DiLoCo's syncs, as the job requires).

Per run, from its lines (timestamped as they arrive, `faults.Job`):

- held-out accuracy against training time: a checkpoint's time is its
  line's arrival since the job started (start-up included: processes,
  TensorFlow, the strategy) minus the seconds the chief spent scoring,
  that checkpoint's included;
- bytes per host: each host's link counters (`eth0` in its namespace)
  read when the chief's model line and each checkpoint's line arrive
  (headers included); the record's figures are from the model line (the
  initial weights sent) to the last checkpoint. The job reports no count
  of the elements PowerSGD sends (`Curve.elements_sent` stays None).

Targets, at each scored rate (SCORED_RATES; at 10gbit the cores, not the
link, bound every method: its figures are in the record's note, not
scored), against the level "the synchronous uncompressed run's final
held-out accuracy minus 1 point": DiLoCo's time to the level (the faster
of the two DiLoCo runs) at least 1.5x shorter than the fastest
synchronous method's (uncompressed or PowerSGD), and DiLoCo's final
accuracy (the better of the two) at most 1 point below the synchronous
run's. A run that never reaches the level has no time; the note says so.

The defaults fit the whole group in 30 minutes on a 2-core machine. The
dense model (MODEL_FLAGS: 2.4M parameters, 9.5 MB of float32 gradients)
needs 2(p-1)/p of its gradients each way per step: 0.11 s of a 1 Gbit/s
link between 4 hosts, 1.1 s at 100 Mbit/s, more than its step's compute
on 64 examples per host with half a core, so that the link bounds the
synchronous step at the scored rates. The synchronous run at 100mbit,
STEPS x (1.1 s + compute), is the largest part of the group's time; the
runs' start-up (a fixed cost, counted in every time) is the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.faults import Job, Line
from benchmarks.records import Run, Target
from tf_crossdevice.cluster.hosts import LinkBytes

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORD = ROOT / "benchmarks" / "records" / "communicate_4hosts.json"
SMOKE_RECORD = pathlib.Path(tempfile.gettempdir()) / "communicate_smoke.json"
HOSTS = 4
SCORED_RATES = ("100mbit", "1gbit")
REPORTED_RATES = ("10gbit",)  # The cores bound every method there.
RATES = (*SCORED_RATES, *REPORTED_RATES)
PERIOD = 32  # DiLoCo's H: local steps between syncs.
# Checkpoints, and so held-out scores, fall on syncs (the job requires it).
EVAL_EVERY = PERIOD
STEPS = 256  # 8 syncs of DiLoCo.
BATCH_SIZE = 64 * HOSTS  # Global.
# 4 epochs at the defaults. Each host makes the examples it trains on
# before its first step, a cost in every run's time: here about 68% of
# them (1 - (3/4)^4), where one epoch of fresh examples would be 16384.
NUM_EXAMPLES = 16384
SEED = 0
# 4 hidden layers of 768 units on 16x16x3 images: 2.4M parameters.
MODEL_FLAGS = ("--model=dense", "--width=768", "--depth=4")
# Standard error of an accuracy near 85%: 0.56 points.
EVAL_EXAMPLES = 4096
RUN_TIMEOUT_SECONDS = 600  # About twice the longest run (synchronous, 100mbit).
# What the targets ask.
LEVEL_BELOW = 0.01  # The level: the synchronous run's final - 1 point.
SPEEDUP = 1.5
ACCURACY_BELOW_POINTS = 1.0

SYNC = "synchronous"
POWERSGD = "PowerSGD rank 4"
DILOCO = f"DiLoCo H={PERIOD}"
DILOCO_POWERSGD = f"DiLoCo H={PERIOD}, PowerSGD outer step"
POWERSGD_FLAGS = (
    "--compression=powersgd",
    "--powersgd_rank=4",
    "--cross_device_ops=CollectiveAllReduce",
)
DILOCO_FLAGS = ("--sync=diloco", f"--sync_period={PERIOD}")
METHODS: dict[str, tuple[str, ...]] = {
    SYNC: ("--sync=every_step",),
    POWERSGD: ("--sync=every_step", *POWERSGD_FLAGS),
    DILOCO: DILOCO_FLAGS,
    DILOCO_POWERSGD: (*DILOCO_FLAGS, *POWERSGD_FLAGS),
}
SYNCHRONOUS = (SYNC, POWERSGD)
DILOCOS = (DILOCO, DILOCO_POWERSGD)
# Every run's: one launcher starts the hosts and their workers; one replica
# per host (half a core each: a second device would add a reduction within
# the host, and PowerSGD's flat class would pay for it between hosts).
JOB_FLAGS = (
    "--mode=collective",
    f"--num_workers={HOSTS}",
    "--devices_per_worker=1",
    "--loop=custom",
    *MODEL_FLAGS,
    f"--seed={SEED}",
    f"--log_every={EVAL_EVERY}",
    f"--eval_every={EVAL_EVERY}",
    f"--eval_examples={EVAL_EXAMPLES}",
    "--lr_schedule=cosine",
)

# The chief's lines, as the launcher prefixes them.
_EVAL = re.compile(
    r"^\[worker 0\] held-out accuracy at step (\d+): ([\d.]+) "
    r"\((\d+) examples, ([\d.]+) s\)"
)
_MODEL = re.compile(r"^\[worker 0\] model \S+: (\d+) parameters;")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one invocation runs."""

    rates: tuple[str, ...] = RATES
    methods: tuple[str, ...] = tuple(METHODS)
    steps: int = STEPS
    batch_size: int = BATCH_SIZE


SMOKE = Plan(("1gbit",), (SYNC, DILOCO_POWERSGD), 2 * PERIOD)


def job_flags(method: str, link_rate: str, plan: Plan) -> list[str]:
    """examples/train.py's flags for `method` at `link_rate`."""
    if method not in METHODS:
        raise ValueError(
            f"method: expected one of {', '.join(METHODS)}, got {method!r}"
        )
    return [
        *JOB_FLAGS,
        f"--link_rate={link_rate}",
        f"--steps={plan.steps}",
        f"--batch_size={plan.batch_size}",
        f"--num_examples={NUM_EXAMPLES}",
        *METHODS[method],
    ]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The chief's held-out score at one checkpoint.

    Attributes:
        step: the steps trained.
        accuracy: held-out accuracy (0 to 1).
        seconds: training time: since the job started, less the seconds
            spent scoring so far (this checkpoint's included).
        sent_bytes, received_bytes: per host, what its link carried since
            the hosts were made, when the line came (None: not read).
    """

    step: int
    accuracy: float
    seconds: float
    sent_bytes: list[int] | None = None
    received_bytes: list[int] | None = None


@dataclasses.dataclass
class Curve:
    """One run: a method at a link rate, and its checkpoints.

    Attributes:
        start_seconds: when the chief's model line came (start-up done).
        start_sent_bytes, start_received_bytes: per host, at that line.
        parameters: the model's, from that line.
        elements_sent: PowerSGD's elements sent per step, where the job
            reports it (it does not yet).
        error: why the run has no final accuracy ("" if it has one).
    """

    method: str
    link_rate: str
    command: str
    checkpoints: list[Checkpoint]
    status: int | None = None
    start_seconds: float | None = None
    start_sent_bytes: list[int] | None = None
    start_received_bytes: list[int] | None = None
    parameters: int | None = None
    elements_sent: int | None = None
    error: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Curve:
        points = [Checkpoint(**c) for c in data["checkpoints"]]
        return cls(**{**data, "checkpoints": points})

    @property
    def final_accuracy(self) -> float | None:
        """The last checkpoint's accuracy, if the run ended well."""
        if self.error or not self.checkpoints:
            return None
        return self.checkpoints[-1].accuracy

    def time_to(self, level: float) -> float | None:
        """Training seconds to the first checkpoint at `level` or above
        (None: none reached it).

        >>> c = Curve("m", "1gbit", "", [Checkpoint(32, 0.70, 10.0),
        ...     Checkpoint(64, 0.80, 20.0), Checkpoint(96, 0.79, 30.0)])
        >>> c.time_to(0.79), c.time_to(0.81)
        (20.0, None)
        """
        return next(
            (c.seconds for c in self.checkpoints if c.accuracy >= level),
            None,
        )

    def bytes_per_host(self) -> tuple[list[int], list[int]] | None:
        """Each host's bytes sent and received from the model line to the
        last checkpoint (None: not counted)."""
        last = self.checkpoints[-1] if self.checkpoints else None
        if (
            last is None
            or last.sent_bytes is None
            or last.received_bytes is None
            or self.start_sent_bytes is None
            or self.start_received_bytes is None
        ):
            return None
        return (
            _minus(last.sent_bytes, self.start_sent_bytes),
            _minus(last.received_bytes, self.start_received_bytes),
        )


def _minus(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [x - y for x, y in zip(a, b, strict=True)]


Links = Mapping[int, Sequence[LinkBytes]]


def curve_of(
    method: str,
    link_rate: str,
    command: str,
    lines: Sequence[Line],
    started: float,
    links: Links,
    status: int | None,
    steps: int,
) -> Curve:
    """A run's curve from its lines; `links` holds each host's link bytes
    read when line `i` came, by `i`."""

    def counted(i: int) -> tuple[list[int] | None, list[int] | None]:
        if i not in links:
            return None, None
        return [h.sent for h in links[i]], [h.received for h in links[i]]

    curve = Curve(method, link_rate, command, [], status)
    scoring = 0.0
    for i, line in enumerate(lines):
        model = _MODEL.search(line.text)
        if model and curve.start_seconds is None:
            curve.start_seconds = line.at - started
            curve.parameters = int(model[1])
            curve.start_sent_bytes, curve.start_received_bytes = counted(i)
        found = _EVAL.search(line.text)
        if found:
            scoring += float(found[4])
            sent, received = counted(i)
            curve.checkpoints.append(
                Checkpoint(
                    int(found[1]),
                    float(found[2]),
                    line.at - started - scoring,
                    sent,
                    received,
                )
            )
    if status != 0:
        curve.error = f"the job ended with status {status}"
    elif not curve.checkpoints or curve.checkpoints[-1].step != steps:
        curve.error = f"no held-out accuracy at step {steps}"
    return curve


def _seconds(t: float | None) -> str:
    return "did not reach it" if t is None else f"{t:.1f} s"


def _times_note(curves: Mapping[str, Curve], level: float) -> str:
    parts = []
    for method, c in curves.items():
        t = c.time_to(level)
        if c.error:
            parts.append(f"{method}: failed ({c.error})")
        elif t is None:
            best = max(c.checkpoints, key=lambda p: p.accuracy)
            parts.append(
                f"{method}: did not reach it (best {best.accuracy:.4f} at "
                f"step {best.step})"
            )
        else:
            parts.append(f"{method} {_seconds(t)}")
    return "; ".join(parts)


def _fastest(
    curves: Mapping[str, Curve], methods: Sequence[str], level: float
) -> tuple[float, str] | None:
    times = [
        (t, m)
        for m in methods
        if m in curves and (t := curves[m].time_to(level)) is not None
    ]
    return min(times) if times else None


def rate_targets(curves: Sequence[Curve], link_rate: str) -> list[Target]:
    """The two targets at `link_rate` from its runs (see the module's
    docstring); with no final synchronous accuracy, both unmet."""
    here = {c.method: c for c in curves if c.link_rate == link_rate}
    where = f"{HOSTS} emulated hosts at {link_rate}: "
    speed_name = (
        f"{where}time to the synchronous run's final held-out accuracy "
        f"- 1 point, fastest synchronous method / DiLoCo (best of "
        f"{len(DILOCOS)})"
    )
    accuracy_name = (
        f"{where}DiLoCo's final held-out accuracy (best of {len(DILOCOS)}) "
        "at most 1 point below the synchronous run's (difference, points)"
    )
    sync = here.get(SYNC)
    final = sync.final_accuracy if sync is not None else None
    if final is None:
        why = "no synchronous run" if sync is None else sync.error
        note = f"no level: the synchronous run has no final accuracy ({why})"
        return [
            Target(speed_name, None, SPEEDUP, False, False, note),
            Target(
                accuracy_name, None, -ACCURACY_BELOW_POINTS, False, False, note
            ),
        ]
    # Accuracies come with 4 decimals: rounded, 0.85 - 1 point is 0.84.
    level = round(final - LEVEL_BELOW, 6)
    fastest = _fastest(here, SYNCHRONOUS, level)
    diloco = _fastest(here, DILOCOS, level)
    speedup = fastest[0] / diloco[0] if fastest and diloco else None
    note = (
        f"level {level:.4f} (synchronous final {final:.4f} - 1 point); "
        + _times_note(here, level)
    )
    if diloco is None:
        note += "; no DiLoCo run reached the level: not met"
    finals = [
        (a, m)
        for m in DILOCOS
        if m in here and (a := here[m].final_accuracy) is not None
    ]
    best = max(finals) if finals else None
    points = round(100 * (best[0] - final), 6) if best else None
    accuracy_note = f"synchronous {final:.4f}; " + (
        ", ".join(f"{m} {a:.4f}" for a, m in finals) or "no DiLoCo run ended"
    )
    return [
        Target(
            speed_name,
            speedup,
            SPEEDUP,
            speedup is not None and speedup >= SPEEDUP,
            False,
            note,
        ),
        Target(
            accuracy_name,
            points,
            -ACCURACY_BELOW_POINTS,
            points is not None and points >= -ACCURACY_BELOW_POINTS,
            False,
            accuracy_note,
        ),
    ]


def targets(curves: Sequence[Curve], rates: Sequence[str]) -> list[Target]:
    """The scored targets at each of `rates` that is scored."""
    return [
        t for r in rates if r in SCORED_RATES for t in rate_targets(curves, r)
    ]


def reported(curves: Sequence[Curve], rates: Sequence[str]) -> str:
    """The same figures at the rates that are not scored, as a note."""
    lines = []
    for r in rates:
        if r in SCORED_RATES:
            continue
        for t in rate_targets(curves, r):
            shown = "n/a" if t.measured is None else f"{t.measured:.2f}"
            lines.append(f"{t.name}: {shown} (reported, not scored) - {t.note}")
    return " | ".join(lines)


def _namespace(pid: int) -> str:
    return subprocess.run(
        ["ip", "netns", "identify", str(pid)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


class LinkCounter:
    """Reads the link counters of a running job's emulated hosts (`eth0`
    in the namespace of each worker, by task)."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.namespaces: list[str] = []

    def read(self) -> list[LinkBytes] | None:
        """Each host's bytes so far, by task (None: not every host found)."""
        if len(self.namespaces) < HOSTS:
            workers = self.job.workers()
            if len(workers) < HOSTS:
                return None
            self.namespaces = [_namespace(workers[t].pid) for t in range(HOSTS)]
        out = []
        for ns in self.namespaces:
            shown = subprocess.run(
                ["ip", "-n", ns, "-s", "-j", "link", "show", "eth0"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            stats = json.loads(shown)[0]["stats64"]
            out.append(LinkBytes(stats["tx"]["bytes"], stats["rx"]["bytes"]))
        return out


def run_one(method: str, link_rate: str, plan: Plan) -> Curve:
    """Runs `method` at `link_rate` to its end (or RUN_TIMEOUT_SECONDS,
    then stops it), reading the links as its chief's lines come."""
    args = job_flags(method, link_rate, plan)
    command = " ".join(["python examples/train.py", *args])
    print(f"== {method} at {link_rate}: {command}", flush=True)
    job = Job(args, f"{method} at {link_rate}")
    counter = LinkCounter(job)
    links: dict[int, list[LinkBytes]] = {}
    seen = 0
    give_up = time.monotonic() + RUN_TIMEOUT_SECONDS
    while job.status is None and time.monotonic() < give_up:
        job.pump(0.05)
        for i in range(seen, len(job.lines)):
            text = job.lines[i].text
            if _EVAL.search(text) or _MODEL.search(text):
                found = _read_links(counter)
                if found is not None:
                    links[i] = found
        seen = len(job.lines)
    if job.status is None:
        job.child.stop()
    curve = curve_of(
        method,
        link_rate,
        command,
        job.lines,
        job.started,
        links,
        job.status,
        plan.steps,
    )
    if job.status is None:
        curve.error = f"stopped after {RUN_TIMEOUT_SECONDS} s"
    return curve


def _read_links(counter: LinkCounter) -> list[LinkBytes] | None:
    try:
        return counter.read()
    except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as e:
        print(f"link counters not read: {e}", flush=True)
        return None


def curves_of(run: Run) -> list[Curve]:
    """The curves a record of this benchmark holds (none in others)."""
    return [Curve.from_dict(c) for c in run.meta.get("curves", [])]


def _mib(curve: Curve) -> str:
    counted = curve.bytes_per_host()
    if counted is None:
        return "not counted"
    sent, received = counted
    return (
        f"{max(sent) / 2**20:.1f} MiB sent, {max(received) / 2**20:.1f} MiB "
        "received by the busiest host"
    )


def record(
    curves: Sequence[Curve],
    plan: Plan,
    argv: Sequence[str],
    load: float = 0.0,
) -> Run:
    """The run's record: the curves in its meta, the scored targets;
    `load`: the machine's load average when the runs began."""
    found = targets(curves, plan.rates)
    note = "; ".join(
        f"{c.method} at {c.link_rate}: {_mib(c)}, start-up "
        f"{c.start_seconds or 0:.1f} s" + (f" ({c.error})" if c.error else "")
        for c in curves
    )
    note += (
        ". PowerSGD's elements sent: the job does not report them. "
        "Start-up counts as training time (from the job's start)."
    )
    also = reported(curves, plan.rates)
    if also:
        note += " " + also
    return Run(
        {
            "title": "Held-out accuracy against training time on "
            f"{HOSTS} emulated hosts at {', '.join(plan.rates)}: "
            + ", ".join(plan.methods),
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.node()}, {os.cpu_count()} CPU cores, "
            f"load average {load:.1f} at the start",
            "command": " ".join(["python -m benchmarks.communicate", *argv]),
            "note": note,
            "plan": dataclasses.asdict(plan),
            "curves": [dataclasses.asdict(c) for c in curves],
        },
        {},
        [],
        found,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--output",
        type=pathlib.Path,
        default=None,
        help=f"default: {RECORD} ({SMOKE_RECORD} with --smoke)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"{', '.join(SMOKE.rates)} only, {' and '.join(SMOKE.methods)}, "
        f"{SMOKE.steps} steps: that the group runs, not a measurement",
    )
    args = parser.parse_args(argv)
    plan = SMOKE if args.smoke else Plan()
    output = args.output or (SMOKE_RECORD if args.smoke else RECORD)
    began, load = time.monotonic(), os.getloadavg()[0]
    curves = [
        run_one(method, rate, plan)
        for rate in plan.rates
        for method in plan.methods
    ]
    run = record(curves, plan, list(argv or sys.argv[1:]), load)
    run.write(output)
    for t in run.targets:
        print(f"{'MET' if t.met else 'NOT MET'}: {t.name}: {t.note}")
    print(
        f"{run.meta['note']}\nwrote {output} after "
        f"{time.monotonic() - began:.0f} s"
    )
    return 0 if all(t.met for t in run.targets) else 2


if __name__ == "__main__":
    sys.exit(main())
