"""Keras `BackupAndRestore` under `tf_crossdevice.MultiWorkerMirroredStrategy`.

A 2-worker `model.fit` job (keras_backup_worker.py) with one worker killed
mid-epoch, then started again with the same backup folders: the restarted
job runs only the epochs after the last backup and ends with the weights
of a job that was never interrupted, computed by numpy (SGD with momentum
on the same batches from the same initial weights). Every process is
stopped when the test ends.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import psutil
import pytest

from tests.training import keras_backup_worker
from tf_crossdevice import launch
from tf_crossdevice.cluster import processes

pytestmark = pytest.mark.slow

WORKER = os.path.join(os.path.dirname(__file__), "keras_backup_worker.py")
TIMEOUT = 180  # Seconds for one job; generous, for a loaded machine.
PAUSE_EPOCH = 3  # Epochs 0-2 are backed up when the worker is killed.


def start_job(backup_dir, out_dir, *extra: str) -> list[processes.Child]:
    os.makedirs(out_dir, exist_ok=True)
    return [
        processes.Child(
            [sys.executable, WORKER, str(backup_dir), str(out_dir), *extra],
            name=f"worker {i}",
            env=env,
        )
        for i, env in enumerate(launch.tf_config_envs(2))
    ]


def finish(job: list[processes.Child]) -> list[list[str]]:
    """Each worker's lines; raises unless every worker exits 0."""
    try:
        lines = [w.read_all(TIMEOUT) for w in job]
        assert [w.wait(TIMEOUT) for w in job] == [0, 0]
        return lines
    finally:
        processes.stop_all(job)


def begun(lines: list[str]) -> list[int]:
    return [int(x.split()[1]) for x in lines if x.endswith(" begins")]


def numpy_fit(initial: list[np.ndarray]) -> list[np.ndarray]:
    """The uninterrupted job's weights: Dense(4) then Dense(2), mean squared
    error, SGD with momentum (Keras's update: v = 0.9 v - lr g; w += v)."""
    x, y = (a.astype(np.float64) for a in keras_backup_worker.examples())
    w = [a.astype(np.float64) for a in initial]
    velocity = [np.zeros_like(a) for a in w]
    batch = keras_backup_worker.GLOBAL_BATCH
    for _ in range(keras_backup_worker.EPOCHS):
        for start in range(0, len(x), batch):
            xb, yb = x[start : start + batch], y[start : start + batch]
            hidden = xb @ w[0] + w[1]
            d_out = 2 * (hidden @ w[2] + w[3] - yb) / yb.size
            d_hidden = d_out @ w[2].T
            grads = [xb.T @ d_hidden, d_hidden.sum(0), hidden.T @ d_out,
                     d_out.sum(0)]  # fmt: skip
            for i, g in enumerate(grads):
                velocity[i] = 0.9 * velocity[i] - keras_backup_worker.LR * g
                w[i] = w[i] + velocity[i]
    return w


def arrays(path) -> list[np.ndarray]:
    saved = np.load(path)
    return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def test_killed_worker_restarts_to_the_weights_of_an_uninterrupted_job(
    tmp_path,
):
    killed = start_job(
        tmp_path / "backup", tmp_path / "killed", str(PAUSE_EPOCH)
    )
    try:
        for worker in killed:
            while worker.read_line(TIMEOUT) != f"paused in epoch {PAUSE_EPOCH}":
                pass
        # Mid-epoch: both workers have run 3 batches of the epoch.
        killed[1].kill()
        assert killed[1].process.returncode == -9
    finally:
        processes.stop_all(killed)
    assert not [w.pid for w in killed if psutil.pid_exists(w.pid)]
    # The backup folder of each worker holds the end of epoch 2.
    for task in (0, 1):
        assert os.path.exists(
            tmp_path / "backup" / f"task_{task}" / "latest.weights.h5"
        )

    restarted = finish(start_job(tmp_path / "backup", tmp_path / "restarted"))
    # Resumed, not started over: only the epochs after the backup ran.
    assert begun(restarted[0]) == begun(restarted[1]) == [3, 4]
    got = arrays(tmp_path / "restarted" / "weights.npz")
    want = numpy_fit(arrays(tmp_path / "killed" / "initial.npz"))
    assert len(got) == len(want) == 4
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # The job's end removes the backup (Keras's delete_checkpoint=True).
    assert not os.path.exists(tmp_path / "backup" / "task_0")
