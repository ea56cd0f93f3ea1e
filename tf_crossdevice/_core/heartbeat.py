"""A worker's heartbeat: how a launcher tells a stalled job from a slow one,
and which collective a stalled worker waits in.

A worker that hangs (in TensorFlow's abort path after a collective timed
out, say) neither exits nor fails, so a launcher that waits for exits
waits for ever. A launcher that watches for stalls names a file per worker
in the worker's environment (HEARTBEAT_VARIABLE). The worker calls
`heartbeat(step)` after each step; and while a step runs, each collective
the package launches writes, just before it starts and once the worker's
previous collective on that device is done, what it is (`entering`). The
file's modification time says when the worker last made progress; its one
line (`Progress`) says how far it got: the step, the count of collectives
it has entered in that step and the last one's name. When a collective
stalls, the workers that entered it wait in it and the late ones show an
earlier count: the launcher compares them and names both.

After its last step, before work that sends no heartbeats (an evaluation,
a final save), a worker calls `end_heartbeats()`: its file goes, the
launcher stops watching it, and nothing writes it again. Outside such a
launcher, all of this does nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import threading

HEARTBEAT_VARIABLE = "TF_CROSSDEVICE_HEARTBEAT"


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far a worker got: in `step` (None before its first heartbeat:
    the job's first step since it started), it entered `entered`
    collectives, the last named `collective` ('' before any)."""

    step: int | None = None
    entered: int = 0
    collective: str = ""

    def key(self) -> tuple[int, int]:
        """Orders the progress of the workers of one job."""
        return (-1 if self.step is None else self.step, self.entered)

    def describe(self) -> str:
        """'step 58, collective 2: all_reduce ...', for a report."""
        step = "its first step" if self.step is None else f"step {self.step}"
        if not self.entered:
            return f"{step}, before its first collective"
        return f"{step}, collective {self.entered}: {self.collective}"

    def to_line(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_line(cls, line: str) -> Progress:
        """The progress a worker wrote; an empty or partial line (a file
        made by the launcher, or read as it is rewritten) says nothing."""
        try:
            fields = json.loads(line)
            return cls(
                step=fields["step"],
                entered=int(fields["entered"]),
                collective=str(fields["collective"]),
            )
        except (ValueError, KeyError, TypeError):
            return cls()


class _Beats:
    """This process's heartbeats: its progress and its file. Collectives
    enter from TensorFlow's executor threads, steps end on the caller's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._progress = Progress()
        self._beaten = False
        # The file whose watch ended: a later round names a new one.
        self._ended: str | None = None

    @staticmethod
    def path() -> str | None:
        return os.environ.get(HEARTBEAT_VARIABLE) or None

    def step_done(self, step: int | None) -> None:
        with self._lock:
            done = self._progress.step if step is None else step
            after = None if done is None else done + 1
            self._progress = Progress(step=after)
            self._beaten = True
            self._write()

    def entering(self, collective: str) -> None:
        with self._lock:
            self._progress = dataclasses.replace(
                self._progress,
                entered=self._progress.entered + 1,
                collective=collective,
            )
            self._write()

    def end(self) -> None:
        with self._lock:
            path = self._ended = self.path()
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)

    def _write(self) -> None:
        path = self.path()
        if not path or path == self._ended or not os.path.exists(path):
            # Not watched, or no longer: the launcher removes the files
            # with its round.
            return
        # A new file moved over the old one: a reader never sees it half
        # written.
        partial = f"{path}.partial"
        with open(partial, "w") as f:
            f.write(self._progress.to_line())
        os.replace(partial, path)
        if not self._beaten:
            # Before its first heartbeat a worker starts up (builds, traces,
            # restores), for however long: the launcher watches it from
            # its first heartbeat, and reads a time of 0 as none yet.
            os.utime(path, (0, 0))


_BEATS = _Beats()


def watched() -> bool:
    """Whether a launcher watches this process's heartbeats."""
    return _BEATS.path() is not None


def heartbeat(step: int | None = None) -> None:
    """Tells the launcher, if one watches, that this worker finished a step
    (`step`, the job's step number, or None: the one after the last
    heartbeat's); call it once per step (one small file write)."""
    _BEATS.step_done(step)


def entering(collective: str) -> None:
    """Records that this worker enters `collective` (its name, for a
    report), if a launcher watches."""
    _BEATS.entering(collective)


def end_heartbeats() -> None:
    """Tells the launcher, if one watches, that this worker's steps are
    over: it is no longer watched for stalls (and `heartbeat` does nothing
    from then on)."""
    _BEATS.end()


def read_progress(path: str) -> Progress:
    """What the worker whose heartbeat file is `path` wrote last (empty
    `Progress` if nothing, or the file is gone)."""
    try:
        with open(path) as f:
            return Progress.from_line(f.read())
    except FileNotFoundError:
        return Progress()
