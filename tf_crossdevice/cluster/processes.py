"""Starts, talks to, watches and stops child processes: the one process layer.

The cluster launcher, the benchmark and the tests start every child process
through this module, so free ports, the child's environment, its process
group, its stderr, the exit-when-the-parent-goes watch and the teardown are
written once.

Parent side: `Child` (or `start_module`) starts a command in its own process
group with stdin and stdout as pipes and stderr in an anonymous temporary
file (nothing stays on disk, even when the parent is killed). The parent
sends JSON commands with `send` and reads the child's answers with `receive`
(or `poll`, which does not block); `read_line` and `read_all` read plain
stdout lines of a child that does not speak the protocol. `stop` (also at
interpreter exit) closes stdin, sends SIGTERM, waits a grace period and then
SIGKILLs the whole process tree, grandchildren in their own sessions
included.

Child side: `exit_when_parent_goes` ends the child when its launcher is gone;
`commands` yields the parent's JSON commands until end of input; `reply`
answers on stdout with a line starting with `MARK`, so that anything else the
child prints is never mistaken for an answer.

portpicker picks free ports (also free for UDP, never the same one twice in
one process, and it can use a port server where a test farm runs one); psutil
finds the process tree so that `stop` reaches grandchildren that left the
process group (killpg alone misses them).

>>> echo = "from tf_crossdevice.cluster.processes import *\\n" \\
...     "for command in commands(): reply(command)"
>>> child = Child([sys.executable, "-c", echo], name="echo")
>>> child.send({"hello": 1})
>>> child.receive(timeout=60)
{'hello': 1}
>>> child.stop()
>>> child.process.returncode is not None
True
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pathlib
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import IO, Any

import portpicker
import psutil

__all__ = [
    "Child",
    "ChildError",
    "MARK",
    "PARENT_PID_ENV",
    "STOP_GRACE_SECONDS",
    "child_env",
    "commands",
    "exit_when_parent_goes",
    "free_ports",
    "reply",
    "start_module",
    "stop_all",
]

MARK = "@@tf_crossdevice "
# Set by `child_env` to the launcher's pid; read by `exit_when_parent_goes`.
PARENT_PID_ENV = "TF_CROSSDEVICE_PARENT_PID"
STOP_GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.05
_PARENT_POLL_SECONDS = 0.5
_STDERR_TAIL_CHARS = 3000
# How long a child whose stdout ended may take to exit before it is
# reported as alive but silent.
_EXIT_AFTER_EOF_SECONDS = 5.0
# The directory that holds the `tf_crossdevice` package, so that children
# import it even when it is not installed.
_PACKAGE_PARENT = str(pathlib.Path(__file__).absolute().parents[2])


class ChildError(RuntimeError):
    """A child exited, went silent or could not be sent to.

    Attributes:
        returncode: the child's exit status when it exited (negative: the
            signal that killed it), else None.
    """

    def __init__(self, message: str, returncode: int | None = None) -> None:
        super().__init__(message)
        self.returncode = returncode


def free_ports(n: int) -> list[int]:
    """Returns `n` distinct ports that are free right now (TCP and UDP)."""
    ports: list[int] = []
    while len(ports) < n:
        port = portpicker.pick_unused_port()
        if port not in ports:
            ports.append(port)
    return ports


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment as a child should get it.

    The package is importable (an uninstalled checkout works), TensorFlow's
    C++ logging is quieter unless the caller chose a level, gRPC cannot
    share a port between two servers (SO_REUSEPORT would hide a lost port
    race), and the child knows its launcher's pid.

    Args:
        extra: variables to set on top.
    """
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_GRPC_REUSE_PORT", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p
    )
    env[PARENT_PID_ENV] = str(os.getpid())
    env.update(extra or {})
    return env


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class Child:
    """One child process in its own process group.

    Args:
        argv: its command line.
        name: names it in errors (default: argv joined).
        env: variables set on top of `child_env()`.
        cwd: its working directory.

    Raises:
        OSError: the command could not be started.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = name or " ".join(argv)
        # Closed by stop(). Read with os.pread, which leaves alone the offset
        # that the child shares.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=child_env(env),
                cwd=cwd,
                text=True,
                bufsize=1,
                start_new_session=True,  # Its own process group, to kill.
            )
        except BaseException:
            self._stderr.close()
            raise
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._ended = False  # Its stdout reached end of file.
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._read_stdout, daemon=True).start()
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        """CPU seconds (user and system, every thread's) the child and the
        processes it started have used so far; what has exited is not
        counted, and once the child has exited it is nan (its pid may be
        another process's by then)."""
        if self.process.poll() is not None:
            return float("nan")
        total = 0.0
        with contextlib.suppress(psutil.Error):
            for p in [psutil.Process(self.pid), *_tree(self.process)]:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    total += times.user + times.system
        return total

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        with contextlib.suppress(ValueError, OSError):
            for line in self.process.stdout:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def send(self, message: Mapping[str, Any]) -> None:
        """Writes one JSON command line to the child's stdin.

        Raises:
            ChildError: the child is gone.
        """
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except (OSError, ValueError) as e:
            raise ChildError(
                f"{self.name}: cannot send: {e}; {self._stderr_tail()}",
                self.process.poll(),
            ) from e

    def _next_line(self, deadline: float | None) -> str | None:
        """The next stdout line; None if none came by `deadline` (a
        `time.monotonic()` value; None: do not wait).

        Raises:
            ChildError: the child's stdout ended.
        """
        if self._ended:
            raise self._ended_error()
        try:
            if deadline is None:
                line = self._lines.get_nowait()
            else:
                timeout = max(0.0, deadline - time.monotonic())
                line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self._ended = True
            raise self._ended_error()
        return line

    def next_line(self, timeout: float = 0.0) -> str | None:
        """The next line the child printed, or None if none came in time.

        Raises:
            ChildError: the child's stdout ended (nothing left to read).
        """
        return self._next_line(time.monotonic() + timeout if timeout else None)

    def echo(self, prefix: str | None) -> int | None:
        """Prints the lines the child printed since the last call, each
        after `prefix` (None: reads them, prints nothing); once its stdout
        ended, its exit status, and for a status other than 0 a line
        "<prefix>exited with S:" and its stderr's tail, on stderr. None
        while it runs. The launchers echo their workers with it."""
        try:
            line = self.next_line()
            while line is not None:
                if prefix is not None:
                    print(f"{prefix}{line}", flush=True)
                line = self.next_line()
        except ChildError:
            status = self.wait(timeout=60)
            if status != 0 and prefix is not None:
                print(
                    f"{prefix}exited with {status}:\n{self.stderr_text(3000)}",
                    file=sys.stderr,
                    flush=True,
                )
            return status
        return None

    def read_line(self, timeout: float) -> str:
        """The next line the child printed, without its newline.

        Raises:
            ChildError: no line within `timeout` seconds, or the child's
                stdout ended (the message has its exit status and stderr).
        """
        line = self._next_line(time.monotonic() + timeout)
        if line is None:
            raise ChildError(f"{self.name}: no line within {timeout:g} s")
        return line

    def read_all(self, timeout: float) -> list[str]:
        """Every line not read yet, up to the end of the child's stdout.

        For a child that runs to its end (a script whose output is checked).

        Raises:
            ChildError: the child was not done within `timeout` seconds, or
                it exited with a status other than 0.
        """
        deadline = time.monotonic() + timeout
        lines: list[str] = []
        while True:
            try:
                line = self._next_line(deadline)
            except ChildError as e:
                if e.returncode == 0:
                    return lines
                raise
            if line is None:
                raise ChildError(
                    f"{self.name}: not done within {timeout:g} s; "
                    f"{self._stderr_tail()}"
                )
            lines.append(line)

    def receive(self, timeout: float) -> dict[str, Any]:
        """The child's next `reply`; lines without `MARK` are skipped.

        Raises:
            ChildError: no reply within `timeout` seconds, or the child's
                stdout ended (the message has its exit status and stderr).
        """
        deadline = time.monotonic() + timeout
        while True:
            line = self._next_line(deadline)
            if line is None:
                raise ChildError(f"{self.name}: no answer within {timeout:g} s")
            if line.startswith(MARK):
                message: dict[str, Any] = json.loads(line[len(MARK) :])
                return message

    def poll(self) -> dict[str, Any] | None:
        """The child's next `reply` if one has arrived, else None.

        Raises:
            ChildError: the child's stdout ended with no reply left.
        """
        while True:
            line = self._next_line(None)
            if line is None:
                return None
            if line.startswith(MARK):
                message: dict[str, Any] = json.loads(line[len(MARK) :])
                return message

    def wait(self, timeout: float) -> int:
        """Waits for the child to exit; returns its exit status.

        Raises:
            ChildError: it was still running after `timeout` seconds.
        """
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ChildError(
                f"{self.name}: still running after {timeout:g} s"
            ) from None

    def stderr_text(self, limit: int | None = None) -> str:
        """What the child wrote to stderr (the last `limit` chars)."""
        if self._stderr.closed:
            return ""
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        start = 0 if limit is None else max(0, size - limit)
        return os.pread(fd, size - start, start).decode(errors="replace")

    def _stderr_tail(self) -> str:
        tail = self.stderr_text(_STDERR_TAIL_CHARS).strip()
        return "stderr tail:\n" + (tail or "<empty>")

    def _ended_error(self) -> ChildError:
        try:
            code = self.process.wait(timeout=_EXIT_AFTER_EOF_SECONDS)
        except subprocess.TimeoutExpired:
            return ChildError(
                f"{self.name} closed its stdout; {self._stderr_tail()}"
            )
        return ChildError(
            f"{self.name} {_describe_exit(code)}; {self._stderr_tail()}", code
        )

    def kill(self) -> None:
        """SIGKILLs the child's process tree at once and reaps the child.

        Keeps its stderr readable; `stop` still closes it. Does nothing to
        a child that was already reaped.
        """
        # Signal first: end of file on stdin could end it with status 0.
        _signal_tree(self.process, _tree(self.process), signal.SIGKILL)
        _close_stdin(self.process)
        self.process.wait()

    def stop(self, grace_seconds: float = STOP_GRACE_SECONDS) -> None:
        """Stops the child and everything it started; safe to call again.

        Closes its stdin (a protocol child ends its command loop), sends
        SIGTERM to its process group and every descendant, waits up to
        `grace_seconds` for all of them, SIGKILLs what is left and reaps the
        child: afterwards `process.returncode` is set and no descendant
        runs. Runs at interpreter exit if not called before.
        """
        stop_all([self], grace_seconds)

    def _claim_stop(self) -> bool:
        """True for the first caller only."""
        with self._lock:
            if self._stopped:
                return False
            self._stopped = True
        atexit.unregister(self.stop)
        return True

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Child({self.name!r}, pid={self.pid})"


def start_module(
    module: str,
    *args: str,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Child:
    """Starts `python -m module args...` with this interpreter as a `Child`.

    Args:
        module: a module name that the child can import.
        *args: its arguments.
        name: names it in errors (default: the module name).
        env: variables set on top of `child_env()`.
        cwd: its working directory (`python -m` imports from there first).
    """
    return Child(
        [sys.executable, "-m", module, *args],
        name=name or module,
        env=env,
        cwd=cwd,
    )


def stop_all(
    children: Iterable[Child], grace_seconds: float = STOP_GRACE_SECONDS
) -> None:
    """`Child.stop` for several children, sharing one grace period."""
    claimed = [c for c in children if c._claim_stop()]
    trees = []
    for child in claimed:
        _close_stdin(child.process)  # EOF alone ends a protocol child.
        tree = _tree(child.process)
        _signal_tree(child.process, tree, signal.SIGTERM)
        trees.append(tree)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline:
        if all(
            _has_exited(c.process) and not any(map(_is_alive, tree))
            for c, tree in zip(claimed, trees, strict=True)
        ):
            break
        time.sleep(_POLL_SECONDS)
    for child, tree in zip(claimed, trees, strict=True):
        # Also what the child started after the first look.
        tree += _tree(child.process)
        _signal_tree(child.process, tree, signal.SIGKILL)
        child.process.wait()
        child._stderr.close()


def _tree(process: subprocess.Popen[str]) -> list[psutil.Process]:
    """The child's descendants (not the child itself), while it lives."""
    if process.returncode is not None:
        return []
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.Error:
        return []


def _is_alive(process: psutil.Process) -> bool:
    """False once `process` exited, also while it waits to be reaped."""
    try:  # is_running() also says False for a reused pid.
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_tree(
    process: subprocess.Popen[str], tree: list[psutil.Process], sig: int
) -> None:
    # The group only while the child is unreaped (running or zombie): then
    # its pid still names our group and cannot have been reused. psutil
    # checks each descendant's start time, so a reused pid is left alone.
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    for p in tree:
        with contextlib.suppress(psutil.Error):
            p.send_signal(sig)


def _close_stdin(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None and not process.stdin.closed:
        with contextlib.suppress(OSError, ValueError):
            process.stdin.close()


def _has_exited(process: subprocess.Popen[str]) -> bool:
    """True once the process exited, without reaping it (see _signal_tree)."""
    if process.returncode is not None:
        return True
    try:
        info = os.waitid(
            os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT
        )
    except ChildProcessError:
        return True
    return info is not None


# ---- The child's side ------------------------------------------------------

_reply_lock = threading.Lock()


def exit_when_parent_goes(watch_stdin: bool = False) -> None:
    """Starts daemon threads that end this process when its launcher is gone.

    The launcher's pid comes from `child_env` (checked every 0.5 s; it also
    covers a pipe that some other process still holds open). With
    `watch_stdin`, end of file on stdin ends the process at once: the
    launcher holds the write end, and the kernel closes it however the
    launcher dies. Only for children that do not read commands; a protocol
    child's `commands()` ends at end of file instead. Either way the process
    leaves with `os._exit(0)`.

    Does nothing about the parent when the process was not started through
    this module (run by hand).
    """
    # Popped so that a grandchild started by other means does not watch a
    # process that is not its parent.
    raw = os.environ.pop(PARENT_PID_ENV, None)
    if raw is not None:
        parent_pid = int(raw)

        def watch_parent() -> None:
            while os.getppid() == parent_pid:
                time.sleep(_PARENT_POLL_SECONDS)
            os._exit(0)

        threading.Thread(target=watch_parent, daemon=True).start()
    if watch_stdin:

        def watch_pipe(fd: int) -> None:
            # os.read, not sys.stdin: a daemon thread blocked inside a
            # buffered reader can abort interpreter shutdown.
            try:
                while os.read(fd, 4096):
                    pass
            finally:
                os._exit(0)

        threading.Thread(
            target=watch_pipe, args=(sys.stdin.fileno(),), daemon=True
        ).start()


def commands() -> Iterator[dict[str, Any]]:
    """The parent's JSON commands, one per line, until end of input."""
    while True:
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield json.loads(line)


def reply(message: Mapping[str, Any]) -> None:
    """Sends one answer to the parent (a `MARK` line on stdout)."""
    line = MARK + json.dumps(message) + "\n"
    with _reply_lock:
        sys.stdout.write(line)
        sys.stdout.flush()
