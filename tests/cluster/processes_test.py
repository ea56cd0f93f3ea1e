"""Tests for tf_crossdevice.cluster.processes with real child processes.

The child is tests/processes_child.py, which loads the layer without
TensorFlow and starts in a fraction of a second. Every child is stopped at
the end of its test (a `with` block), also on failure.
"""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import sys
import time

import numpy as np
import psutil
import pytest

from tf_crossdevice.cluster import processes as _processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 60  # Seconds; generous on a loaded machine.


def start_child(*args: str) -> _processes.Child:
    return _processes.start_module(
        "tests.processes_child", *args, name="test child", cwd=ROOT
    )


def gone(process: psutil.Process, timeout: float = TIMEOUT) -> bool:
    """Waits until `process` has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if process.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_commands_are_answered_in_order_and_chatter_is_skipped():
    with start_child() as child:
        assert child.poll() is None  # Nothing sent, nothing arrived.
        for value in (1, "two", [3.0, None], {"four": 4}):
            child.send({"echo": value})
        answers = [child.receive(timeout=TIMEOUT) for _ in range(4)]
        assert answers == [
            {"echo": 1},
            {"echo": "two"},
            {"echo": [3.0, None]},
            {"echo": {"four": 4}},
        ]
        child.send({"print": "a plain line"})
        child.send({"echo": 5})
        assert child.read_line(timeout=TIMEOUT) == "a plain line"
        assert child.read_line(timeout=TIMEOUT) == (
            "plain chatter, not an answer"
        )
        assert child.read_line(timeout=TIMEOUT).startswith(_processes.MARK)
    assert child.process.returncode is not None
    child.stop()  # Idempotent.


def test_silence_is_an_error_after_the_timeout():
    with start_child() as child:
        start = time.monotonic()
        with pytest.raises(_processes.ChildError, match="no answer within"):
            child.receive(timeout=0.3)
        assert time.monotonic() - start < 5
        child.send({"echo": "still alive"})
        assert child.receive(timeout=TIMEOUT) == {"echo": "still alive"}


def test_a_child_that_dies_is_reported_with_its_stderr_tail():
    with start_child() as child:
        child.send({"fail": 3, "stderr": "lost the will\nto compute\n"})
        with pytest.raises(_processes.ChildError) as raised:
            child.receive(timeout=TIMEOUT)
        assert raised.value.returncode == 3
        message = str(raised.value)
        assert "test child exited with code 3" in message
        assert "stderr tail:\nlost the will\nto compute" in message
        with pytest.raises(_processes.ChildError, match="code 3"):
            child.poll()  # Stays reported.
        with pytest.raises(_processes.ChildError, match="cannot send"):
            for _ in range(100):  # The pipe may take a write to break.
                child.send({"echo": "anyone?"})


@pytest.mark.parametrize(
    "args", [pytest.param([], id="protocol"), pytest.param(["--worker"])]
)
def test_a_killed_child_is_named_by_its_signal(args):
    with start_child(*args) as child:
        if not args:
            child.send({"echo": 0})
        child.receive(timeout=TIMEOUT)
        # SIGKILL, not the end of stdin that a worker exits 0 on.
        child.kill()
        assert child.process.returncode == -signal.SIGKILL
        with pytest.raises(_processes.ChildError, match="killed by SIGKILL"):
            child.receive(timeout=TIMEOUT)
        child.kill()  # Already reaped: nothing to do.


def test_stop_kills_a_grandchild_that_left_the_process_group():
    with start_child() as child:
        child.send({"spawn_sleeper": True})
        sleeper = psutil.Process(child.receive(timeout=TIMEOUT)["pid"])
        # killpg on the child's group would miss it.
        assert os.getpgid(sleeper.pid) != os.getpgid(child.pid)
        assert sleeper.ppid() == child.pid
        child.stop()
        assert child.process.returncode is not None
        assert gone(sleeper, timeout=5)


def ignore_sigterm_and_block(child: _processes.Child) -> None:
    """Makes `child` deaf to SIGTERM and to the end of its stdin."""
    child.send({"ignore_sigterm": True})
    child.send({"block": True})
    child.receive(timeout=TIMEOUT)
    child.receive(timeout=TIMEOUT)


def test_stop_sigkills_a_child_that_ignores_sigterm():
    with start_child() as child:
        ignore_sigterm_and_block(child)
        start = time.monotonic()
        child.stop(grace_seconds=0.5)
        assert child.process.returncode == -signal.SIGKILL
        assert time.monotonic() - start < 5


def test_stop_all_shares_one_grace_period():
    children = [start_child() for _ in range(3)]
    try:
        for child in children:
            ignore_sigterm_and_block(child)
        start = time.monotonic()
        _processes.stop_all(children, grace_seconds=1.0)
        assert time.monotonic() - start < 2.5  # Not 3 grace periods.
        assert [c.process.returncode for c in children] == [-9] * 3
    finally:
        _processes.stop_all(children)


@pytest.mark.parametrize(
    "args, then",
    [
        # Blocked without reading stdin: only the parent pid watch ends it.
        pytest.param([], {"block": True}, id="parent_pid_watch"),
        # End of file on stdin ends it at once.
        pytest.param(["--worker"], None, id="stdin_watch"),
    ],
)
def test_a_busy_child_exits_when_its_parent_dies(args, then):
    with start_child() as parent:
        parent.send({"start_child": args, "then": then})
        child = psutil.Process(parent.receive(timeout=TIMEOUT)["pid"])
        assert child.ppid() == parent.pid
        environ = child.environ()
        assert environ[_processes.PARENT_PID_ENV] == str(parent.pid)
        parent.process.kill()  # SIGKILL: no cleanup runs in the parent.
        parent.process.wait()
        assert gone(child, timeout=10), child


def test_free_ports_are_distinct_and_bindable():
    ports = _processes.free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_child_env_makes_the_package_importable_and_names_the_parent(
    monkeypatch,
):
    monkeypatch.setenv("TF_GRPC_REUSE_PORT", "1")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    env = _processes.child_env({"EXTRA": "x"})
    first, rest = env["PYTHONPATH"].split(os.pathsep)
    assert rest == "/elsewhere"
    # The folder that holds this checkout's package (Bazel's runfiles hold
    # it through symlinks, so compare the files they lead to).
    package = pathlib.Path(first) / "tf_crossdevice/cluster/processes.py"
    assert package.resolve() == (ROOT / "tf_crossdevice/cluster/processes.py")
    assert env[_processes.PARENT_PID_ENV] == str(os.getpid())
    assert env["TF_CPP_MIN_LOG_LEVEL"] == "2"
    assert "TF_GRPC_REUSE_PORT" not in env
    assert env["EXTRA"] == "x"


def test_a_command_that_cannot_start_raises():
    with pytest.raises(OSError):
        _processes.Child([sys.executable + "-does-not-exist"])


@pytest.mark.parametrize(
    "code, error",
    [
        pytest.param("print('a'); print('b')", None, id="exits_0"),
        pytest.param(
            "print('a'); print('b'); raise SystemExit('bad end')",
            "exited with code 1; stderr tail:\nbad end",
            id="exits_1",
        ),
        pytest.param(
            "print('a'); print('b', flush=True); import time; time.sleep(60)",
            "not done within 0.5 s",
            id="too_slow",
        ),
    ],
)
def test_read_all_returns_the_output_of_a_child_that_succeeded(code, error):
    with _processes.Child([sys.executable, "-c", code], name="script") as c:
        if error is None:
            assert c.read_all(timeout=TIMEOUT) == ["a", "b"]
            assert c.process.returncode == 0
        else:
            timeout = 0.5 if "0.5" in error else TIMEOUT
            with pytest.raises(_processes.ChildError, match=error):
                c.read_all(timeout=timeout)


# The child burns 0.2 s of CPU, the child it starts 0.4 s; both then wait.
def test_cpu_seconds_counts_the_child_and_what_it_started():
    code = (
        "import subprocess, sys, time\n"
        "def burn(seconds):\n"
        "    start = time.process_time()\n"
        "    while time.process_time() - start < seconds:\n"
        "        pass\n"
        "if sys.argv[1:] == ['grandchild']:\n"
        "    burn(0.4)\n"
        "    print('burnt', flush=True)\n"
        "    time.sleep(60)\n"
        "else:\n"
        "    grandchild = subprocess.Popen(\n"
        "        [sys.executable, '-c', CODE, 'grandchild'],\n"
        "        stdout=subprocess.PIPE, text=True)\n"
        "    burn(0.2)\n"
        "    grandchild.stdout.readline()\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    code = f"CODE = {code!r}\n{code}"
    with _processes.Child([sys.executable, "-c", code], name="burner") as c:
        assert c.read_line(timeout=TIMEOUT) == "ready"
        used = c.cpu_seconds()
    # 0.6 s burnt, plus two interpreters' start-up (a few tens of ms each).
    assert 0.6 <= used < 1.2, used
    assert np.isnan(c.cpu_seconds())  # Stopped.
