"""Every process the benchmark starts, and the ports it picks.

All Popen, signals and ports of the study live here, so that it can move
onto the package's process layer in one step. A parent writes commands to a
child's stdin, one JSON object per line; the child answers on stdout with
lines starting with `MARK` (anything else, TensorFlow's chatter included,
is ignored). A child exits at end of input or when its parent dies;
`Child.stop` kills its process group.

>>> child = Child("echo", ["-c", "import sys; print(sys.argv[1] + "
...               "sys.stdin.readline(), flush=True)", MARK])
>>> child.send({"hello": 1})
>>> child.receive(timeout=60)
{'hello': 1}
>>> child.stop()
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

MARK = "@@benchmarks "
# The checkout's root: children import `benchmarks` and `tf_crossdevice`
# from it, installed or not.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ChildError(RuntimeError):
    """A child process failed, answered with an error, or did not answer."""


class Child:
    """`python ARGS` in its own process group, speaking JSON lines.

    Args:
        name: names the child in errors.
        args: the interpreter's arguments (`-m module ...`, `-c code ...`).
        env: more environment variables (the child gets this process's,
            quieter, with the checkout on PYTHONPATH).
    """

    def __init__(
        self, name: str, args: list[str], env: dict[str, str] | None = None
    ):
        self.name = name
        environ = dict(os.environ, **(env or {}))
        environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        path = (_ROOT, environ.get("PYTHONPATH"))
        environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        if "TF_CONFIG" in (env or {}):  # a server: its port its own
            environ.pop("TF_GRPC_REUSE_PORT", None)
        else:
            environ.pop("TF_CONFIG", None)
        self.process = subprocess.Popen(
            [sys.executable, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environ,
            text=True,
            start_new_session=True,  # its own process group, to kill
        )
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._stderr: collections.deque[str] = collections.deque(maxlen=30)
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(
            target=self._stderr.extend, args=(self.process.stderr,), daemon=True
        ).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(MARK):
                self._lines.put(json.loads(line[len(MARK) :]))
        self._lines.put(None)

    def _tail(self) -> str:
        return "stderr tail:\n" + ("".join(self._stderr).strip() or "<empty>")

    def send(self, message: dict[str, Any]) -> None:
        """Writes one command line (ChildError: the child is gone)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(message) + "\n")
            self.process.stdin.flush()
        except OSError as e:
            error = f"{self.name}: cannot send: {e}; {self._tail()}"
            raise ChildError(error) from e

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
            code = self.process.wait()
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else ""
            how = how or f"exited with code {code}"
            raise ChildError(f"{self.name} {how}; {self._tail()}")
        return message

    def stop(self) -> None:
        """EOF on stdin, SIGTERM, 5 s, SIGKILL, reap."""
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            # Only while unreaped: then the pid still names our group.
            if self.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)


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


def python_module(name: str, module: str, *args: str, **env: str) -> Child:
    """`python -m module args... --parent_pid=<this process>`."""
    argv = ["-m", module, *args, f"--parent_pid={os.getpid()}"]
    return Child(name, argv, env)


# ---- The child's side ----------------------------------------------------


def serve(argv: list[str], roles: dict[str, Callable[[Any], Any]]) -> int:
    """A child's main: `roles[argv[0]](setup)` answers each command.

    Exits as soon as the parent (`--parent_pid`, last) is gone. The parent's
    first line is the setup; the session's `handle` answers every later
    one (an exception becomes an {"error": ...} answer).
    """
    from tf_crossdevice import _measure

    parent = int(argv[-1].removeprefix("--parent_pid="))

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    commands = (json.loads(line) for line in sys.stdin if line.strip())
    setup = next(commands, None)
    if setup is None:
        return 0
    try:
        session = roles[argv[0]](setup)
    except Exception as e:  # noqa: BLE001 - sent to the parent.
        reply({"error": f"{argv[0]} setup: {type(e).__name__}: {e}"})
        return 1
    reply({"ready": True})
    for command in commands:
        try:
            answer = session.handle(command)
        except Exception as e:  # noqa: BLE001 - sent to the parent.
            answer = {
                "error": f"{type(e).__name__}: {_measure.first_line(str(e))}"
            }
        reply(answer)
    return 0


def reply(message: dict[str, Any]) -> None:
    """Sends one answer to the parent."""
    sys.stdout.write(MARK + json.dumps(message) + "\n")
    sys.stdout.flush()


# ---- Ports, servers -------------------------------------------------------


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports free on 127.0.0.1 right now.

    >>> len(set(free_ports(3)))
    3
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in sockets:  # all held until all are picked: distinct
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


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


def start_tcp_sink(num_bytes: int) -> tuple[Child, socket.socket]:
    """A receiver process for `num_bytes` rounds, and the socket to it."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(60)
        port = str(server.getsockname()[1])
        child = Child("TCP sink", ["-c", _TCP_SINK, port, str(num_bytes)])
        try:
            connection, _ = server.accept()
        except BaseException:
            child.stop()
            raise
    connection.settimeout(60)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return child, connection


@contextlib.contextmanager
def worker_cluster(num_workers: int) -> Iterator[dict[str, Any]]:
    """`num_workers` TensorFlow worker servers (one CPU each): their spec."""
    from tf_crossdevice import cluster

    with cluster.start_local_cluster(num_workers, cpus_per_worker=1) as local:
        yield local.cluster_spec.as_dict()


def tf_config_envs(num_workers: int) -> list[dict[str, str]]:
    """Each task's TF_CONFIG for a cluster on free ports."""
    addresses = [f"127.0.0.1:{p}" for p in free_ports(num_workers)]
    return [
        {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"worker": addresses},
                    "task": {"type": "worker", "index": task},
                }
            )
        }
        for task in range(num_workers)
    ]
