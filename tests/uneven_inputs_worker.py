"""A process of the uneven-inputs tests (started by them, not pytest).

    python -m tests.uneven_inputs_worker MODE RECIPE [CLUSTER_JSON]

Worker w of the job owns `worker_batches(w)`: worker 0 has NUM_BATCHES
batches, worker 1 half as many. The model is one linear layer without
bias (`INITIAL_KERNEL`), trained with plain SGD on the mean squared error.
Modes:

- fit: a worker of `tf_crossdevice.MultiWorkerMirroredStrategy` (one CPU,
  `TF_CONFIG` from the test) that trains with Keras `model.fit` on a
  dataset from `distribute_datasets_from_function`;
- loop: the same worker with a custom loop (`strategy.run`) over such a
  dataset;
- in_graph: a client that connects to the worker servers named by
  CLUSTER_JSON and drives one replica on each (`WorkerReplicas`,
  `MultiWorkerAllReduce`); a worker whose data ran out gets an empty batch.

RECIPE says how the step averages: "tf" as TensorFlow and Keras document
it (Keras's "mse"; `tf.nn.compute_average_loss`; in-graph, each replica's
mean loss and a MEAN all-reduce, as examples/train.py does), "ours" with
`tf_crossdevice.training.compute_average_loss` (the per-example mean over
the step's examples on every worker). Each process replies its final
kernel (and, for the strategy modes, how many steps it ran).

The data live here without TensorFlow, so that the test computes numpy's
reference from the same numbers.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

NUM_WORKERS = 2
NUM_BATCHES = 4  # Worker 0's; worker 1 has NUM_BATCHES // 2.
BATCH = 4  # Examples in each batch of each worker.
FEATURES = 3
LEARNING_RATE = 0.1
FIT_EPOCHS = 2
INITIAL_KERNEL = np.array([[0.5], [-0.25], [1.0]], np.float32)
TIMEOUT_SECONDS = 30.0


def num_batches(worker: int) -> int:
    return NUM_BATCHES if worker == 0 else NUM_BATCHES // 2


def worker_batches(worker: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Worker `worker`'s batches (x, y), in order."""
    rng = np.random.default_rng(100 + worker)
    true_kernel = np.array([[1.0], [2.0], [-1.0]], np.float32)
    out = []
    for _ in range(num_batches(worker)):
        x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
        y = (x @ true_kernel + rng.normal(size=(BATCH, 1))).astype(np.float32)
        out.append((x, y))
    return out


# ---- Everything below runs in the child only -------------------------------


def main(argv: list[str]) -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    mode, recipe = argv[0], argv[1]
    if mode == "in_graph":
        kernel = in_graph(recipe, json.loads(argv[2]))
        processes.reply({"kernel": kernel.tolist()})
        return 0
    import tensorflow as tf

    import tf_crossdevice

    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=TIMEOUT_SECONDS
        ),
        local_devices=["/cpu:0"],
    )
    kernel, steps = {"fit": fit, "loop": loop}[mode](strategy, recipe)
    processes.reply({"kernel": kernel.tolist(), "steps": steps})
    return 0


def dataset_fn(context):
    """This worker's batches, as `distribute_datasets_from_function` asks."""
    import tensorflow as tf

    assert context.get_per_replica_batch_size(NUM_WORKERS * BATCH) == BATCH
    x, y = zip(*worker_batches(context.input_pipeline_id), strict=True)
    # Batched as they were made: the element's batch dimension is None.
    return tf.data.Dataset.from_tensor_slices(
        (np.concatenate(x), np.concatenate(y))
    ).batch(BATCH)


def build_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(
                1,
                use_bias=False,
                kernel_initializer=keras.initializers.Constant(INITIAL_KERNEL),
            ),
        ]
    )
    return model


def fit(strategy, recipe: str) -> tuple[np.ndarray, int]:
    import keras

    import tf_crossdevice

    with strategy.scope():
        model = build_model()
        loss = (
            "mse"
            if recipe == "tf"
            else tf_crossdevice.training.AverageOverExamples(
                keras.losses.mean_squared_error
            )
        )
        model.compile(optimizer=keras.optimizers.SGD(LEARNING_RATE), loss=loss)
    steps = []

    class CountSteps(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append(batch)

    model.fit(
        strategy.distribute_datasets_from_function(dataset_fn),
        epochs=FIT_EPOCHS,
        verbose=0,
        callbacks=[CountSteps()],
    )
    return model.get_weights()[0], len(steps)


def loop(strategy, recipe: str) -> tuple[np.ndarray, int]:
    import keras
    import tensorflow as tf

    import tf_crossdevice

    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(LEARNING_RATE)

    @tf.function
    def step(batch):
        def replica_step(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                per_example = keras.losses.mean_squared_error(y, model(x))
                if recipe == "tf":
                    loss = tf.nn.compute_average_loss(per_example)
                else:
                    loss = tf_crossdevice.training.compute_average_loss(
                        per_example
                    )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(
                zip(grads, model.trainable_variables, strict=True)
            )

        strategy.run(replica_step, args=(batch,))

    steps = 0
    for batch in strategy.distribute_datasets_from_function(dataset_fn):
        step(batch)
        steps += 1
    return model.get_weights()[0], steps


def in_graph(recipe: str, cluster: dict) -> np.ndarray:
    import tensorflow as tf

    import tf_crossdevice
    from tf_crossdevice.cluster import WorkerReplicas

    replicas = WorkerReplicas(cluster)
    ops = tf_crossdevice.MultiWorkerAllReduce(replicas.worker_devices, 0)
    kernels = []
    for device in replicas.devices:
        with tf.device(device):
            kernels.append(tf.Variable(INITIAL_KERNEL))

    @tf.function
    def step(xs, ys):
        if recipe == "ours":
            num_examples = tf.add_n([tf.shape(x)[0] for x in xs])
        grads = []
        for device, kernel, x, y in zip(
            replicas.devices, kernels, xs, ys, strict=True
        ):
            with tf.device(device), tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(x @ kernel - y), -1)
                if recipe == "tf":
                    loss = tf.reduce_mean(per_example)
                else:
                    loss = tf_crossdevice.training.compute_average_loss(
                        per_example, num_examples=num_examples
                    )
                grads.append(tape.gradient(loss, kernel))
        reduce_op = "mean" if recipe == "tf" else "sum"
        (reduced,) = ops.batch_reduce(
            reduce_op, [(replicas.per_replica(lambda r: grads[r]), None)]
        )
        for device, kernel, grad in zip(
            replicas.devices, kernels, reduced.values, strict=True
        ):
            with tf.device(device):
                kernel.assign_sub(LEARNING_RATE * grad)

    data = [worker_batches(w) for w in range(NUM_WORKERS)]
    empty = np.zeros((0, FEATURES), np.float32), np.zeros((0, 1), np.float32)
    for s in range(max(len(d) for d in data)):
        batches = [d[s] if s < len(d) else empty for d in data]
        xs = [tf.constant(x) for x, _ in batches]
        ys = [tf.constant(y) for _, y in batches]
        replicas.run(step, xs, ys, timeout_seconds=TIMEOUT_SECONDS)
    result = kernels[0].numpy()
    for kernel in kernels[1:]:
        np.testing.assert_array_equal(kernel.numpy(), result)
    replicas.release()
    return result


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv[1:]))
