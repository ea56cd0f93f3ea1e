"""Tests of tf_crossdevice.launch with real (TensorFlow-free) children."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import psutil
import pytest

from tf_crossdevice import launch
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
