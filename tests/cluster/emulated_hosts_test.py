"""Emulated hosts: all-reduces across them are right, their bytes cross the
links as the algorithm says, and nothing is left behind.

Two hosts on 1 Gbit/s links. A collective (two workers, each on its host)
and an in-graph all-reduce (two worker servers on the hosts, the client on
the bridge) each sum S = 8 MiB of float32 per worker. A bandwidth-optimal
all-reduce (both run a ring here) makes each of p hosts send and receive
2(p-1)/p·S = S; each link's counters must show that, plus at most 5% and
TensorFlow's own messages (connection set-up, graphs, group resolution),
which stay under 1 MiB. The sums are checked against numpy.

These tests build namespaces, links and cgroups: they need root on Linux,
which README's test command and CI have.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import emulated_hosts_child as child_lib
from tf_crossdevice import launch
from tf_crossdevice.cluster import _commands, processes, start_local_cluster
from tf_crossdevice.cluster import hosts as hosts_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TIMEOUT = 240  # Seconds, for a step on a loaded machine.
S = child_lib.SIZE * 4
OVERHEAD = 1 << 20


def expected_sum(num_workers: int) -> np.ndarray:
    return sum(
        child_lib.value(t).astype(np.float64) for t in range(num_workers)
    )


def decode(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), np.float32)


def check_ring_bytes(counts: list[hosts_lib.LinkBytes]) -> None:
    for i, c in enumerate(counts):
        for what, n in (("sent", c.sent), ("received", c.received)):
            assert S <= n <= 1.05 * S + OVERHEAD, (
                f"host {i} {what} {n} bytes; a ring all-reduce of {S} bytes "
                f"on 2 hosts moves {S} each way"
            )


@pytest.mark.slow
def test_collective_across_two_hosts_sums_and_moves_s_each_way():
    with hosts_lib.EmulatedHosts(2, "1gbit") as bed:
        envs = launch.tf_config_envs(2, [h.address for h in bed.hosts])
        children = [
            processes.Child(
                bed.command(
                    i,
                    [
                        sys.executable,
                        "-m",
                        "tests.emulated_hosts_child",
                        "collective",
                    ],  # fmt: skip
                ),
                name=f"worker {i}",
                env=env,
                cwd=ROOT,
            )
            for i, env in enumerate(envs)
        ]
        try:
            for c in children:
                assert c.receive(TIMEOUT) == {"reduced": True}
            counts = bed.link_bytes()
            for c in children:
                c.send({"go": True})
            sums = [decode(c.receive(TIMEOUT)["sums"][0]) for c in children]
        finally:
            processes.stop_all(children)
    for got in sums:
        np.testing.assert_array_equal(got, expected_sum(2))
    check_ring_bytes(counts)
    assert hosts_lib.leftovers(os.getpid()) == []


@pytest.mark.slow
def test_in_graph_across_two_hosts_sums_and_moves_s_each_way():
    with (
        hosts_lib.EmulatedHosts(2, "1gbit") as bed,
        start_local_cluster(2, hosts=bed, timeout_seconds=TIMEOUT) as cluster,
    ):
        spec = cluster.cluster_spec.as_dict()
        assert [a.rsplit(":", 1)[0] for a in spec["worker"]] == [
            h.address for h in bed.hosts
        ]
        # The client, on the bridge, as the workers dial it.
        assert spec["localhost"][0].startswith(bed.client_address + ":")
        before = bed.link_bytes()
        client = processes.start_module(
            "tests.emulated_hosts_child",
            "in_graph",
            json.dumps(spec),
            name="client",
            cwd=ROOT,
        )
        with client:
            assert client.receive(TIMEOUT) == {"reduced": True}
            after = bed.link_bytes()
            client.send({"go": True})
            sums = [decode(s) for s in client.receive(TIMEOUT)["sums"]]
    for got in sums:
        np.testing.assert_array_equal(got, expected_sum(2))
    check_ring_bytes(
        [
            hosts_lib.LinkBytes(a.sent - b.sent, a.received - b.received)
            for a, b in zip(after, before, strict=True)
        ]
    )
    assert hosts_lib.leftovers(os.getpid()) == []


def test_everything_is_removed_when_the_block_fails():
    with (  # noqa: PT012
        pytest.raises(ZeroDivisionError),
        hosts_lib.EmulatedHosts(3, "100mbit") as bed,
    ):
        made = hosts_lib.leftovers(os.getpid())
        sleeper = processes.Child(bed.command(2, ["sleep", "600"]))
        1 / 0  # noqa: B018
    # Three namespaces, their links, three cgroups and the bridge.
    assert len(made) == 3 + 3 + 3 + 1, made
    assert sleeper.process.wait(timeout=10) == -9  # Killed.
    assert hosts_lib.leftovers(os.getpid()) == []


def test_everything_is_removed_when_the_process_gets_sigterm():
    # A process that holds hosts and is told to stop (a benchmark run
    # stopped with kill): the block unwinds and removes what it made.
    script = (
        "import time\n"
        "from tf_crossdevice.cluster import hosts\n"
        "with hosts.EmulatedHosts(2, '100mbit'):\n"
        "    print('up', flush=True)\n"
        "    time.sleep(600)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "up\n"
        # Two namespaces, their links, two cgroups and the bridge.
        assert len(hosts_lib.leftovers(child.pid)) == 2 + 2 + 2 + 1
        child.terminate()
        assert child.wait(timeout=60) == 128 + 15
    finally:
        child.kill()
        child.wait()
        left = hosts_lib.leftovers(child.pid)
        hosts_lib.remove_stale()  # Its process is gone: this test's part.
    assert left == []


def test_links_are_shaped_and_cores_shared():
    with hosts_lib.EmulatedHosts(4, "250mbit") as bed:
        for host in bed.hosts:
            tc = _commands.run(["tc", "qdisc", "show", "dev", host.link])
            assert "tbf" in tc and "250Mbit" in tc, tc
            quota = int((host.cgroup / "cpu.cfs_quota_us").read_text())
            period = int((host.cgroup / "cpu.cfs_period_us").read_text())
            assert quota / period == pytest.approx((os.cpu_count() or 1) / 4)
        addresses = [h.address for h in bed.hosts]
        assert len(set(addresses)) == 4
        assert all(a.startswith("198.18.") for a in addresses)
        assert bed.client_address.endswith(".254")


def test_two_sets_of_hosts_coexist_in_one_process():
    ping = [sys.executable, "-c", "print('up')"]
    with (
        hosts_lib.EmulatedHosts(2, "100mbit") as first,
        hosts_lib.EmulatedHosts(1, "100mbit") as second,
    ):
        names = [h.namespace for h in first.hosts + second.hosts]
        assert len(set(names)) == 3, names
        assert first.client_address != second.client_address
        for bed in (first, second):
            for i in range(bed.num_hosts):
                out = subprocess.run(
                    bed.command(i, ping), capture_output=True, timeout=30
                )
                assert out.stdout == b"up\n", out
        made = hosts_lib.leftovers(os.getpid())
        # Three namespaces, their links and cgroups, and two bridges.
        assert len(made) == 3 + 3 + 3 + 2, made
    assert hosts_lib.leftovers(os.getpid()) == []


# On host 1: a connection that starts with b"G" gets SIZE bytes back; one
# that starts with b"P" sends bytes until it shuts its side, and gets b"ok".
TRANSFER_SERVER = """
import socket, sys
size = int(sys.argv[2])
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
while True:
    conn = server.accept()[0]
    with conn:
        if conn.recv(1) == b"G":
            conn.sendall(bytes(size))
        else:
            while conn.recv(1 << 16):
                pass
            conn.sendall(b"ok")
"""
TRANSFER = 256 << 10  # Bytes each way.


def transfer_seconds(address: str, port: int) -> tuple[float, float]:
    """Seconds to fetch TRANSFER bytes from the server, and to send them."""
    with socket.create_connection((address, port), 10) as conn:
        start = time.monotonic()
        conn.sendall(b"G")
        got = 0
        while chunk := conn.recv(1 << 16):
            got += len(chunk)
        assert got == TRANSFER
        fetched = time.monotonic() - start
    with socket.create_connection((address, port), 10) as conn:
        start = time.monotonic()
        conn.sendall(b"P" + bytes(TRANSFER))
        conn.shutdown(socket.SHUT_WR)
        assert conn.recv(2) == b"ok"
        sent = time.monotonic() - start
    return fetched, sent


def test_throttle_slows_a_link_both_ways_until_restored():
    crawl = "2mbit"
    # What TRANSFER takes at the crawl, less what the bucket lets through
    # at once and what the queue holds (a tenth of a second's bytes each).
    least = (TRANSFER - 2 * 25_000) * 8 / hosts_lib.parse_rate(crawl)
    with hosts_lib.EmulatedHosts(2, "1gbit") as bed:
        port = processes.free_ports(1)[0]
        argv = [sys.executable, "-c", TRANSFER_SERVER, str(port)]
        server = processes.Child(
            bed.command(1, [*argv, str(TRANSFER)]), name="server on host 1"
        )
        with server:
            assert server.read_line(timeout=30) == "listening"
            address = bed.hosts[1].address
            before = transfer_seconds(address, port)
            bed.throttle(1, crawl)
            slowed = transfer_seconds(address, port)
            unaffected = _commands.run(
                ["tc", "qdisc", "show", "dev", bed.hosts[0].link]
            )
            bed.restore(1)
            after = transfer_seconds(address, port)
            tc = _commands.run(
                ["tc", "qdisc", "show", "dev", bed.hosts[1].link]
            )
    print(f"fetch, send (s): {before} before, {slowed} slowed, {after} after")
    # Host 1 sends (fetch) and receives (send) at the crawl...
    for seconds in slowed:
        assert least <= seconds <= 10 * least, slowed
    # ...and at full rate before and after; host 0 was never slowed.
    for seconds in (*before, *after):
        assert seconds < least / 4, (before, after)
    assert "1Gbit" in unaffected, unaffected
    assert "1Gbit" in tc, tc
    assert hosts_lib.leftovers(os.getpid()) == []


def test_answering_names_the_hosts_that_reach_the_launcher():
    """A host cut at the bridge, or whose own end of its link is down (as
    a process on it can do), does not answer until it is connected
    again."""
    with hosts_lib.EmulatedHosts(3, "1gbit") as bed:
        assert hosts_lib.answering(bed) == [0, 1, 2]
        bed.cut(1)
        assert hosts_lib.answering(bed, timeout=1) == [0, 2]
        bed.restore(1)
        own_end = ["ip", "-n", bed.hosts[2].namespace, "link", "set", "eth0"]
        _commands.run([*own_end, "down"])
        assert hosts_lib.answering(bed, timeout=1) == [0, 1]
        _commands.run([*own_end, "up"])
        assert hosts_lib.answering(bed) == [0, 1, 2]
        with pytest.raises(ValueError, match="timeout"):
            hosts_lib.answering(bed, timeout=0)
    assert hosts_lib.leftovers(os.getpid()) == []


def test_throttle_names_a_bad_rate_or_index():
    with hosts_lib.EmulatedHosts(2, "100mbit") as bed:
        with pytest.raises(ValueError, match=r"rate: expected .*'1gbit'"):
            bed.throttle(1, "slow")
        with pytest.raises(ValueError, match=r"index: expected"):
            bed.throttle(2, "1mbit")


@pytest.mark.parametrize(
    ("rate", "bits"),
    [("1gbit", 1e9), ("250mbit", 2.5e8), ("100kbit", 1e5), ("10mbps", 8e7)],
)
def test_parse_rate(rate, bits):
    assert hosts_lib.parse_rate(rate) == bits


@pytest.mark.parametrize("rate", ["fast", "1 gigabit", "-1gbit", "0mbit", 1])
def test_bad_rates_name_the_argument_and_the_form(rate):
    with pytest.raises(ValueError, match=r"link_rate: expected .*'1gbit'"):
        hosts_lib.EmulatedHosts(2, rate)


def test_without_root_the_error_says_what_is_needed(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="need root"):
        hosts_lib.EmulatedHosts(2).__enter__()


PEER_CHECK = """
import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
me = config["task"]["index"]
addresses = config["cluster"]["worker"]
host, port = addresses[me].rsplit(":", 1)
server = socket.create_server(("0.0.0.0", int(port)))
peer_host, peer_port = addresses[1 - me].rsplit(":", 1)
for _ in range(200):
    try:
        socket.create_connection((peer_host, int(peer_port)), 1).close()
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit(3)
server.settimeout(30)
server.accept()  # The peer reached this worker too.
print("task", me, "at", host, "reached", peer_host)
"""


def test_launcher_runs_each_worker_on_its_own_host(capfd):
    # Each worker listens on its own address and reaches the other's.
    argv = [sys.executable, "-c", PEER_CHECK]
    assert launch.run_local_job(argv, 2, link_rate="100mbit") == [0, 0]
    lines = sorted(
        line for line in capfd.readouterr().out.splitlines() if "task" in line
    )
    assert len(lines) == 2, lines
    for me, line in enumerate(lines):
        match = re.fullmatch(
            rf"\[worker {me}\] task {me} at (198\.18\.\S+) reached (\S+)",
            line,
        )
        assert match, line
        assert match[1] != match[2] and match[2].startswith("198.18.")
    assert hosts_lib.leftovers(os.getpid()) == []


# A worker of an elastic job (the launcher's --max_restarts) on an emulated
# host: prints its round, task, cluster size and network namespace. In
# round 0 the worker on the third host takes its own end of its link down
# (its host stops answering) and every worker fails; in round 1 they fail
# again after 3 s; in round 2 they succeed.
ELASTIC_WORKER = """
import json, os, subprocess, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]["index"]
size = len(config["cluster"]["worker"])
round = int(os.environ["TF_CROSSDEVICE_RESTART"])
namespace = subprocess.run(
    ["ip", "netns", "identify"], capture_output=True, text=True
).stdout.strip()
print("round", round, "task", task, "of", size, "on", namespace, flush=True)
if round == 0:
    if task == 2:
        subprocess.run(["ip", "link", "set", "eth0", "down"], check=True)
    sys.exit(1)
if round == 1:
    time.sleep(3)
    sys.exit(1)
"""


@pytest.mark.slow
def test_restarts_leave_out_a_host_that_stops_answering_and_take_it_back():
    """`launch --num_workers=2:3 --max_restarts=2`: round 0 loses host 2,
    round 1 runs on hosts 0 and 1 (host 2 is connected again meanwhile),
    round 2 runs on all three."""
    job = processes.Child(
        [
            sys.executable,
            "-m",
            "tf_crossdevice.launch",
            "--num_workers=2:3",
            "--max_restarts=2",
            "--emulate_hosts",
            "--link_rate=100mbit",
            "--",
            sys.executable,
            "-c",
            ELASTIC_WORKER,
        ],  # fmt: skip
        name="launch",
    )
    lines: list[str] = []
    lost = None
    with job:
        while True:
            try:
                line = job.read_line(TIMEOUT)
            except processes.ChildError as e:
                assert e.returncode == 0, (lines, job.stderr_text())
                break
            lines.append(line)
            if found := re.fullmatch(r"\[worker 2\] round 0 .* on (\S+)", line):
                lost = found[1]
            if line.startswith("restart 1:"):
                assert lost, lines
                _commands.run(["ip", "-n", lost, "link", "set", "eth0", "up"])
    restarts = [line for line in lines if line.startswith("restart")]
    assert restarts == [
        "restart 1: 2 workers on hosts 0, 1 (2 does not answer)",
        "restart 2: 3 workers on hosts 0, 1, 2",
    ], lines
    sizes = {
        found.groups()
        for line in lines
        if (
            found := re.match(
                r"\[worker \d\] round (\d) task (\d) of (\d)", line
            )
        )
    }
    assert sizes == {
        ("0", "0", "3"), ("0", "1", "3"), ("0", "2", "3"),
        ("1", "0", "2"), ("1", "1", "2"),
        ("2", "0", "3"), ("2", "1", "3"), ("2", "2", "3"),
    }  # fmt: skip
    assert hosts_lib.leftovers(job.pid) == []


@pytest.mark.slow
def test_a_restart_without_enough_hosts_says_how_many_answered():
    worker = ELASTIC_WORKER.replace("if task == 2:", "if task == 1:")
    with pytest.raises(RuntimeError) as raised:
        launch.run_local_job(
            [sys.executable, "-c", worker],
            2,
            link_rate="100mbit",
            max_restarts=1,
            rendezvous_seconds=2,
            echo=False,
        )
    assert str(raised.value) == (
        "min_workers: 2 hosts needed, 1 answered within 2 s (hosts 0 of 0-1)"
    )
    assert hosts_lib.leftovers(os.getpid()) == []
