"""A worker server's SIGTERM becomes a preemption notice: the server records
it in a file and serves on, and stopping the cluster removes the file. The
in-graph controller that reads the notice and saves is tested through the
example job (tests/examples/examples_test.py, mode in_graph)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tf_crossdevice._core.network import port_answers
from tf_crossdevice.cluster import _notices, start_local_cluster


@pytest.mark.slow
def test_sigterm_records_a_notice_and_the_server_serves_on():
    with start_local_cluster(2) as cluster:
        ports = [int(a.rsplit(":", 1)[1]) for a in cluster.addresses]
        paths = [
            _notices.notice_path("worker", i, p) for i, p in enumerate(ports)
        ]
        assert not any(map(os.path.exists, paths))
        cluster.processes[1].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not os.path.exists(paths[1]):
            assert time.monotonic() < deadline, "no notice recorded"
            time.sleep(0.05)
        with open(paths[1]) as f:
            assert f.read() == "SIGTERM\n"
        time.sleep(0.5)
        # Still serving: alive, its port answering; worker 0 has no notice.
        assert cluster.processes[1].poll() is None
        assert port_answers(cluster.addresses[1])
        assert not os.path.exists(paths[0])
    assert not any(map(os.path.exists, paths))
    assert cluster.processes[1].returncode is not None


def test_a_stale_notice_is_cleared_when_a_server_starts():
    path = _notices.notice_path("worker", 0, 1)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("SIGTERM\n")
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        _notices.record_notices_on("worker", 0, 1, [signal.SIGUSR1])
        assert not os.path.exists(path)
        signal.raise_signal(signal.SIGUSR1)
        with open(path) as f:
            assert f.read() == "SIGUSR1\n"
    finally:
        signal.signal(signal.SIGUSR1, previous)
        _notices.clear_notice("worker", 0, 1)
