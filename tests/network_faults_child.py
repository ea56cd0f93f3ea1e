"""A worker of the network-fault tests (started by them, not pytest).

    python -m tests.network_faults_child TIMEOUT_SECONDS \
        [STALL_WARNING_SECONDS [SIZE]]

reads its cluster from `TF_CONFIG`, builds tf_crossdevice's
MultiWorkerMirroredStrategy with `tf_crossdevice.CollectiveAllReduce` and
`timeout_seconds=TIMEOUT_SECONDS`, and all-reduces `value(task, SIZE)` step
after step, each step called inside
`tf_crossdevice.reporting_unreachable_peers(strategy,
stall_warning_seconds=STALL_WARNING_SECONDS)` (default: its own). After
every step it replies {"steps": n, "time": time.time(), "sum": base64
float32 bytes}; when a step fails, {"error": its type, "message": ...,
"time": ...}, and exits with status 2. The test computes the sums with
numpy from `value`.
"""

from __future__ import annotations

import base64
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
) -> int:
    import tensorflow as tf

    import tf_crossdevice
    from tf_crossdevice.cluster import processes

    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout_seconds
        ),
    )
    mine = tf.constant(value(strategy.cluster_resolver.task_id, size))

    @tf.function
    def step():
        return strategy.extended.reduce_to(
            tf.distribute.ReduceOp.SUM, mine, mine.device
        )

    steps = 0
    try:
        while True:
            with tf_crossdevice.reporting_unreachable_peers(
                strategy, stall_warning_seconds=stall_warning_seconds
            ):
                total = step().numpy()
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


def main(argv: list[str]) -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    stall = float(argv[1]) if len(argv) > 1 else None
    size = int(argv[2]) if len(argv) > 2 else SIZE
    return loop(float(argv[0]), stall, size)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
