"""Tests of the multi-machine launcher (`cluster.run_host_agent`): agents
meet on a private etcd server, each in its own thread (or process, for the
host that is lost), and run TensorFlow-free children on 127.0.0.1."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures

import pytest

from tf_crossdevice import cluster
from tf_crossdevice.cluster import processes

# Short waits, so that the file runs in seconds (etcd's least lease is 2 s;
# 3 leaves a busy machine time to renew it).
FAST = {
    "lease_seconds": 3,
    "last_call_seconds": 1.0,
    "rendezvous_seconds": 20.0,
    "grace_seconds": 1.0,
    "timeout_seconds": 45.0,
}


@pytest.fixture
def etcd() -> Iterator[str]:
    """A private etcd server on free ports of 127.0.0.1, its data in a
    temporary folder; its client address. Stopped and removed after the
    test, also when it fails."""
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip(
            "no etcd on PATH; scripts/etcd.sh installs Debian's etcd-server"
        )
    pytest.importorskip("etcd3gw", reason="the `elastic` extra is missing")
    folder = tempfile.mkdtemp(prefix="tf_crossdevice_etcd_")
    client, peer = processes.free_ports(2)
    peer_url = f"http://127.0.0.1:{peer}"
    client_url = f"http://127.0.0.1:{client}"
    server = None
    try:
        server = processes.Child(
            [
                binary,
                "--name=test",
                f"--data-dir={folder}/data",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                "--logger=zap",
                "--log-level=error",
            ],
            name="etcd",
        )
        give_up = time.monotonic() + 30
        while not healthy(client_url):
            if server.process.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError(
                    f"etcd did not start: {server.stderr_text()}"
                )
            time.sleep(0.1)
        yield f"127.0.0.1:{client}"
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
            return json.load(answer).get("health") == "true"
    except OSError:
        return False


def addresses(n: int) -> list[str]:
    return [f"127.0.0.1:{p}" for p in processes.free_ports(n)]


def agents(
    argv: list[str], etcd: str, job: str, hosts: list[str], **kwargs
) -> list[futures.Future]:
    """Starts one agent per address of `hosts`, each in its own thread."""
    pool = futures.ThreadPoolExecutor(len(hosts))
    running = [
        pool.submit(
            cluster.run_host_agent,
            argv,
            rendezvous=f"etcd://{etcd}/{job}",
            address=host,
            **{**FAST, **kwargs},
        )
        for host in hosts
    ]
    pool.shutdown(wait=False)
    return running


def results(running: list[futures.Future]) -> list[int]:
    return [f.result(timeout=90) for f in running]


def keys(etcd: str, prefix: str) -> list[str]:
    """The keys under `prefix` on the etcd server at `etcd`."""
    import etcd3gw

    host, port = etcd.split(":")
    found = etcd3gw.Etcd3Client(host, int(port)).get_prefix(prefix)
    return [meta["key"].decode() for _, meta in found]


# Prints its round, its task, and its cluster (JSON).
PRINTING = """
import json, os, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]["index"]
round = int(os.environ["TF_CROSSDEVICE_RESTART"])
print("round", round, "task", task, json.dumps(config["cluster"]), flush=True)
"""

# In the rounds before argv[1], task 1 exits with status 3: after argv[2]
# seconds if given, or once the file argv[2] exists.
CHILD = (
    PRINTING
    + """
if round < int(sys.argv[1]) and task == 1:
    if len(sys.argv) > 2:
        if sys.argv[2].replace(".", "").isdigit():
            time.sleep(float(sys.argv[2]))
        else:
            while not os.path.exists(sys.argv[2]):
                time.sleep(0.05)
    sys.exit(3)
"""
)


def rounds(out: str) -> list[tuple[int, int, list[str]]]:
    """(round, task, cluster's workers) of each line CHILD printed."""
    found = []
    for line in out.splitlines():
        if line.startswith("[worker") and " round " in line:
            words = line.split(" ", 6)
            cluster_spec = json.loads(words[6])
            found.append((int(words[3]), int(words[5]), cluster_spec["worker"]))
    return sorted(found)


def test_two_hosts_run_one_cluster_with_distinct_tasks(etcd, capsys):
    hosts = addresses(2)
    argv = [sys.executable, "-c", CHILD, "0"]
    codes = results(
        agents(argv, etcd, "two", hosts, min_workers=2, max_workers=2)
    )
    assert codes == [0, 0]
    out = capsys.readouterr().out
    assert rounds(out) == [(0, 0, sorted(hosts)), (0, 1, sorted(hosts))]
    assert "restart" not in out
    # Each agent revoked its lease on leaving: no join key is left.
    assert not [k for k in keys(etcd, "/tf_crossdevice/two/") if "joined" in k]
    # The job ended; its id cannot start another.
    with pytest.raises(RuntimeError, match="a new job needs a new job id"):
        cluster.run_host_agent(
            argv,
            rendezvous=f"etcd://{etcd}/two",
            address=hosts[0],
            min_workers=1,
            max_workers=2,
            **FAST,
        )


def test_a_failed_round_restarts_on_every_host(etcd, capsys):
    hosts = addresses(2)
    codes = results(
        agents(
            [sys.executable, "-c", CHILD, "1"],
            etcd,
            "restart",
            hosts,
            min_workers=2,
            max_workers=2,
            max_restarts=1,
        )
    )
    assert codes == [0, 0]
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines.count("restart 1: 2 workers") == 2, lines
    assert [(r, t) for r, t, _ in rounds(captured.out)] == [
        (0, 0), (0, 1), (1, 0), (1, 1)
    ]  # fmt: skip
    failed = sorted(hosts)[1]  # Task 1.
    assert f"round 0 failed: {failed}: exited with 3" in captured.err


def test_without_restarts_every_host_returns_the_failed_status(etcd, capsys):
    hosts = addresses(2)
    codes = results(
        agents(
            [sys.executable, "-c", CHILD, "1", "0.5"],
            etcd,
            "fail",
            hosts,
            min_workers=2,
            max_workers=2,
        )
    )
    assert codes == [3, 3]
    assert "restart" not in capsys.readouterr().out


# Writes a heartbeat (as tf_crossdevice.cluster.heartbeat does) every 0.1 s
# for 2 s; in round 0 task 1 beats once and then hangs.
HANGING = (
    PRINTING
    + """
from tf_crossdevice._core import heartbeat
for step in range(20):
    heartbeat.heartbeat(step)
    if round == 0 and task == 1:
        time.sleep(3600)
    time.sleep(0.1)
"""
)


def test_a_hung_worker_fails_its_round_after_stall_seconds(etcd, capsys):
    hosts = addresses(2)
    codes = results(
        agents(
            [sys.executable, "-c", HANGING],
            etcd,
            "hung",
            hosts,
            min_workers=2,
            max_workers=2,
            max_restarts=1,
            stall_seconds=2.0,
        )
    )
    assert codes == [0, 0]
    captured = capsys.readouterr()
    assert captured.out.splitlines().count("restart 1: 2 workers") == 2
    hung = sorted(hosts)[1]  # Task 1.
    assert (
        f"round 0 failed: {hung}: no heartbeat for 2 s (stall_seconds)"
    ) in captured.err


# An agent as a program, as on a host of its own (its status on the last
# line); its arguments are JSON.
AGENT = """
import json, sys
from tf_crossdevice.cluster import run_host_agent
argv, kwargs = json.loads(sys.argv[1])
print("agent status", run_host_agent(argv, **kwargs), flush=True)
"""


def test_a_lost_host_is_left_out_of_the_next_round(etcd, capsys):
    survivor, victim = addresses(2)
    # Every task sleeps in round 0 until stopped, and ends in round 1.
    argv = [sys.executable, "-c", PRINTING + "time.sleep(120 * (round == 0))"]
    common = {
        "rendezvous": f"etcd://{etcd}/lost",
        "min_workers": 1,
        "max_workers": 2,
        "max_restarts": 1,
        **FAST,
        # Round 0 closes when both joined; round 1 as soon as every host of
        # round 0 that is alive has joined again (not after the last call).
        "last_call_seconds": 60.0,
    }
    lost = processes.Child(
        [
            sys.executable,
            "-c",
            AGENT,
            json.dumps([argv, {**common, "address": victim}]),
        ],  # fmt: skip
        name="lost agent",
    )
    with lost:
        running = agents(argv, etcd, "lost", [survivor], **{
            k: v for k, v in common.items() if k != "rendezvous"
        })  # fmt: skip
        assert lost.read_line(timeout=60).startswith("[worker ")
        start = time.monotonic()
        lost.kill()  # The host, its agent and its worker, are gone.
        assert results(running) == [0]
    assert time.monotonic() - start < 20  # Lease 3 s, grace 1 s.
    captured = capsys.readouterr()
    assert "restart 1: 1 workers" in captured.out.splitlines()
    assert (1, 0, [survivor]) in rounds(captured.out)
    assert f"round 0 failed: {victim}: lost" in captured.err


def test_a_late_host_is_admitted_at_the_next_restart(etcd, capsys, tmp_path):
    early = addresses(2)
    late = addresses(1)
    release = tmp_path / "release"
    argv = [sys.executable, "-c", CHILD, "1", str(release)]
    kwargs = {"min_workers": 2, "max_workers": 3, "max_restarts": 1}
    running = agents(argv, etcd, "late", early, **kwargs)
    # Round 0 runs on the early hosts (2 of at most 3, after the last call).
    wait_for(
        lambda: (
            "/tf_crossdevice/late/round/0/members"
            in keys(etcd, "/tf_crossdevice/late/round/0/")
        )
    )
    running += agents(argv, etcd, "late", late, **kwargs)
    wait_for(
        lambda: (
            f"/tf_crossdevice/late/round/1/joined/{late[0]}"
            in keys(etcd, "/tf_crossdevice/late/round/1/")
        )
    )
    release.touch()  # Task 1 of round 0 fails now.
    assert results(running) == [0, 0, 0]
    out = capsys.readouterr().out
    assert (
        f"round 0 closed without {late[0]} (at most 3 hosts): waiting for "
        "the next one"
    ) in out.splitlines()
    assert out.splitlines().count("restart 1: 3 workers") == 3
    everyone = sorted(early + late)
    assert rounds(out) == [
        (0, 0, sorted(early)),
        (0, 1, sorted(early)),
        (1, 0, everyone),
        (1, 1, everyone),
        (1, 2, everyone),
    ]


def wait_for(condition, timeout: float = 30.0) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.1)


def test_too_few_hosts_is_an_error_that_says_who_joined_where(etcd):
    (host,) = addresses(1)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as raised:
        cluster.run_host_agent(
            [sys.executable, "-c", "pass"],
            rendezvous=f"etcd://{etcd}/few",
            address=host,
            min_workers=2,
            max_workers=2,
            **{**FAST, "rendezvous_seconds": 1.0},
        )
    assert str(raised.value) == (
        f"min_workers: 2 hosts needed, 1 joined within 1 s ({host}) at etcd "
        f"{etcd} job 'few'; start a launcher on more hosts, or lower "
        "min_workers"
    )
    assert time.monotonic() - start < 10
    assert keys(etcd, "/tf_crossdevice/few/") == []  # Its join key went.


def test_an_unreachable_etcd_is_an_error_that_names_it():
    (port,) = processes.free_ports(1)
    with pytest.raises(RuntimeError, match=f"etcd 127.0.0.1:{port} job 'j'"):
        cluster.run_host_agent(
            ["true"],
            rendezvous=f"etcd://127.0.0.1:{port}/j",
            address="127.0.0.1:2222",
            min_workers=1,
            max_workers=1,
            lease_seconds=2,
        )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"rendezvous": "127.0.0.1:2379/j"},
            ValueError,
            "rendezvous: expected",
        ),
        ({"rendezvous": "etcd://h:2379/"}, ValueError, "rendezvous: expected"),
        ({"address": "host"}, ValueError, "address: expected HOST:PORT"),
        ({"min_workers": 3}, ValueError, "min_workers: 3 is more than"),
        ({"max_workers": 0}, ValueError, "max_workers"),
        ({"max_restarts": -1}, ValueError, "max_restarts"),
        ({"lease_seconds": 1}, ValueError, "lease_seconds"),
        ({"last_call_seconds": 0}, ValueError, "last_call_seconds"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    arguments = {
        "rendezvous": "etcd://127.0.0.1:1/j",
        "address": "127.0.0.1:2222",
        "min_workers": 1,
        "max_workers": 2,
        **kwargs,
    }
    with pytest.raises(error, match=match):
        cluster.run_host_agent(["true"], **arguments)


def test_without_etcd3gw_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "etcd3gw", None)
    with pytest.raises(ImportError, match=r"tf_crossdevice\[elastic\]"):
        cluster.run_host_agent(
            ["true"],
            rendezvous="etcd://127.0.0.1:1/j",
            address="127.0.0.1:2222",
            min_workers=1,
            max_workers=1,
        )


def test_one_launcher_command_per_host(etcd):
    hosts = addresses(2)
    launchers = [
        processes.Child(
            [
                sys.executable,
                "-m",
                "tf_crossdevice.launch",
                f"--rendezvous=etcd://{etcd}/cli",
                f"--address={host}",
                "--num_workers=2",
                "--",
                sys.executable,
                "-c",
                CHILD,
                "0",
            ],
            name=f"launcher {host}",
        )
        for host in hosts
    ]
    try:
        outs = ["\n".join(launcher.read_all(60)) for launcher in launchers]
        assert [launcher.wait(timeout=60) for launcher in launchers] == [0, 0]
    finally:
        processes.stop_all(launchers)
    assert rounds("\n".join(outs)) == [
        (0, 0, sorted(hosts)),
        (0, 1, sorted(hosts)),
    ]
