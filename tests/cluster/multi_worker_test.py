"""MultiWorkerAllReduce across real worker processes on 127.0.0.1.

Workers are tf.distribute.Server processes (tf_crossdevice.cluster); the
client that connects to them runs in its own process
(tests/multi_worker_client.py, started through tf_crossdevice.cluster.processes)
because connecting changes process-wide TensorFlow state. Every cluster and
client is stopped when its test (module) ends, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import multi_worker_client
from tests.compression import powersgd_reference
from tf_crossdevice.cluster import _local as cluster
from tf_crossdevice.cluster import processes as _processes

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

# Specs that run on CPU workers, in both forms of the spec grammar.
SPECS = {
    "xring": "xring",
    "rechd": "rechd",
    "pscpu": "pscpu",
    "pscpu_pscpu": "pscpu/pscpu",
    "ranges": [["pscpu/pscpu", 2, 100], ["xring", 2, -1]],
    "string_grammar": "pscpu:1k:rechd#2",
    "psgpu_on_cpus": "psgpu#2",
    "default": ["pscpu/pscpu", 2, -1],
}
PACKING = {
    "packs_0": {"num_packs": 0},
    "packs_1": {"num_packs": 1},
    "small_tensor_aggregation": {"num_packs": 0, "agg": [256, 3]},
}


def cases_for(replicas_per_worker, every_packing=True):
    """Every spec with every packing, or (`every_packing=False`) each spec
    with one packing, taken in turn, so that each packing still meets
    several specs and both replica counts."""
    cases = []
    for i, (spec_name, spec) in enumerate(SPECS.items()):
        packings = PACKING if spec_name != "default" else {"packs_0": {}}
        if not every_packing:
            name = list(packings)[(i + replicas_per_worker) % len(packings)]
            packings = {name: packings[name]}
        for packing_name, packing in packings.items():
            cases.append(
                {
                    "name": f"{spec_name}-{packing_name}-{replicas_per_worker}",
                    "spec": spec,
                    "replicas_per_worker": replicas_per_worker,
                    "reduce_op": "sum",
                    "seed": len(cases),
                    **packing,
                }
            )
    cases.append(
        {
            "name": f"mean-{replicas_per_worker}",
            "spec": "pscpu/pscpu#2",
            "replicas_per_worker": replicas_per_worker,
            "reduce_op": "mean",
            "seed": 99,
        }
    )
    # PowerSGD at rank 1: the (3, 5) float32 value (position 2) goes as
    # low-rank factors, the others exactly. Its factors, 8 values for 15,
    # are not twice smaller: compressed at min_compression_rate 1 only.
    cases.append(
        {
            "name": f"powersgd-{replicas_per_worker}",
            "spec": "pscpu/pscpu#2",
            "replicas_per_worker": replicas_per_worker,
            "reduce_op": "mean",
            "seed": 5,
            "powersgd": [1, 0, 1],
        }
    )
    cases.append(
        {
            "name": f"nccl_on_cpus-{replicas_per_worker}",
            "spec": "nccl/xring",
            "replicas_per_worker": replicas_per_worker,
            "reduce_op": "sum",
            "seed": 7,
        }
    )
    return cases


def start_client(job):
    """The client process, given `job` as its command."""
    client = _processes.start_module(
        "tests.multi_worker_client", name=f"client ({job['mode']})", cwd=ROOT
    )
    client.send(job)
    return client


def run_client(job, replies, timeout=600):
    """Runs `job` in a client; returns its `replies` answers and stderr."""
    deadline = time.monotonic() + timeout
    with start_client(job) as client:
        lines = [
            client.receive(timeout=deadline - time.monotonic())
            for _ in range(replies)
        ]
        assert client.wait(timeout=60) == 0, client.stderr_text(3000)
        return lines, client.stderr_text()


@pytest.fixture(scope="module", params=[2, 3], ids=["2_workers", "3_workers"])
def workers(request):
    """A cluster of 2 or 3 workers with 2 CPUs each, for the whole module."""
    with cluster.start_local_cluster(request.param, cpus_per_worker=2) as c:
        yield request.param, c


@pytest.fixture(scope="module")
def results(workers):
    """Runs the cluster's cases from one client process: every spec with
    every packing on 2 workers; on 3, where the specs' schedules differ
    again but packing happens inside each worker, each spec with one."""
    num_workers, c = workers
    every = num_workers == 2
    job = {
        "mode": "cases",
        "cluster": c.cluster_spec.as_dict(),
        "cases": cases_for(1, every) + cases_for(2, every),
    }
    lines, stderr = run_client(job, replies=len(job["cases"]))
    return (
        num_workers,
        job["cases"],
        {line["name"]: line for line in lines},
        stderr,
    )


def test_every_case_equals_numpy_on_every_replica(results):
    num_workers, cases, by_name, _ = results
    assert len(by_name) == len(cases)
    for case in cases:
        got = by_name[case["name"]]
        per_worker = case["replicas_per_worker"]
        num_replicas = num_workers * per_worker
        inputs = multi_worker_client.make_inputs(case["seed"], num_replicas)
        want_devices = [
            f"/job:worker/replica:0/task:{t}/device:CPU:{i}"
            for t in range(num_workers)
            for i in range(per_worker)
        ]
        sums = expected_sums(case, inputs, num_replicas)
        for k in range(len(inputs)):
            want = sums[k]
            if case["reduce_op"] == "mean":
                want = want / num_replicas  # Every replica of every worker.
            assert got["devices"][k] == want_devices, case["name"]
            assert len(got["results"][k]) == num_replicas
            for replica_result in got["results"][k]:
                np.testing.assert_allclose(
                    np.asarray(replica_result, np.float64),
                    want,
                    rtol=1e-6 if k not in compressed(case) else 1e-4,
                    atol=0 if k not in compressed(case) else 1e-4,
                    err_msg=f"{case['name']} value {k}",
                )


def compressed(case) -> dict:
    """Position -> shape of the values a case's PowerSGD compresses."""
    return {2: (3, 5)} if "powersgd" in case else {}


def expected_sums(case, inputs, num_replicas) -> list:
    """Value k's sum over every replica: numpy's, or for what PowerSGD
    compresses, the numpy PowerSGD's (one step, from a fresh state)."""
    exact = [np.sum(np.asarray(a, np.float64), axis=0) for a in inputs]
    if "powersgd" not in case:
        return exact
    rank = case["powersgd"][0]
    reference = powersgd_reference.NumpyPowerSGD(
        compressed(case), rank, num_replicas, dtype=tf.float32
    )
    approx = reference.sum(
        {
            k: [np.asarray(a, np.float64) for a in inputs[k]]
            for k in compressed(case)
        }
    )
    # Rank 1 of a 3x5 sum: not the sum itself (the test would not see a
    # missing compression).
    for k, value in approx.items():
        assert not np.allclose(value, exact[k], atol=1e-3), k
        exact[k] = value
    return exact


def test_integer_sums_stay_integers(results):
    _, cases, by_name, _ = results
    for case in cases:
        dtypes = by_name[case["name"]]["dtypes"][-1]
        want = "float64" if case["reduce_op"] == "mean" else "int64"
        assert set(dtypes) == {want}, case["name"]


def test_powersgd_start_step_in_graph():
    """In-graph (one client, 2 workers x 2 replicas), one traced step with
    PowerSGD(start_step=2): the first 2 calls sum exactly and leave the
    errors at zero, the 3rd compresses, as numpy's PowerSGD does."""
    with cluster.start_local_cluster(2, cpus_per_worker=2) as c:
        lines, stderr = run_client(
            {
                "mode": "powersgd_steps",
                "cluster": c.cluster_spec.as_dict(),
                "replicas_per_worker": 2,
                "spec": "pscpu/pscpu#2",
                "rank": 1,
                "start_step": 2,
                "steps": 3,
            },
            replies=3,
        )
    reference = powersgd_reference.NumpyPowerSGD(
        {0: (8, 6)}, 1, 4, start_step=2, dtype=tf.float32
    )
    for step, got in enumerate(lines):
        inputs = [
            [a.astype(np.float64) for a in value]
            for value in multi_worker_client.powersgd_inputs(step, 4)
        ]
        want = [np.sum(value, axis=0) for value in inputs]
        expected = reference.sum({0: inputs[0]})[0]
        matrices = [np.asarray(r) for r in got["results"][0]]
        errors = np.asarray(got["errors"])
        for matrix in matrices[1:]:
            np.testing.assert_array_equal(matrix, matrices[0])
        for bias in got["results"][1]:
            np.testing.assert_allclose(bias, want[1], rtol=1e-6, atol=1e-6)
        if step < 2:
            np.testing.assert_allclose(matrices[0], want[0], atol=1e-6)
            assert not errors.any(), step
        else:
            assert np.abs(matrices[0] - want[0]).max() > 0.1
            np.testing.assert_allclose(matrices[0], expected, atol=1e-5)
            np.testing.assert_allclose(errors, reference.errors[0], atol=1e-5)
            np.testing.assert_allclose(
                matrices[0] + errors.sum(axis=0), want[0], atol=1e-5
            )
        assert got["compressor_step"] == step + 1
        assert got["traces"] == 1
    assert "Failed to remove function remotely" not in stderr, stderr


def test_nccl_stage_on_cpu_workers_says_what_it_used(results):
    _, _, _, stderr = results
    assert "NCCL all-reduce cannot run here" in stderr
    assert "devices are not all GPUs" in stderr


@contextlib.contextmanager
def failing_client(c, **job):
    """A client repeating a reduction on `c`, ready (traced and warm)."""
    job = {"mode": "until_failure", "cluster": c.cluster_spec.as_dict(), **job}
    with start_client(job) as client:
        assert client.receive(timeout=300) == {"ready": True}
        yield client


def test_killed_worker_fails_the_step_naming_it():
    with (
        cluster.start_local_cluster(3) as c,
        failing_client(c, elements=5_000_000, seconds=60) as client,
    ):
        time.sleep(0.5)  # Mid-way through a stream of reductions.
        c.kill_worker(1)
        killed = time.monotonic()
        result = client.receive(timeout=60)
        reported = time.monotonic() - killed
    assert result["error"] == "WorkerUnreachableError", result
    assert "/job:worker/replica:0/task:1" in result["message"]
    assert c.addresses[1] in result["message"]
    assert result["workers"] == ["/job:worker/replica:0/task:1"], result
    assert "refuses connections" in result["message"], result
    # A dead worker's sockets close at once, so the error comes well before
    # any timeout; the bound is loose for a loaded CI machine.
    assert reported < 15, reported


def test_hung_worker_is_bounded_by_timeout_seconds():
    with (
        cluster.start_local_cluster(2) as c,
        failing_client(
            c, elements=100_000, seconds=60, timeout_seconds=3
        ) as client,
    ):
        os.kill(c.processes[1].pid, signal.SIGSTOP)
        try:
            stopped = time.monotonic()
            result = client.receive(timeout=60)
            reported = time.monotonic() - stopped
        finally:
            os.kill(c.processes[1].pid, signal.SIGCONT)
    assert result["error"] == "DeadlineExceededError", result
    assert "timeout_seconds" in result["message"]
    assert c.addresses[1] in result["message"]
    assert reported < 20, reported


def test_release_waits_until_the_workers_have_freed_what_was_dropped():
    """A function dropped while its worker is stopped: `release` returns
    only once the worker, resumed 1.5 s later, has answered, so that
    killing the worker then leaves no release unanswered (TensorFlow logs
    an error line for each)."""
    with cluster.start_local_cluster(1) as c:
        job = {
            "mode": "release",
            "cluster": c.cluster_spec.as_dict(),
            "worker_pid": c.processes[0].pid,
            "resume_after": 1.5,
        }
        with start_client(job) as client:
            result = client.receive(timeout=120)
            stderr = client.stderr_text()
    assert result["waited"] >= 1.4, result
    assert "Failed to remove function remotely" not in stderr, stderr


def test_legacy_graph_mode_mirrored_strategy_over_workers(workers):
    """TF 1 code: in-graph MirroredStrategy on the workers' devices, Session.

    TF 2.21 takes an explicit list of remote devices as one in-graph
    strategy and calls our ops; only TF 1's configure(cluster_spec=...)
    route is refused by TensorFlow itself (pinned here, documented). SUM
    on 2 workers, MEAN (divided by every replica) on 3.
    """
    num_workers, c = workers
    reduce_op = "sum" if num_workers == 2 else "mean"
    lines, _ = run_client(
        {
            "mode": "legacy_graph",
            "cluster": c.cluster_spec.as_dict(),
            "replicas_per_worker": 2,
            "spec": "pscpu/pscpu#2",
            "reduce_op": reduce_op,
        },
        replies=1,
    )
    got = lines[-1]
    n = 2 * num_workers
    total = n * (n + 1) / 2
    want = total / n if reduce_op == "mean" else total
    assert got["calls"] == 1
    assert [d.split("/device:")[0] for d in got["devices"]] == [
        f"/job:worker/replica:0/task:{t}"
        for t in range(num_workers)
        for _ in (0, 1)
    ]
    for value in got["values"]:
        np.testing.assert_allclose(value, [want] * 4)
    assert "In-graph multi-worker training" in got["configure_error"]


@pytest.mark.parametrize(
    "args, error, message",
    [
        (([], 0), ValueError, "worker_devices: expected at least one"),
        (
            ("/job:worker/task:0", 0),
            TypeError,
            "worker_devices: expected a list",
        ),
        ((["/job:worker/task:0"] * 2, 0), ValueError, "listed twice"),
        (
            (["/job:worker/task:0", ""], 0),
            ValueError,
            r"^worker_devices\[1\]: the device string is empty",
        ),
        (
            (["/job:worker/task:0", "/job:worker/task:x"], 0),
            ValueError,
            r"^worker_devices\[1\]: bad task index in 'task:x'",
        ),
        ((["/job:worker/task:0"], -1), ValueError, "num_gpus_per_worker"),
        ((["/job:worker/task:0"], 1.0), TypeError, "num_gpus_per_worker"),
        ((["/job:worker/task:0"], 0, "xrng"), ValueError, "all_reduce_spec"),
    ],
)
def test_bad_constructor_arguments(args, error, message):
    with pytest.raises(error, match=message):
        tf_crossdevice.MultiWorkerAllReduce(*args)


def test_values_off_the_listed_workers_are_refused():
    ops = tf_crossdevice.MultiWorkerAllReduce(["/job:worker/task:0"], 0)
    value = tf_crossdevice.testing.per_replica([tf.ones([2])] * 2)
    with pytest.raises(ValueError, match="not on a worker in worker_devices"):
        ops.reduce("sum", value)


def test_sparse_values_and_destinations_are_checked_too():
    ops = tf_crossdevice.MultiWorkerAllReduce(
        ["/job:localhost/replica:0/task:0"], 0
    )
    value = tf_crossdevice.testing.per_replica(
        [tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), [3, 2])] * 2
    )
    remote = tf_crossdevice.MultiWorkerAllReduce(["/job:worker/task:0"], 0)
    with pytest.raises(ValueError, match="not on a worker in worker_devices"):
        remote.reduce("sum", value)
    dense = tf_crossdevice.testing.per_replica([tf.ones([2])] * 2)
    with pytest.raises(ValueError, match="task:3.* is not on a worker"):
        ops.reduce("sum", dense, "/job:worker/replica:0/task:3/device:CPU:0")
