"""The stall report: a worker's heartbeat file says how far it got, and the
launcher names the late workers and the collective the others wait in."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tf_crossdevice import launch
from tf_crossdevice._core import heartbeat
from tf_crossdevice._core.heartbeat import Progress
from tf_crossdevice.cluster import HeartbeatWatch
from tf_crossdevice.cluster._stall_watch import stall_report


def test_a_worker_writes_its_step_and_each_collective_it_enters(
    watched_heartbeat,
):
    path = watched_heartbeat
    beats = heartbeat._Beats()
    beats.entering("all_reduce A")
    # Before its first heartbeat the worker starts up: time 0 says so.
    assert path.stat().st_mtime == 0
    assert heartbeat.read_progress(str(path)) == Progress(
        None, 1, "all_reduce A"
    )
    beats.step_done(7)
    assert abs(path.stat().st_mtime - time.time()) < 60
    assert heartbeat.read_progress(str(path)) == Progress(8, 0, "")
    beats.entering("all_reduce A")
    beats.entering("all_gather B")
    assert heartbeat.read_progress(str(path)) == Progress(8, 2, "all_gather B")
    beats.step_done(None)  # The step after the last one.
    assert heartbeat.read_progress(str(path)) == Progress(9, 0, "")
    beats.end()
    assert not path.exists()
    beats.entering("all_reduce C")  # After the end: nothing written.
    assert not path.exists()


def test_progress_orders_by_step_then_collective_and_reads_any_line():
    assert Progress(3, 1, "x").key() < Progress(3, 2, "y").key()
    assert Progress(3, 9, "x").key() < Progress(4, 0, "").key()
    assert Progress(None, 5, "x").key() < Progress(1, 0, "").key()
    assert Progress.from_line(Progress(4, 2, "z").to_line()) == Progress(
        4, 2, "z"
    )
    assert Progress.from_line("") == Progress()
    assert Progress.from_line('{"step": 4, "ent') == Progress()


def test_the_report_names_the_late_workers_and_where_the_others_wait():
    report = stall_report(
        {
            0: Progress(5, 2, "all_reduce of pack 2 of 2 (3 tensors)"),
            1: Progress(5, 1, "all_reduce of pack 1 of 2 (5 tensors)"),
            2: Progress(5, 2, "all_reduce of pack 2 of 2 (3 tensors)"),
            3: Progress(5, 0, ""),
        },
        3.04,
    )
    assert report == (
        "stall: no progress for 3.0 s. Late: worker 1 (step 5, collective "
        "1: all_reduce of pack 1 of 2 (5 tensors)); worker 3 (step 5, "
        "before its first collective) have not reached step 5, collective "
        "2: all_reduce of pack 2 of 2 (3 tensors), where workers 0, 2 wait."
    )


def test_the_report_says_when_no_worker_is_late_or_none_has_stepped():
    same = Progress(2, 1, "all_reduce of pack 1 of 1 (1 tensor)")
    assert stall_report({0: same, 1: same}, 2.0) == (
        "stall: no progress for 2.0 s. Every worker is at step 2, collective "
        "1: all_reduce of pack 1 of 1 (1 tensor): none is late, so a link or "
        "a worker is slow (each worker's own stall report names its slow or "
        "unreachable peers)."
    )
    assert stall_report({0: Progress(), 1: Progress()}, 2.0) == (
        "stall: no progress for 2.0 s. No worker has finished a step since "
        "it started."
    )


def test_the_watch_reports_once_per_stall_and_stalls_after_its_limit(capsys):
    watch = HeartbeatWatch(stall_seconds=20.0, warning_seconds=5.0)
    paths = [watch.env(t)[heartbeat.HEARTBEAT_VARIABLE] for t in range(2)]
    try:
        assert watch.stalled({}) is None  # Both still start up (time 0).
        now = time.time()
        for path in paths:
            os.utime(path, (now, now))
        os.utime(paths[1], (now - 6, now - 6))
        assert watch.stalled({}) is None
        assert watch.stalled({}) is None
        err = capsys.readouterr().err
        assert err.count("stall: no progress for 6.0 s.") == 1
        os.utime(paths[1], (now, now))  # Progress again: the next stall...
        assert watch.stalled({}) is None
        os.utime(paths[0], (now - 21, now - 21))
        assert watch.stalled({}) == 0  # ...is reported, and over its limit.
        assert capsys.readouterr().err.startswith("stall: no progress for 21")
        assert watch.stalled({0: 1}) is None  # Ended: no longer watched.
    finally:
        folder = os.path.dirname(paths[0])
        watch.close()
    assert not os.path.exists(folder)


def test_the_first_step_is_the_earliest_first_heartbeat():
    watch = HeartbeatWatch(stall_seconds=20.0, warning_seconds=None)
    paths = [watch.env(t)[heartbeat.HEARTBEAT_VARIABLE] for t in range(2)]
    try:
        assert watch.first_step() is None  # Both still start up.
        os.utime(paths[1], (1000.0, 1000.0))
        assert watch.first_step() == 1000.0
        os.utime(paths[0], (900.0, 900.0))
        assert watch.first_step() == 900.0
    finally:
        watch.close()


def test_unwatched_the_watch_makes_no_files():
    watch = HeartbeatWatch(None, None)
    assert watch.env(0) == {}
    assert watch.stalled({}) is None
    watch.close()


@pytest.mark.slow
def test_a_stalled_collective_names_the_late_worker_and_the_collective(
    capsys, monkeypatch
):
    # One stream, so that the report's place among the workers' lines
    # shows when it came.
    monkeypatch.setattr(sys, "stderr", sys.stdout)
    warning = 2.0
    codes = launch.run_local_job(
        [sys.executable, "-m", "benchmarks.stall_job", str(2 * warning)],
        2,
        stall_warning_seconds=warning,
        timeout_seconds=180,
    )
    assert codes == [0, 0]
    lines = [
        line
        for line in capsys.readouterr().out.splitlines()
        if line.startswith(("stall", "[worker 1] late"))
    ]
    # Task 1 is late into step 3's second all-reduce (benchmarks/stall_job.py)
    # for 2 x stall_warning_seconds: the report comes within that time.
    assert len(lines) == 3
    assert lines[0].startswith("[worker 1] late from ")
    assert lines[2].startswith("[worker 1] late until ")
    report = lines[1]
    waited = float(report.split("no progress for ")[1].split(" s.")[0])
    assert warning <= waited < 2 * warning
    key = int(report.split("instance key ")[1].split(")")[0])
    assert report.endswith(
        "s. Late: worker 1 (step 3, collective 1: all_reduce of pack 1 of 1 "
        f"(1 tensor) in CollectiveAllReduce, instance key {key}) has not "
        "reached step 3, collective 2: all_reduce of pack 1 of 1 (1 tensor) "
        f"in CollectiveAllReduce, instance key {key + 1}, where worker 0 "
        "waits."
    )
