"""A MultiWorkerAllReduce user with an all_reduce_spec (TensorFlow 1.12).

The spec sends tensors of at most 1 KiB through pscpu and larger ones
through a 2-shard ring. Here the one worker is this process, holding 4
replicas on logical CPUs. Prints the sums and a mean as one JSON line.
"""

import json

import tensorflow as tf

from tf_crossdevice import compat as distribute

NUM_REPLICAS = 4
WORKERS = ["/job:localhost/replica:0/task:0"]


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS
    )
    devices = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]

    all_reduce = distribute.MultiWorkerAllReduce(
        WORKERS,
        0,  # No GPUs: the workers' CPUs hold the replicas.
        all_reduce_spec=[
            distribute.AllReduceSpecTuple("pscpu", 1, 1024),
            ("xring", 2, -1),
        ],
    )
    strategy = distribute.MirroredStrategy(
        devices=devices, cross_tower_ops=all_reduce
    )
    # Replica i holds (i + 1) * [...]: 16 bytes (pscpu) and 4000 (xring).
    small = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.fill([4], float(ctx.replica_id_in_sync_group + 1))
    )
    large = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            tf.range(1000, dtype=tf.float32)
            * float(ctx.replica_id_in_sync_group + 1)
        )
    )

    small_sum, large_sum = all_reduce.batch_reduce(
        tf.VariableAggregation.SUM, [(small, "/cpu:0"), (large, "/cpu:0")]
    )
    large_mean = all_reduce.reduce(
        aggregation=tf.VariableAggregation.MEAN,
        per_device_value=large,
        destinations=large,
    )
    (small_sum,) = strategy.experimental_local_results(small_sum)
    (large_sum,) = strategy.experimental_local_results(large_sum)
    print(
        json.dumps(
            {
                "small_sum": small_sum.numpy().tolist(),
                "large_sum_total": float(tf.reduce_sum(large_sum).numpy()),
                "large_sum_last": float(large_sum.numpy()[-1]),
                "large_mean_last": [
                    float(v.numpy()[-1])
                    for v in strategy.experimental_local_results(large_mean)
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
