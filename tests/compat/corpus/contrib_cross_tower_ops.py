"""TensorFlow 1.12 code as it was, imports included.

It cannot run on TensorFlow 2; the migration command converts it, and the
converted copy runs on 4 logical CPUs and prints its numbers as one JSON
line.
"""

import json

import tensorflow as tf
from tensorflow.contrib.distribute.python import cross_tower_ops

NUM_REPLICAS = 4


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS
    )
    devices = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]

    ring = cross_tower_ops.AllReduceCrossTowerOps("xring", num_packs=1)
    strategy = tf.contrib.distribute.MirroredStrategy(
        devices=devices, cross_tower_ops=ring
    )
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            tf.constant([1.0, 10.0]) * float(ctx.replica_id_in_sync_group + 1)
        )
    )
    ring_sum = ring.reduce(
        aggregation=tf.VariableAggregation.SUM,
        per_device_value=value,
        destinations=value,
    )

    best = cross_tower_ops.choose_the_best(devices, session_config=None)
    (best_mean,) = best.batch_reduce(
        tf.VariableAggregation.MEAN, [(value, "/cpu:0")]
    )
    assert isinstance(best, tf.contrib.distribute.CrossTowerOps)

    spec_ops = tf.contrib.distribute.MultiWorkerAllReduce(
        ["/job:localhost/replica:0/task:0"],
        0,
        [cross_tower_ops.AllReduceSpecTuple("pscpu/pscpu", 2, -1)],
    )
    spec_sum = spec_ops.reduce(tf.VariableAggregation.SUM, value, "/cpu:3")

    def local(result):
        return [
            v.numpy().tolist()
            for v in strategy.experimental_local_results(result)
        ]

    print(
        json.dumps(
            {
                "ring_sum": local(ring_sum),
                "best_mean": local(best_mean),
                "spec_sum": local(spec_sum),
            }
        )
    )


if __name__ == "__main__":
    main()
