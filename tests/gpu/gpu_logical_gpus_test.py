"""The single-host classes on 1 to 8 logical GPUs of GPU:0, and the whole
contract on 8 of them.

TensorFlow fixes its devices when it initialises, so each device count runs
in a child process of its own (logical_gpus_child.py; the eight start side
by side), and the contract in a nested pytest run whose conftest splits
GPU:0 (gpu_contract_test.py). Logical GPUs share one GPU's memory: these
tests check numbers and placement on real GPU kernels and copies, not
speed between GPUs.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import time

import pytest

from tests.gpu import gpu_util, logical_gpus_child
from tf_crossdevice.cluster import processes

ROOT = pathlib.Path(__file__).resolve().parents[2]
COUNTS = range(1, 9)
TIMEOUT = 900  # Seconds for a child, or for the nested contract run.
pytestmark = gpu_util.needs_gpus(
    1, physical=True, why=" (split into 1 to 8 logical GPUs)"
)


@pytest.fixture(scope="module")
def replies():
    """Per device count, what its child answered: "devices", "links",
    "selected", "problems" (check -> None or what went wrong) and "error"
    (why the child stopped early, if it did). The children run side by
    side and are stopped before this returns."""
    children = {
        n: processes.start_module(
            "tests.gpu.logical_gpus_child",
            str(n),
            name=f"logical_gpus_child {n}",
            cwd=ROOT,
        )
        for n in COUNTS
    }
    out = {}
    try:
        for n, child in children.items():
            reply = out[n] = {"problems": {}, "error": None}
            try:
                reply.update(child.receive(TIMEOUT))
                while not (answer := child.receive(TIMEOUT)).get("done"):
                    reply["problems"][answer["check"]] = answer["problem"]
            except processes.ChildError as e:
                reply["error"] = str(e)
    finally:
        processes.stop_all(children.values())
    return out


@pytest.mark.parametrize("n", COUNTS)
@pytest.mark.parametrize("name", list(logical_gpus_child.CHECKS))
def test_all_reduce_on_logical_gpus(replies, name, n):
    reply = replies[n]
    if name not in reply["problems"]:
        pytest.fail(
            f"the child with {n} logical GPUs stopped before checking "
            f"{name}: {reply['error']}"
        )
    what = name
    if name == logical_gpus_child.SELECTED:
        what = f"{name} ({reply['selected']})"
    problem = reply["problems"][name]
    assert problem is None, f"{what} on {n} logical GPUs: {problem}"


@pytest.mark.parametrize("n", COUNTS)
def test_selection_follows_the_links(replies, n):
    """Logical GPUs of one GPU: whatever links TensorFlow reports between
    them, the rule of select_cross_device_ops applies to them."""
    reply = replies[n]
    if "selected" not in reply:
        pytest.fail(f"the child with {n} logical GPUs failed: {reply['error']}")
    want = gpu_util.rule_for_links(reply["devices"], reply["links"])
    assert reply["selected"] == want, reply["links"]


def test_contract_on_eight_logical_gpus():
    """gpu_contract_test.py in a pytest process whose GPU:0 is 8 logical
    GPUs; its JUnit XML goes to $OUT when that is set."""
    if gpu_util.physical_gpu_count() >= 8:
        pytest.skip(
            "this machine has 8 GPUs: gpu_contract_test.py runs on them "
            "directly"
        )
    args = ["tests/gpu/gpu_contract_test.py", "-q", "-rs"]
    args += ["-p", "no:cacheprovider"]
    if importlib.util.find_spec("xdist") is not None:
        args += ["-n", "4"]
    if os.environ.get("OUT"):
        args.append(f"--junitxml={os.environ['OUT']}/gpu_contract_8.xml")
    lines: list[str] = []
    code = None
    with processes.start_module(
        "pytest",
        *args,
        name="pytest gpu_contract_test.py on 8 logical GPUs",
        env={gpu_util.LOGICAL_GPUS_ENV: "8"},
        cwd=ROOT,
    ) as run:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                lines.append(run.read_line(max(deadline - time.monotonic(), 1)))
            except processes.ChildError as e:
                code = e.returncode
                break
    print("\n".join(lines[-40:]), file=sys.stderr)
    assert code == 0, "\n".join(lines[-80:])
