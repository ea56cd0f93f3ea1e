"""Late TensorFlow 1 code for the between-graph collective strategy.

Linear regression by SGD under the collective all-reduce strategy, as a
worker ran it (its communication argument came after TF 1.12): each step's
gradients are averaged by a replica-context all-reduce, which the strategy's
collective runs. With no cluster configured and no GPU asked for, the
process trains alone on its CPU, one replica. It cannot run on TensorFlow
2; the migration command converts it, and the converted copy prints the
final weights, bias and loss as one JSON line.
"""

import json

import numpy as np
import tensorflow as tf
from tensorflow.contrib.distribute import CollectiveAllReduceStrategy

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
    features, labels = make_data()
    strategy = CollectiveAllReduceStrategy(
        num_gpus_per_worker=0,
        communication=tf.distribute.experimental.CollectiveCommunication.RING,
    )
    assert isinstance(
        strategy, tf.contrib.distribute.CollectiveAllReduceStrategy
    )
    with strategy.scope():
        weights = tf.Variable(tf.zeros([3, 1]), name="weights")
        bias = tf.Variable(0.0, name="bias")

    @tf.function
    def step(x, y):
        def replica_step():
            with tf.GradientTape() as tape:
                error = tf.matmul(x, weights) + bias - y
                loss = tf.reduce_mean(tf.square(error))
            gradients = tape.gradient(loss, [weights, bias])
            context = tf.distribute.get_replica_context()
            grad_weights, grad_bias, loss = context.all_reduce(
                "mean", [*gradients, loss]
            )
            weights.assign_sub(LEARNING_RATE * grad_weights)
            bias.assign_sub(LEARNING_RATE * grad_bias)
            return loss

        return strategy.run(replica_step)

    for _ in range(STEPS):
        loss = step(tf.constant(features), tf.constant(labels))
    (loss,) = strategy.experimental_local_results(loss)
    print(
        json.dumps(
            {
                "weights": weights.numpy().ravel().tolist(),
                "bias": float(bias.numpy()),
                "loss": float(loss.numpy()),
            }
        )
    )


if __name__ == "__main__":
    main()
