r"""Data-parallel training across worker processes with MultiWorkerAllReduce.

Each replica (a device on a worker) keeps its own copy of a linear model,
draws its own batch on its worker, computes gradients there, and the
replicas' gradients are averaged by `tf_crossdevice.MultiWorkerAllReduce`
before each copy takes the same SGD step. TensorFlow's gRPC runtime moves the
tensors; this process is the client that drives the workers.

On one machine (starts 2 local worker processes with 2 logical CPUs each):

    python examples/multi_worker_train.py --num_workers=2 \
        --replicas_per_worker=2 --all_reduce_spec="pscpu/pscpu#2"

On real hosts, start a `tf.distribute.Server` per host with the same cluster
spec (for example `python -m tf_crossdevice.cluster` on each, or your own
launcher) and pass it:

    python examples/multi_worker_train.py \
        --cluster_spec='{"worker": ["host1:2222", "host2:2222"]}'
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import tf_crossdevice  # noqa: E402
from tf_crossdevice import cluster, multi_worker  # noqa: E402

_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers",
    2,
    "Local worker processes to start (ignored with --cluster_spec).",
)
_REPLICAS_PER_WORKER = flags.DEFINE_integer(
    "replicas_per_worker", 2, "Replicas (logical CPU devices) per worker."
)
_CLUSTER_SPEC = flags.DEFINE_string(
    "cluster_spec",
    "",
    "JSON cluster spec of running workers; empty starts "
    "local workers on 127.0.0.1.",
)
_ALL_REDUCE_SPEC = flags.DEFINE_string(
    "all_reduce_spec",
    "pscpu/pscpu#2",
    "all_reduce_spec for the gradients, e.g. xring, rechd#2, pscpu:32k:xring.",
)
_NUM_PACKS = flags.DEFINE_integer("num_packs", 0, "Concat-and-split packs.")
_STEPS = flags.DEFINE_integer("steps", 60, "Training steps.")
_FEATURES = flags.DEFINE_integer("features", 512, "Model inputs.")
_BATCH = flags.DEFINE_integer("batch_per_replica", 64, "Examples per replica.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 0.1, "SGD step size.")
_TIMEOUT = flags.DEFINE_float(
    "timeout_seconds", 120.0, "Fail a step that takes longer (a hung worker)."
)


def true_weights(features: int) -> np.ndarray:
    return (
        np.random.default_rng(0).normal(size=(features, 1)).astype(np.float32)
    )


def make_train_step(replicas, ops, weights, features, batch, learning_rate):
    w_true = tf.constant(true_weights(features))

    def replica_gradients(r, step):
        seed = tf.stack([step, tf.constant(r, tf.int64)])
        x = tf.random.stateless_normal([batch, features], seed=seed)
        noise = tf.random.stateless_normal([batch, 1], seed=seed + 1)
        y = tf.matmul(x, w_true) + 0.01 * noise
        error = tf.matmul(x, weights[r]) - y
        loss = tf.reduce_mean(error**2)
        grad = 2.0 * tf.matmul(x, error, transpose_a=True) / batch
        return grad, loss

    @tf.function
    def train_step(step):
        grads = {}
        losses = {}

        def grad_of(r):
            grads[r], losses[r] = replica_gradients(r, step)
            return grads[r]

        gradient = replicas.per_replica(grad_of)
        loss = replicas.per_replica(lambda r: losses[r])
        mean_grad, mean_loss = ops.batch_reduce(
            "mean", [(gradient, None), (loss, None)]
        )
        for r, device in enumerate(replicas.devices):
            with tf.device(device):
                weights[r].assign_sub(
                    learning_rate * per_replica_results(mean_grad)[r]
                )
        return per_replica_results(mean_loss)[0]

    return train_step


def per_replica_results(value) -> tuple:
    """A reduction's values, one per replica device.

    As TensorFlow's CrossDeviceOps do, one destination device gives the
    plain tensor and several a Mirrored value.
    """
    if isinstance(value, tf.distribute.DistributedValues):
        return tuple(value.values)
    return (value,)


def check_one_all_reduce(replicas, ops) -> float:
    """Max error of one MultiWorkerAllReduce sum against numpy."""
    rng = np.random.default_rng(1)
    arrays = [
        rng.normal(size=(1000, 33)).astype(np.float32) for _ in replicas.devices
    ]

    @tf.function
    def reduce_known():
        value = replicas.per_replica(lambda r: tf.constant(arrays[r]))
        return list(per_replica_results(ops.reduce("sum", value)))

    results = replicas.run(reduce_known, timeout_seconds=_TIMEOUT.value)
    expected = np.sum(arrays, axis=0)
    return max(float(np.max(np.abs(t.numpy() - expected))) for t in results)


def train(cluster_spec: dict) -> None:
    replicas = multi_worker.WorkerReplicas(
        cluster_spec, replicas_per_worker=_REPLICAS_PER_WORKER.value
    )
    ops = tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices,
        0,
        _ALL_REDUCE_SPEC.value,
        num_packs=_NUM_PACKS.value,
    )
    print(
        f"{len(replicas.worker_devices)} workers x "
        f"{_REPLICAS_PER_WORKER.value} replicas, all_reduce_spec="
        f"{_ALL_REDUCE_SPEC.value!r}"
    )
    error = check_one_all_reduce(replicas, ops)
    print(f"one all-reduce across workers vs numpy: max error {error:.2e}")

    features = _FEATURES.value
    weights = []
    for device in replicas.devices:
        with tf.device(device):
            weights.append(tf.Variable(tf.zeros([features, 1])))
    train_step = make_train_step(
        replicas, ops, weights, features, _BATCH.value, _LEARNING_RATE.value
    )
    times = []
    for step in range(_STEPS.value):
        start = time.perf_counter()
        loss = replicas.run(
            train_step,
            tf.constant(step, tf.int64),
            timeout_seconds=_TIMEOUT.value,
        )
        loss = float(loss)
        times.append(time.perf_counter() - start)
        if step % max(1, _STEPS.value // 6) == 0 or step == _STEPS.value - 1:
            print(f"step {step:4d}  loss {loss:.5f}")
    copies = [w.numpy() for w in weights]
    spread = max(float(np.max(np.abs(c - copies[0]))) for c in copies)
    distance = float(np.max(np.abs(copies[0] - true_weights(features))))
    print(
        f"replica copies agree to {spread:.1e}; max |w - w_true| = "
        f"{distance:.4f}"
    )
    print(
        f"time per step: median {statistics.median(times[1:]) * 1e3:.1f} ms "
        f"over {len(times) - 1} steps (first, with tracing, {times[0]:.2f} s)"
    )


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TF logs configs at INFO.
    if _CLUSTER_SPEC.value:
        train(json.loads(_CLUSTER_SPEC.value))
        return
    with contextlib.ExitStack() as stack:
        start = time.perf_counter()
        local = stack.enter_context(
            cluster.start_local_cluster(
                _NUM_WORKERS.value, cpus_per_worker=_REPLICAS_PER_WORKER.value
            )
        )
        print(
            f"started {local.num_workers} local workers in "
            f"{time.perf_counter() - start:.1f} s: "
            f"{json.dumps(local.cluster_spec.as_dict())}"
        )
        train(local.cluster_spec.as_dict())
    print("workers stopped")


if __name__ == "__main__":
    app.run(main)
