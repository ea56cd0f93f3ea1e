"""The stall report: its rule on hand-made links, its text, the connections
it reads, the warning it logs once, and its option's checks.

In this process, without collectives: the peers are listening sockets on
127.0.0.1. tests/cluster/network_faults_test.py shows the report on a real
collective whose peer's link is slowed to a crawl, then cut.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import socket
import time
import types

import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice.collective import _peers, _stall
from tf_crossdevice.collective._stall import PeerLink, Verdict

TASK_0 = "/job:worker/replica:0/task:0"
TASK_1 = "/job:worker/replica:0/task:1"
TASK_2 = "/job:worker/replica:0/task:2"
WAITED = 4.0  # Seconds the step has waited when the report is made.

# A peer on a quick link that answers: recent packets, sub-millisecond
# round trips, nothing of ours unacknowledged.
QUICK = PeerLink(
    task=TASK_1,
    address="198.18.1.2:2222",
    answers=True,
    connections=2,
    silent_seconds=0.01,
    round_trip_seconds=0.002,
    least_round_trip_seconds=0.00002,
    unacknowledged_bytes=0,
)


def link(**changes) -> PeerLink:
    return dataclasses.replace(QUICK, **changes)


@pytest.mark.parametrize(
    ("peer", "verdict"),
    [
        (QUICK, Verdict.ANSWERING),
        # Packets still come, but each waits in a slow queue; a probe's SYN
        # waits behind them too, so the port may not answer in time.
        (link(round_trip_seconds=1.5), Verdict.SLOW),
        (link(round_trip_seconds=1.5, answers=False), Verdict.SLOW),
        (link(round_trip_seconds=0.1), Verdict.SLOW),
        (link(round_trip_seconds=0.099), Verdict.ANSWERING),
        # A long-distance link is slow from the start: not a crawl.
        (
            link(round_trip_seconds=0.3, least_round_trip_seconds=0.05),
            Verdict.ANSWERING,
        ),
        (
            link(round_trip_seconds=0.5, least_round_trip_seconds=0.05),
            Verdict.SLOW,
        ),
        # Data trickles: the round trip lags behind, the bytes do not.
        (link(moved_bytes=8948, window_seconds=1.0), Verdict.SLOW),
        (link(moved_bytes=999_999, window_seconds=1.0), Verdict.SLOW),
        # At full rate, or only control traffic: not a crawl.
        (link(moved_bytes=1_000_000, window_seconds=1.0), Verdict.ANSWERING),
        (link(moved_bytes=1023, window_seconds=1.0), Verdict.ANSWERING),
        # Cut: silent for half the wait, our data unacknowledged.
        (
            link(silent_seconds=WAITED / 2, unacknowledged_bytes=237),
            Verdict.NOT_REACHABLE,
        ),
        # A round trip measured before the wait does not make a peer that
        # has been silent since slow.
        (
            link(
                silent_seconds=WAITED + 0.5,
                unacknowledged_bytes=237,
                round_trip_seconds=1.5,
                answers=False,
            ),
            Verdict.NOT_REACHABLE,
        ),
        # Cut just before the report: packets were recent, the port is dead.
        (link(answers=False), Verdict.NOT_REACHABLE),
        # Idle but there: a peer that has not reached the collective.
        (link(silent_seconds=3.9), Verdict.ANSWERING),
        # No connection yet: the port decides.
        (
            PeerLink(TASK_1, "198.18.1.2:2222", answers=True),
            Verdict.ANSWERING,
        ),
        (
            PeerLink(TASK_1, "198.18.1.2:2222", answers=False),
            Verdict.NOT_REACHABLE,
        ),
    ],
    ids=[
        "quick",
        "crawl",
        "crawl_port_silent",
        "rtt_at_floor",
        "rtt_below_floor",
        "long_distance",
        "long_distance_crawl",
        "trickle",
        "trickle_just_under",
        "full_rate",
        "control_traffic",
        "cut",
        "cut_after_slow",
        "cut_just_now",
        "idle",
        "no_connection",
        "no_connection_port_silent",
    ],
)
def test_classify(peer, verdict):
    assert _stall.classify(peer, WAITED) is verdict


def test_describe_names_slow_and_unreachable_peers_with_addresses():
    slow = link(round_trip_seconds=1.2)
    cut = link(
        task=TASK_2,
        address="198.18.1.3:2222",
        answers=False,
        silent_seconds=3.5,
        unacknowledged_bytes=34,
    )
    text = _stall.describe([slow, cut], WAITED, f"step 7 of {TASK_0}", 12)
    assert text.startswith(
        f"step 7 of {TASK_0} has waited 4.0 s in its collectives "
        "(timeout_seconds=12). "
    )
    assert (
        f"Slow: {TASK_1} (198.18.1.2:2222): its link is slow (round trip "
        "1.2 s, 0.02 ms at best)." in text
    ), text
    assert (
        f"Not reachable: {TASK_2} (198.18.1.3:2222): nothing received for "
        "3.5 s while 34 bytes to it wait, its port does not answer." in text
    ), text
    assert "Every peer" not in text
    trickle = link(moved_bytes=25_000, window_seconds=2.0)
    text = _stall.describe([trickle], WAITED, f"step 7 of {TASK_0}")
    assert (
        f"Slow: {TASK_1} (198.18.1.2:2222): its link is slow (round trip "
        "2 ms, 0.02 ms at best; 12.5 kB/s over 2.0 s)." in text
    ), text


def test_describe_points_at_this_host_when_every_peer_is_slow():
    peers = [
        link(round_trip_seconds=1.2),
        link(task=TASK_2, address="h:2", round_trip_seconds=0.9),
    ]
    text = _stall.describe(peers, WAITED, f"step 1 of {TASK_0}")
    assert "this host's own link may be the slow one" in text, text
    one = _stall.describe(peers[:1], WAITED, f"step 1 of {TASK_0}")
    assert "own link" not in one, one


def test_describe_lists_every_peer_when_all_answer():
    text = _stall.describe(
        [QUICK, link(task=TASK_2, address="h:2")], WAITED, "step 1 of x"
    )
    assert "Slow" not in text and "Not reachable" not in text
    assert (
        "Every peer answers on a quick link: one has not reached this step's "
        f"collectives (still computing, hung, or running others): {TASK_1} "
        "(198.18.1.2:2222): round trip 2 ms, 0.02 ms at best; "
        f"{TASK_2} (h:2): round trip 2 ms, 0.02 ms at best." in text
    ), text


SS = """\
ESTAB 0      220    [::ffff:198.18.1.1]:42934 [::ffff:198.18.1.2]:40239 \
ino:11 sk:1 cgroup:/ <->
\t bbr wscale:10,10 rto:3900 rtt:436.661/865.6 ato:40 mss:8948 \
bytes_acked:5485 lastsnd:720 lastrcv:772 lastack:700 unacked:2 minrtt:0.02
ESTAB 0      0      127.0.0.1:2222 127.0.0.1:51000 ino:12 sk:2 <->
\t cubic rto:204 rtt:0.03/0.015 mss:32768 lastsnd:10 minrtt:0.01
ESTAB 0      0      127.0.0.1:51001 127.0.0.1:2223 ino:99 sk:3 <->
\t cubic rto:204 rtt:0.03/0.015 mss:32768 minrtt:0.01
"""


def test_parse_ss_reads_each_connection_of_this_process():
    got = _stall.parse_ss(SS, {11, 12})
    assert [(c.local, c.remote) for c in got] == [
        (("198.18.1.1", 42934), ("198.18.1.2", 40239)),
        (("127.0.0.1", 2222), ("127.0.0.1", 51000)),
    ]
    crawl, idle = got
    assert crawl.unacknowledged_bytes == 220
    assert crawl.silent_seconds == pytest.approx(0.7)
    assert crawl.round_trip_seconds == pytest.approx(0.436661)
    assert crawl.least_round_trip_seconds == pytest.approx(0.00002)
    # lastrcv and lastack are left out when something just arrived.
    assert idle.silent_seconds == 0
    assert len(_stall.parse_ss(SS)) == 3
    assert _stall.parse_ss("") == []


needs_ss = pytest.mark.skipif(
    shutil.which("ss") is None, reason="needs iproute2's ss"
)


@pytest.fixture
def cluster():
    """Task 0 (this one) and task 1, a socket listening on 127.0.0.1."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        addresses = ["127.0.0.1:1", f"127.0.0.1:{listening.getsockname()[1]}"]
        spec = tf.train.ClusterSpec({"worker": addresses})
        yield tf_crossdevice.CollectiveCluster(spec, "worker", 0, 2), listening


@needs_ss
def test_observe_peers_reads_this_process_s_connection_to_a_peer(cluster):
    cluster, listening = cluster
    with socket.create_connection(listening.getsockname()) as conn:
        conn.sendall(b"x")
        (peer,) = _stall.observe_peers(cluster, probe_seconds=1)
    assert peer.task == TASK_1 and peer.answers
    # This connection, and the probe's while it lasted.
    assert peer.connections >= 1, peer
    assert peer.silent_seconds is not None and peer.silent_seconds < 5
    assert _stall.classify(peer, WAITED) is Verdict.ANSWERING


@pytest.fixture
def warnings(monkeypatch):
    logged: list[str] = []
    monkeypatch.setattr(
        _stall.logging, "warning", lambda fmt, *a: logged.append(fmt % a)
    )
    return logged


def wait_for(logged: list[str], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not logged and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_block_past_the_warning_time_is_reported_once(cluster, warnings):
    cluster, _ = cluster
    with tf_crossdevice.reporting_unreachable_peers(
        cluster, probe_seconds=0.5, stall_warning_seconds=0.2
    ):
        wait_for(warnings, 10)
        time.sleep(0.5)  # Long past the warning time: still one report.
    assert len(warnings) == 1, warnings
    assert "Stalled collective: step " in warnings[0]
    assert re.search(
        rf" of {TASK_0} has waited 0\.[2-9] s in its collectives\.",
        warnings[0],
    ), warnings
    assert f"{TASK_1} ({cluster.address(TASK_1)})" in warnings[0], warnings


def test_a_quick_block_is_not_reported(cluster, warnings):
    cluster, _ = cluster
    for _ in range(3):
        with tf_crossdevice.reporting_unreachable_peers(
            cluster, stall_warning_seconds=0.3
        ):
            pass
    time.sleep(0.6)
    assert warnings == []


def test_nested_blocks_are_one_step(cluster, warnings):
    cluster, _ = cluster
    with (
        tf_crossdevice.reporting_unreachable_peers(
            cluster, probe_seconds=0.5, stall_warning_seconds=0.2
        ),
        tf_crossdevice.reporting_unreachable_peers(
            cluster, probe_seconds=0.5, stall_warning_seconds=0.2
        ),
    ):
        wait_for(warnings, 10)
        time.sleep(0.5)
    assert len(warnings) == 1, warnings


def test_infinity_turns_the_report_off(cluster, warnings):
    cluster, _ = cluster
    with tf_crossdevice.reporting_unreachable_peers(
        cluster, stall_warning_seconds=math.inf
    ):
        time.sleep(0.3)
    assert warnings == []


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, ValueError),
        (-1.0, ValueError),
        (math.nan, ValueError),
        ("2", TypeError),
        (True, TypeError),
    ],
)
def test_a_bad_warning_time_names_the_argument(value, error):
    alone = tf_crossdevice.CollectiveCluster(None, "worker", 0, 1)
    with (
        pytest.raises(
            error, match=r"stall_warning_seconds: expected a number > 0"
        ),
        tf_crossdevice.reporting_unreachable_peers(
            alone, stall_warning_seconds=value
        ),
    ):
        pass


def test_the_default_warning_time_is_half_the_timeout_at_most_a_minute():
    assert _stall.default_warning_seconds(None) == 60
    assert _stall.default_warning_seconds(8) == 4
    assert _stall.default_warning_seconds(600) == 60

    def strategy(timeout):
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout
        )
        return types.SimpleNamespace(
            extended=types.SimpleNamespace(_communication_options=options)
        )

    assert _peers._timeout_of(strategy(8)) == 8
    assert _peers._timeout_of(strategy(None)) is None
    assert _peers._timeout_of(None) is None
