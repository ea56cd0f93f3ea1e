"""README's Python code blocks run, and compute what they should.

Each block runs in a Python process of its own, after the imports of the
blocks above it (as a reader pasting them in order has them), on 4 logical
CPU devices that the process asks for before TensorFlow initialises; a device
named "/gpu:N" becomes "/cpu:N". What a block takes as given (a model, a
dataset, a cluster spec) a stand-in provides, and a check then compares what
the block made with numpy. Every block needs exactly one case below, so a new
block fails here until it has one.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import re
import subprocess
import sys

import pytest

from tf_crossdevice.cluster import processes

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@dataclasses.dataclass(frozen=True)
class Block:
    line: int  # README's line of the block's first code line
    code: str


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, in order.

    >>> python_blocks("Say:\\n```python\\nx = 1\\n```\\n```sh\\nls\\n```\\n")
    [Block(line=3, code='x = 1\\n')]
    """
    return [
        Block(text.count("\n", 0, match.start(1)) + 1, match[1])
        for match in FENCE.finditer(text)
    ]


def imports_of(code: str) -> str:
    """The top-level import statements of `code`."""
    return "\n".join(
        ast.unparse(node)
        for node in ast.parse(code).body
        if isinstance(node, ast.Import | ast.ImportFrom)
    )


@dataclasses.dataclass(frozen=True)
class Case:
    marker: str  # text that only this case's block holds
    setup: str = ""  # stand-ins for what the block takes as given
    check: str = ""  # asserts on what the block made


CASES = {
    "mirrored_strategy": Case(
        marker="tf.distribute.MirroredStrategy(",
        check="""
import numpy as np
import tensorflow as tf
import tf_crossdevice

assert strategy.num_replicas_in_sync == 2
# batch_reduce_to (how the strategy sums gradients) reduces with the block's
# class. (strategy.reduce to a CPU would not: MirroredStrategy sends any
# reduce to a CPU destination to ReductionToOneDevice.)
cls = tf_crossdevice.HierarchicalCopyAllReduce
calls = []
batch_reduce = cls.batch_reduce
cls.batch_reduce = lambda self, *args, **kwargs: (
    calls.append(self), batch_reduce(self, *args, **kwargs)
)[1]


def replica_value():
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return tf.cast(replica + 1, tf.float32) * tf.constant([1.0, 2.0, 3.0])


value = strategy.run(replica_value)
(total,) = strategy.extended.batch_reduce_to("SUM", [(value, value)])
assert len(total.values) == 2
for v in total.values:
    np.testing.assert_allclose(v.numpy(), (1 + 2) * np.array([1, 2, 3]))
assert calls, "the strategy did not reduce with HierarchicalCopyAllReduce"
""",
    ),
    "select_cross_device_ops": Case(
        marker="select_cross_device_ops(",
        check="""
import numpy as np
import tensorflow as tf
import tf_crossdevice

assert len(devices) == 4 and all("CPU:" in d for d in devices), devices
assert isinstance(ops, tf.distribute.CrossDeviceOps), ops
parts = [np.arange(6, dtype=np.float32).reshape(2, 3) * i for i in (1, 2, 3, 4)]
value = tf_crossdevice.testing.per_replica(
    [tf.constant(p) for p in parts], devices
)
reduced = ops.reduce("SUM", value, destinations=value)
assert [v.device for v in reduced.values] == devices
for v in reduced.values:
    np.testing.assert_allclose(v.numpy(), np.sum(parts, axis=0))
""",
    ),
    "multi_worker_strategy": Case(
        marker="tf_crossdevice.MultiWorkerMirroredStrategy(",
        setup="""
import numpy as np
import tensorflow as tf


def make_model():
    model = tf.keras.Sequential([
        tf.keras.Input((2,)),
        tf.keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros"),
    ])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    return model


FEATURES = np.tile(np.eye(2, dtype=np.float32), (4, 1))
TARGETS = FEATURES @ np.array([[2.0], [-1.0]], np.float32)
# One batch: an epoch is one step.
dataset = tf.data.Dataset.from_tensor_slices((FEATURES, TARGETS)).batch(8)
""",
        check="""
import numpy as np

# No TF_CONFIG: one worker. Its two epochs are two steps of full-batch
# gradient descent on the mean squared error, whatever the replica count.
weights = np.zeros((2, 1))
for _ in range(2):
    error = FEATURES @ weights - TARGETS
    weights -= 0.1 * 2 * FEATURES.T @ error / len(FEATURES)
np.testing.assert_allclose(model.get_weights()[0], weights, rtol=1e-5)
assert model.history.epoch == [0, 1]
""",
    ),
    "worker_replicas": Case(
        marker="cluster.WorkerReplicas(",
        setup="""
import tensorflow as tf
from tf_crossdevice.cluster import processes

# Two workers of 2 CPU devices, served from this process (README's workers
# are other processes, e.g. python -m tf_crossdevice.cluster).
cluster_spec = {
    "worker": [f"127.0.0.1:{port}" for port in processes.free_ports(2)]
}
SERVERS = [
    tf.distribute.Server(
        cluster_spec,
        job_name="worker",
        task_index=task,
        config=tf.compat.v1.ConfigProto(device_count={"CPU": 2}),
    )
    for task in range(2)
]


def compute_gradient(r):
    return tf.fill([3], float(r + 1))  # replica r's gradient
""",
        check="""
import numpy as np

assert len(results) == 4
assert [r.device for r in results] == replicas.devices
for result in results:
    np.testing.assert_allclose(result.numpy(), [2.5, 2.5, 2.5])  # mean of 1..4
""",
    ),
    "legacy_import": Case(
        marker="AllReduceCrossTowerOps(",
        check="""
import numpy as np
import tensorflow as tf
import tf_crossdevice

devices = tf_crossdevice.testing.cpu_devices(4)
parts = [np.array([1.0, 2.0, 3.0], np.float32) * 10**i for i in range(4)]
value = tf_crossdevice.testing.per_replica(
    [tf.constant(p) for p in parts], devices
)
# TF 1's classes return TF 1's Mirrored, read with get(device).
reduced = ops.reduce("sum", value, destinations=value)
for device in devices:
    np.testing.assert_allclose(reduced.get(device), np.sum(parts, axis=0))
""",
    ),
}

CHILD = """
import tf_crossdevice

tf_crossdevice.testing.request_cpu_devices(4)
namespace = {{"__name__": "__main__"}}
for code, name in [
    ({imports!r}, "README.md (imports of the blocks above)"),
    ({setup!r}, "readme_test.py (stand-ins)"),
    ({block!r}, "README.md"),
    ({check!r}, "readme_test.py (check)"),
]:
    exec(compile(code, name, "exec"), namespace)
print("README block ran and checked")
"""


def blocks_by_case() -> dict[str, tuple[Block, list[Block]]]:
    """Each case's block and the blocks above it."""
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    found = {}
    for name, case in CASES.items():
        indices = [i for i, b in enumerate(blocks) if case.marker in b.code]
        assert len(indices) == 1, (
            f"{name}: {len(indices)} README blocks hold {case.marker!r}"
        )
        found[name] = (blocks[indices[0]], blocks[: indices[0]])
    return found


def test_every_python_block_has_a_case():
    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert blocks, "README has no ```python blocks"
    covered = {block.line for block, _ in blocks_by_case().values()}
    uncovered = [b.line for b in blocks if b.line not in covered]
    assert not uncovered, (
        f"README's Python blocks at lines {uncovered} have no case in "
        "tests/readme_test.py's CASES"
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_block_runs_and_computes(name, tmp_path):
    case = CASES[name]
    block, above = blocks_by_case()[name]
    # Line numbers in a traceback are README's.
    code = "\n" * (block.line - 1) + re.sub(
        r"/gpu:(\d+)", r"/cpu:\1", block.code
    )
    script = tmp_path / "block.py"
    script.write_text(
        CHILD.format(
            imports="\n".join(imports_of(b.code) for b in above),
            setup=case.setup,
            block=code,
            check=case.check,
        ),
        encoding="utf-8",
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=processes.child_env(),
        timeout=300,
    )
    assert done.returncode == 0, (
        f"README's block at line {block.line} ({name}) failed:\n"
        f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    )
    assert "README block ran and checked" in done.stdout
