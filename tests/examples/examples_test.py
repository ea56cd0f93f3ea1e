"""examples/train.py runs as a user runs it, in every mode, and does what it
prints: replicas agree, TensorBoard scalars and checkpoints are written, a
killed job resumes to the weights of an uninterrupted one, workers stop
without TensorFlow error lines. Every process is stopped when its test ends.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tf_crossdevice.cluster import processes

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
TRAIN = os.path.join(ROOT, "examples", "train.py")
TIMEOUT = 240  # Seconds for one job; generous, for a loaded machine.
# Small and quick: the point is every path, not accuracy.
TINY_CNN = ["--depth=1", "--width=4", "--image_size=8", "--num_examples=512"]


def start(*args: str, env: dict[str, str] | None = None) -> processes.Child:
    return processes.Child(
        [sys.executable, TRAIN, *args], name="train.py", env=env
    )


def run(*args: str) -> str:
    """The job's stdout; raises with its stderr tail unless it exits 0."""
    with start(*args) as job:
        out = "\n".join(job.read_all(TIMEOUT))
        assert_no_error_lines(job.stderr_text())
        return out


def assert_no_error_lines(stderr: str) -> None:
    """No TensorFlow ERROR/FATAL log line, but the CUDA wheel's start-up
    complaint that this CPU-only machine has no driver."""
    errors = [
        line
        for line in stderr.splitlines()
        if re.match(r"[EF]\d{4} ", line) and "cuInit" not in line
    ]
    assert not errors, "\n".join(errors)


def digest(out: str) -> str:
    return re.search(r"weights digest: (\w+)", out)[1]


def scalar_tags(log_dir: str) -> dict[str, list[float]]:
    """Every scalar TensorBoard would show, by tag, in step order."""
    tags: dict[str, list[float]] = {}
    for path in sorted(glob.glob(os.path.join(log_dir, "events.out.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                tags.setdefault(value.tag, []).append(number)
    return tags


def check_model_dir(model_dir: str, steps: int) -> None:
    tags = scalar_tags(os.path.join(model_dir, "train"))
    for tag in ("loss", "accuracy", "step_time_seconds", "examples_per_second"):
        assert tags.get(tag), f"no {tag} scalars in {model_dir}/train"
        assert all(np.isfinite(tags[tag])), tags[tag]
    assert 0.0 <= min(tags["accuracy"]) <= max(tags["accuracy"]) <= 1.0
    assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{steps}")


def test_default_job_trains_between_graph_and_stops_its_workers(tmp_path):
    # The README's main job (collective, HierarchicalCollectiveAllReduce,
    # model.fit, 2 workers x 2 devices), tiny and short.
    out = run(
        *TINY_CNN, "--steps=8", "--log_every=4", f"--model_dir={tmp_path}"
    )
    assert "[worker 0] mode=collective: 2 workers x 2 devices, " in out
    assert "HierarchicalCollectiveAllReduce" in out
    assert re.search(r"\[worker 0\] step +8/8 .* examples/s .* ETA", out)
    assert "[worker 0] replica weights equal: yes (4 replicas)" in out
    assert "[worker 1]" not in out  # Only the chief reports.
    assert "workers stopped (exit statuses [0, 0])" in out
    check_model_dir(str(tmp_path), 8)
    assert not os.path.exists(tmp_path / ".scratch" / "task_1")


def test_collective_workers_from_flags_exit_without_errors(tmp_path):
    # One command per host, as on real machines: --worker_hosts and
    # --task_index instead of TF_CONFIG; CollectiveAllReduce, custom loop.
    hosts = [f"127.0.0.1:{p}" for p in processes.free_ports(2)]
    common = [
        "--model=dense",
        "--image_size=8",
        "--num_examples=512",
        "--loop=custom",
        "--cross_device_ops=CollectiveAllReduce",
        "--bytes_per_pack=4096",
        "--steps=6",
        "--log_every=3",
        f"--worker_hosts={','.join(hosts)}",
        f"--model_dir={tmp_path}",
        "--timeout_seconds=120",
    ]
    workers = [
        start(*common, "--job_name=worker", f"--task_index={i}") for i in (0, 1)
    ]
    try:
        outs = ["\n".join(w.read_all(TIMEOUT)) for w in workers]
        for w in workers:
            assert_no_error_lines(w.stderr_text())
    finally:
        processes.stop_all(workers)
    assert "CollectiveAllReduce" in outs[0]
    assert "replica weights equal: yes (4 replicas)" in outs[0]
    assert outs[1] == ""  # Only the chief reports.
    check_model_dir(str(tmp_path), 6)


def test_in_graph_job_drives_local_workers(tmp_path):
    out = run(
        "--mode=in_graph",
        *TINY_CNN,
        "--all_reduce_spec=xring#2",
        "--steps=6",
        "--log_every=3",
        f"--model_dir={tmp_path}",
    )
    assert "2 workers x 2 devices, MultiWorkerAllReduce" in out
    assert "all_reduce_spec='xring#2'" in out
    assert "replica weights equal: yes (4 replicas)" in out
    assert out.rstrip().splitlines()[-1].startswith("workers stopped")
    check_model_dir(str(tmp_path), 6)


def write_image_folder(root) -> str:
    """3 classes of 8x8 PNGs told apart by their colour."""
    rng = np.random.default_rng(0)
    for label in range(3):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True)
        for i in range(16):
            image = rng.integers(0, 80, size=(8, 8, 3))
            image[..., label] += 170
            png = tf.io.encode_png(image.astype(np.uint8)).numpy()
            (folder / f"{i}.png").write_bytes(png)
    return str(root)


@pytest.mark.parametrize(
    ("mode", "steps"),
    [
        # Enough steps that the killed job is still training when the test
        # reads its first checkpoint line and kills it.
        pytest.param("mirrored", 300, id="mirrored"),
        pytest.param("collective", 60, id="collective"),
        pytest.param("in_graph", 60, id="in_graph"),
    ],
)
def test_killed_job_resumes_to_the_weights_of_an_uninterrupted_one(
    tmp_path, mode, steps
):
    # collective and in_graph start 2 local workers; killing the job kills
    # its whole process tree, as a lost machine or Ctrl-C would.
    data_dir = write_image_folder(tmp_path / "images")
    args = [
        f"--mode={mode}",
        "--model=dense",
        f"--data_dir={data_dir}",
        "--image_size=8",
        "--batch_size=8",
        f"--steps={steps}",
        "--log_every=10",
    ]
    replicas = 2 if mode == "mirrored" else 4
    model_dir = f"--model_dir={tmp_path / 'killed'}"
    # Side by side: the uninterrupted run, and one killed after a checkpoint.
    with (
        start(*args, f"--model_dir={tmp_path / 'whole'}") as uninterrupted,
        start(*args, model_dir) as job,
    ):
        while "checkpoint saved at step" not in job.read_line(TIMEOUT):
            pass
        job.kill()
        whole = "\n".join(uninterrupted.read_all(TIMEOUT))
        assert_no_error_lines(uninterrupted.stderr_text())
    assert "3 classes" in whole
    assert f"replica weights equal: yes ({replicas} replicas)" in whole
    assert f"trained {steps} steps in this run, from step 0" in whole
    resumed = run(*args, model_dir)
    step = int(re.search(r"resumed from step (\d+)", resumed)[1])
    assert 10 <= step < steps and step % 10 == 0, step
    # Only the steps the killed job had not saved, on every replica.
    assert f"trained {steps - step} steps in this run, from step {step}" in (
        resumed
    )
    assert f"replica weights equal: yes ({replicas} replicas)" in resumed
    assert digest(resumed) == digest(whole)
    check_model_dir(str(tmp_path / "killed"), steps)


def test_bad_flags_exit_with_status_1_naming_the_flag():
    result = subprocess.run(
        [sys.executable, TRAIN, "--batch_size=30"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=processes.child_env(),
    )
    assert result.returncode == 1, result.stderr
    assert "--batch_size: 30 does not split over 4 replicas" in result.stderr
