"""Training when one worker has half the data of the other.

Two workers on 127.0.0.1, one CPU replica each; worker 0 has
`NUM_BATCHES` batches of `BATCH` examples, worker 1 half as many
(tests/uneven_inputs_worker.py holds the data and the training code). Once
worker 1's data runs out, its replica gets empty batches and worker 0 trains
on alone. What every path must give, `numpy_kernel`: plain SGD on the mean
squared error where each step's gradient is the per-example mean over the
examples present in that step on every worker (2·BATCH while both have
data, then BATCH), not over 2·BATCH in every step.

Every process runs under a timeout (the workers' collectives fail after
`TIMEOUT_SECONDS`, the test stops waiting after `WAIT_SECONDS`) and is
stopped when its test ends, also on failure.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from tests import uneven_inputs_worker as job
from tf_crossdevice import launch
from tf_crossdevice.cluster import _local as cluster
from tf_crossdevice.cluster import processes

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
WAIT_SECONDS = 2 * job.TIMEOUT_SECONDS


def numpy_kernel(epochs: int, divisor: str = "present") -> np.ndarray:
    """The kernel after `epochs` passes of SGD, in float64.

    Args:
        divisor: "present": each step's gradient is the mean over the
            examples present in that step on every worker; "every": the
            sum over those examples divided by a full step's examples
            (every replica counted as if it had a full batch).
    """
    data = [job.worker_batches(w) for w in range(job.NUM_WORKERS)]
    kernel = job.INITIAL_KERNEL.astype(np.float64)
    for _ in range(epochs):
        for step in range(max(len(d) for d in data)):
            present = [d[step] for d in data if step < len(d)]
            x = np.concatenate([x for x, _ in present]).astype(np.float64)
            y = np.concatenate([y for _, y in present]).astype(np.float64)
            count = (
                len(x) if divisor == "present" else job.NUM_WORKERS * job.BATCH
            )
            # d/dk of sum((x k - y)^2) / count.
            grad = 2.0 * x.T @ (x @ kernel - y) / count
            kernel = kernel - job.LEARNING_RATE * grad
    return kernel


def run_workers(mode: str, recipe: str) -> list[dict]:
    """Each worker's reply, in task order."""
    children = []
    try:
        for i, env in enumerate(launch.tf_config_envs(job.NUM_WORKERS)):
            children.append(
                processes.start_module(
                    "tests.uneven_inputs_worker",
                    mode,
                    recipe,
                    name=f"worker {i} ({mode})",
                    env=env,
                    cwd=ROOT,
                )
            )
        replies = [c.receive(timeout=WAIT_SECONDS) for c in children]
        for child in children:
            assert child.wait(timeout=WAIT_SECONDS) == 0, child.stderr_text(
                3000
            )
        return replies
    finally:
        processes.stop_all(children)


def assert_kernels(replies: list[dict], want: np.ndarray) -> None:
    for task, reply in enumerate(replies):
        np.testing.assert_allclose(
            np.asarray(reply["kernel"]), want, rtol=1e-5, atol=1e-6,
            err_msg=f"task {task}",
        )  # fmt: skip


def test_the_reference_differs_from_a_divisor_of_every_replica():
    """The uneven steps matter: they move the kernel by far more than the
    tolerance, so a wrong divisor cannot pass."""
    gap = np.abs(numpy_kernel(1) - numpy_kernel(1, "every")).max()
    assert gap > 0.1, gap


def test_fit_with_average_over_examples_trains_every_step():
    """Keras `model.fit`, 2 epochs, loss `AverageOverExamples(mse)`.

    Before the workers agreed on the dataset's cardinality, worker 1 left
    the epoch after its 2 batches and worker 0 waited in the step's
    collective until its timeout."""
    replies = run_workers("fit", "ours")
    assert [r["steps"] for r in replies] == [
        job.FIT_EPOCHS * job.NUM_BATCHES
    ] * job.NUM_WORKERS
    assert_kernels(replies, numpy_kernel(job.FIT_EPOCHS))


def test_fit_with_a_keras_loss_finishes_dividing_by_every_replica():
    """Keras's own "mse" now finishes too, but scales each replica's mean
    by 1/num_replicas_in_sync: the steps with one worker's data move half
    as far. Pinned, so that a change there is seen."""
    replies = run_workers("fit", "tf")
    assert [r["steps"] for r in replies] == [
        job.FIT_EPOCHS * job.NUM_BATCHES
    ] * job.NUM_WORKERS
    assert_kernels(replies, numpy_kernel(job.FIT_EPOCHS, "every"))


def test_custom_loop_from_function_with_compute_average_loss():
    """`strategy.run` over `distribute_datasets_from_function`, loss from
    `tf_crossdevice.training.compute_average_loss`."""
    replies = run_workers("loop", "ours")
    assert [r["steps"] for r in replies] == [job.NUM_BATCHES] * job.NUM_WORKERS
    assert_kernels(replies, numpy_kernel(1))


def test_in_graph_client_with_compute_average_loss():
    """A client drives one replica on each worker server
    (`MultiWorkerAllReduce`, SUM of each replica's
    `compute_average_loss(..., num_examples=<the step's examples>)`)."""
    with cluster.start_local_cluster(job.NUM_WORKERS) as c:
        spec = json.dumps(c.cluster_spec.as_dict())
        with processes.start_module(
            "tests.uneven_inputs_worker",
            "in_graph",
            "ours",
            spec,
            name="in-graph client",
            cwd=ROOT,
        ) as client:
            reply = client.receive(timeout=WAIT_SECONDS)
            assert client.wait(timeout=WAIT_SECONDS) == 0, client.stderr_text(
                3000
            )
    assert_kernels([reply], numpy_kernel(1))
