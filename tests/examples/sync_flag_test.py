"""examples/train.py --sync=diloco on 2 local workers x 2 devices: killed
between two syncs, the job is restarted by its launcher from the last
sync's checkpoint, replays the period on the same data, and ends with the
weights of an uninterrupted run, which also scores its held-out examples
at checkpoints (--eval_every) (tests/training/periodic_sync_test.py
checks the updates themselves against numpy). Every process is stopped
when its test ends, also on failure.
"""

from __future__ import annotations

import re
import signal

import psutil
import pytest

from tests.examples.examples_test import (
    TIMEOUT,
    _task_of,
    assert_no_error_lines,
    digest,
    start,
)

pytestmark = pytest.mark.slow

PERIOD = 8
STEPS = 4 * PERIOD
ARGS = [
    "--model=dense",
    "--depth=1",
    "--width=32",
    "--image_size=8",
    "--num_examples=512",
    "--batch_size=8",
    f"--steps={STEPS}",
    f"--log_every={PERIOD}",
    f"--sync_period={PERIOD}",
    f"--sync_warmup_steps={PERIOD}",
    "--loop=custom",
    "--timeout_seconds=60",
]


def test_a_worker_killed_between_syncs_restarts_to_the_uninterrupted_weights(
    tmp_path,
):
    diloco = [*ARGS, "--sync=diloco"]
    with (
        start(
            *diloco, "--eval_every=16", f"--model_dir={tmp_path / 'whole'}"
        ) as whole_job,
        start(
            *diloco, "--max_restarts=1", f"--model_dir={tmp_path / 'killed'}"
        ) as job,
    ):
        lines = []
        # The first sync after the warm-up (step 16) is saved; the kill
        # comes while the workers take the next period's steps alone.
        saved = f"checkpoint saved at step {2 * PERIOD}"
        while not lines or saved not in lines[-1]:
            lines.append(job.read_line(TIMEOUT))
        workers = psutil.Process(job.pid).children()
        (chief,) = [w for w in workers if _task_of(w) == 0]
        chief.send_signal(signal.SIGKILL)
        lines += job.read_all(TIMEOUT)
        whole = "\n".join(whole_job.read_all(TIMEOUT))
        assert_no_error_lines(whole_job.stderr_text())
    out = "\n".join(lines)
    assert "--sync=diloco, every 8 steps after 8 synchronous ones" in whole
    resumed = re.search(
        r"\[worker 0\] restart 1: 2 workers, from step (\d+)", out
    )
    assert resumed, out
    # A sync's step: the checkpoints fall on syncs only.
    assert int(resumed[1]) % PERIOD == 0 and int(resumed[1]) >= 2 * PERIOD
    assert "replica weights equal: yes (4 replicas)" in out
    assert digest(out) == digest(whole)
    # --eval_every: the chief scored the held-out examples at steps 16 and
    # 32, the last on the final weights.
    scores = re.findall(
        r"\[worker 0\] held-out accuracy at step (\d+): (0\.\d{4}) "
        r"\(1024 examples, \d+\.\d{3} s\)",
        whole,
    )
    assert [step for step, _ in scores] == ["16", "32"], whole
    final = re.search(r"held-out accuracy: (0\.\d{3}) \(1024", whole)
    assert final and f"{float(scores[-1][1]):.3f}" == final[1]
