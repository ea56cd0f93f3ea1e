"""examples/train.py --uneven_data: the last of 2 local workers holds half
the batches of the other. Keras `fit` (the loss
`tf_crossdevice.training.AverageOverExamples`) and the custom loop
(`tf_crossdevice.training.compute_average_loss`) each run every step on
every worker, and they train to the same weights: two ways of dividing
each step's loss by the examples present agree bit for bit. Every process
is stopped when its test ends.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

from tf_crossdevice.cluster import processes

pytestmark = pytest.mark.slow

TRAIN = os.path.join(
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ),
    "examples",
    "train.py",
)
TIMEOUT = 240  # Seconds for one job; generous, for a loaded machine.
STEPS = 8


def run(*args: str) -> str:
    """The job's stdout; raises with its stderr tail unless it exits 0."""
    with processes.Child(
        [sys.executable, TRAIN, *args], name="train.py"
    ) as job:
        return "\n".join(job.read_all(TIMEOUT))


def summary_value(out: str, name: str) -> str:
    found = re.search(rf"{name}: (\S+)", out)
    assert found, out
    return found[1]


def test_fit_and_the_custom_loop_train_every_step_to_the_same_weights(
    tmp_path,
):
    outs = {
        loop: run(
            f"--loop={loop}",
            "--uneven_data=0.5",
            "--model=dense",
            "--image_size=8",
            "--num_examples=512",
            f"--steps={STEPS}",
            "--log_every=4",
            f"--model_dir={tmp_path / loop}",
            "--timeout_seconds=120",
        )
        for loop in ("fit", "custom")
    }
    for out in outs.values():
        # The steps of the worker with the most batches, on every replica.
        assert f"trained {STEPS} steps in this run, from step 0" in out, out
        assert (
            "uneven data: worker 1 (the last) has 4 of the others' 8 "
            "batches (50%)"
        ) in out
        assert "replica weights equal: yes (4 replicas)" in out
    fit, custom = outs["fit"], outs["custom"]
    assert summary_value(fit, "weights digest") == summary_value(
        custom, "weights digest"
    )
    # Both progress lines average the loss over the examples present.
    assert summary_value(fit, "final loss") == summary_value(
        custom, "final loss"
    )
