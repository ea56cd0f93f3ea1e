"""One worker of collective_powersgd_test's cluster (started by it).

    python -m tests.powersgd_worker

reads its cluster from `TF_CONFIG`, gives itself `LOCAL_DEVICES` logical
CPUs and, for each of `KINDS`, builds
`tf_crossdevice.MultiWorkerMirroredStrategy` with that collective class
and `compression=PowerSGD(...)` and trains a Dense layer
(kernel: compressed; bias: a vector, exact) with a Keras SGD optimizer in
a custom loop of `strategy.run` steps, each global replica g on its own
batch `batch(step, g)`. After every step it replies

    {"kind": KIND, "step": s, "kernel": [per local replica], "bias": [...],
     "errors": [per local replica: its error feedback of the kernel],
     "q": the compressor's Q of the kernel,
     "reduced": strategy.reduce(SUM) of a per-replica matrix,
     "loss_sum": a replica-context all-reduce of each replica's loss}

Then it trains the same layer with Keras `model.fit` (CollectiveAllReduce,
PowerSGD from the first step) on a linear regression task and replies
{"fit": True, "kernel": [per local replica], "losses": [per epoch],
"compressor_step": ...}.

The inputs and the model's constants live here without TensorFlow, so that
the test computes its numpy reference from the same numbers.
"""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[1]
NUM_WORKERS = 2
LOCAL_DEVICES = 2
TIMEOUT_SECONDS = 60
KINDS = ("flat", "hier")  # CollectiveAllReduce, HierarchicalCollectiveAllReduce
FEATURES, OUTPUTS, PER_REPLICA_BATCH = 8, 6, 4
STEPS = 4
START_STEP = 2  # Two exact steps (errors stay zero), then compressed.
RANK = 1
SEED = 3
LEARNING_RATE = 0.1
# model.fit: examples (split between the workers), epochs.
FIT_EXAMPLES, FIT_EPOCHS = 64, 3


def initial_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    kernel = rng.normal(size=(FEATURES, OUTPUTS)).astype(np.float32) * 0.3
    return kernel, np.zeros(OUTPUTS, np.float32)


def batch(step: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Global replica g's (x, y) at `step`."""
    rng = np.random.default_rng(1000 * step + g)
    x = rng.normal(size=(PER_REPLICA_BATCH, FEATURES)).astype(np.float32)
    y = rng.normal(size=(PER_REPLICA_BATCH, OUTPUTS)).astype(np.float32)
    return x, y


def probe(g: int) -> np.ndarray:
    """A per-replica matrix that strategy.reduce must sum exactly."""
    return np.random.default_rng(77 + g).normal(size=(5, 7)).astype(np.float32)


# ---- Everything below runs in the worker only ------------------------------


def main() -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * LOCAL_DEVICES
    )
    for kind in KINDS:
        train(kind)
    fit()
    return 0


def make_strategy(kind: str, compressor):
    import tensorflow as tf

    import tf_crossdevice

    if kind == "flat":
        ops = tf_crossdevice.CollectiveAllReduce(compression=compressor)
    else:
        ops = tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.ReductionToOneDevice(), compression=compressor
        )
    return tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=ops,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=TIMEOUT_SECONDS
        ),
        local_devices=[f"/cpu:{i}" for i in range(LOCAL_DEVICES)],
    )


def fit() -> None:
    """Keras `model.fit` with PowerSGD (CollectiveAllReduce): replies
    {"fit": True, "kernel": [per local replica], "losses": [...],
    "compressor_step": ...}."""
    import keras
    import tensorflow as tf

    from tf_crossdevice.cluster import processes
    from tf_crossdevice.compression import PowerSGD

    compressor = PowerSGD(rank=RANK, min_compression_size=0, seed=SEED)
    strategy = make_strategy("flat", compressor)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(FIT_EXAMPLES, FEATURES)).astype(np.float32)
    y = x @ rng.normal(size=(FEATURES, OUTPUTS)).astype(np.float32)
    global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        global_batch, drop_remainder=True
    )
    kernel0, bias0 = initial_weights()
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(OUTPUTS)]
        )
        model.set_weights([kernel0, bias0])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(dataset, epochs=FIT_EPOCHS, verbose=0)
    kernel = model.layers[0].kernel
    processes.reply(
        {
            "fit": True,
            "kernel": [
                np.asarray(v).tolist()
                for v in strategy.experimental_local_results(
                    getattr(kernel, "value", kernel)
                )
            ],
            "losses": [float(v) for v in history.history["loss"]],
            "compressor_step": int(compressor.step.numpy()),
        }
    )


def train(kind: str) -> None:
    import keras
    import tensorflow as tf

    from tf_crossdevice.cluster import processes
    from tf_crossdevice.compression import PowerSGD

    compressor = PowerSGD(
        rank=RANK, start_step=START_STEP, min_compression_size=0, seed=SEED
    )
    strategy = make_strategy(kind, compressor)
    global_batch = PER_REPLICA_BATCH * strategy.num_replicas_in_sync
    kernel0, bias0 = initial_weights()
    with strategy.scope():
        layer = keras.layers.Dense(OUTPUTS)
        layer.build((None, FEATURES))
        layer.set_weights([kernel0, bias0])
        optimizer = keras.optimizers.SGD(LEARNING_RATE)

    def replica_step(x, y, probe_value):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum((layer(x) - y) ** 2) / (2.0 * global_batch)
        grads = tape.gradient(loss, layer.trainable_variables)
        # Keras 3's optimizer all-reduces (SUM) the gradients in replica
        # context: the path PowerSGD compresses.
        optimizer.apply_gradients(
            zip(grads, layer.trainable_variables, strict=True)
        )
        context = tf.distribute.get_replica_context()
        return context.all_reduce("sum", loss), probe_value

    @tf.function
    def train_step(x, y, probe_value):
        loss_sum, probes = strategy.run(replica_step, args=(x, y, probe_value))
        return loss_sum, strategy.reduce("sum", probes, axis=None)

    def local(values):
        return [np.asarray(v).tolist() for v in values]

    for step in range(STEPS):

        def value_fn(context, step=step, part=0):
            g = context.replica_id_in_sync_group
            return tf.constant(batch(step, g)[part])

        x = strategy.experimental_distribute_values_from_function(value_fn)
        y = strategy.experimental_distribute_values_from_function(
            lambda c, step=step: tf.constant(
                batch(step, c.replica_id_in_sync_group)[1]
            )
        )
        probes = strategy.experimental_distribute_values_from_function(
            lambda c: tf.constant(probe(c.replica_id_in_sync_group))
        )
        loss_sum, reduced = train_step(x, y, probes)
        state = compressor.state(0)
        processes.reply(
            {
                "kind": kind,
                "step": step,
                "kernel": local(
                    strategy.experimental_local_results(layer.kernel.value)
                ),
                "bias": local(
                    strategy.experimental_local_results(layer.bias.value)
                ),
                "errors": local([e.numpy() for e in state.errors]),
                "q": state.q.numpy().tolist(),
                "reduced": np.asarray(reduced).tolist(),
                "loss_sum": local(
                    strategy.experimental_local_results(loss_sum)
                ),
                "compressor_step": int(compressor.step.numpy()),
            }
        )


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
