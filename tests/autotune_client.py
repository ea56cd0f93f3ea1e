"""Client of tests/tuning/autotune_multi_worker_test.py, in its own process.

Connecting to a cluster changes process-wide TensorFlow state, so autotune
runs here: it connects through the cluster spec it is given, measures
in-graph MultiWorkerAllReduce candidates across the workers, and the
returned ops then reduce `autotune_test`-style inputs once more. The test
process computes numpy's sums; this one only reports what TensorFlow did.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice.cluster import _in_graph as multi_worker
from tf_crossdevice.cluster import processes


def make_inputs(gradients, num_replicas, seed=0):
    """inputs[k][r]: gradient k on replica r (small integers: exact sums)."""
    rng = np.random.default_rng(seed)
    return [
        [
            rng.integers(-50, 50, size=shape).astype(dtype)
            for _ in range(num_replicas)
        ]
        for shape, dtype in gradients
    ]


def main(job):
    ops = tf_crossdevice.autotune(
        [tuple(g) for g in job["gradients"]],
        job["cluster"],
        budget_seconds=job["budget_seconds"],
        cache_dir=job["cache_dir"],
    )
    result = ops.autotune_result
    replicas = multi_worker.WorkerReplicas(
        job["cluster"], job["replicas_per_worker"], connect=False
    )
    inputs = make_inputs(job["gradients"], replicas.num_replicas)

    @tf.function(autograph=False)
    def step():
        values = [
            replicas.per_replica(lambda r, a=arrays: tf.constant(a[r]))
            for arrays in inputs
        ]
        reduced = ops.batch_reduce("sum", [(v, v) for v in values])
        return [list(r.values) for r in reduced]

    out = replicas.run(step, timeout_seconds=120)
    again = tf_crossdevice.autotune(
        [tuple(g) for g in job["gradients"]],
        job["cluster"],
        budget_seconds=job["budget_seconds"],
        cache_dir=job["cache_dir"],
    )
    processes.reply(
        {
            "class": type(ops).__name__,
            "config": list(result.config),
            "workers": list(ops.worker_devices),
            "measurements": [
                [m.label, m.verified, m.median_seconds, m.error]
                for m in result.measurements
            ],
            "elapsed_seconds": result.elapsed_seconds,
            "devices": [[c.device for c in r] for r in out],
            "results": [[c.numpy().tolist() for c in r] for r in out],
            "second_from_cache": again.autotune_result.from_cache,
        }
    )


if __name__ == "__main__":
    processes.exit_when_parent_goes()
    tf.get_logger().setLevel("ERROR")
    main(next(processes.commands()))
