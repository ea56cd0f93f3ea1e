"""A process of the network-fault tests (started by them, not pytest).

    python -m tests.network_faults_child TIMEOUT_SECONDS \
        [STALL_WARNING_SECONDS [SIZE [CLASS]]]

is a worker: it reads its cluster from `TF_CONFIG`, builds tf_crossdevice's
MultiWorkerMirroredStrategy with CLASS (`CollectiveAllReduce`, the
default, or `HierarchicalCollectiveAllReduce`, then with 2 CPU devices) and
`timeout_seconds=TIMEOUT_SECONDS`, and all-reduces `value(task, SIZE)` (on
every device) step after step, each step called inside
`tf_crossdevice.reporting_unreachable_peers(strategy,
stall_warning_seconds=STALL_WARNING_SECONDS)` (default: its own).

    python -m tests.network_faults_child --in_graph TIMEOUT_SECONDS SPEC

is the client of an in-graph job (SPEC: the cluster spec as JSON): it
all-reduces `value(task)` built on each worker with
`tf_crossdevice.MultiWorkerAllReduce` step after step, each step through
`WorkerReplicas.run(..., timeout_seconds=TIMEOUT_SECONDS)`, and replies the
sum held by worker 0.

After every step either replies {"steps": n, "time": time.time(), "sum":
base64 float32 bytes}; when a step fails, {"error": its type, "message":
..., "time": ...}, and exits with status 2. The test computes the sums
with numpy from `value` (times the devices per worker).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import time

import numpy as np

SIZE = 4096
# Between steps, so that the loop leaves the cores to others (the hosts
# share this machine) and an outage spans many steps' worth of time.
PAUSE_SECONDS = 0.05


def value(task: int, size: int = SIZE) -> np.ndarray:
    """Worker `task`'s value (small integers: float32 sums are exact)."""
    return ((np.arange(size) * (task + 1)) % 13).astype(np.float32)


def loop(
    timeout_seconds: float,
    stall_warning_seconds: float | None = None,
    size: int = SIZE,
    class_name: str = "CollectiveAllReduce",
) -> int:
    import tensorflow as tf

    import tf_crossdevice

    devices = 2 if class_name == "HierarchicalCollectiveAllReduce" else 1
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * devices
    )
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=getattr(tf_crossdevice, class_name)(),
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout_seconds
        ),
        local_devices=[f"/cpu:{i}" for i in range(devices)],
    )
    mine = tf.constant(value(strategy.cluster_resolver.task_id, size))

    @tf.function
    def step():
        per_replica = strategy.run(lambda: tf.identity(mine))
        return strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, per_replica, mine.device
        )

    def reported_step():
        with tf_crossdevice.reporting_unreachable_peers(
            strategy, stall_warning_seconds=stall_warning_seconds
        ):
            return step()

    return _steps(reported_step)


def _steps(step) -> int:
    """Runs `step` until it fails, replying after each (see the module
    docstring)."""
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    steps = 0
    try:
        while True:
            total = np.asarray(step())
            steps += 1
            processes.reply(
                {
                    "steps": steps,
                    "time": time.time(),
                    "sum": base64.b64encode(total.tobytes()).decode(),
                }
            )
            time.sleep(PAUSE_SECONDS)
    except tf.errors.OpError as e:
        processes.reply(
            {
                "error": type(e).__name__,
                "message": e.message[-4000:],
                "time": time.time(),
            }
        )
        return 2


def in_graph_loop(timeout_seconds: float, spec: str) -> int:
    import tensorflow as tf

    import tf_crossdevice
    from tf_crossdevice.cluster import WorkerReplicas

    replicas = WorkerReplicas(json.loads(spec))
    ops = tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices, 0, all_reduce_spec="xring"
    )

    @tf.function
    def step(one):
        # `one` (an argument, 1.0) keeps Grappler from folding the whole
        # step, all-reduce included, into a constant on worker 0.
        def build(task: int) -> tf.Tensor:
            n = tf.range(SIZE, dtype=tf.int64) * (task + 1)
            return tf.cast(n % 13, tf.float32) * one  # value(task).

        reduced = ops.reduce(
            tf.distribute.ReduceOp.SUM,
            replicas.per_replica(build),
            destinations=None,
        )
        with tf.device(replicas.devices[0]):
            return tf.identity(reduced.values[0])

    one = tf.constant(1.0)
    return _steps(
        lambda: replicas.run(step, one, timeout_seconds=timeout_seconds)
    )


def main(argv: list[str]) -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    if argv[0] == "--in_graph":
        code = in_graph_loop(float(argv[1]), argv[2])
        # A step that timed out still waits in TensorFlow, and the client's
        # context cannot be torn down while a worker is cut off.
        sys.stdout.flush()
        os._exit(code)
    stall = float(argv[1]) if len(argv) > 1 else None
    size = int(argv[2]) if len(argv) > 2 else SIZE
    class_name = argv[3] if len(argv) > 3 else "CollectiveAllReduce"
    return loop(float(argv[0]), stall, size, class_name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
