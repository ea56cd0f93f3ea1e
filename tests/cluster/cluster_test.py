"""Tests for tf_crossdevice.cluster: real worker processes on 127.0.0.1.

The client side (`tf.config.experimental_connect_to_cluster`) always runs in
a child process: connecting changes process-wide TensorFlow state, and this
pytest process is shared with every other test. The client starts before the
cluster and waits for the cluster spec as its first command, so that its
TensorFlow import overlaps the workers' start. Every process is started and
stopped through tf_crossdevice.cluster.processes.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import sys
import time

import numpy as np
import psutil
import pytest
import tensorflow as tf

from tf_crossdevice.cluster import _local as cluster_lib
from tf_crossdevice.cluster import _worker_main
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.cluster._local import start_local_cluster

pytestmark = pytest.mark.slow

REPO = pathlib.Path(__file__).resolve().parents[2]

# Takes {"spec", "devices", "inputs"} as its command, squares inputs[k]
# eagerly and inside a tf.function on devices[k], sums the squares on
# devices[0] and replies with the devices it saw and the results.
CLIENT = """
import numpy as np
import tensorflow as tf
from tf_crossdevice.cluster import processes as _processes

_processes.exit_when_parent_goes()
request = next(_processes.commands())
tf.config.experimental_connect_to_cluster(
    tf.train.ClusterSpec(request["spec"]))
devices = request["devices"]
inputs = [tf.constant(np.array(x, np.float32)) for x in request["inputs"]]

eager_devices = []
for device, x in zip(devices, inputs):
    with tf.device(device):
        eager_devices.append(tf.square(x).device)

@tf.function
def sum_of_squares(xs):
    squares = []
    for device, x in zip(devices, xs):
        with tf.device(device):
            squares.append(tf.square(x))
    with tf.device(devices[0]):
        return tf.add_n(squares)

total = sum_of_squares(inputs)
_processes.reply({
    "listed": [d.name for d in tf.config.list_logical_devices("CPU")],
    "eager_devices": eager_devices,
    "total": total.numpy().tolist(),
    "total_device": total.device,
})
"""


def _port_open(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            return True
    except ConnectionRefusedError:
        return False


def _wait_until_closed(address: str, timeout_seconds: float) -> bool:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if not _port_open(address):
            return True
        time.sleep(0.1)
    return False


def _our_workers(launcher_pid: int | None = None) -> list[int]:
    """Pids of live workers launched by this process (or `launcher_pid`).

    Found by the launcher pid that `_processes.child_env` gives every child
    (so also after the launcher died) and a `--task_index=` argument.
    """
    launcher = str(os.getpid() if launcher_pid is None else launcher_pid)
    pids = []
    for process in psutil.process_iter():
        try:
            if (
                process.environ().get(_processes.PARENT_PID_ENV) == launcher
                and any(
                    a.startswith("--task_index=") for a in process.cmdline()
                )
                and process.status() != psutil.STATUS_ZOMBIE
            ):
                pids.append(process.pid)
        except psutil.Error:
            continue
    return pids


def _expected_devices(num_workers: int, cpus: int) -> list[str]:
    return [
        f"/job:worker/replica:0/task:{t}/device:CPU:{c}"
        for t in range(num_workers)
        for c in range(cpus)
    ]


@pytest.mark.parametrize(
    "num_workers, cpus_per_worker",
    [
        pytest.param(2, 1, id="two_workers_one_cpu"),
        pytest.param(3, 2, id="three_workers_two_cpus"),
    ],
)
def test_client_sees_devices_and_sums_across_workers(
    num_workers, cpus_per_worker
):
    with (
        _processes.Child(
            [sys.executable, "-c", CLIENT], name="client"
        ) as client,
        start_local_cluster(
            num_workers, cpus_per_worker=cpus_per_worker
        ) as cluster,
    ):
        devices = cluster.worker_devices()
        assert devices == _expected_devices(num_workers, cpus_per_worker)
        gpus = len(tf.config.list_physical_devices("GPU"))
        assert cluster.worker_devices("GPU") == [
            f"/job:worker/replica:0/task:{t}/device:GPU:{g}"
            for t in range(num_workers)
            for g in range(gpus)
        ]
        with pytest.raises(
            ValueError, match="device_type: unknown value 'TPU'"
        ):
            cluster.worker_devices("TPU")
        assert cluster.num_workers == num_workers
        # Each worker has imported TensorFlow, which takes more than half a
        # second of CPU.
        for task in range(num_workers):
            assert cluster.cpu_seconds(task) > 0.5
        with pytest.raises(ValueError, match=f"task: .* below {num_workers}"):
            cluster.cpu_seconds(num_workers)
        addresses = cluster.cluster_spec.as_dict()["worker"]
        assert addresses == cluster.addresses
        assert len(set(addresses)) == num_workers
        # The last device of every worker: CPU:1 where there are two.
        used = devices[cpus_per_worker - 1 :: cpus_per_worker]
        rng = np.random.default_rng(num_workers)
        inputs = rng.uniform(-2, 2, size=(num_workers, 3, 5))
        inputs = inputs.astype(np.float32)
        request = {
            "spec": cluster.cluster_spec.as_dict(),
            "devices": used,
            "inputs": inputs.tolist(),
        }
        client.send(request)
        result = client.receive(timeout=60)
    remote = [d for d in result["listed"] if d.startswith("/job:worker/")]
    assert remote == devices
    assert result["eager_devices"] == used
    assert result["total_device"] == used[0]
    np.testing.assert_allclose(
        result["total"], np.sum(np.square(inputs), axis=0), rtol=1e-6
    )


class _BodyError(Exception):
    pass


def test_kill_worker_and_exit_on_exception_free_every_port():
    with pytest.raises(_BodyError), start_local_cluster(2) as cluster:
        addresses = cluster.addresses
        processes = cluster.processes
        assert all(_port_open(a) for a in addresses)
        assert sorted(_our_workers()) == sorted(p.pid for p in processes)

        cluster.kill_worker(1)
        assert processes[1].returncode == -signal.SIGKILL
        assert not _port_open(addresses[1])
        assert processes[0].poll() is None
        assert _port_open(addresses[0])
        cluster.kill_worker(1)  # Already dead: nothing to do.
        for bad, error in [
            (2, ValueError),
            (-1, ValueError),
            (True, TypeError),
            ("0", TypeError),
        ]:
            with pytest.raises(error, match="^task_index: expected an int"):
                cluster.kill_worker(bad)
        raise _BodyError  # __exit__ must still stop worker 0.
    assert [p.returncode is not None for p in processes] == [True, True]
    assert not any(_port_open(a) for a in addresses)
    assert _our_workers() == []
    cluster.stop()  # Idempotent.


def _fake_worker(code: str):
    """A `_worker_command` stand-in that runs `code` with `task` defined."""

    def command(spec, job_name, task_index, cpus_per_worker):
        return [
            sys.executable,
            "-c",
            f"task = {task_index}\n{code}",
            f"--task_index={task_index}",  # Found by _our_workers().
        ]

    return command


def test_worker_that_exits_early_is_named_with_its_stderr(monkeypatch):
    code = (
        "import sys, time\n"
        "if task == 1:\n"
        "    sys.exit('task one exploded')\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setattr(cluster_lib, "_worker_command", _fake_worker(code))
    with pytest.raises(RuntimeError) as raised:
        start_local_cluster(2)
    message = str(raised.value)
    assert "worker task 1 (127.0.0.1:" in message
    assert "exited with code 1 before it was ready" in message
    assert "task one exploded" in message
    assert _our_workers() == []  # The sleeping task 0 was stopped too.


def test_timeout_names_the_tasks_and_stops_them():
    with pytest.raises(RuntimeError, match="not ready after 0.2 s") as raised:
        start_local_cluster(2, timeout_seconds=0.2)
    message = str(raised.value)
    assert "task 0 (127.0.0.1:" in message
    assert "task 1 (127.0.0.1:" in message
    assert _our_workers() == []


def test_taken_port_is_retried_on_new_ports(monkeypatch):
    with socket.socket() as other_server:
        other_server.bind(("127.0.0.1", 0))
        other_server.listen()
        taken = other_server.getsockname()[1]
        calls = []
        pick = _processes.free_ports

        def pick_taken_first(n):
            calls.append(n)
            return [taken] if len(calls) == 1 else pick(n)

        monkeypatch.setattr(_processes, "free_ports", pick_taken_first)
        # A real worker: TF's own bind error must be recognised as a race.
        with start_local_cluster(1) as cluster:
            assert calls == [1, 1]
            assert cluster.addresses != [f"127.0.0.1:{taken}"]
            assert _port_open(cluster.addresses[0])
    assert _our_workers() == []


def test_ports_taken_every_time_raises_after_bounded_attempts(monkeypatch):
    code = f"import sys\nsys.exit({_worker_main.EXIT_BIND_FAILED})\n"
    monkeypatch.setattr(cluster_lib, "_worker_command", _fake_worker(code))
    picked = []
    pick = _processes.free_ports

    def pick_and_count(n):
        picked.append(n)
        return pick(n)

    monkeypatch.setattr(_processes, "free_ports", pick_and_count)
    with pytest.raises(RuntimeError, match="in 3 attempts, ports were taken"):
        start_local_cluster(2)
    assert picked == [2, 2, 2]
    assert _our_workers() == []


@pytest.mark.parametrize(
    "kwargs, name",
    [
        pytest.param({"num_workers": 0}, "num_workers", id="zero_workers"),
        pytest.param({"cpus_per_worker": 0}, "cpus_per_worker", id="zero_cpus"),
        pytest.param({"host": ""}, "host", id="empty_host"),
        pytest.param({"timeout_seconds": 0}, "timeout_seconds", id="no_time"),
        pytest.param(
            {"timeout_seconds": float("nan")}, "timeout_seconds", id="nan_time"
        ),
        pytest.param({"job_name": ""}, "job_name", id="empty_job"),
        pytest.param({"job_name": "9w"}, "job_name", id="digit_job"),
        pytest.param({"job_name": "a/b"}, "job_name", id="slash_job"),
    ],
)
def test_bad_arguments_raise_before_starting_anything(kwargs, name):
    kwargs = {"num_workers": 1, **kwargs}
    with pytest.raises(ValueError, match=f"^{name}: "):
        start_local_cluster(**kwargs)
    assert _our_workers() == []


@pytest.mark.parametrize(
    "kwargs, name",
    [
        pytest.param({"num_workers": True}, "num_workers", id="bool_workers"),
        pytest.param({"num_workers": 2.0}, "num_workers", id="float_workers"),
        pytest.param({"timeout_seconds": "9"}, "timeout_seconds", id="str"),
    ],
)
def test_arguments_of_the_wrong_type_raise_type_error(kwargs, name):
    kwargs = {"num_workers": 1, **kwargs}
    with pytest.raises(TypeError, match=f"^{name}: expected "):
        start_local_cluster(**kwargs)
    assert _our_workers() == []


class _Cli:
    """`python -m tf_crossdevice.cluster`, its stdout read line by line."""

    def __init__(self, *flags: str) -> None:
        self.child = _processes.start_module(
            "tf_crossdevice.cluster", *flags, name="cluster CLI", cwd=REPO
        )
        self.process = self.child.process

    def addresses(self) -> list[str]:
        spec = json.loads(self.child.read_line(timeout=60))
        assert list(spec) == ["worker"]
        line = self.child.read_line(timeout=10)
        assert f"kill -TERM {self.process.pid}" in line
        return spec["worker"]

    def close(self) -> None:
        self.child.stop()
        for pid in _our_workers(self.process.pid):  # Only if a test failed.
            psutil.Process(pid).kill()


@pytest.fixture(scope="module")
def clis():
    """Both command-line runs, started together to overlap their startup."""
    started = {
        "sigterm": _Cli("--num_workers=2", "--run_seconds=120"),
        "sigkill": _Cli("--num_workers=1", "--run_seconds=120"),
    }
    yield started
    for cli in started.values():
        cli.close()


def test_cli_prints_spec_and_stops_on_sigterm(clis):
    cli = clis["sigterm"]
    addresses = cli.addresses()
    assert len(addresses) == 2
    assert all(_port_open(a) for a in addresses)
    assert len(_our_workers(cli.process.pid)) == 2
    cli.process.send_signal(signal.SIGTERM)
    cli.process.wait(timeout=30)
    assert cli.process.returncode == 0, cli.child.stderr_text(3000)
    assert not any(_port_open(a) for a in addresses)
    assert _our_workers(cli.process.pid) == []


def test_workers_exit_when_the_launcher_is_killed(clis):
    cli = clis["sigkill"]
    [address] = cli.addresses()
    assert _port_open(address)
    assert len(_our_workers(cli.process.pid)) == 1
    cli.process.kill()  # SIGKILL: no cleanup code runs in the launcher.
    cli.process.wait(timeout=30)
    assert _wait_until_closed(address, timeout_seconds=10)
    assert _our_workers(cli.process.pid) == []
