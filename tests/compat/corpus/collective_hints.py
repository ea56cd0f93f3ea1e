"""Hints for collectives on each reduce call (TensorFlow 2.2 style).

Reduces one replica value per logical CPU with ReductionToOneDevice and,
between the 4 logical CPUs of this one process, CollectiveAllReduce, each
call with the same bytes_per_pack and timeout. Prints the results as one
JSON line.
"""

import json

import tensorflow as tf

from tf_crossdevice import compat as distribute

NUM_REPLICAS = 4


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS
    )
    devices = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]
    hints = distribute.CollectiveHints(bytes_per_pack=64, timeout_seconds=60.0)
    to_one_device = distribute.ReductionToOneDevice()
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=to_one_device
    )

    def replica_values():
        ctx = tf.distribute.get_replica_context()
        scale = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
        value = scale * tf.constant([1.0, 2.0, 3.0])
        return value, value * value

    values, squares = strategy.run(replica_values)

    total = to_one_device.reduce(
        tf.distribute.ReduceOp.SUM, values, "/cpu:0", experimental_hints=hints
    )
    means = to_one_device.batch_reduce(
        tf.distribute.ReduceOp.MEAN,
        [(values, values), (squares, values)],
        experimental_hints=hints,
    )
    collective = distribute.CollectiveAllReduce()
    collective_total = collective.reduce(
        tf.distribute.ReduceOp.SUM, values, values, experimental_hints=hints
    )

    def local(value):
        return [
            v.numpy().tolist()
            for v in strategy.experimental_local_results(value)
        ]

    print(
        json.dumps(
            {
                "total": local(total),
                "mean": local(means[0]),
                "mean_square": local(means[1]),
                "collective_total": local(collective_total),
            }
        )
    )


if __name__ == "__main__":
    main()
