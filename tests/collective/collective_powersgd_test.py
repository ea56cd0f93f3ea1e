"""PowerSGD in the collective classes, on 2 worker processes x 2 devices.

Each worker (tests/powersgd_worker.py) trains a Dense layer with a Keras
SGD optimizer in a custom loop under our MultiWorkerMirroredStrategy with
CollectiveAllReduce, then HierarchicalCollectiveAllReduce, each given
`compression=PowerSGD(rank=1, start_step=2)` (its start_step condition
runs inside the strategy's tf.function), every global replica on its own
batch, and replies after every step. The
reference is computed here with numpy: the same gradients, summed by
`powersgd_reference.NumpyPowerSGD` (the algorithm written again from the
paper), applied by plain SGD. Checked after every step:

- every replica of every worker holds the same weights, bit for bit;
- they equal the numpy simulation (the first two steps exact, with zero
  errors, then compressed kernel, exact bias);
- each replica's error feedback equals the simulation's;
- `strategy.reduce` and a replica-context all-reduce of a scalar (the
  loss) stay exact.

Then Keras `model.fit` with PowerSGD on a linear regression: every replica
of every worker ends with the same kernel, the compressor counted one step
per batch, and the loss fell every epoch.

The workers are stopped when the replies are in, also on failure.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tests import powersgd_worker as worker
from tests.compression.powersgd_reference import NumpyPowerSGD
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.launch import tf_config_envs

pytestmark = pytest.mark.slow

TIMEOUT = 150  # Seconds for one reply, on a loaded machine.
REPLICAS = worker.NUM_WORKERS * worker.LOCAL_DEVICES


@pytest.fixture(scope="module")
def cluster() -> dict[str, list]:
    """{kind: replies[step][task], "fit": replies[task]}."""
    children: list[_processes.Child] = []
    try:
        for task, env in enumerate(tf_config_envs(worker.NUM_WORKERS)):
            children.append(
                _processes.start_module(
                    "tests.powersgd_worker",
                    name=f"worker {task}",
                    env=env,
                    cwd=worker._ROOT,
                )
            )
        out: dict[str, list[list[dict]]] = {}
        for kind in worker.KINDS:
            out[kind] = []
            for step in range(worker.STEPS):
                per_task = [c.receive(timeout=TIMEOUT) for c in children]
                assert all(
                    r["step"] == step and r["kind"] == kind for r in per_task
                ), per_task
                out[kind].append(per_task)
        out["fit"] = [c.receive(timeout=TIMEOUT) for c in children]
        return out
    finally:
        _processes.stop_all(children)


def simulate():
    """[(kernel, bias, errors per global replica, loss sum)] per step."""
    kernel, bias = (w.astype(np.float64) for w in worker.initial_weights())
    global_batch = worker.PER_REPLICA_BATCH * REPLICAS
    reference = NumpyPowerSGD(
        {0: (worker.FEATURES, worker.OUTPUTS)},
        rank=worker.RANK,
        replicas=REPLICAS,
        seed=worker.SEED,
        start_step=worker.START_STEP,
        dtype=tf.float32,
    )
    out = []
    for step in range(worker.STEPS):
        grads = {0: [], 1: []}
        loss = 0.0
        for g in range(REPLICAS):
            x, y = (a.astype(np.float64) for a in worker.batch(step, g))
            residual = x @ kernel + bias - y
            loss += np.sum(residual**2) / (2 * global_batch)
            grads[0].append(x.T @ residual / global_batch)
            grads[1].append(residual.sum(0) / global_batch)
        sums = reference.sum(grads)
        kernel = kernel - worker.LEARNING_RATE * sums[0]
        bias = bias - worker.LEARNING_RATE * sums[1]
        out.append((kernel, bias, list(reference.errors[0]), loss))
    return out


@pytest.fixture(params=worker.KINDS)
def replies(cluster, request) -> list[list[dict]]:
    """One collective class's replies[step][task]."""
    return cluster[request.param]


def everyone(per_task: list[dict], key: str) -> list[np.ndarray]:
    """Every global replica's value of `key` (task-major)."""
    return [np.asarray(v) for reply in per_task for v in reply[key]]


def test_weights_identical_everywhere_and_equal_to_numpy(replies):
    expected = simulate()
    for step, per_task in enumerate(replies):
        kernel, bias, _, _ = expected[step]
        for key, want in (("kernel", kernel), ("bias", bias)):
            got = everyone(per_task, key)
            assert len(got) == REPLICAS
            for g, value in enumerate(got[1:], start=1):
                np.testing.assert_array_equal(
                    value, got[0], err_msg=f"step {step}: replica {g}"
                )
            np.testing.assert_allclose(
                got[0], want, atol=2e-6, err_msg=f"step {step}: {key}"
            )
        assert [r["compressor_step"] for r in per_task] == [step + 1] * 2


def test_compressed_steps_differ_from_exact_sgd(replies):
    """The comparison above can tell compression from exact sums: after
    the first compressed step, exact SGD's kernel is another."""
    kernel, bias = (w.astype(np.float64) for w in worker.initial_weights())
    global_batch = worker.PER_REPLICA_BATCH * REPLICAS
    for step in range(worker.START_STEP + 1):
        kernel_grad, bias_grad = 0.0, 0.0
        for g in range(REPLICAS):
            x, y = (a.astype(np.float64) for a in worker.batch(step, g))
            residual = x @ kernel + bias - y
            kernel_grad += x.T @ residual / global_batch
            bias_grad += residual.sum(0) / global_batch
        kernel = kernel - worker.LEARNING_RATE * kernel_grad
        bias = bias - worker.LEARNING_RATE * bias_grad
    got = np.asarray(replies[worker.START_STEP][0]["kernel"][0])
    assert np.abs(got - kernel).max() > 1e-3


def test_error_feedback_per_replica_equals_numpy(replies):
    expected = simulate()
    for step, per_task in enumerate(replies):
        errors = everyone(per_task, "errors")
        for g in range(REPLICAS):
            np.testing.assert_allclose(
                errors[g],
                expected[step][2][g],
                atol=2e-6,
                err_msg=f"step {step}: replica {g}",
            )
        if step < worker.START_STEP:
            assert all(np.abs(e).max() == 0 for e in errors)
        else:
            assert max(np.abs(e).max() for e in errors) > 1e-3


def test_other_reductions_stay_exact(replies):
    expected = simulate()
    probe_sum = np.sum([worker.probe(g) for g in range(REPLICAS)], axis=0)
    for step, per_task in enumerate(replies):
        for reply in per_task:
            np.testing.assert_allclose(
                np.asarray(reply["reduced"]), probe_sum, rtol=1e-6, atol=1e-6
            )
        for loss_sum in everyone(per_task, "loss_sum"):
            np.testing.assert_allclose(loss_sum, expected[step][3], rtol=1e-5)


def test_keras_fit_keeps_replicas_identical_and_learns(cluster):
    per_task = cluster["fit"]
    assert all(r["fit"] for r in per_task)
    kernels = everyone(per_task, "kernel")
    assert len(kernels) == REPLICAS
    for g, kernel in enumerate(kernels[1:], start=1):
        np.testing.assert_array_equal(kernel, kernels[0], err_msg=f"{g}")
    global_batch = worker.PER_REPLICA_BATCH * REPLICAS
    steps = worker.FIT_EPOCHS * (worker.FIT_EXAMPLES // global_batch)
    assert [r["compressor_step"] for r in per_task] == [steps] * 2
    losses = per_task[0]["losses"]
    assert np.all(np.isfinite(losses))
    assert losses[2] < losses[1] < losses[0]


def test_one_worker_reduces_exactly_and_leaves_the_compressor_alone():
    """In this process (one worker): nothing crosses a worker boundary."""
    import tf_crossdevice
    from tf_crossdevice import testing
    from tf_crossdevice.compression import PowerSGD

    compressor = PowerSGD(rank=1, min_compression_size=0)
    ops = tf_crossdevice.CollectiveAllReduce(compression=compressor)
    assert ops.compression is compressor
    rng = np.random.default_rng(0)
    parts = [rng.normal(size=(8, 6)).astype(np.float32) for _ in range(2)]
    value = testing.per_replica([tf.constant(p) for p in parts])
    (reduced,) = ops.batch_reduce("sum", [(value, value)])
    for component in reduced.values:
        np.testing.assert_allclose(component.numpy(), parts[0] + parts[1])
    assert not compressor.variables  # Never used: no state, no step.


@pytest.mark.parametrize(
    "cls", ["CollectiveAllReduce", "HierarchicalCollectiveAllReduce"]
)
def test_compression_names_powersgd_among_the_allowed(cls):
    import tf_crossdevice

    with pytest.raises(
        ValueError,
        match="compression: unknown value 'powersgd'; expected one of None, "
        "'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD",
    ):
        getattr(tf_crossdevice, cls)(compression="powersgd")
