"""`reporting_unreachable_peers` names the peers whose port does not answer.

In this process, without collectives: the errors are raised by the test,
the peers are a listening socket on 127.0.0.1 and a port where nothing
listens. tests/cluster/network_faults_test.py shows it on a real collective
whose peer's link is cut.
"""

from __future__ import annotations

import socket

import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice.cluster import processes

TASK_1 = "/job:worker/replica:0/task:1"
TASK_2 = "/job:worker/replica:0/task:2"


@pytest.fixture
def cluster():
    """Task 0 (this one), task 1 listening, task 2 refusing."""
    with socket.create_server(("127.0.0.1", 0)) as listening:
        silent = processes.free_ports(1)[0]
        addresses = [
            "127.0.0.1:1",
            f"127.0.0.1:{listening.getsockname()[1]}",
            f"127.0.0.1:{silent}",
        ]
        spec = tf.train.ClusterSpec({"worker": addresses})
        yield tf_crossdevice.CollectiveCluster(spec, "worker", 0, 3)


def raise_in_block(where, error):
    with tf_crossdevice.reporting_unreachable_peers(where, probe_seconds=1):
        raise error


@pytest.mark.parametrize(
    "kind",
    [
        tf.errors.DeadlineExceededError,
        tf.errors.UnavailableError,
        tf.errors.AbortedError,
        tf.errors.CancelledError,
    ],
    ids=lambda k: k.__name__,
)
def test_names_the_peer_that_does_not_answer(cluster, kind):
    original = kind(None, None, "Graph execution error: collective timed out")
    with pytest.raises(kind) as caught:
        raise_in_block(cluster, original)
    message = caught.value.message
    assert type(caught.value) is kind
    assert caught.value.__cause__ is original
    assert message.startswith(original.message)
    refusing = cluster.address(TASK_2)
    assert (
        f"/job:worker/replica:0/task:0: tasks not reachable: {TASK_2} "
        f"({refusing})" in message
    ), message
    assert TASK_1 not in message, message


def test_says_when_every_peer_answers():
    with socket.create_server(("127.0.0.1", 0)) as listening:
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        spec = tf.train.ClusterSpec({"worker": ["127.0.0.1:1", address]})
        cluster = tf_crossdevice.CollectiveCluster(spec, "worker", 0, 2)
        with pytest.raises(tf.errors.DeadlineExceededError) as caught:
            raise_in_block(
                cluster, tf.errors.DeadlineExceededError(None, None, "late")
            )
    assert "not reachable" not in caught.value.message
    assert (
        f"every peer task's port answers ({TASK_1} ({address})): none is "
        "cut off" in caught.value.message
    )


def test_nested_blocks_report_once(cluster):
    with (  # noqa: PT012
        pytest.raises(tf.errors.DeadlineExceededError) as caught,
        tf_crossdevice.reporting_unreachable_peers(cluster),
    ):
        raise_in_block(
            cluster, tf.errors.DeadlineExceededError(None, None, "late")
        )
    assert caught.value.message.count("tasks not reachable") == 1


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.InvalidArgumentError(None, None, "bad shape"),
        ValueError("not TensorFlow's"),
    ],
    ids=["InvalidArgumentError", "ValueError"],
)
def test_other_errors_pass_unchanged(cluster, error):
    with pytest.raises(type(error)) as caught:
        raise_in_block(cluster, error)
    assert caught.value is error


def test_without_peers_errors_pass_unchanged():
    alone = tf_crossdevice.CollectiveCluster(None, "worker", 0, 1)
    mirrored = tf.distribute.MirroredStrategy(testing.cpu_devices(1))
    for where in (alone, mirrored, None):
        error = tf.errors.DeadlineExceededError(None, None, "late")
        with pytest.raises(tf.errors.DeadlineExceededError) as caught:
            raise_in_block(where, error)
        assert caught.value is error


def test_a_strategy_s_cluster_resolver_says_where_the_peers_are(cluster):
    class Resolved(tf.distribute.MirroredStrategy):
        cluster_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            cluster.cluster_spec, task_type="worker", task_id=0
        )

    strategy = Resolved(testing.cpu_devices(1))
    with pytest.raises(tf.errors.UnavailableError) as caught:
        raise_in_block(strategy, tf.errors.UnavailableError(None, None, "x"))
    assert f"tasks not reachable: {TASK_2}" in caught.value.message


def test_bad_arguments_name_themselves():
    with (
        pytest.raises(TypeError, match=r"strategy_or_cluster: expected"),
        tf_crossdevice.reporting_unreachable_peers("worker"),
    ):
        pass
    alone = tf_crossdevice.CollectiveCluster(None, "worker", 0, 1)
    with (
        pytest.raises(ValueError, match=r"probe_seconds"),
        tf_crossdevice.reporting_unreachable_peers(alone, probe_seconds=0),
    ):
        pass
