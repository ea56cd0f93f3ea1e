"""examples/train.py runs as a user runs it, in every mode, and does what it
prints: replicas agree, TensorBoard scalars and checkpoints are written, a
preempted job (SIGTERM) saves at one step on every worker, exits 0 and
resumes to the weights of an uninterrupted one, workers stop without
TensorFlow error lines. Each mode runs once uninterrupted (its workers on
emulated hosts, --link_rate), beside a preempted run of the same command,
to save start-ups. Every process is
stopped when its test ends.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import psutil
import pytest
import tensorflow as tf

from tf_crossdevice.cluster import hosts as hosts_lib
from tf_crossdevice.cluster import processes

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
TRAIN = os.path.join(ROOT, "examples", "train.py")
TIMEOUT = 240  # Seconds for one job; generous, for a loaded machine.


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


def check_parts(out: str, share: float | None = None) -> None:
    """The summary's step parts (--timing_steps): each time measured, and
    each ratio what the printed times give; the cores kept busy within
    the host's core `share` (None: the machine's cores)."""
    times = re.search(
        r"step ([\d.]+) ms; this host alone ([\d.]+) ms; all-reduce alone "
        r"([\d.]+) ms",
        out,
    )
    assert times, out
    step, alone, all_reduce = (float(t) for t in times.groups())
    assert step > 0 and alone > 0 and all_reduce > 0, times[0]

    def ratio(name: str) -> float:
        return float(re.search(rf"{name}: ([\d.]+) ", out)[1])

    # Printed to 0.1 ms and two decimals: each time off by up to 0.05 ms.
    def close(a: float, b: float) -> dict[str, float]:
        return {"abs": 0.006 + a / b * 0.05 * (1 / a + 1 / b)}

    longer = max(alone, all_reduce)
    assert ratio("all-reduce share of the step") == pytest.approx(
        all_reduce / step, **close(all_reduce, step)
    )
    assert ratio("overlap") == pytest.approx(
        step / longer, **close(step, longer)
    )
    assert ratio("scaling efficiency") == pytest.approx(
        alone / step, **close(alone, step)
    )
    forward = re.search(
        r"forward pass alone ([\d.]+) ms: no step under it \+ the "
        r"all-reduce alone, ([\d.]+) ms",
        out,
    )
    assert forward, out
    # The bound adds the forward pass to the all-reduce alone. (Against the
    # step alone nothing holds at these sizes: a call of a few ms is mostly
    # its dispatch, which the two pay differently.)
    assert float(forward[1]) > 0, forward[0]
    assert float(forward[2]) == pytest.approx(
        float(forward[1]) + all_reduce, abs=0.11
    )
    cores = re.search(
        r"cores busy \(CPU time / wall time\): step ([\d.]+), alone "
        r"([\d.]+), all-reduce alone ([\d.]+)",
        out,
    )
    assert cores, out
    # Over the training's steps: within the share (a quota lets a host
    # overdraw it by a little within a period). Another process's CPU time
    # comes in clock ticks (10 ms), too coarse to bound the figures of the
    # few short calls timed here.
    step_busy = float(cores[1])
    assert 0 < step_busy <= 1.1 * (share or os.cpu_count()), cores[0]


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
        "--timing_steps=2",
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
    check_parts(outs[0])
    assert outs[1] == ""  # Only the chief reports.
    check_model_dir(str(tmp_path), 6)


def test_tensorflow_baseline_trains_with_tfs_own_strategy(tmp_path):
    # The job's baseline: the same flags, TensorFlow's strategy instead.
    out = run(
        "--cross_device_ops=TensorFlow",
        "--devices_per_worker=1",
        "--bytes_per_pack=4096",
        "--model=dense",
        "--image_size=8",
        "--num_examples=512",
        "--steps=6",
        "--log_every=3",
        f"--model_dir={tmp_path}",
        "--timing_steps=2",
    )
    assert (
        "2 workers x 1 devices, TensorFlow's MultiWorkerMirroredStrategy" in out
    )
    assert "replica weights equal: yes (2 replicas)" in out
    check_parts(out)
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


def preemption_target(job: processes.Child, mode: str) -> psutil.Process:
    """Where a cluster manager's SIGTERM goes: worker 1 of a collective job
    (its launcher's child with task index 1), the server of worker 1 of an
    in-graph job (it records a notice that its controller reads), the one
    training process of a mirrored job."""
    if mode == "mirrored":
        return psutil.Process(job.pid)
    for child in psutil.Process(job.pid).children():
        if mode == "collective":
            if _task_of(child) == 1:
                return child
        elif "--task_index=1" in child.cmdline():
            return child
    raise AssertionError("the job has no worker 1")


STEPS = 20


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# Each mode's flags. collective: README's main job (its defaults: 2 local
# workers x 2 devices, HierarchicalCollectiveAllReduce, model.fit, the CNN),
# small, with PowerSGD, whose state each worker saves and restores (its
# classifier's 2048x3 kernel is compressed: the resumed weights match only
# if each replica's error and Q come back). in_graph: PowerSGD too, its
# state saved by the controller (the 192x32 hidden kernel is compressed).
MODE_FLAGS = {
    "mirrored": ["--mode=mirrored", "--loop=custom", "--model=dense"],
    "collective": [
        "--depth=1",
        "--width=32",
        "--compression=powersgd",
        "--powersgd_rank=1",
    ],
    "in_graph": [
        "--mode=in_graph",
        "--model=dense",
        "--width=32",
        "--all_reduce_spec=xring#2",
        "--compression=powersgd",
        "--powersgd_rank=1",
    ],
}


def check_uninterrupted(
    mode: str, whole: str, model_dir, default: bool = True
) -> None:
    """What each mode's uninterrupted job prints and writes (`default`:
    with the mode's own class and loop)."""
    replicas = 2 if mode == "mirrored" else 4
    assert "3 classes" in whole
    assert f"replica weights equal: yes ({replicas} replicas)" in whole
    assert f"trained {STEPS} steps in this run, from step 0" in whole
    if mode == "collective":
        assert "starting 2 local workers on emulated hosts at 10gbit" in whole
        assert "[worker 0] mode=collective: 2 workers x 2 devices, " in whole
        if default:
            assert "HierarchicalCollectiveAllReduce" in whole
            assert "loop=fit" in whole
        assert re.search(rf"\[worker 0\] step +{STEPS}/{STEPS} .* ETA", whole)
        assert "[worker 1]" not in whole  # Only the chief reports.
        assert "workers stopped (exit statuses [0, 0])" in whole
        assert not os.path.exists(model_dir / ".scratch" / "task_1")
    if mode == "in_graph":
        assert re.search(
            r'local worker servers: \{"worker": \["198\.18\.', whole
        )
        assert "2 workers x 2 devices, MultiWorkerAllReduce" in whole
        assert "all_reduce_spec='xring#2'" in whole
        # The controller reads its first worker's CPU: one of 2 cores each.
        check_parts(whole, share=os.cpu_count() / 2)
        assert whole.rstrip().splitlines()[-1].startswith("workers stopped")
    check_model_dir(str(model_dir), STEPS)


# The flat collective under the custom loop (the rest of the collective
# mode's flags, PowerSGD included, as above).
FLAT_CUSTOM = ["--loop=custom", "--cross_device_ops=CollectiveAllReduce"]


@pytest.mark.parametrize(
    ("mode", "loop", "extra", "controller"),
    [
        pytest.param("mirrored", "custom", [], False, id="mirrored-custom"),
        # Only worker 1 is signalled: the workers must agree on a step.
        pytest.param("collective", "fit", [], False, id="collective-fit"),
        pytest.param(
            "collective", "custom", FLAT_CUSTOM, False, id="collective-flat"
        ),
        pytest.param("in_graph", "custom", [], False, id="in_graph-custom"),
        # The notice goes to the controller, not to a worker's server.
        pytest.param("in_graph", "custom", [], True, id="in_graph-controller"),
    ],
)
def test_preempted_job_resumes_to_the_weights_of_an_uninterrupted_one(
    tmp_path, mode, loop, extra, controller
):
    # The uninterrupted job also shows that each mode trains and reports.
    data_dir = write_image_folder(tmp_path / "images")
    args = [
        *MODE_FLAGS[mode],
        *extra,
        f"--data_dir={data_dir}",
        "--image_size=8",
        "--batch_size=8",
        f"--steps={STEPS}",
        "--log_every=5",
        "--timeout_seconds=60",
    ]
    replicas = 2 if mode == "mirrored" else 4
    model_dir = f"--model_dir={tmp_path / 'preempted'}"
    # The uninterrupted run of the modes with workers runs them on emulated
    # hosts (--link_rate): the links change no number, so its weights must
    # still be those of the run preempted and resumed on 127.0.0.1.
    emulated = [] if mode == "mirrored" else ["--link_rate=10gbit"]
    # In-graph, it also times its step's parts (after its weights were
    # read): the first host's copies take the step alone.
    emulated += ["--timing_steps=2"] if mode == "in_graph" else []
    # Side by side: the uninterrupted run, and one preempted as it starts
    # training (after the chief's line on the model, when every worker
    # watches for the signal).
    with (
        start(
            *args, *emulated, f"--model_dir={tmp_path / 'whole'}"
        ) as uninterrupted,
        start(*args, model_dir) as job,
    ):
        lines = []
        while not lines or f"loop={loop}" not in lines[-1]:
            lines.append(job.read_line(TIMEOUT))
        tree = psutil.Process(job.pid).children(recursive=True)
        target = (
            psutil.Process(job.pid)
            if controller
            else preemption_target(job, mode)
        )
        target.send_signal(signal.SIGTERM)
        lines += job.read_all(TIMEOUT)
        assert job.wait(TIMEOUT) == 0
        assert_no_error_lines(job.stderr_text())
        whole = "\n".join(uninterrupted.read_all(TIMEOUT))
        assert_no_error_lines(uninterrupted.stderr_text())
    assert not [p for p in tree if alive(p)], "processes left"
    saved = [
        int(found[1])
        for line in lines
        if (
            found := re.search(
                r"preempted: checkpoint saved at step (\d+)", line
            )
        )
    ]
    # Every worker saved, at one step, before the end.
    assert len(saved) == (2 if mode == "collective" else 1), lines
    assert len(set(saved)) == 1 and 1 <= saved[0] < STEPS, saved
    if mode == "collective":
        assert "workers stopped (exit statuses [0, 0])" in "\n".join(lines)
    step = saved[0]
    assert tf.train.latest_checkpoint(str(tmp_path / "preempted")).endswith(
        f"ckpt-{step}"
    )
    check_uninterrupted(mode, whole, tmp_path / "whole", default=not extra)
    if extra:
        assert "2 workers x 2 devices, CollectiveAllReduce\n" in whole + "\n"

    resumed = run(*args, model_dir)
    assert f"resumed from step {step} " in resumed
    # Only the steps after the preemption, on every replica.
    assert f"trained {STEPS - step} steps in this run, from step {step}" in (
        resumed
    )
    assert f"replica weights equal: yes ({replicas} replicas)" in resumed
    assert digest(resumed) == digest(whole)
    check_model_dir(str(tmp_path / "preempted"), STEPS)


def test_bad_flags_exit_with_status_1_naming_the_flag():
    result = subprocess.run(
        [sys.executable, TRAIN, "--batch_size=30"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=processes.child_env(),
    )
    assert result.returncode == 1, result.stderr
    # The rule alone: no flag's value but those it names (TensorFlow's
    # start-up lines may come before it).
    assert result.stderr.endswith(
        "FATAL Flags parsing error: --batch_size: 30 does not split over 4 "
        "replicas (2 workers x 2 devices_per_worker); use a multiple of 4\n"
        "Pass --helpshort or --helpfull to see help on flags.\n"
    ), result.stderr
    assert "num_workers=2" not in result.stderr


def test_the_main_job_trains_steps_not_a_multiple_of_log_every(tmp_path):
    """README's main job (model.fit on two local workers), small: 5 steps
    with a progress line every 2 end with a line and a checkpoint at 5."""
    out = run(
        "--model=dense",
        "--image_size=8",
        "--num_examples=256",
        "--batch_size=8",
        "--steps=5",
        "--log_every=2",
        f"--model_dir={tmp_path}",
    )
    lines = re.findall(r"^\[worker 0\] step +(\d+)/5 ", out, re.MULTILINE)
    assert lines == ["2", "4", "5"], out
    assert "trained 5 steps in this run, from step 0" in out
    assert "workers stopped (exit statuses [0, 0])" in out
    check_model_dir(str(tmp_path), 5)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_lost_worker_is_restarted_to_the_weights_of_an_uninterrupted_job(
    tmp_path, how
):
    """--max_restarts=1: after the first checkpoint the chief (worker 0)
    is killed (SIGKILL), or worker 1 hangs (SIGSTOP: it neither exits nor
    fails, and its peer waits in a collective whose timeout is far off,
    so only the launcher's --stall_seconds sees it); the launcher starts
    both workers again, they resume from the last checkpoint and end with
    an uninterrupted run's weights. The killed job trains with
    --sync=diloco: the kill lands while the workers step alone between two
    syncs, the restart replays that period from the last sync's checkpoint
    (each worker's own optimizer state with it), and the uninterrupted
    run also scores its held-out examples at checkpoints (--eval_every).
    """
    args = [
        "--model=dense",
        "--depth=1",
        "--width=32",
        "--image_size=8",
        "--num_examples=256",
        "--batch_size=8",
        f"--steps={STEPS}",
        "--log_every=5",
    ]
    if how == "killed":
        args += [
            "--sync=diloco",
            "--sync_period=5",
            "--sync_warmup_steps=5",
            "--eval_every=10",
        ]
    watch = (
        ["--timeout_seconds=20"]
        if how == "killed"
        else ["--timeout_seconds=120", "--stall_seconds=10"]
    )
    with (
        start(*args, f"--model_dir={tmp_path / 'whole'}") as uninterrupted,
        start(
            *args,
            *watch,
            "--max_restarts=1",
            f"--model_dir={tmp_path / 'lost'}",
        ) as job,
    ):
        lines = []
        while not lines or "checkpoint saved at step 5" not in lines[-1]:
            lines.append(job.read_line(TIMEOUT))
        workers = psutil.Process(job.pid).children()
        assert len(workers) == 2, workers
        task = 0 if how == "killed" else 1
        (lost,) = [w for w in workers if _task_of(w) == task]
        lost.send_signal(signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        lines += job.read_all(TIMEOUT)
        if how == "killed":
            assert "[worker 0] exited with -9" in job.stderr_text()
        else:
            assert re.search(
                r"\[worker \d\] no heartbeat for 10 s \(stall_seconds\): the "
                r"round stops",
                job.stderr_text(),
            ), job.stderr_text()
        whole = "\n".join(uninterrupted.read_all(TIMEOUT))
        assert_no_error_lines(uninterrupted.stderr_text())
    out = "\n".join(lines)
    check_resumed(out, "global batch 8, learning rate 0.1")
    assert "restart 1: 2 workers\n" in out + "\n"
    assert "workers stopped (exit statuses [0, 0])" in out
    assert digest(out) == digest(whole)
    if how == "killed":
        check_sync_and_scores(out, whole)


def check_sync_and_scores(out: str, whole: str) -> None:
    """--sync=diloco: the restart resumed from a sync (checkpoints fall on
    syncs only); --eval_every=10: the chief scored the held-out examples
    at steps 10 and 20, the last on the final weights."""
    assert "--sync=diloco, every 5 steps after 5 synchronous ones" in whole
    resumed = re.search(
        r"\[worker 0\] restart 1: 2 workers, from step (\d+)", out
    )
    assert resumed and int(resumed[1]) % 5 == 0, out
    scores = re.findall(
        r"\[worker 0\] held-out accuracy at step (\d+): (0\.\d{4}) "
        r"\(1024 examples, \d+\.\d{3} s\)",
        whole,
    )
    assert [step for step, _ in scores] == ["10", "20"], whole
    final = re.search(r"held-out accuracy: (0\.\d{3}) \(1024", whole)
    assert final and f"{float(scores[-1][1]):.3f}" == final[1]


def check_resumed(out: str, trains_with: str) -> None:
    """The chief's line on restart 1 (2 workers, then `trains_with`) names
    a step from the first checkpoint on, and the run trained the rest."""
    resumed = re.search(
        r"\[worker 0\] restart 1: 2 workers, from step (\d+); "
        + re.escape(trains_with)
        + "\n",
        out + "\n",
    )
    assert resumed, out
    step = int(resumed[1])
    assert 5 <= step < STEPS
    assert f"trained {STEPS - step} steps in this run, from step {step}" in out


def _task_of(process: psutil.Process) -> int | None:
    """A worker's task index, from its TF_CONFIG (None: not a worker)."""
    with contextlib.suppress(psutil.Error, KeyError):
        return json.loads(process.environ()["TF_CONFIG"])["task"]["index"]
    return None


@pytest.mark.slow
def test_a_restart_runs_on_the_hosts_still_answering(tmp_path):
    """3 emulated hosts, --min_workers=2, under
    HierarchicalCollectiveAllReduce (whose abort path has crashed after a
    cut link: with the launcher a crash is a restart): host 2 goes off the
    network after the first checkpoint; the workers' collectives time out,
    and the restart trains the rest on hosts 0 and 1. --rescale=per_replica
    keeps each replica's 2 examples: the global batch goes from 12 to 8
    and the learning rate from 0.3 to 0.2."""
    with start(
        "--model=dense",
        "--depth=1",
        "--width=32",
        "--image_size=8",
        "--num_examples=256",
        "--batch_size=12",
        f"--steps={STEPS}",
        "--log_every=5",
        "--timeout_seconds=20",
        "--num_workers=3",
        "--min_workers=2",
        "--max_restarts=1",
        "--rescale=per_replica",
        "--cross_device_ops=HierarchicalCollectiveAllReduce",
        "--learning_rate=0.3",
        "--link_rate=1gbit",
        f"--model_dir={tmp_path}",
    ) as job:
        lines = []
        while not lines or "checkpoint saved at step 5" not in lines[-1]:
            lines.append(job.read_line(TIMEOUT))
        tree = psutil.Process(job.pid).children(recursive=True)
        (lost,) = [p for p in tree if _task_of(p) == 2 and p.name() != "sh"]
        namespace = subprocess.run(
            ["ip", "netns", "identify", str(lost.pid)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        subprocess.run(
            ["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True
        )
        lines += job.read_all(TIMEOUT)
    out = "\n".join(lines)
    assert "restart 1: 2 workers on hosts 0, 1 (2 does not answer)" in out
    assert "6 replicas; global batch 12; loop=fit" in out
    check_resumed(out, "global batch 8, learning rate 0.2")
    assert "replica weights equal: yes (4 replicas)" in out
    assert "workers stopped (exit statuses [0, 0])" in out
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"ckpt-{STEPS}")
    assert hosts_lib.leftovers(job.pid) == []
