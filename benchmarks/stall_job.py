"""A job whose collective stalls, for the launcher's stall report (run by
tests/cluster/stall_report_test.py and benchmarks.faults, each worker
started by the launcher): 4 steps of two all-reduces each under
`tf_crossdevice.MultiWorkerMirroredStrategy`, a heartbeat after each; in
step 3, task 1 computes the second all-reduce's input for argv[1] seconds,
so that task 0 waits in it. Prints "late from T" and "late until T"
(time.time()) around that wait."""

from __future__ import annotations

import json
import os
import sys
import time

import tensorflow as tf

import tf_crossdevice

LATE_STEP = 3


def main() -> None:
    late_seconds = float(sys.argv[1])
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=tf_crossdevice.CollectiveAllReduce(
            options=tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=60
            )
        )
    )

    def slow_on_task_1(step: tf.Tensor) -> tf.Tensor:
        if task == 1 and int(step) == LATE_STEP:
            print("late from", time.time(), flush=True)
            time.sleep(late_seconds)
            print("late until", time.time(), flush=True)
        return step

    @tf.function
    def run(step: tf.Tensor) -> tf.Tensor:
        def replica() -> tf.Tensor:
            ctx = tf.distribute.get_replica_context()
            first = ctx.all_reduce("sum", tf.ones([5]))
            waited = tf.numpy_function(slow_on_task_1, [step], tf.int64)
            with tf.control_dependencies([first, waited]):
                second = ctx.all_reduce("sum", tf.ones([3]))
            return tf.reduce_sum(first) + tf.reduce_sum(second)

        return strategy.run(replica)

    for step in range(1, 5):
        total = float(run(tf.constant(step, tf.int64)))
        tf_crossdevice.cluster.heartbeat(step)
    tf_crossdevice.cluster.end_heartbeats()
    print("total", total, flush=True)


if __name__ == "__main__":
    main()
