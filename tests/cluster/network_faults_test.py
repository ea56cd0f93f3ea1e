"""Network faults between emulated hosts: a cut link blocks both ways and
heals; a collective names the host cut off for longer than its timeout and
rides out a shorter outage.

Workers are tests/network_faults_child.py, one per emulated host (1 Gbit/s
links), all-reducing a vector step after step with CollectiveAllReduce
inside `tf_crossdevice.reporting_unreachable_peers`. Sums are checked
against numpy. After each test no process, namespace, link or cgroup of it
remains. These tests build namespaces: they need root on Linux, which
README's test command and CI have.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tests import network_faults_child as child_lib
from tf_crossdevice import launch
from tf_crossdevice.cluster import hosts as hosts_lib
from tf_crossdevice.cluster import processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
STARTUP = 240  # Seconds for both workers' first steps on a loaded machine.
# A cut longer than timeout_seconds (T): each worker must fail within T
# plus this margin (the probe's second, the error's way back, a loaded
# machine).
TIMEOUT = 8
MARGIN = 15
# An outage shorter than a generous T: the steps must carry on.
OUTAGE = 2.0
OUTAGE_TIMEOUT = 20
# Steps reported to have finished within this long after the cut may have
# sent their last bytes before it.
IN_FLIGHT = 0.5

SERVE = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
while True:
    server.accept()[0].close()
"""
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()
except OSError:
    sys.exit(1)
"""


def connects(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), 1).close()
        return True
    except OSError:
        return False


def host_connects(bed: hosts_lib.EmulatedHosts, i: int, port: int) -> bool:
    """Whether host `i` reaches the bridge's address at `port`."""
    argv = [sys.executable, "-c", CONNECT, bed.client_address, str(port)]
    return subprocess.run(bed.command(i, argv), timeout=30).returncode == 0


def test_a_cut_link_blocks_both_ways_until_restored():
    with (
        hosts_lib.EmulatedHosts(2, "100mbit") as bed,
        socket.create_server((bed.client_address, 0)) as root_server,
    ):
        root_port = root_server.getsockname()[1]
        host_port = processes.free_ports(1)[0]
        server = processes.Child(
            bed.command(1, [sys.executable, "-c", SERVE, str(host_port)]),
            name="server on host 1",
        )
        with server:
            assert server.read_line(timeout=30) == "listening"
            address = bed.hosts[1].address

            def both_ways() -> tuple[bool, bool]:
                return (
                    connects(address, host_port),
                    host_connects(bed, 1, root_port),
                )

            assert both_ways() == (True, True)
            bed.cut(1)
            bed.cut(1)  # Cutting a cut host does nothing.
            assert both_ways() == (False, False)
            assert host_connects(bed, 0, root_port)  # Host 0 is unaffected.
            bed.restore(1)
            deadline = time.monotonic() + 10
            while both_ways() != (True, True):
                assert time.monotonic() < deadline, both_ways()
                time.sleep(0.2)
            tc = hosts_lib._run(
                ["tc", "qdisc", "show", "dev", bed.hosts[1].link]
            )
            assert "tbf" in tc and "100Mbit" in tc, tc  # Still shaped.
    assert hosts_lib.leftovers(os.getpid()) == []


@pytest.mark.parametrize("index", [2, -1])
def test_cut_names_a_bad_index(index):
    with hosts_lib.EmulatedHosts(2, "100mbit") as bed:
        with pytest.raises(ValueError, match=r"index: expected"):
            bed.cut(index)
        with pytest.raises(ValueError, match=r"index: expected"):
            bed.restore(index)


def expected_sum() -> np.ndarray:
    return child_lib.value(0) + child_lib.value(1)


@contextlib.contextmanager
def looping_workers(
    bed: hosts_lib.EmulatedHosts, timeout: float
) -> Iterator[tuple[list[processes.Child], list[str]]]:
    """Both workers all-reducing; yields them and their addresses, after
    each has finished 3 steps with the right sums."""
    envs = launch.tf_config_envs(2, [h.address for h in bed.hosts])
    addresses = json.loads(envs[0]["TF_CONFIG"])["cluster"]["worker"]
    argv = [sys.executable, "-m", "tests.network_faults_child", str(timeout)]
    children = [
        processes.Child(
            bed.command(i, argv), name=f"worker {i}", env=env, cwd=ROOT
        )
        for i, env in enumerate(envs)
    ]
    try:
        for child in children:
            for reply in steps_until(child, lambda r: r["steps"] >= 3):
                check_sum(reply)
        yield children, addresses
    finally:
        processes.stop_all(children)


def steps_until(child: processes.Child, done) -> list[dict]:
    replies = [child.receive(STARTUP)]
    while not done(replies[-1]):
        assert "steps" in replies[-1], replies[-1]
        replies.append(child.receive(STARTUP))
    return replies


def check_sum(reply: dict) -> None:
    assert "steps" in reply, reply
    got = np.frombuffer(base64.b64decode(reply["sum"]), np.float32)
    np.testing.assert_array_equal(got, expected_sum())


@pytest.mark.slow
def test_a_host_cut_off_past_the_timeout_is_named_by_the_others():
    with (
        hosts_lib.EmulatedHosts(2, "1gbit") as bed,
        looping_workers(bed, TIMEOUT) as (children, addresses),
    ):
        cut_at = time.time()
        bed.cut(1)
        failures = []
        for child in children:
            replies = steps_until(child, lambda r: "error" in r)
            for reply in replies[:-1]:  # Steps that ended before the cut.
                check_sum(reply)
                assert reply["time"] <= cut_at + IN_FLIGHT, reply["time"]
            failures.append(replies[-1])
            assert child.wait(timeout=30) == 2, child.stderr_text(3000)
    worker_0, worker_1 = failures
    # Worker 0 names task 1, which it cannot reach, and its address.
    assert worker_0["error"] == "DeadlineExceededError", worker_0
    assert (
        f"tasks not reachable: /job:worker/replica:0/task:1 ({addresses[1]})"
        in worker_0["message"]
    ), worker_0
    # The cut host cannot reach anyone either; TensorFlow may see that as
    # a refused connection before the timeout.
    assert worker_1["error"] in (
        "DeadlineExceededError",
        "UnavailableError",
    ), worker_1
    assert (
        f"tasks not reachable: /job:worker/replica:0/task:0 ({addresses[0]})"
        in worker_1["message"]
    ), worker_1
    took = [f["time"] - cut_at for f in failures]
    for i, (failure, seconds) in enumerate(zip(failures, took, strict=True)):
        print(f"worker {i}: {failure['error']} {seconds:.1f} s after the cut")
    assert TIMEOUT - 1 <= took[0] <= TIMEOUT + MARGIN, took
    assert took[1] <= TIMEOUT + MARGIN, took
    assert hosts_lib.leftovers(os.getpid()) == []


@pytest.mark.slow
def test_an_outage_shorter_than_the_timeout_delays_the_steps():
    with (
        hosts_lib.EmulatedHosts(2, "1gbit") as bed,
        looping_workers(bed, OUTAGE_TIMEOUT) as (children, _),
    ):
        cut_at = time.time()
        bed.cut(1)
        time.sleep(OUTAGE)
        bed.restore(1)
        restored_at = time.time()
        resumed = []
        for child in children:
            # Until 3 steps have ended after the link came back.
            after: list[dict] = []

            def three_after(reply, after=after) -> bool:
                if reply.get("time", 0) > restored_at:
                    after.append(reply)
                return len(after) >= 3

            replies = steps_until(child, three_after)
            for reply in replies:
                check_sum(reply)
            during = [
                r["steps"]
                for r in replies
                if cut_at + IN_FLIGHT < r["time"] < restored_at
            ]
            assert not during, f"steps ended while the link was down: {during}"
            resumed.append(after[0]["time"] - restored_at)
    print(f"first step after the outage ended {max(resumed):.1f} s after it")
    assert max(resumed) <= 10, resumed
    assert hosts_lib.leftovers(os.getpid()) == []
