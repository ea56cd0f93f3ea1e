"""Local SGD and DiLoCo between 2 worker processes of 2 CPU replicas each.

Each worker (tests/periodic_sync_worker.py, which holds the data) trains a
linear model without bias on the mean squared error, inner optimizer Keras
SGD with momentum, every replica on its own examples and each worker's
targets from its own true kernel: 1 synchronous step, then 2 periods of 2
local steps, each ended by a sync. What every worker must hold after each
step, `numpy_kernels`: the warm-up step on the job's mean gradient; a local
step on the worker's own mean gradient over its 2 replicas' examples, with
the worker's own momentum; at a sync the mean change since the last sync
applied to the anchor (local SGD: anchor - mean change; DiLoCo: Keras's
Nesterov SGD(0.7, momentum=0.9) with the mean change as gradient), then
every replica takes the anchor, keeping its momentum.

One job runs every case (`KINDS` x custom loop / `model.fit`); the resume
test adds a preempted and a restored job. Every process runs under a
timeout (the workers' collectives fail after `TIMEOUT_SECONDS`, the test
stops waiting after `WAIT_SECONDS`) and is stopped when its test or
fixture ends, also on failure.
"""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest

from tests import periodic_sync_worker as job
from tf_crossdevice import launch
from tf_crossdevice.cluster import processes

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
WAIT_SECONDS = 4 * job.TIMEOUT_SECONDS
CASES = list(itertools.product(job.KINDS, job.MODES))
CASE_IDS = [f"{kind}-{mode}" for kind, mode in CASES]
# Keras SGD's update, with momentum m: m <- momentum m - lr g, then
# w <- w + m, or with Nesterov w <- w + momentum m - lr g.
OUTER_LEARNING_RATE, OUTER_MOMENTUM = 0.7, 0.9  # DiLoCo's default


def worker_gradient(step: int, worker: int, kernel: np.ndarray) -> np.ndarray:
    """The gradient of the mean squared error over the worker's replicas'
    examples at `step` (0-based)."""
    batches = [
        job.batch(step, worker * job.LOCAL_DEVICES + local)
        for local in range(job.LOCAL_DEVICES)
    ]
    x = np.concatenate([x for x, _ in batches]).astype(np.float64)
    y = np.concatenate([y for _, y in batches]).astype(np.float64)
    return 2.0 * x.T @ (x @ kernel - y) / len(x)


def is_sync_step(step: int) -> bool:
    after = step - job.WARMUP_STEPS
    return after > 0 and after % job.PERIOD == 0


def numpy_kernels(
    kind: str,
    local_steps: bool = True,
    inner_state: str = "own",
    local_scale: float = 1.0,
) -> list[list[np.ndarray]]:
    """Each worker's kernel after each step: [step][worker], float64.

    Args:
        kind: "local_sgd" or "diloco".
        local_steps: False: every step on the job's mean gradient (what a
            helper whose steps were not local would give).
        inner_state: "own": each worker keeps its momentum; "mean": a sync
            also averages the momenta (not what the helpers do).
        local_scale: a local step applies this times the worker's mean
            gradient (1 / NUM_WORKERS: a within-worker SUM left unscaled).
    """
    workers = range(job.NUM_WORKERS)
    kernel = [job.INITIAL_KERNEL.astype(np.float64) for _ in workers]
    momentum = [np.zeros_like(k) for k in kernel]
    anchor = kernel[0].copy()
    outer_momentum = np.zeros_like(anchor)
    out = []
    for step in range(1, job.STEPS + 1):
        grads = [worker_gradient(step - 1, w, kernel[w]) for w in workers]
        if step <= job.WARMUP_STEPS or not local_steps:
            # Every worker at the same weights: the job's mean gradient (the
            # workers have as many examples each).
            grads = [np.mean(grads, axis=0)] * job.NUM_WORKERS
        else:
            grads = [local_scale * g for g in grads]
        for w in workers:
            momentum[w] = (
                job.MOMENTUM * momentum[w] - job.LEARNING_RATE * grads[w]
            )
            kernel[w] = kernel[w] + momentum[w]
        if step == job.WARMUP_STEPS:
            anchor = kernel[0].copy()
        if is_sync_step(step):
            change = np.mean([anchor - k for k in kernel], axis=0)
            if kind == "local_sgd":
                anchor = anchor - change
            else:
                outer_momentum = (
                    OUTER_MOMENTUM * outer_momentum
                    - OUTER_LEARNING_RATE * change
                )
                anchor = (
                    anchor
                    + OUTER_MOMENTUM * outer_momentum
                    - OUTER_LEARNING_RATE * change
                )
            kernel = [anchor.copy() for _ in workers]
            if inner_state == "mean":
                momentum = [np.mean(momentum, axis=0)] * job.NUM_WORKERS
        out.append([k.copy() for k in kernel])
    return out


def start_job(command: str, folder: pathlib.Path) -> list[processes.Child]:
    children: list[processes.Child] = []
    try:
        for task, env in enumerate(launch.tf_config_envs(job.NUM_WORKERS)):
            children.append(
                processes.start_module(
                    "tests.periodic_sync_worker",
                    command,
                    str(folder),
                    name=f"worker {task} ({command})",
                    env=env,
                    cwd=ROOT,
                )
            )
    except BaseException:
        processes.stop_all(children)
        raise
    return children


def run_job(
    command: str, folder: pathlib.Path, replies: int = 1
) -> list[list[dict]]:
    """The job's replies: [reply][task]; every worker must exit 0."""
    children = start_job(command, folder)
    try:
        out = [
            [c.receive(timeout=WAIT_SECONDS) for c in children]
            for _ in range(replies)
        ]
        for child in children:
            assert child.wait(timeout=WAIT_SECONDS) == 0, child.stderr_text(
                3000
            )
        return out
    finally:
        processes.stop_all(children)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    """{(kind, mode): [reply per task]}; the DiLoCo loop is the resume
    test's uninterrupted run (it checkpoints as the preempted one does)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    out: dict = {}
    for per_task in run_job("cases", folder, replies=len(CASES)):
        kind, mode = per_task[0]["kind"], per_task[0]["mode"]
        assert all((r["kind"], r["mode"]) == (kind, mode) for r in per_task)
        out[kind, mode] = per_task
    assert sorted(out) == sorted(CASES)
    return out


def worker_kernels(per_task: list[dict]) -> list[list[np.ndarray]]:
    """[step][task] kernels; each worker's replicas hold the same one."""
    out = []
    steps = len(per_task[0]["kernels"])
    for step in range(steps):
        row = []
        for task, reply in enumerate(per_task):
            local = [np.asarray(k) for k in reply["kernels"][step]]
            assert len(local) == job.LOCAL_DEVICES
            for replica, kernel in enumerate(local[1:], start=1):
                np.testing.assert_array_equal(
                    kernel, local[0],
                    err_msg=f"task {task} replica {replica} step {step + 1}",
                )  # fmt: skip
            row.append(local[0])
        out.append(row)
    return out


def assert_numpy(
    got: list[list[np.ndarray]],
    want: list[list[np.ndarray]],
    first_step: int = 1,
) -> None:
    for step, (row, want_row) in enumerate(zip(got, want, strict=True)):
        for task, (kernel, expected) in enumerate(
            zip(row, want_row, strict=True)
        ):
            np.testing.assert_allclose(
                kernel, expected, rtol=1e-5, atol=1e-6,
                err_msg=f"task {task} after step {step + first_step}",
            )  # fmt: skip


def test_the_workers_data_make_local_steps_matter():
    """The reference can tell a wrong helper: workers left alone drift apart
    by far more than the tolerance; a helper whose steps reduced over every
    worker, that averaged the inner momenta, or whose local steps applied
    half the worker's mean gradient would end elsewhere; the two outer
    rules differ."""
    for kind in job.KINDS:
        want = numpy_kernels(kind)
        after = want[job.PREEMPTED_AFTER - 1]  # Mid-period.
        mid = np.abs(after[0] - after[1]).max()
        assert mid > 0.1, (kind, mid)
        for variant in (
            numpy_kernels(kind, local_steps=False),
            numpy_kernels(kind, inner_state="mean"),
            numpy_kernels(kind, local_scale=1 / job.NUM_WORKERS),
        ):
            gap = np.abs(variant[-1][0] - want[-1][0]).max()
            assert gap > 1e-3, (kind, gap)
    local_sgd, diloco = (numpy_kernels(kind)[-1][0] for kind in job.KINDS)
    gap = np.abs(local_sgd - diloco).max()
    assert gap > 0.1, gap


@pytest.mark.parametrize(("kind", "mode"), CASES, ids=CASE_IDS)
def test_every_worker_ends_with_numpys_kernel(cases, kind, mode):
    per_task = cases[kind, mode]
    assert [r["steps_done"] for r in per_task] == [job.STEPS] * job.NUM_WORKERS
    got = worker_kernels(per_task)
    assert len(got) == job.STEPS
    assert_numpy(got, numpy_kernels(kind))


@pytest.mark.parametrize(("kind", "mode"), CASES, ids=CASE_IDS)
def test_workers_drift_apart_between_syncs_and_agree_at_them(cases, kind, mode):
    """After the warm-up's step and at every sync both workers hold the same
    kernel, bit for bit; after the local steps between (2 and 4) they
    differ: those steps did not reduce between the workers."""
    got = worker_kernels(cases[kind, mode])
    for step, row in enumerate(got, start=1):
        if step <= job.WARMUP_STEPS or is_sync_step(step):
            np.testing.assert_array_equal(
                row[1], row[0], err_msg=f"after step {step}"
            )
        else:
            gap = np.abs(row[1] - row[0]).max()
            assert gap > 0.05, (step, gap)


def test_diloco_restored_after_a_preemption_ends_as_if_never_stopped(
    cases, tmp_path
):
    """A DiLoCo job checkpoints at the sync after step 3 (the model and the
    helper by the chief, each worker its inner optimizer), is stopped after
    step 4, and a new job restores that checkpoint and replays steps 4 and
    5 on the same data: it ends with the uninterrupted job's kernel."""
    uninterrupted = worker_kernels(cases["diloco", "loop"])
    (preempted,) = run_job("preempted", tmp_path)
    stopped = worker_kernels(preempted)
    assert len(stopped) == job.PREEMPTED_AFTER
    for task in range(job.NUM_WORKERS):
        np.testing.assert_allclose(
            stopped[-1][task],
            uninterrupted[job.PREEMPTED_AFTER - 1][task],
            rtol=1e-6, atol=0, err_msg=f"task {task}",
        )  # fmt: skip
    (restored,) = run_job("restored", tmp_path)
    assert [r["restored_steps_done"] for r in restored] == [
        job.CHECKPOINT_STEP
    ] * job.NUM_WORKERS
    replayed = worker_kernels(restored)
    assert len(replayed) == job.STEPS - job.CHECKPOINT_STEP
    for step, row in enumerate(replayed, start=job.CHECKPOINT_STEP + 1):
        for task, kernel in enumerate(row):
            np.testing.assert_allclose(
                kernel, uninterrupted[step - 1][task], rtol=1e-6, atol=0,
                err_msg=f"task {task} after step {step}",
            )  # fmt: skip
    assert_numpy(
        replayed,
        numpy_kernels("diloco")[job.CHECKPOINT_STEP :],
        first_step=job.CHECKPOINT_STEP + 1,
    )
