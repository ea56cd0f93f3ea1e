r"""Trains a small model with MirroredStrategy over logical CPU devices.

Each step every replica computes gradients on its share of the batch, and
the chosen tf_crossdevice CrossDeviceOps all-reduces them. The job checks one
reduction against numpy, trains for --steps steps, and prints the loss, the
final weights against the least-squares solution, and the time per step.

    python examples/mirrored_demo.py --num_devices=4 \
        --algorithm=hierarchical_copy --num_packs=1
"""

from __future__ import annotations

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import tf_crossdevice  # noqa: E402

ALGORITHMS = ("auto", "reduction_to_one_device", "nccl", "hierarchical_copy")

_NUM_DEVICES = flags.DEFINE_integer(
    "num_devices", 4, "Logical CPU devices (>= 1)."
)
_ALGORITHM = flags.DEFINE_enum(
    "algorithm", "auto", ALGORITHMS, "Which CrossDeviceOps reduces gradients."
)
_NUM_PACKS = flags.DEFINE_integer(
    "num_packs", 1, "Packs for nccl / hierarchical_copy (0: no packing)."
)
_STEPS = flags.DEFINE_integer("steps", 200, "Training steps.")
_FEATURES = flags.DEFINE_integer("features", 256, "Input features.")


def make_cross_device_ops(devices: list[str]) -> tf.distribute.CrossDeviceOps:
    algorithm = _ALGORITHM.value
    if algorithm == "auto":
        return tf_crossdevice.select_cross_device_ops(devices)
    if algorithm == "reduction_to_one_device":
        return tf_crossdevice.ReductionToOneDevice()
    return tf_crossdevice.AllReduceCrossDeviceOps(
        algorithm, num_packs=_NUM_PACKS.value
    )


def check_one_reduction(strategy, ops, devices) -> float:
    """Sums known per-replica tensors and returns the max error vs numpy."""
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(1000, 37)).astype(np.float32) for _ in devices]
    value = tf_crossdevice.testing.per_replica(
        [tf.constant(a) for a in arrays], devices
    )
    summed = ops.reduce(tf.distribute.ReduceOp.SUM, value, None)
    expected = np.sum(arrays, axis=0)
    return max(
        float(np.max(np.abs(c.numpy() - expected)))
        for c in strategy.experimental_local_results(summed)
    )


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TF logs configs at INFO.
    tf_crossdevice.testing.request_cpu_devices(_NUM_DEVICES.value)
    devices = tf_crossdevice.testing.cpu_devices(_NUM_DEVICES.value)
    ops = make_cross_device_ops(devices)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    print(f"{len(devices)} replicas, cross_device_ops={type(ops).__name__}")
    print(
        f"one all-reduce vs numpy: max error "
        f"{check_one_reduction(strategy, ops, devices):.2e}"
    )

    rng = np.random.default_rng(1)
    features = _FEATURES.value
    true_w = rng.normal(size=(features, 1)).astype(np.float32)
    x = rng.normal(size=(4096, features)).astype(np.float32)
    y = x @ true_w + 0.01 * rng.normal(size=(4096, 1)).astype(np.float32)
    batch = 64 * len(devices)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))

    with strategy.scope():
        w = tf.Variable(tf.zeros([features, 1]))
        b = tf.Variable(tf.zeros([1]))
        optimizer = tf.keras.optimizers.SGD(0.05)

    def replica_step(inputs):
        xs, ys = inputs
        with tf.GradientTape() as tape:
            error = tf.matmul(xs, w) + b - ys
            loss = tf.reduce_sum(error**2) / batch
        grads = tape.gradient(loss, [w, b])
        optimizer.apply_gradients(zip(grads, [w, b], strict=True))
        return loss

    @tf.function
    def step():
        losses = strategy.run(replica_step, args=(next(iterator),))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, None)

    times = []
    for i in range(_STEPS.value):
        start = time.perf_counter()
        loss = float(step())
        times.append(time.perf_counter() - start)
        if i % max(1, _STEPS.value // 5) == 0 or i == _STEPS.value - 1:
            print(f"step {i:4d}  loss {loss:.5f}")
    solution = np.linalg.lstsq(x, y, rcond=None)[0]
    distance = float(np.max(np.abs(w.numpy() - solution)))
    print(f"max |w - least squares| = {distance:.4f}")
    print(
        f"time per step: median {statistics.median(times[1:]) * 1e3:.2f} ms "
        f"over {len(times) - 1} steps (first step, with tracing, "
        f"{times[0]:.2f} s)"
    )


if __name__ == "__main__":
    app.run(main)
