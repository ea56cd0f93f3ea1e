"""A 2018 MirroredStrategy training loop (TensorFlow 1.12 style).

Linear regression by SGD on 4 replicas (logical CPUs): each replica's
gradients on its quarter of the batch are averaged by the strategy's
all-reduce (a MEAN batch_reduce, TF 1's arguments) and applied to the
mirrored variables. Prints the final weights, bias and loss as one JSON line.
"""

import json

import numpy as np
import tensorflow as tf

from tf_crossdevice import compat as distribute

NUM_REPLICAS = 4
BATCH = 32
STEPS = 5
LEARNING_RATE = 0.1


def make_data():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(BATCH, 3)).astype(np.float32)
    true_weights = np.array([[1.0], [-2.0], [0.5]], np.float32)
    labels = features @ true_weights + np.float32(0.3)
    return features, labels


def main():
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS
    )
    devices = [f"/cpu:{i}" for i in range(NUM_REPLICAS)]
    features, labels = make_data()

    cross_tower_ops = distribute.AllReduceCrossTowerOps(
        "hierarchical_copy", num_packs=2
    )
    strategy = distribute.MirroredStrategy(
        devices=devices, cross_tower_ops=cross_tower_ops
    )
    with strategy.scope():
        weights = tf.Variable(tf.zeros([3, 1]), name="weights")
        bias = tf.Variable(0.0, name="bias")

    # Each replica gets its quarter of the batch.
    feature_shards = np.split(features, NUM_REPLICAS)
    label_shards = np.split(labels, NUM_REPLICAS)
    x = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(feature_shards[ctx.replica_id_in_sync_group])
    )
    y = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(label_shards[ctx.replica_id_in_sync_group])
    )

    def tower_gradients(x, y):
        with tf.GradientTape() as tape:
            error = tf.matmul(x, weights) + bias - y
            loss = tf.reduce_mean(tf.square(error))
        grad_weights, grad_bias = tape.gradient(loss, [weights, bias])
        return grad_weights, grad_bias, loss

    def apply_gradient(variable, gradient):
        return variable.assign_sub(LEARNING_RATE * gradient)

    for _ in range(STEPS):
        grad_weights, grad_bias, loss = strategy.run(
            tower_gradients, args=(x, y)
        )
        mean_weights, mean_bias = cross_tower_ops.batch_reduce(
            tf.VariableAggregation.MEAN,
            [(grad_weights, weights), (grad_bias, bias)],
        )
        strategy.extended.update(weights, apply_gradient, (mean_weights,))
        strategy.extended.update(bias, apply_gradient, (mean_bias,))

    # The last step's loss, averaged over the replicas onto one device.
    mean_loss = cross_tower_ops.reduce(
        aggregation=tf.VariableAggregation.MEAN,
        per_device_value=loss,
        destinations="/cpu:0",
    )
    (mean_loss,) = strategy.experimental_local_results(mean_loss)
    print(
        json.dumps(
            {
                "weights": weights.numpy().ravel().tolist(),
                "bias": float(bias.numpy()),
                "loss": float(mean_loss.numpy()),
            }
        )
    )


if __name__ == "__main__":
    main()
