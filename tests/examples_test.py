"""The examples run as a user runs them, and do what they print."""

from __future__ import annotations

import os
import re
import sys

import pytest

from tf_crossdevice import _processes

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_example(name, *args, timeout=300):
    """Its stdout; raises with its stderr tail unless it exits with 0.

    On a timeout or failure the example's workers are stopped with it.
    """
    argv = [sys.executable, os.path.join(ROOT, "examples", name), *args]
    with _processes.Child(argv, name=name) as example:
        return "\n".join(example.read_all(timeout))


def losses(output):
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", output)]


def test_multi_worker_train_learns_and_stops_its_workers():
    out = run_example(
        "multi_worker_train.py", "--steps=40", "--all_reduce_spec=xring#2"
    )
    assert "2 workers x 2 replicas" in out
    error = float(re.search(r"vs numpy: max error ([0-9.e+-]+)", out)[1])
    assert error < 1e-5
    seen = losses(out)
    assert seen[-1] < seen[0] / 100, seen
    assert "replica copies agree to 0.0e+00" in out
    assert "time per step: median" in out
    assert out.rstrip().endswith("workers stopped")


# Every class is trained under MirroredStrategy in keras_fit_test; here the
# selection path and NCCL's CPU fallback run as a user would run them.
@pytest.mark.parametrize("algorithm", ["auto", "nccl"])
def test_mirrored_demo_learns(algorithm):
    out = run_example(
        "mirrored_demo.py", f"--algorithm={algorithm}", "--steps=60"
    )
    error = float(re.search(r"vs numpy: max error ([0-9.e+-]+)", out)[1])
    assert error < 1e-5
    seen = losses(out)
    assert seen[-1] < seen[0] / 100, seen
    assert "time per step: median" in out
