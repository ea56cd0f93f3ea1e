"""Training on 2 worker processes x 2 local devices equals training alone.

Each worker (tests/collective_worker.py, train mode) builds
`tf_crossdevice.MultiWorkerMirroredStrategy` with one of our collective
classes and 2 logical CPUs, trains a small model (Embedding, whose
gradient is IndexedSlices, and two Dense layers) with Keras `model.fit`
and then, from the same start, with a custom loop of `strategy.run` steps,
and sends back every replica's copy of every variable. The optimizer is
momentum SGD, whose slot variables Keras creates inside the first traced
step, as TensorFlow's multi-worker tutorial does. The reference is plain
numpy momentum SGD on the same global batches, computed here: no
TensorFlow, no strategy, none of the code under test. Every worker is
stopped when its test ends, also on failure.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import collective_worker as worker

pytestmark = pytest.mark.slow

TIMEOUT = 150  # Seconds for a worker's whole run, on a loaded machine.
NUM_WORKERS = 2
KINDS = ["flat", "hier"]
NAMES = ["embedding", "kernel1", "bias1", "kernel2", "bias2"]


def numpy_sgd(steps: int) -> tuple[dict[str, np.ndarray], list[float]]:
    """Weights after `steps` momentum SGD steps on the global batches, and
    the losses. Keras's rule: m = MOMENTUM * m - LEARNING_RATE * g; w += m.

    The model: h = tanh([E[ids], x] @ W1 + b1), prediction h @ W2 + b2;
    the loss is the mean squared error over the global batch.
    """
    w = {k: v.astype(np.float64) for k, v in worker.initial_weights().items()}
    ids, x, y = worker.batches_arrays()
    per_epoch = worker.NUM_EXAMPLES // worker.GLOBAL_BATCH
    velocity = {k: np.zeros_like(v) for k, v in w.items()}
    losses = []
    for step in range(steps):
        rows = slice(
            (step % per_epoch) * worker.GLOBAL_BATCH,
            (step % per_epoch + 1) * worker.GLOBAL_BATCH,
        )
        b_ids, b_x, b_y = ids[rows, 0], x[rows], y[rows]
        z = np.concatenate([w["embedding"][b_ids], b_x], axis=1)
        h = np.tanh(z @ w["kernel1"] + w["bias1"])
        pred = h @ w["kernel2"] + w["bias2"]
        losses.append(float(np.mean((pred - b_y) ** 2)))
        d_pred = 2 * (pred - b_y) / len(b_y)
        d_a = (d_pred @ w["kernel2"].T) * (1 - h**2)
        d_z = d_a @ w["kernel1"].T
        d_embedding = np.zeros_like(w["embedding"])
        np.add.at(d_embedding, b_ids, d_z[:, : worker.EMBED])
        grads = {
            "embedding": d_embedding,
            "kernel1": z.T @ d_a,
            "bias1": d_a.sum(axis=0),
            "kernel2": h.T @ d_pred,
            "bias2": d_pred.sum(axis=0),
        }
        for k in w:
            velocity[k] = (
                worker.MOMENTUM * velocity[k] - worker.LEARNING_RATE * grads[k]
            )
            w[k] = w[k] + velocity[k]
    return w, losses


@pytest.fixture(scope="module")
def results() -> dict[str, list[dict]]:
    """results[kind][task]: that worker's weights and losses.

    One pair of worker processes trains with both classes, one strategy
    after the other (collectives are enabled once per process, and the two
    strategies share it).
    """
    return worker.replies("train", KINDS, NUM_WORKERS, TIMEOUT)


def check_replicas(results: list[dict], key: str, expected: dict) -> None:
    """Every replica of every worker holds exactly worker 0's first copy,
    which equals `expected`."""
    first = results[0][key][0]
    for task, result in enumerate(results):
        replicas = result[key]
        assert len(replicas) == worker.LOCAL_DEVICES, (task, key)
        for r, weights in enumerate(replicas):
            for name, got, want in zip(NAMES, weights, first, strict=True):
                assert got == want, (
                    f"{key}: worker {task} replica {r} differs from worker 0 "
                    f"replica 0 in {name}"
                )
    for name, got in zip(NAMES, first, strict=True):
        np.testing.assert_allclose(
            got,
            np.ravel(expected[name]),
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"{key}: {name} differs from numpy SGD",
        )


@pytest.mark.parametrize("kind", KINDS)
def test_variable_created_inside_a_step_holds_the_chiefs_value(results, kind):
    # Worker t creates the variable with t + 1: every replica of every
    # worker must hold the chief's 1.0, broadcast when the step first runs.
    for result in results[kind]:
        assert result["created_in_step"] == [1.0] * worker.LOCAL_DEVICES


@pytest.mark.parametrize("kind", KINDS)
def test_fit_and_custom_loop_equal_numpy_sgd_on_every_replica(results, kind):
    results = results[kind]

    per_epoch = worker.NUM_EXAMPLES // worker.GLOBAL_BATCH
    fit_weights, fit_losses = numpy_sgd(worker.FIT_EPOCHS * per_epoch)
    check_replicas(results, "fit", fit_weights)
    loop_weights, loop_losses = numpy_sgd(worker.LOOP_STEPS)
    check_replicas(results, "loop", loop_weights)

    # Not trivially equal: training moved the weights.
    start = worker.initial_weights()
    assert not np.allclose(fit_weights["kernel1"], start["kernel1"])
    assert not np.allclose(loop_weights["embedding"], start["embedding"])
    # The embedding's gradient took the IndexedSlices path.
    for result in results:
        assert result["gradient_types"][0] == "IndexedSlices"
        assert "IndexedSlices" not in result["gradient_types"][1:]
        # strategy.reduce of the per-replica losses: the global batch's loss.
        np.testing.assert_allclose(result["loop_losses"], loop_losses, 1e-5)
        # Keras logs each epoch's mean of the steps' losses.
        np.testing.assert_allclose(
            result["fit_loss"],
            np.mean(np.reshape(fit_losses, (-1, per_epoch)), axis=1),
            rtol=1e-5,
        )
