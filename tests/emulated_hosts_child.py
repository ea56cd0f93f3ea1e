"""A process of the emulated-host tests (started by them, not pytest).

    python -m tests.emulated_hosts_child collective
        a worker on an emulated host (cluster from `TF_CONFIG`): all-reduces
        `value(task)` with `tf_crossdevice.CollectiveAllReduce` under our
        MultiWorkerMirroredStrategy, one CPU per worker.
    python -m tests.emulated_hosts_child in_graph CLUSTER_SPEC_JSON
        the client of an in-graph job, on the hosts' bridge: builds each
        worker's `value(task)` on that worker and all-reduces them with
        `tf_crossdevice.MultiWorkerAllReduce` (xring), keeping the sums on
        the workers.

Both reply {"reduced": True} when the all-reduce is done, wait for a
command (so that the test can read the links' counters first), then reply
every sum they hold as base64 float32 bytes. The test computes what the
sums must be from `value` with numpy.
"""

from __future__ import annotations

import base64
import json
import sys

import numpy as np

# 8 MiB of float32: large enough that the all-reduce's bytes dwarf
# TensorFlow's own messages on the links.
SIZE = 2 << 20


def value(task: int) -> np.ndarray:
    """Worker `task`'s value (small integers: float32 sums are exact)."""
    return ((np.arange(SIZE) * (task + 1)) % 13).astype(np.float32)


def _encode(array) -> str:
    return base64.b64encode(np.asarray(array, np.float32).tobytes()).decode()


def collective() -> None:
    import tensorflow as tf

    import tf_crossdevice
    from tf_crossdevice.cluster import processes

    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=120
        ),
    )
    task = strategy.cluster_resolver.task_id
    mine = tf.constant(value(task))

    @tf.function
    def step():
        return strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, mine, mine.device
        )

    total = step()
    processes.reply({"reduced": True})
    next(processes.commands())
    processes.reply({"sums": [_encode(total)]})


def in_graph(spec: str) -> None:
    import tensorflow as tf

    import tf_crossdevice
    from tf_crossdevice.cluster import processes

    cluster = tf.train.ClusterSpec(json.loads(spec))
    tf.config.experimental_connect_to_cluster(cluster)
    workers = [
        f"/job:worker/replica:0/task:{i}/device:CPU:0"
        for i in range(cluster.num_tasks("worker"))
    ]
    ops = tf_crossdevice.MultiWorkerAllReduce(
        workers, 0, all_reduce_spec="xring"
    )
    sums = []
    for w in workers:
        with tf.device(w):
            sums.append(tf.Variable(tf.zeros([SIZE], tf.float32)))

    # A tensor of this client's that the workers pull: they must reach the
    # client at its bridge address, not at their own loopback.
    modulus = tf.constant(13, tf.int64)

    @tf.function
    def step():
        parts = []
        for task, w in enumerate(workers):
            with tf.device(w):  # Built on the worker: nothing from here.
                n = tf.range(SIZE, dtype=tf.int64) * (task + 1)
                parts.append(tf.cast(n % modulus, tf.float32))
        reduced = ops.reduce(
            tf.distribute.ReduceOp.SUM,
            tf_crossdevice.ops.PerReplica(parts),
            destinations=None,
        )
        for w, var, part in zip(workers, sums, reduced.values, strict=True):
            with tf.device(w):
                var.assign(part)

    step()
    processes.reply({"reduced": True})
    next(processes.commands())
    processes.reply({"sums": [_encode(v.numpy()) for v in sums]})


def main(argv: list[str]) -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    if argv[0] == "collective":
        collective()
    else:
        in_graph(argv[1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
