"""The example job through a schedule of faults on 4 emulated hosts.

    python -m benchmarks.faults  # benchmarks/records/faults_4hosts_1gbit.json

One run scores every target of the elastic launcher: examples/train.py on
4 emulated hosts at 1 Gbit/s (an equal share of the cores each) restarted
by its launcher (`--max_restarts`, `--min_workers=3`, `--stall_seconds`),
with `--timeout_seconds=20`, first without faults, then through this
schedule, each fault once the job has trained for `--settle_seconds` after
the previous restart's first step:

1. a worker killed with SIGKILL (task 2);
2. the chief killed with SIGKILL (task 0);
3. host 3's link cut for longer than the timeout: the restart runs on the
   3 hosts that answer, and the link comes back while they train;
4. a worker that dies with SIGSEGV (task 1): the restart takes host 3
   back (a host that comes back).

Every line of the job is timestamped as it arrives. Per fault, the time to
the first step after the restart, by part: detection (the fault to the
launcher's line that a worker exited or stalled), teardown (to the
launcher's "restart k" line: every worker stopped, the hosts probed),
start (to the chief's "restoring" line: processes, TensorFlow, the
strategy and the model), restore (to its "resumed from step" line) and the
first step (to the launcher's "round k: first step done" line). Steps lost
per fault: the chief's finished steps when the fault came (its heartbeat
file) minus the step it resumed from. Goodput: the faulted run's examples
(steps x global batch) over the fault-free run's examples per second
times the faulted run's time, each run timed from its start (start-up
included) to the chief's progress line on the last step. The held-out
accuracy of both runs. Then the two other targets of the same issue: a
stalled collective's report (`benchmarks.stall_job` under the launcher)
and uneven inputs (tests/training/uneven_inputs_test.py, which checks the
three paths' weights against numpy).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import pathlib
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

import psutil

from benchmarks.records import Run, Target
from tf_crossdevice import launch
from tf_crossdevice.cluster import HEARTBEAT_VARIABLE, processes, read_progress

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "train.py"
RECORD = ROOT / "benchmarks" / "records" / "faults_4hosts_1gbit.json"
HOSTS = 4
TIMEOUT_SECONDS = 20
LOG_EVERY = 50
# A global batch that splits over 3 and 4 hosts: the job's steps and data
# stay the same whatever the membership (--rescale=global_batch).
JOB_FLAGS = (
    "--mode=collective",
    # The custom loop: long runs of Keras's fit on 4 hosts x 2 devices have
    # ended in a collective that only some workers entered (not yet
    # understood), which would fail the fault-free run.
    "--loop=custom",
    "--model=cnn",
    f"--num_workers={HOSTS}",
    "--min_workers=3",
    "--link_rate=1gbit",
    "--batch_size=96",
    "--num_examples=16384",
    # Accuracies within a point must be told apart from noise: 8192
    # held-out examples (standard error 0.25 points), and a rate that
    # falls to 0 so each run ends at rest rather than mid-stride.
    "--eval_examples=8192",
    "--lr_schedule=cosine",
    f"--log_every={LOG_EVERY}",
    f"--timeout_seconds={TIMEOUT_SECONDS}",
    "--stall_seconds=60",
)
FAULTS = (
    "worker killed (SIGKILL, task 2)",
    "chief killed (SIGKILL, task 0)",
    f"host 3's link cut for {TIMEOUT_SECONDS + 25} s",
    "worker dies with SIGSEGV (task 1); host 3 is back",
)
PARTS = ("detection", "teardown", "start", "restore", "first step")


@dataclasses.dataclass(frozen=True)
class Line:
    at: float  # time.time() when it arrived
    text: str


class Job:
    """The example job, its lines timestamped as they arrive."""

    def __init__(self, args: Sequence[str], name: str) -> None:
        # One stream: the launcher's notices go to stderr.
        self.child = processes.Child(
            ["bash", "-c", 'exec "$@" 2>&1', name, sys.executable,
             str(TRAIN), *args],
            name=name,
            env={"PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        self.started = time.time()
        self.lines: list[Line] = []
        self.status: int | None = None

    def pump(self, seconds: float) -> None:
        """Reads the lines that come within `seconds`."""
        give_up = time.monotonic() + seconds
        while self.status is None and time.monotonic() < give_up:
            try:
                text = self.child.next_line(timeout=0.05)
            except processes.ChildError:
                self.status = self.child.wait(timeout=120)
                self.ended = time.time()
                return
            if text is not None:
                self.lines.append(Line(time.time(), text))
                print(text, flush=True)

    def wait_for(
        self, pattern: str, after: float, timeout: float = 900
    ) -> Line:
        """The first line after `after` that matches `pattern`."""
        give_up = time.monotonic() + timeout
        while True:
            found = self.find(pattern, after)
            if found is not None:
                return found
            if self.status is not None or time.monotonic() > give_up:
                raise RuntimeError(
                    f"no line matching {pattern!r} after {after:.0f} "
                    f"(job status {self.status})"
                )
            self.pump(0.5)

    def find(self, pattern: str, after: float) -> Line | None:
        return next(
            (
                line
                for line in self.lines
                if line.at >= after and re.search(pattern, line.text)
            ),
            None,
        )

    def workers(self) -> dict[int, psutil.Process]:
        """The running workers by task (the python process, not the shell
        that enters its host)."""
        found = {}
        for p in psutil.Process(self.child.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, KeyError, ValueError):
                if p.name() in ("sh", "bash", "ip", "nsenter"):
                    continue
                env = p.environ()
                task = json.loads(env["TF_CONFIG"])["task"]["index"]
                found[task] = p
        return found

    def finish(self, timeout: float = 3600) -> int:
        give_up = time.monotonic() + timeout
        while self.status is None and time.monotonic() < give_up:
            self.pump(1.0)
        if self.status is None:
            raise RuntimeError(f"the job did not end within {timeout:g} s")
        return self.status

    def trained(self, steps: int) -> float:
        """When the chief's progress line on step `steps` of `steps`
        came."""
        found = self.find(rf"^\[worker 0\] step\s+{steps}/{steps}\s", 0)
        if found is None:
            raise RuntimeError(f"the job has no line on step {steps}")
        return found.at

    def summary(self, key: str) -> str:
        """The value after `key: ` in the chief's closing summary."""
        for line in reversed(self.lines):
            found = re.search(
                rf"\[worker 0\] {re.escape(key)}: (.*)", line.text
            )
            if found:
                return found[1]
        raise RuntimeError(f"the job's summary has no {key!r}")


@dataclasses.dataclass
class Fault:
    name: str
    at: float
    step: int  # The chief's finished steps when it came.
    parts: dict[str, float] = dataclasses.field(default_factory=dict)
    resumed_from: int | None = None
    restart_line: str = ""

    @property
    def lost(self) -> int | None:
        if self.resumed_from is None:
            return None
        return self.step - self.resumed_from

    @property
    def to_first_step(self) -> float:
        return sum(self.parts.values())


def _finished_steps(process: psutil.Process) -> int:
    """The steps a worker has finished (its heartbeat file)."""
    progress = read_progress(process.environ()[HEARTBEAT_VARIABLE])
    if progress.step is None:
        raise RuntimeError("the chief has not finished a step yet")
    return progress.step - 1


def _inject(job: Job, number: int) -> tuple[float, int, Callable[[], None]]:
    """Fault `number` of FAULTS: its time, the chief's finished steps then,
    and what to do once the job trains again (restore a link)."""
    workers = job.workers()
    step = _finished_steps(workers[0])
    nothing: Callable[[], None] = lambda: None  # noqa: E731
    at = time.time()
    if number == 0:
        workers[2].send_signal(signal.SIGKILL)
    elif number == 1:
        workers[0].send_signal(signal.SIGKILL)
    elif number == 2:
        namespace = subprocess.run(
            ["ip", "netns", "identify", str(workers[3].pid)],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        link = ["ip", "-n", namespace, "link", "set", "eth0"]
        subprocess.run([*link, "down"], check=True)
        at = time.time()

        def restore() -> None:
            subprocess.run([*link, "up"], check=True)

        return at, step, restore
    else:
        workers[1].send_signal(signal.SIGSEGV)
    return at, step, nothing


def _measure_restart(job: Job, fault: Fault, restart: int) -> None:
    """Waits for the first step after `fault`'s restart, then reads its
    parts from the job's lines."""
    job.wait_for(rf"^round {restart}: first step done", fault.at)
    fault.parts, fault.resumed_from, fault.restart_line = restart_parts(
        job.lines, fault.at, restart
    )


# The lines that end each part of a restart, in order (PARTS).
_PART_ENDS = (
    r"^\[worker \d\] (exited with|no heartbeat for)",
    r"^restart {restart}: ",
    r"^\[worker 0\] restoring ",
    r"^\[worker 0\] resumed from step (\d+)",
    r"^round {restart}: first step done",
)


def restart_parts(
    lines: Sequence[Line], fault_at: float, restart: int
) -> tuple[dict[str, float], int, str]:
    """A restart's parts (seconds, by PARTS) after a fault at `fault_at`,
    the step it resumed from, and the launcher's restart line.

    >>> lines = [Line(t, text) for t, text in [
    ...     (9.0, "[worker 0] step 100/400 ..."),
    ...     (12.0, "[worker 2] exited with -9:"),
    ...     (15.0, "restart 1: 4 workers on hosts 0, 1, 2, 3"),
    ...     (30.0, "[worker 0] restoring /tmp/job/ckpt-2"),
    ...     (31.5, "[worker 0] resumed from step 100 (/tmp/job/ckpt-2)"),
    ...     (40.0, "round 1: first step done 25.0 s after the workers started"),
    ... ]]
    >>> restart_parts(lines, 10.0, 1)[:2]
    ({'detection': 2.0, 'teardown': 3.0, 'start': 15.0, 'restore': 1.5, \
'first step': 8.5}, 100)
    """
    times = [fault_at]
    found = []
    for pattern in _PART_ENDS:
        pattern = pattern.format(restart=restart)
        line = next(
            (
                x
                for x in lines
                if x.at >= times[-1] and re.search(pattern, x.text)
            ),
            None,
        )
        if line is None:
            raise RuntimeError(f"no line matching {pattern!r} after the fault")
        times.append(line.at)
        found.append(line)
    parts = {
        name: end - begin
        for name, begin, end in zip(PARTS, times[:-1], times[1:], strict=True)
    }
    step = re.search(r"resumed from step (\d+)", found[3].text)
    assert step is not None
    return parts, int(step[1]), found[1].text


def run_faulted(args: Sequence[str], settle: float) -> tuple[Job, list[Fault]]:
    job = Job(args, "faulted job")
    faults: list[Fault] = []
    # The first round: trained `settle` seconds past its first checkpoint.
    ready = job.wait_for(r"^\[worker 0\] checkpoint saved at step", 0)
    after = ready.at
    undo: Callable[[], None] = lambda: None  # noqa: E731
    for number, name in enumerate(FAULTS):
        job.pump(max(0.0, after + settle - time.time()))
        if number == 3:
            undo()  # Host 3's link is back; the next restart takes it.
            job.pump(5.0)
        at, step, undo = _inject(job, number)
        fault = Fault(name, at, step)
        faults.append(fault)
        _measure_restart(job, fault, number + 1)
        after = time.time()
    job.finish()
    return job, faults


def run_fault_free(args: Sequence[str]) -> Job:
    job = Job(args, "fault-free job")
    job.finish()
    return job


def _unscheduled(job: Job, scheduled: int, name: str) -> str:
    """The launcher's restarts of `job` beyond the `scheduled` ones, if
    any, with the step each resumed from."""
    restarts = [
        line.text for line in job.lines if re.match(r"restart \d+:", line.text)
    ]
    extra = restarts[scheduled:]
    if not extra:
        return ""
    resumed = re.findall(
        r"\[worker 0\] restart \d+: \d+ workers, from step (\d+)",
        "\n".join(line.text for line in job.lines),
    )[scheduled:]
    return (
        f"; {name} restarted {len(extra)} time(s) beyond the schedule "
        f"(resumed from step {', '.join(resumed) or '?'}): {'; '.join(extra)}"
    )


def _global_batch(job: Job) -> int:
    for line in job.lines:
        found = re.search(r"global batch (\d+);", line.text)
        if found:
            return int(found[1])
    raise RuntimeError("no global batch line")


def targets(
    free: Job, faulted: Job, faults: list[Fault], steps: int
) -> list[Target]:
    batch = _global_batch(free)
    # Both to the chief's line on the last step: what follows it (the
    # evaluation, the closing check) is not training, and a hang there
    # that the launcher ends with a restart (seen once in a fault-free
    # run) would otherwise count against that run.
    free_time = free.trained(steps) - free.started
    free_rate = steps * batch / free_time
    faulted_time = faulted.trained(steps) - faulted.started
    goodput = steps * batch / (free_rate * faulted_time)
    free_acc = float(free.summary("held-out accuracy").split()[0])
    faulted_acc = float(faulted.summary("held-out accuracy").split()[0])
    lost = [f.lost for f in faults]
    found = [
        Target(
            "fault schedule: the job ends with status 0",
            1.0 if faulted.status == 0 else 0.0, 1.0, faulted.status == 0,
            False,
            f"{len(faults)} faults over {faulted_time:.0f} s: "
            + "; ".join(f"{f.name} -> {f.restart_line}" for f in faults)
            + _unscheduled(free, 0, "the fault-free run")
            + _unscheduled(faulted, len(faults), "the faulted run"),
        ),
        Target(
            "the fault schedule runs over at least 10 minutes "
            "(faulted run's seconds / 600)",
            faulted_time / 600, 1.0, faulted_time >= 600, False,
            f"the last fault came {faults[-1].at - faulted.started:.0f} s "
            f"into a {faulted_time:.0f} s run",
        ),
        Target(
            "goodput (examples / (fault-free examples/s x time))",
            goodput, 0.8, goodput >= 0.8, False,
            f"{steps} steps x {batch} examples in {faulted_time:.0f} s; "
            f"fault-free {free_rate:.1f} examples/s over its whole run "
            f"({free_time:.0f} s to its last step, start-up included)",
        ),
        Target(
            "held-out accuracy within 1 point of the fault-free run "
            "(1 point - |difference|)",
            0.01 - abs(faulted_acc - free_acc), 0.0,
            abs(faulted_acc - free_acc) <= 0.01, False,
            f"faulted {faulted_acc:.3f}, fault-free {free_acc:.3f}",
        ),
        Target(
            f"steps lost per fault <= the checkpoint interval ({LOG_EVERY}) "
            "(interval / most lost)",
            LOG_EVERY / max(max(x for x in lost if x is not None), 1), 1.0,
            all(x is not None and x <= LOG_EVERY for x in lost), False,
            "lost: " + ", ".join(str(x) for x in lost),
        ),
    ]  # fmt: skip
    bound = TIMEOUT_SECONDS + 30
    for f in faults:
        found.append(
            Target(
                f"fault to first step <= timeout + 30 s ({bound} s), "
                f"{f.name} (bound / seconds)",
                bound / f.to_first_step,
                1.0,
                f.to_first_step <= bound,
                False,
                f"{f.to_first_step:.1f} s: "
                + ", ".join(f"{k} {v:.1f} s" for k, v in f.parts.items()),
            )  # fmt: skip
        )
    return found


def stall_target(warning: float = 2.0) -> Target:
    """A collective stalled for 2 x `warning`: the launcher's report must
    name task 1 (the late one) and step 3's second collective within that
    time (benchmarks.stall_job)."""
    with (
        tempfile.TemporaryFile("w+") as out,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
    ):
        launch.run_local_job(
            [sys.executable, "-m", "benchmarks.stall_job", str(2 * warning)],
            2,
            stall_warning_seconds=warning,
            timeout_seconds=300,
        )
        out.seek(0)
        lines = out.read().splitlines()
    reports = [line for line in lines if line.startswith("stall:")]
    waited = (
        float(reports[0].split("no progress for ")[1].split(" s.")[0])
        if reports
        else None
    )
    named = bool(reports) and (
        "Late: worker 1 (step 3, collective 1:" in reports[0]
        and "has not reached step 3, collective 2:" in reports[0]
    )
    met = named and waited is not None and waited < 2 * warning
    return Target(
        "a stalled collective's report names the late task and the "
        "collective within 2 x stall_warning_seconds (2 x warning / seconds)",
        None if waited is None else 2 * warning / waited,
        1.0,
        met,
        False,
        reports[0] if reports else "no report",
    )


# pytest's counts of tests (its summary also counts warnings).
_COUNTS = r"(\d+) (passed|failed|errors?|skipped)"


def uneven_target() -> Target:
    """tests/training/uneven_inputs_test.py: one worker with half the
    data, in fit, a custom loop and in-graph, against numpy."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "no:xdist", "tests/training/uneven_inputs_test.py"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    summary = result.stdout.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    return Target(
        "uneven inputs: weights equal numpy's in fit, a custom loop and "
        "in-graph (tests passed / tests)",
        (int(passed[1]) if passed else 0)
        / max(sum(int(n) for n, _ in re.findall(_COUNTS, summary)), 1),
        1.0, result.returncode == 0, False,
        f"pytest tests/training/uneven_inputs_test.py: {summary}",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=pathlib.Path, default=RECORD)
    parser.add_argument("--steps", type=int, default=11000)
    parser.add_argument("--settle_seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        common = [*JOB_FLAGS, f"--steps={args.steps}"]
        free = run_fault_free(
            [
                *common,
                f"--model_dir={scratch}/free",
                f"--max_restarts={len(FAULTS)}",
            ]
        )
        if free.status != 0:
            raise RuntimeError(f"the fault-free job failed: {free.status}")
        # One restart to spare in each run: a failure outside the schedule
        # is the launcher's to absorb, and the record names it.
        faulted, faults = run_faulted(
            [*common, f"--model_dir={scratch}/faulted",
             f"--max_restarts={len(FAULTS) + 1}"],
            args.settle_seconds,
        )  # fmt: skip
    found = targets(free, faulted, faults, args.steps)
    found += [stall_target(), uneven_target()]
    command = "python -m benchmarks.faults"
    if argv:
        command += " " + " ".join(argv)
    run = Run(
        {
            "title": "The example job through a fault schedule on 4 emulated "
            "hosts at 1gbit; a stalled collective's report; uneven inputs",
            "date": datetime.date.today().isoformat(),
            "machine": platform.node(),
            "command": command,
            "job": " ".join(["python examples/train.py", *JOB_FLAGS]),
            "faults": [dataclasses.asdict(f) for f in faults],
        },
        {},
        [],
        found,
    )
    run.write(args.output)
    for t in found:
        print(f"{'MET' if t.met else 'NOT MET'}: {t.name}: {t.note}")
    print(f"wrote {args.output}")
    return 0 if all(t.met for t in found) else 2


if __name__ == "__main__":
    sys.exit(main())
