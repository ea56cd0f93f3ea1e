"""How the collective classes fail: a missing worker, a killed worker, and
use under the wrong strategy.

Worker processes are tests/collective_worker.py on 127.0.0.1, started and
stopped through tf_crossdevice.cluster.processes (stopped also when a test
fails). After each multi-process test no worker process is alive and every
port of its cluster can be bound again.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import socket
import sys
import time
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import launch, testing
from tf_crossdevice.cluster import processes as _processes

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
STARTUP = 150  # Seconds a worker may take to import TensorFlow and start.
# timeout_seconds (T) and how long failing may take (T + 10 s): a worker
# waiting for a missing peer, and collectives, whose T is larger so that a
# slow step on a loaded machine does not time out before the kill.
TIMEOUT = 5
BOUND = TIMEOUT + 10
COLLECTIVE_TIMEOUT = 15
COLLECTIVE_BOUND = COLLECTIVE_TIMEOUT + 10


def cluster_ports(env: dict[str, str]) -> list[int]:
    workers = json.loads(env["TF_CONFIG"])["cluster"]["worker"]
    return [int(address.rsplit(":", 1)[1]) for address in workers]


def port_is_free(port: int) -> bool:
    """True if a listening socket could take `port` on every address.

    SO_REUSEADDR, as servers set it: a closed connection's TIME_WAIT does
    not count, a socket that still listens there does.
    """
    families = [(socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        families.append((socket.AF_INET6, "::"))
    for family, host in families:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
                s.listen()
        except OSError:
            return False
    return True


def wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@contextlib.contextmanager
def workers(
    mode: str, envs: list[dict[str, str]], *args: str
) -> Iterator[list[_processes.Child]]:
    """Starts a worker per env; afterwards checks that they, and whatever
    they started, are gone and that the cluster's ports are free."""
    children: list[_processes.Child] = []
    processes: list[psutil.Process] = []
    try:
        for i, env in enumerate(envs):
            child = _processes.start_module(
                "tests.collective_worker",
                mode,
                "flat",
                *args,
                name=f"worker {i}",
                env=env,
                cwd=ROOT,
            )
            children.append(child)
            processes.append(psutil.Process(child.pid))
        yield children
    finally:
        for p in processes:
            with contextlib.suppress(psutil.Error):
                processes.extend(p.children(recursive=True))
        _processes.stop_all(children)
    alive = [p for p in processes if p.is_running()]
    assert not alive, f"still running: {alive}"
    for port in cluster_ports(envs[0]):
        assert wait_until(lambda p=port: port_is_free(p)), f"port {port} bound"


def test_port_is_free_sees_a_listening_socket():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free(port)
    assert port_is_free(port)


def test_a_worker_that_never_starts_times_out_construction():
    envs = launch.tf_config_envs(2)
    missing = json.loads(envs[1]["TF_CONFIG"])["cluster"]["worker"][1]
    with workers("construct", envs[:1], str(TIMEOUT)) as (child,):
        assert child.receive(timeout=STARTUP) == {"constructing": True}
        start = time.monotonic()
        answer = child.receive(timeout=BOUND + 5)
        status = child.wait(timeout=BOUND + 5)
        exited_after = time.monotonic() - start
        stderr = child.stderr_text(3000)
    assert answer["error"] == "DeadlineExceededError", answer
    # Measured inside the worker, from the start of construction.
    assert TIMEOUT - 1 <= answer["seconds"] <= BOUND, answer
    assert exited_after <= BOUND, exited_after
    assert status == 3, stderr
    assert "/job:worker/replica:0/task:1" in answer["message"], answer
    assert missing in answer["message"], answer


def test_a_worker_killed_in_a_collective_fails_the_other():
    envs = launch.tf_config_envs(2)
    with workers("loop", envs, str(COLLECTIVE_TIMEOUT)) as children:
        for child in children:  # Both all-reduce together, step after step.
            answer = child.receive(timeout=STARTUP)
            while answer.get("steps", 0) < 3:
                assert "steps" in answer, answer
                answer = child.receive(timeout=STARTUP)
        children[1].kill()  # SIGKILL, while worker 0 is in a collective.
        killed = time.monotonic()
        answer = children[0].receive(timeout=COLLECTIVE_BOUND)
        while "steps" in answer:  # Steps that ended before the kill.
            answer = children[0].receive(timeout=COLLECTIVE_BOUND)
        status = children[0].wait(timeout=COLLECTIVE_BOUND)
        exited_after = time.monotonic() - killed
        stderr = children[0].stderr_text(3000)
    assert status == 2, stderr
    assert exited_after <= COLLECTIVE_BOUND, exited_after
    # As the between-hosts guide says: TensorFlow's UnavailableError naming
    # the killed task when the broken connection is seen, else the timeout
    # naming the collective that waited.
    if answer["error"] == "UnavailableError":
        assert "/job:worker/replica:0/task:1" in answer["message"], answer
    else:
        assert answer["error"] == "DeadlineExceededError", answer
        assert "CollectiveAllReduce_all_reduce" in answer["message"], answer


# ---- Under tf.distribute.MirroredStrategy (this process, no workers) --------


def test_mirrored_strategy_refuses_a_multi_worker_collective():
    with pytest.raises(ValueError, match=r"tf_crossdevice\.MultiWorker"):
        tf.distribute.MirroredStrategy(
            devices=testing.cpu_devices(2),
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(num_workers=2),
        )


def single_worker_strategy() -> tf.distribute.MirroredStrategy:
    return tf.distribute.MirroredStrategy(
        devices=testing.cpu_devices(2),
        cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
    )


VALUES = np.arange(12, dtype=np.float32).reshape(2, 2, 3) ** 1.5


def replica_step():
    context = tf.distribute.get_replica_context()
    replica = context.replica_id_in_sync_group
    value = tf.gather(tf.constant(VALUES), replica)
    return (
        value,
        context.all_reduce("sum", value),
        context.all_reduce("mean", value * 2.0),
    )


def test_a_single_worker_collective_sums_under_mirrored_strategy():
    strategy = single_worker_strategy()
    values, sums, means = tf.function(lambda: strategy.run(replica_step))()
    for got in strategy.experimental_local_results(sums):
        np.testing.assert_allclose(got, VALUES.sum(axis=0), rtol=1e-6)
    for got in strategy.experimental_local_results(means):
        np.testing.assert_allclose(got, VALUES.mean(axis=0) * 2, rtol=1e-6)
    np.testing.assert_allclose(
        strategy.reduce("sum", values, axis=None),
        VALUES.sum(axis=0),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        strategy.reduce("mean", values, axis=0),
        VALUES.mean(axis=(0, 1)),
        rtol=1e-6,
    )


# Eager values from experimental_distribute_values_from_function all report
# CPU:0: an unbound collective object takes the strategy's replicas by
# position, as TensorFlow's classes do.
def test_replica_all_reduce_of_distributed_values():
    strategy = single_worker_strategy()
    values = strategy.experimental_distribute_values_from_function(
        lambda context: tf.constant(VALUES[context.replica_id_in_sync_group])
    )

    def step(value):
        return tf.distribute.get_replica_context().all_reduce("sum", value)

    sums = strategy.run(step, args=(values,))
    for got in strategy.experimental_local_results(sums):
        np.testing.assert_allclose(got, VALUES.sum(axis=0), rtol=1e-6)


# A collective whose peer never comes: one process, a group of two with only
# one member. In a child, because a timed-out collective leaves TensorFlow's
# collective executor aborted for the rest of the process.
LONELY = """
import tensorflow as tf
import tf_crossdevice
ops = tf_crossdevice.CollectiveAllReduce(
    num_workers=2,
    options=tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=1),
)
value = tf_crossdevice.testing.per_replica([tf.constant([1.0])])
try:
    ops.reduce("sum", value, None)
except tf.errors.DeadlineExceededError as e:
    print("DeadlineExceededError", e.message.replace("\\n", " "))
"""


def test_a_collective_that_times_out_names_itself():
    with _processes.Child([sys.executable, "-c", LONELY], name="lonely") as c:
        lines = c.read_all(timeout=STARTUP)
    errors = [line for line in lines if line.startswith("Deadline")]
    assert errors, lines
    assert "CollectiveAllReduce_all_reduce" in errors[0]
