"""WorkerReplicas without a cluster: arguments and how failures are named."""

from __future__ import annotations

import socket
import threading

import pytest
import tensorflow as tf

from tf_crossdevice.cluster import _in_graph as multi_worker
from tf_crossdevice.cluster import processes


@pytest.fixture
def listening_port():
    """A port that accepts connections, like a healthy worker's."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


@pytest.fixture
def closed_port():
    """A port nobody listens on, like a killed worker's."""
    return processes.free_ports(1)[0]


def replicas_at(*ports):
    spec = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return multi_worker.WorkerReplicas(
        spec, replicas_per_worker=2, connect=False
    )


def test_devices_are_listed_worker_by_worker(listening_port):
    replicas = replicas_at(listening_port, listening_port + 1)
    assert replicas.worker_devices == [
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    ]
    assert replicas.devices == [
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:CPU:1",
        "/job:worker/replica:0/task:1/device:CPU:0",
        "/job:worker/replica:0/task:1/device:CPU:1",
    ]


def test_an_op_error_on_a_healthy_worker_stays_what_it_is(listening_port):
    replicas = replicas_at(listening_port)
    error = tf.errors.InvalidArgumentError(
        None, None, "Incompatible shapes on /job:worker/replica:0/task:0"
    )
    assert replicas._explain(error, 0.1) is error


def test_unavailable_names_the_worker(listening_port, closed_port):
    replicas = replicas_at(listening_port, closed_port)
    error = tf.errors.CancelledError(
        None, None, "RecvFromRemoteAsync is cancelled."
    )
    explained = replicas._explain(error, 0.4)
    assert isinstance(explained, multi_worker.WorkerUnreachableError)
    assert explained.workers == ("/job:worker/replica:0/task:1",)
    assert f"127.0.0.1:{closed_port}" in str(explained)
    assert "refuses connections" in str(explained)


def test_unavailable_text_names_the_task(listening_port):
    replicas = replicas_at(listening_port, listening_port)
    error = tf.errors.UnavailableError(
        None,
        None,
        "UNAVAILABLE: Socket closed\nremote target "
        "/job:worker/replica:0/task:1/device:CPU:0",
    )
    explained = replicas._explain(error, 0.4)
    assert explained.workers == ("/job:worker/replica:0/task:1",)
    assert "Socket closed" in str(explained)


def test_a_worker_whose_port_closes_after_the_error_is_the_one_named(
    listening_port,
):
    """A killed worker's port may still answer when its peers' failure
    reaches the client; the error text names every task of the failed
    op. The worker whose port closes within the settling time is named,
    not the healthy task the text names too."""
    dying = socket.socket()
    dying.bind(("127.0.0.1", 0))
    dying.listen()
    replicas = replicas_at(listening_port, dying.getsockname()[1])
    timer = threading.Timer(0.5, dying.close)
    timer.start()
    try:
        error = tf.errors.UnavailableError(
            None,
            None,
            "Graph execution error: /job:worker/replica:0/task:0 and "
            "/job:worker/replica:0/task:1",
        )
        explained = replicas._explain(error, 0.1)
    finally:
        timer.join()
        dying.close()
    assert explained.workers == ("/job:worker/replica:0/task:1",)
    assert "refuses connections" in str(explained)


def test_run_returns_the_value_and_checks_timeout(listening_port):
    replicas = replicas_at(listening_port)
    assert replicas.run(lambda x: x + 1, 1, timeout_seconds=5) == 2
    assert replicas.run(lambda: "plain") == "plain"
    with pytest.raises(ValueError, match="timeout_seconds"):
        replicas.run(lambda: None, timeout_seconds=0)


def test_run_reraises_other_errors_unchanged(listening_port):
    replicas = replicas_at(listening_port)

    def fails():
        raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        replicas.run(fails, timeout_seconds=5)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"cluster_spec": ["127.0.0.1:1"]}, TypeError, "cluster_spec"),
        ({"job_name": "ps"}, ValueError, "job_name: 'ps' is not a job"),
        ({"replicas_per_worker": 0}, ValueError, "replicas_per_worker"),
        ({"device_type": "TPU"}, ValueError, "device_type"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    args = {"cluster_spec": {"worker": ["127.0.0.1:1"]}, "connect": False}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        multi_worker.WorkerReplicas(**args)
