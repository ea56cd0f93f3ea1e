"""TensorFlow 1.12 code from the field: positional arguments and aliases.

Trainers of the time passed the all-reduce's arguments by position
(algorithm, packs, small-tensor bytes, group size) and imported the
modules under their own names. It cannot run on TensorFlow 2; the migration
command converts it, and the converted copy runs on 4 logical CPUs (NCCL
sums on the first device there, with one logged warning) and prints its
numbers as one JSON line.

What the command cannot convert (a fork's extra keyword, the Estimator,
the strategy's per-worker GPU count) is checked by the upgrade tests
instead: a script holding it would not run once upgraded.
"""

import json

import tensorflow as tf
import tensorflow.contrib.distribute as tcd
from tensorflow.contrib.distribute.python import (
    cross_tower_ops as cross_tower_ops_lib,
)

NUM_REPLICAS = 4


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS
    )
    devices = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]

    # all_reduce_alg, num_packs, agg_small_grads_max_bytes,
    # agg_small_grads_max_group.
    ops = cross_tower_ops_lib.AllReduceCrossTowerOps("nccl", 16, 0, 0)
    strategy = tf.contrib.distribute.MirroredStrategy(devices, None, ops)
    single = tcd.MirroredStrategy(num_gpus=0)
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            tf.constant([1.0, 10.0]) * float(ctx.replica_id_in_sync_group + 1)
        )
    )
    nccl_sum = ops.reduce(tf.VariableAggregation.SUM, value)
    strategy_sum = strategy.reduce("sum", value, axis=None)

    # reduce_to_device, by position.
    one_device = tcd.ReductionToOneDeviceCrossTowerOps("/cpu:2")
    one_device_mean = one_device.reduce(
        tf.VariableAggregation.MEAN, value, "/cpu:1"
    )

    # worker_devices, num_gpus_per_worker, all_reduce_spec, num_packs.
    spec_ops = tf.contrib.distribute.MultiWorkerAllReduce(
        ["/job:localhost/replica:0/task:0"], 0, [("pscpu", 1, -1)], 2
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
                "nccl_sum": local(nccl_sum),
                "strategy_sum": strategy_sum.numpy().tolist(),
                "one_device_mean": local(one_device_mean),
                "spec_sum": local(spec_sum),
                "single_replicas": single.num_replicas_in_sync,
            }
        )
    )


if __name__ == "__main__":
    main()
