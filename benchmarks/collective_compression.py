"""CollectiveAllReduce with and without wire compression, between workers.

    python -m benchmarks.collective_compression [--workers=2] [--rounds=7]

starts `--workers` local worker processes (one CPU device each); every
worker builds `tf_crossdevice.MultiWorkerMirroredStrategy` with
`CollectiveAllReduce()`, `CollectiveAllReduce(compression="bf16")` and
`CollectiveAllReduce(compression="fp16")`, all-reduces ResNet-50's float32
gradients (`benchmarks.workloads.resnet50`: 214 tensors, 102 MB) in a
traced `strategy.run` step, and times the three interleaved, `--rounds`
times after a warm-up. Worker 0 prints each one's median seconds per step
and its ratio to the uncompressed one (measured in the same run: the
machine is shared and noisy, the absolute times are not comparable across
runs).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from absl import app, flags

VARIANTS = (None, "bf16", "fp16")
_WORKERS = flags.DEFINE_integer("workers", 2, "worker processes")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "timed rounds per variant")
_ROLE = flags.DEFINE_string("role", "parent", "parent or worker (internal)")


def worker(rounds: int) -> dict:
    """Runs on every worker; returns the medians and ratios."""
    import numpy as np
    import tensorflow as tf

    import tf_crossdevice
    from benchmarks import workloads

    # Collectives are enabled before anything else runs TensorFlow ops.
    strategies = {
        compression: tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(
                compression=compression
            ),
            communication_options=(
                tf.distribute.experimental.CommunicationOptions(
                    timeout_seconds=600
                )
            ),
        )
        for compression in VARIANTS
    }
    shapes = workloads.resnet50().shapes
    steps = {}
    for compression, strategy in strategies.items():
        task = strategy.cluster_resolver.task_id
        rng = np.random.default_rng(task)
        values = [
            tf.Variable(rng.normal(size=s).astype(np.float32)) for s in shapes
        ]

        def step(strategy=strategy, values=values):
            def replica_fn():
                context = tf.distribute.get_replica_context()
                return context.all_reduce("sum", [v.value() for v in values])

            return strategy.run(replica_fn)

        steps[compression] = tf.function(step)
    results = {c: steps[c]() for c in VARIANTS}  # Traces and warms up.
    exact = results[None][0].numpy()
    errors = {
        str(c): float(
            np.max(np.abs(results[c][0].numpy() - exact))
            / np.max(np.abs(exact))
        )
        for c in VARIANTS
    }
    times: dict[str | None, list[float]] = {c: [] for c in VARIANTS}
    for _ in range(rounds):
        for c in VARIANTS:
            start = time.perf_counter()
            steps[c]()
            times[c].append(time.perf_counter() - start)
    medians = {str(c): statistics.median(t) for c, t in times.items()}
    return {
        "median_seconds": medians,
        "ratio_to_uncompressed": {
            c: medians[c] / medians["None"] for c in medians
        },
        "max_error_of_first_tensor_relative_to_its_max": errors,
        "megabytes_per_replica": workloads.resnet50().num_bytes / 1e6,
    }


def main(argv: list[str]) -> int:
    del argv
    from tf_crossdevice import _processes, launch

    if _ROLE.value == "worker":
        _processes.exit_when_parent_goes()
        _processes.reply(worker(_ROUNDS.value))
        return 0
    children = []
    try:
        for i, env in enumerate(launch.tf_config_envs(_WORKERS.value)):
            children.append(
                _processes.start_module(
                    "benchmarks.collective_compression",
                    "--role=worker",
                    f"--rounds={_ROUNDS.value}",
                    name=f"worker {i}",
                    env=env,
                )
            )
        replies = [child.receive(timeout=1800) for child in children]
        print(json.dumps({"workers": _WORKERS.value, **replies[0]}, indent=1))
    finally:
        _processes.stop_all(children)
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
