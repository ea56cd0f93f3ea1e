"""A launcher's watch over its workers' heartbeats: the stall report, and
the stall that ends a round.

Each watched worker gets a heartbeat file (`tf_crossdevice._core.
heartbeat`), which it rewrites after every step and as it enters each
collective. A worker whose file has not changed for `warning_seconds`
makes the watch print one report for that stall, which compares how far
every worker got: in a stalled collective the workers that entered it wait
in it, and the late ones show an earlier collective or step.

    stall: no progress for 4.0 s. Late: worker 1 (step 58, collective 1:
    all_reduce of pack 1 of 2 (5 tensors) in CollectiveAllReduce, instance
    key 9) has not reached step 58, collective 2: all_reduce of pack 2 of 2
    (3 tensors) in CollectiveAllReduce, instance key 10, where worker 0
    waits.

One whose file has not changed for `stall_seconds` ends the round (it
neither exits nor fails by itself, as in TensorFlow's abort path).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping

import psutil

from tf_crossdevice._core.heartbeat import (
    HEARTBEAT_VARIABLE,
    Progress,
    read_progress,
)
from tf_crossdevice.cluster import processes

# How long a stalled worker has to print its stacks before it is stopped.
_STACKS_SECONDS = 2.0


class HeartbeatWatch:
    """The heartbeat files of one round's workers, by task.

    Args:
        stall_seconds: a worker without progress for this long stalls its
            round (`stalled`); None: never.
        warning_seconds: a worker without progress for this long makes the
            stall report; None: none.
    """

    def __init__(
        self, stall_seconds: float | None, warning_seconds: float | None
    ) -> None:
        self.stall_seconds = stall_seconds
        self.warning_seconds = warning_seconds
        self._folder: str | None = None
        self._files: dict[int, str] = {}
        self._reported = False

    @property
    def watching(self) -> bool:
        return bool(self._limits())

    def env(self, task: int) -> dict[str, str]:
        """What to add to worker `task`'s environment: its file's name (a
        new, empty file, time 0: no heartbeat yet), if anything is
        watched."""
        if not self.watching:
            return {}
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="tf_crossdevice_heartbeats_")
        path = self._files[task] = os.path.join(self._folder, f"worker{task}")
        open(path, "w").close()  # noqa: SIM115 (only created)
        os.utime(path, (0, 0))
        return {HEARTBEAT_VARIABLE: path}

    def stalled(self, ended: Mapping[int, int]) -> int | None:
        """The first running worker without progress for `stall_seconds`;
        prints the stall report first, once per stall, when one has been
        without progress for `warning_seconds`. A worker that has sent no
        heartbeat yet is still starting, and one whose file is gone has
        ended its heartbeats."""
        quiet = self._quiet_for(ended)
        if not quiet:
            self._reported = False
            return None
        longest = max(quiet.values())
        if (
            self.warning_seconds is not None
            and longest > self.warning_seconds
            and not self._reported
        ):
            self._reported = True
            progress = {
                t: read_progress(p)
                for t, p in self._files.items()
                if t not in ended
            }
            print(stall_report(progress, longest), file=sys.stderr, flush=True)
        if self.stall_seconds is None:
            return None
        over = [t for t, q in quiet.items() if q > self.stall_seconds]
        return over[0] if over else None

    @staticmethod
    def print_stacks(child: processes.Child, task: int) -> None:
        """Worker `task`'s Python stacks, on stderr, before it is stopped
        for a stall: each Python process of `child` is sent SIGUSR1, and
        one that registered `faulthandler` for it (the example job does)
        prints every thread's stack, where a hang outside any collective
        waits. One that did not dies of it, a moment before the launcher
        would stop it."""
        before = len(child.stderr_text())
        for process in _python_processes(child.pid):
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGUSR1)
        time.sleep(_STACKS_SECONDS)
        stacks = child.stderr_text()[before:].strip()
        if stacks:
            print(
                f"[worker {task}] its Python threads when it stalled:\n"
                f"{stacks}",
                file=sys.stderr,
                flush=True,
            )

    def first_step(self) -> float | None:
        """When (time.time()) a worker of the round first sent a heartbeat:
        its first step since it started; None before that."""
        beats = []
        for path in self._files.values():
            with contextlib.suppress(FileNotFoundError):
                beats.append(os.stat(path).st_mtime)
        started = [b for b in beats if b]
        return min(started) if started else None

    def _quiet_for(self, ended: Mapping[int, int]) -> dict[int, float]:
        """For each running worker watched, the seconds since its last
        progress, if it is more than the least limit."""
        limits = self._limits()
        if not limits:
            return {}
        now = time.time()
        quiet = {}
        for task, path in self._files.items():
            if task in ended:
                continue
            with contextlib.suppress(FileNotFoundError):
                beat = os.stat(path).st_mtime
                if beat and now - beat > min(limits):
                    quiet[task] = now - beat
        return quiet

    def _limits(self) -> list[float]:
        both = (self.stall_seconds, self.warning_seconds)
        return [s for s in both if s is not None]

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        self._files = {}


def stall_report(progress: Mapping[int, Progress], waited: float) -> str:
    """The stall report for workers (by task) that got as far as
    `progress` and have made none for `waited` seconds.

    >>> ahead = Progress(58, 2, "all_reduce of pack 2 of 2 (3 tensors)")
    >>> print(stall_report({0: ahead, 1: Progress(58, 1, "all_reduce "
    ...     "of pack 1 of 2 (5 tensors)")}, 4.0))
    stall: no progress for 4.0 s. Late: worker 1 (step 58, collective 1: \
all_reduce of pack 1 of 2 (5 tensors)) has not reached step 58, collective \
2: all_reduce of pack 2 of 2 (3 tensors), where worker 0 waits.
    """
    head = f"stall: no progress for {waited:.1f} s."
    known = {t: p for t, p in progress.items() if p.step is not None}
    if not known:
        return f"{head} No worker has finished a step since it started."
    ahead = max(p.key() for p in known.values())
    leaders = sorted(t for t, p in known.items() if p.key() == ahead)
    late = sorted(t for t in progress if t not in leaders)
    where = known[leaders[0]].describe()
    if not late:
        return (
            f"{head} Every worker is at {where}: none is late, so a link or "
            "a worker is slow (each worker's own stall report names its "
            "slow or unreachable peers)."
        )
    named = "; ".join(f"worker {t} ({progress[t].describe()})" for t in late)
    has = "has" if len(late) == 1 else "have"
    wait = "waits" if len(leaders) == 1 else "wait"
    return (
        f"{head} Late: {named} {has} not reached {where}, where "
        f"{_workers(leaders)} {wait}."
    )


def _workers(tasks: list[int]) -> str:
    if len(tasks) == 1:
        return f"worker {tasks[0]}"
    return "workers " + ", ".join(str(t) for t in tasks)


def _python_processes(pid: int) -> list[psutil.Process]:
    """`pid` and its descendants that run Python (not the shell or the
    wrapper that enters an emulated host)."""
    found = []
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error, OSError):
                # The executable, not the name: absl renames a process
                # after its script ("train.py").
                if "python" in os.path.basename(process.exe()).lower():
                    found.append(process)
    return found
