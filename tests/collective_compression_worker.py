"""One worker of collective_compression_test's cluster (started by it).

    python -m tests.collective_compression_worker

reads its cluster from `TF_CONFIG`, gives itself `LOCAL_DEVICES` logical
CPUs and, for each of `CASES` in turn, builds
`tf_crossdevice.MultiWorkerMirroredStrategy` with that collective class,
local devices and `compression`, and replica-context all-reduces (SUM, then
MEAN) the values of `values(g)` of every global replica g. It replies

    {"case": NAME, "sums": [[...] per value] per local replica,
     "means": ...}

Then it trains a small Keras classifier with `model.fit`, once for each
of `TRAIN_COMPRESSIONS`, from the same initial weights and on the same
data, and replies {"train": COMPRESSION, "weights": [...]} with replica 0's
weights; the test computes the accuracy with numpy.

The inputs and the model live here without TensorFlow, so that the test
computes its references from the same numbers.
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
# (name, class, local devices, compression). The collective group: flat1
# 2 members (compressed), hier 2 (one per worker: compressed between
# workers), flat2 4 (too many: reduces uncompressed, logged).
CASES = [
    ("flat1-bf16", "flat", 1, "bf16"),
    ("flat1-fp16", "flat", 1, "fp16"),
    ("hier-bf16", "hier", 2, "bf16"),
    ("hier-fp16", "hier", 2, "fp16"),
    ("flat2-bf16", "flat", 2, "bf16"),
]
# The values all-reduced: name -> dtype.
DTYPES = {
    "f32": "float32",  # beyond float16's range: the fp16 scale must act
    "f64": "float64",  # below float16's normal range
    "special": "float32",  # inf and nan among finite values
    "i32": "int32",
    "i64": "int64",
    "f16": "float16",
}
MEAN_NAMES = ("f32", "f64")
# The classifier (examples, features, hidden units) and its training.
EXAMPLES = 256
FEATURES = 8
HIDDEN = 8
GLOBAL_BATCH = 64
EPOCHS = 3
LEARNING_RATE = 2.0
TRAIN_COMPRESSIONS = (None, "bf16")


def values(g: int) -> dict[str, np.ndarray]:
    """What global replica g all-reduces."""
    rng = np.random.default_rng(100 + g)
    special = (rng.normal(size=8) * 10).astype(np.float32)
    if g == 0:
        special[0] = np.inf
    if g == 1:
        special[1] = np.nan
    return {
        "f32": (rng.normal(size=64) * 1e5).astype(np.float32),
        "f64": rng.normal(size=(4, 4)) * 1e-6,
        "special": special,
        "i32": rng.integers(-(10**6), 10**6, size=5).astype(np.int32),
        "i64": rng.integers(-(2**40), 2**40, size=5).astype(np.int64),
        # Halves below 64: their sums are exact in float16.
        "f16": (rng.integers(-128, 128, size=6) / 2).astype(np.float16),
    }


def classification_data() -> tuple[np.ndarray, np.ndarray]:
    """A learnable task: the label is the sign of a fixed linear form."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)
    w = rng.normal(size=(FEATURES, 1))
    y = (x @ w > 0).astype(np.float32)
    return x, y


def initial_weights() -> list[np.ndarray]:
    """kernel1, bias1, kernel2, bias2."""
    rng = np.random.default_rng(9)
    return [
        (rng.normal(size=(FEATURES, HIDDEN)) * 0.3).astype(np.float32),
        np.zeros(HIDDEN, np.float32),
        (rng.normal(size=(HIDDEN, 1)) * 0.3).astype(np.float32),
        np.zeros(1, np.float32),
    ]


def predict(weights: list[np.ndarray], x: np.ndarray) -> np.ndarray:
    """The classifier's probabilities, with numpy."""
    k1, b1, k2, b2 = (np.asarray(w, np.float64) for w in weights)
    logits = (
        np.tanh(x @ k1.reshape(FEATURES, HIDDEN) + b1) @ k2.reshape(HIDDEN, 1)
        + b2
    )
    return 1 / (1 + np.exp(-logits))


# ---- Everything below runs in the worker only ------------------------------


def make_strategy(kind: str, local: int, compression: str | None):
    import tensorflow as tf

    import tf_crossdevice

    if kind == "flat":
        ops = tf_crossdevice.CollectiveAllReduce(compression=compression)
    else:
        ops = tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.ReductionToOneDevice(), compression=compression
        )
    return tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=ops,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=TIMEOUT_SECONDS
        ),
        local_devices=[f"/cpu:{i}" for i in range(local)],
    )


def as_lists(strategy, per_replica_values) -> list[list]:
    """[replica][value]: each local replica's results, flattened."""
    local = [strategy.experimental_local_results(v) for v in per_replica_values]
    return [
        [np.ravel(np.asarray(v[r], np.float64)).tolist() for v in local]
        for r in range(len(local[0]))
    ]


def reduce_case(name: str, kind: str, local: int, compression: str) -> None:
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    strategy = make_strategy(kind, local, compression)

    def value_fn(context):
        g = context.replica_id_in_sync_group
        return [tf.constant(v) for v in values(g).values()]

    inputs = strategy.experimental_distribute_values_from_function(value_fn)
    means_at = [list(DTYPES).index(n) for n in MEAN_NAMES]

    @tf.function
    def step(inputs):
        def replica_step(inputs):
            context = tf.distribute.get_replica_context()
            sums = context.all_reduce("sum", inputs)
            means = context.all_reduce("mean", [inputs[i] for i in means_at])
            return sums, means

        return strategy.run(replica_step, args=(inputs,))

    sums, means = step(inputs)
    processes.reply(
        {
            "case": name,
            "sums": as_lists(strategy, sums),
            "means": as_lists(strategy, means),
        }
    )


def train(compression: str | None) -> None:
    import keras
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    strategy = make_strategy("flat", 1, compression)
    x, y = classification_data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(
        GLOBAL_BATCH, drop_remainder=True
    )
    start = initial_weights()
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((FEATURES,)),
                keras.layers.Dense(HIDDEN, activation="tanh"),
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        model.set_weights(start)
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE),
            loss="binary_crossentropy",
        )
    model.fit(dataset, epochs=EPOCHS, verbose=0)
    processes.reply(
        {
            "train": compression,
            "weights": [np.ravel(w).tolist() for w in model.get_weights()],
        }
    )


def main() -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * LOCAL_DEVICES
    )
    for case in CASES:
        reduce_case(*case)
    for compression in TRAIN_COMPRESSIONS:
        train(compression)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
