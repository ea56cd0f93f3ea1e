"""Every process the benchmark starts, and the ports it picks.

All Popen, signals and ports of the study live here (one module, so that it
can move onto the package's process layer in one step). The benchmark runs
each single-process group in a fresh process (its memory high-water mark
and any crash stay there), the multi-worker sides in processes of their own,
and a plain TCP receiver for the loopback roofline. A parent writes
commands to a child's stdin, one JSON object per line; the child answers on
stdout with lines starting with `MARK` (anything else, TensorFlow's chatter
included, is ignored). A child exits at end of input or when its parent
dies; `Child.stop` kills its process group.

>>> child = Child("echo", [sys.executable, "-c",
...     "import sys; print(sys.argv[1] + sys.stdin.readline(), flush=True)",
...     MARK], child_env({}))
>>> child.send({"hello": 1})
>>> child.receive(timeout=60)
{'hello': 1}
>>> child.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

MARK = "@@benchmarks "
_STOP_GRACE_SECONDS = 5.0
_STDERR_TAIL_CHARS = 3000
# The directory holding the `tf_crossdevice` package, so that children can
# import it even when it is not installed.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ChildError(RuntimeError):
    """A child process failed, answered with an error, or did not answer."""


class Child:
    """One child process speaking the JSON-lines protocol.

    Args:
        name: names the child in errors.
        argv: its command line.
        env: its environment (default: `child_env({})`).
    """

    def __init__(
        self, name: str, argv: list[str], env: dict[str, str] | None = None
    ):
        self.name = name
        # Read with os.pread on failure; nothing stays on disk.
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=child_env({}) if env is None else env,
            text=True,
            bufsize=1,
            start_new_session=True,  # Its own process group, to kill.
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(MARK):
                self._lines.put(json.loads(line[len(MARK) :]))
        self._lines.put(None)

    def send(self, message: dict[str, Any]) -> None:
        """Writes one command line (ChildError: the child is gone)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except OSError as e:
            raise ChildError(
                f"{self.name}: cannot send: {e}; {self.stderr_tail()}"
            ) from e

    def receive(self, timeout: float) -> dict[str, Any]:
        """The child's next answer.

        Raises:
            ChildError: none within `timeout` seconds, or the child exited
                (with its exit status and the tail of its stderr).
        """
        try:
            message = self._lines.get(timeout=timeout)
        except queue.Empty:
            error = f"{self.name}: no answer within {timeout:.0f} s"
            raise ChildError(error) from None
        if message is None:
            self.process.wait()
            code = self.process.returncode
            how = (
                f"was killed by {signal.Signals(-code).name}"
                if code < 0
                else f"exited with code {code}"
            )
            raise ChildError(f"{self.name} {how}; {self.stderr_tail()}")
        return message

    def stderr_tail(self) -> str:
        if self._stderr.closed:
            return "stderr closed"
        fd = self._stderr.fileno()
        size = os.fstat(fd).st_size
        start = max(0, size - _STDERR_TAIL_CHARS)
        text = os.pread(fd, size - start, start).decode(errors="replace")
        return "stderr tail:\n" + (text.strip() or "<empty>")

    def stop(self) -> None:
        """EOF on stdin, SIGTERM, grace period, SIGKILL, reap."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        _signal_group(self.process, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=_STOP_GRACE_SECONDS)
        _signal_group(self.process, signal.SIGKILL)
        self.process.wait()
        self._stderr.close()


class ChildGroup:
    """Children that get every command and answer it once each."""

    def __init__(self, name: str, children: list[Child]):
        self.name, self.children = name, children
        self.dead: str | None = None

    def request(self, message: dict[str, Any], timeout: float) -> list[Any]:
        """Every child's answer to `message`.

        Raises:
            ChildError: a child failed or was too slow (the group is then
                stopped for good), or answered with an error.
        """
        if self.dead is not None:
            raise ChildError(f"{self.name} was stopped earlier: {self.dead}")
        try:
            for child in self.children:
                child.send(message)
            answers = [child.receive(timeout) for child in self.children]
        except ChildError as e:
            self.dead = str(e).splitlines()[0][:200]
            self.stop()
            raise
        errors = [a["error"] for a in answers if a.get("error")]
        if errors:
            raise ChildError(errors[0])
        return answers

    def stop(self) -> None:
        for child in self.children:
            child.stop()


def _signal_group(process: subprocess.Popen[str], sig: int) -> None:
    # Only while unreaped: then the pid still names our process group.
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment, quieter, with the package importable."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p
    )
    env.update(extra)
    return env


def module_argv(module: str, *args: str) -> list[str]:
    """`python -m module args... --parent_pid=<this process>`."""
    return [sys.executable, "-m", module, *args, f"--parent_pid={os.getpid()}"]


# ---- The child's side --------------------------------------------------


def child_start(argv: list[str]) -> dict[str, Any] | None:
    """In a child: watch the parent (`argv[-1]`), return the first command.

    Exits as soon as the parent is gone; None when stdin closes first.
    """
    parent = int(argv[-1].removeprefix("--parent_pid="))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    return next(commands(), None)


def reply(message: dict[str, Any]) -> None:
    """Sends one answer to the parent."""
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


def commands() -> Iterator[dict[str, Any]]:
    """The parent's commands, until end of input."""
    for line in sys.stdin:
        if line.strip():
            yield json.loads(line)


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


# Reads `size` bytes per round and answers each round with one byte; no
# TensorFlow, no numpy. Exits when the connection closes.
_TCP_SINK = """
import socket, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
with socket.create_connection(("127.0.0.1", port)) as s:
    view = memoryview(bytearray(1 << 20))
    while True:
        left = size
        while left:
            got = s.recv_into(view[: min(left, len(view))])
            if not got:
                sys.exit(0)
            left -= got
        s.sendall(b"k")
"""


def start_tcp_sink(
    num_bytes: int, timeout: float = 60.0
) -> tuple[Child, socket.socket]:
    """A receiver process for `num_bytes` rounds, and the socket to it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(timeout)
        port = str(server.getsockname()[1])
        argv = [sys.executable, "-c", _TCP_SINK, port, str(num_bytes)]
        child = Child("TCP sink", argv, child_env({}))
        try:
            connection, _ = server.accept()
        except BaseException:
            child.stop()
            raise
    connection.settimeout(timeout)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return child, connection


@contextlib.contextmanager
def worker_cluster(num_workers: int) -> Iterator[dict[str, Any]]:
    """`num_workers` TensorFlow worker servers (one CPU each): their spec."""
    from tf_crossdevice import cluster

    with cluster.start_local_cluster(num_workers, cpus_per_worker=1) as local:
        yield local.cluster_spec.as_dict()


def tf_config_envs(num_workers: int) -> list[dict[str, str]]:
    """Each task's environment for a TF_CONFIG cluster on free ports."""
    addresses = [f"127.0.0.1:{p}" for p in free_ports(num_workers)]
    envs = []
    for task in range(num_workers):
        tf_config = {
            "cluster": {"worker": addresses},
            "task": {"type": "worker", "index": task},
        }
        env = child_env({"TF_CONFIG": json.dumps(tf_config)})
        env.pop("TF_GRPC_REUSE_PORT", None)
        envs.append(env)
    return envs
