"""Tests of tf_crossdevice.launch with real (TensorFlow-free) children."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import psutil
import pytest

from tf_crossdevice import cluster, launch
from tf_crossdevice.cluster import processes

# Prints its task index; exits with the code in argv[1] for task 1.
CHILD = """
import json, os, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]["index"]
print("task", task, "of", len(config["cluster"]["worker"]), flush=True)
if task == 1:
    sys.exit(int(sys.argv[1]))
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
"""


def test_tf_config_envs_give_one_cluster_and_each_task():
    envs = launch.tf_config_envs(3)
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    assert [c["task"] for c in configs] == [
        {"type": "worker", "index": i} for i in range(3)
    ]
    clusters = [c["cluster"] for c in configs]
    assert all(c == clusters[0] for c in clusters)
    addresses = clusters[0]["worker"]
    assert len(set(addresses)) == 3
    assert all(a.startswith("127.0.0.1:") for a in addresses)


def test_every_worker_runs_with_its_task(capsys):
    codes = launch.run_local_job([sys.executable, "-c", CHILD, "0"], 3)
    assert codes == [0, 0, 0]
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == [f"[worker {i}] task {i} of 3" for i in range(3)]


def test_a_failing_worker_stops_the_others_after_the_grace_period():
    start = time.monotonic()
    codes = launch.run_local_job(
        [sys.executable, "-c", CHILD, "3", "120"],
        2,
        grace_seconds=1,
        echo=False,
    )
    assert codes[1] == 3
    assert codes[0] != 0  # Stopped, not finished: it sleeps 120 s.
    assert time.monotonic() - start < 60


def test_timeout_stops_every_worker():
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    codes = launch.run_local_job(
        [sys.executable, "-c", "import time; time.sleep(120)"],
        2,
        timeout_seconds=2,
        echo=False,
    )
    assert all(c is not None and c < 0 for c in codes)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"argv": "python x.py", "num_workers": 2}, TypeError, "argv"),
        ({"argv": ["python"], "num_workers": 0}, ValueError, "num_workers"),
        (
            {"argv": ["python"], "num_workers": 1, "timeout_seconds": 0},
            ValueError,
            "timeout_seconds",
        ),
        (
            {"argv": ["python"], "num_workers": 2, "min_workers": 3},
            ValueError,
            "min_workers: 3 is more than num_workers=2",
        ),
        (
            {"argv": ["python"], "num_workers": 2, "min_workers": 0},
            ValueError,
            "min_workers",
        ),
        (
            {"argv": ["python"], "num_workers": 2, "max_restarts": -1},
            ValueError,
            "max_restarts",
        ),
        (
            {"argv": ["python"], "num_workers": 2, "rendezvous_seconds": 0},
            ValueError,
            "rendezvous_seconds",
        ),
        (
            {"argv": ["python"], "num_workers": 2, "stall_seconds": 0},
            ValueError,
            "stall_seconds",
        ),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        launch.run_local_job(**kwargs)


def launcher(*args: str) -> subprocess.CompletedProcess:
    """`python -m tf_crossdevice.launch ARGS`, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "tf_crossdevice.launch", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=processes.child_env(),
    )


def test_a_command_without_dashes_is_an_error_that_shows_them_in_place():
    # Without --, absl would read -c as the launcher's flag.
    result = launcher("--num_workers=1", "python", "-c", "print(1)")
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""  # No worker started.
    assert result.stderr.endswith(
        "FATAL Flags parsing error: 'python' is no flag of the launcher; put "
        "the job's command after --: python -m tf_crossdevice.launch "
        "--num_workers=1 -- python -c 'print(1)'\n"
        "Pass --helpshort or --helpfull to see help on flags.\n"
    ), result.stderr


def test_the_command_after_dashes_keeps_its_own_flags():
    # Its --num_workers is the command's, not the launcher's.
    result = launcher(
        "--num_workers=2",
        "--",
        sys.executable,
        "-c",
        "import sys; print(sys.argv[1:])",
        "--num_workers=3",
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        f"[worker {i}] ['--num_workers=3']" for i in range(2)
    ]


# Prints its round and task; in the rounds before argv[1], task 1 fails as
# argv[2] says: "exit" (status 3) or "segv" (a segmentation fault).
FAILING_CHILD = """
import json, os, signal, sys
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]["index"]
round = int(os.environ["TF_CROSSDEVICE_RESTART"])
size = len(config["cluster"]["worker"])
print("round", round, "task", task, "of", size, flush=True)
if round < int(sys.argv[1]) and task == 1:
    if sys.argv[2] == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    sys.exit(3)
"""


@pytest.mark.parametrize("how", ["exit", "segv"])
def test_a_failed_round_starts_every_worker_again(capsys, how):
    codes = launch.run_local_job(
        [sys.executable, "-c", FAILING_CHILD, "2", how],
        2,
        max_restarts=2,
        grace_seconds=5,
    )
    assert codes == [0, 0]
    out = capsys.readouterr().out.splitlines()
    assert out.count("restart 1: 2 workers") == 1, out
    assert out.count("restart 2: 2 workers") == 1, out
    rounds = sorted(line for line in out if "round" in line)
    assert rounds == sorted(
        f"[worker {t}] round {r} task {t} of 2"
        for r in range(3)
        for t in range(2)
    )
    assert out.index("restart 1: 2 workers") > out.index(
        "[worker 1] round 0 task 1 of 2"
    )


@pytest.mark.parametrize("how, status", [("exit", 3), ("segv", -11)])
def test_restarts_end_with_the_last_failed_rounds_statuses(capsys, how, status):
    codes = launch.run_local_job(
        [sys.executable, "-c", FAILING_CHILD, "9", how],
        2,
        max_restarts=1,
        grace_seconds=5,
    )
    assert codes == [0, status]
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("restart")] == [
        "restart 1: 2 workers"
    ]
    assert sum("round" in line for line in out) == 4


def test_without_restarts_a_failed_round_is_the_end(capsys):
    codes = launch.run_local_job(
        [sys.executable, "-c", FAILING_CHILD, "1", "exit"], 2, grace_seconds=5
    )
    assert codes == [0, 3]
    out = capsys.readouterr().out
    assert "restart" not in out
    assert "round 1" not in out


def test_the_command_line_restarts_a_failed_round():
    result = launcher(
        "--num_workers=2",
        "--max_restarts=1",
        "--",
        sys.executable,
        "-c",
        FAILING_CHILD,
        "1",
        "exit",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "restart 1: 2 workers" in lines
    assert "[worker 1] round 1 task 1 of 2" in lines


@pytest.mark.parametrize("value", ["0", "3:2", "two", "1:2:3", "0:2", ":"])
def test_a_bad_worker_count_names_the_flag_and_the_forms(value):
    result = launcher(f"--num_workers={value}", "--", "true")
    assert result.returncode == 1
    assert result.stdout == ""
    assert (
        "FATAL Flags parsing error: --num_workers: expected N or MIN:MAX with "
        f"1 <= MIN <= MAX, got {value!r}"
    ) in result.stderr, result.stderr


# Beats (as tf_crossdevice.cluster.heartbeat does: sets its file's time)
# every 0.1 s for argv[1] seconds, then exits 0; in round 0 task 1 beats
# once and then hangs (in `hangs_here`, which its stacks name on SIGUSR1).
# It names itself "train.py", as absl names a job's process after its
# script.
BEATING_CHILD = """
import ctypes, faulthandler, json, os, signal, sys, time
ctypes.CDLL(None).prctl(15, b"train.py", 0, 0, 0)  # PR_SET_NAME
faulthandler.register(signal.SIGUSR1, all_threads=True)
def hangs_here():
    time.sleep(3600)
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
round = int(os.environ["TF_CROSSDEVICE_RESTART"])
beat = os.environ.get("TF_CROSSDEVICE_HEARTBEAT")
print("round", round, "task", task, "watched", beat is not None, flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    if beat:
        os.utime(beat)
    if round == 0 and task == 1:
        hangs_here()
    time.sleep(0.1)
"""


def test_a_worker_without_heartbeats_fails_its_round(capsys):
    start = time.monotonic()
    codes = launch.run_local_job(
        [sys.executable, "-c", BEATING_CHILD, "4"],
        2,
        max_restarts=1,
        stall_seconds=2,
        grace_seconds=5,
    )
    assert codes == [0, 0]
    assert time.monotonic() - start < 60
    captured = capsys.readouterr()
    assert (
        "[worker 1] no heartbeat for 2 s (stall_seconds): the round stops"
    ) in captured.err
    # Where it hung, asked before it was stopped.
    stacks = captured.err.split(
        "[worker 1] its Python threads when it stalled:\n"
    )[1]
    assert re.search(r'File "<string>", line \d+ in hangs_here', stacks)
    out = captured.out.splitlines()
    assert "restart 1: 2 workers" in out
    assert "[worker 1] round 1 task 1 watched True" in out
    # The restart's first heartbeat comes within a second of its start.
    (first,) = [line for line in out if line.startswith("round 1: first")]
    seconds = float(first.split("done ")[1].split(" s after")[0])
    assert 0 <= seconds < 5, first
    assert first.endswith(" s after the workers started")


def test_unwatched_workers_have_no_heartbeat_file(capsys):
    assert launch.run_local_job(
        [sys.executable, "-c", BEATING_CHILD.replace("round == 0", "0"), "0"],
        2,
    ) == [0, 0]
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == [
        f"[worker {t}] round 0 task {t} watched False" for t in range(2)
    ]


def test_heartbeat_sets_the_named_files_time_and_the_end_removes_it(
    watched_heartbeat, monkeypatch
):
    path = watched_heartbeat
    cluster.heartbeat()
    assert abs(path.stat().st_mtime - time.time()) < 60
    path.unlink()
    cluster.heartbeat()  # Its round is over: nothing to do, no error.
    assert not path.exists()
    path.touch()
    cluster.end_heartbeats()  # The steps are over: the watch ends.
    assert not path.exists()
    cluster.end_heartbeats()
    monkeypatch.delenv(cluster.HEARTBEAT_VARIABLE)
    cluster.heartbeat()  # No launcher watches.
    cluster.end_heartbeats()


# Beats for 0.5 s, ends its heartbeats, then works 3 s more without any.
ENDING_CHILD = """
import os, time
beat = os.environ["TF_CROSSDEVICE_HEARTBEAT"]
for _ in range(5):
    os.utime(beat)
    time.sleep(0.1)
os.remove(beat)  # As tf_crossdevice.cluster.end_heartbeats() does.
time.sleep(3)
print("done", flush=True)
"""


def test_a_worker_whose_heartbeats_ended_is_not_watched(capsys):
    codes = launch.run_local_job(
        [sys.executable, "-c", ENDING_CHILD], 2, stall_seconds=1
    )
    assert codes == [0, 0]
    captured = capsys.readouterr()
    assert "no heartbeat" not in captured.err
    assert sorted(captured.out.splitlines()) == [
        "[worker 0] done",
        "[worker 1] done",
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--rendezvous=etcd://127.0.0.1:2379/j"],
            "--address: needed with --rendezvous (HOST:PORT where this "
            "host's worker listens, e.g. --address=10.0.0.2:2222)",
        ),
        (["--address=127.0.0.1:2222"], "--address: only with --rendezvous"),
        (
            [
                "--rendezvous=etcd://127.0.0.1:2379/j",
                "--address=127.0.0.1:2222",
                "--emulate_hosts",
            ],
            "--emulate_hosts: runs every worker on this machine; with "
            "--rendezvous each host runs its own (use one or the other)",
        ),
    ],
)
def test_the_multi_machine_flags_go_together(args, message):
    result = launcher(*args, "--", "true")
    assert result.returncode == 1
    assert result.stdout == ""
    assert f"FATAL Flags parsing error: {message}\n" in result.stderr


def test_a_rendezvous_that_does_not_answer_ends_the_launcher_with_its_address():
    (port,) = processes.free_ports(1)
    result = launcher(
        f"--rendezvous=etcd://127.0.0.1:{port}/j",
        "--address=127.0.0.1:2222",
        "--",
        "true",
    )
    assert result.returncode == 1
    assert result.stdout == ""  # No worker started.
    assert (
        f"launch: rendezvous: etcd 127.0.0.1:{port} job 'j' does not answer ("
    ) in result.stderr, result.stderr
    assert result.stderr.endswith(
        "); start etcd there (or pass the address of a running one) and "
        "check that this host reaches it\n"
    ), result.stderr


# In round 0 task 1 fails at once while task 0 would run for an hour.
STRANDED_CHILD = """
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if int(os.environ["TF_CROSSDEVICE_RESTART"]) == 0:
    if task == 1:
        sys.exit(3)
    time.sleep(3600)
"""


def test_a_round_that_a_restart_follows_stops_the_others_within_1_s(capsys):
    start = time.monotonic()
    codes = launch.run_local_job(
        [sys.executable, "-c", STRANDED_CHILD], 2, max_restarts=1
    )
    assert codes == [0, 0]
    # Not the default 30 s of grace: the restart waits 1 s for task 0,
    # then stops it (a few seconds for two rounds of Python start-ups).
    assert time.monotonic() - start < 10
    assert "restart 1: 2 workers" in capsys.readouterr().out
