"""Client side of the multi-worker tests, run as its own process.

Started by the tests with `processes.start_module("tests.multi_worker_client",
cwd=<repository root>)`. Takes one job as its first command, connects to the
cluster it names, runs each case (a CrossDeviceOps config reducing
`make_inputs` across the workers' devices) and replies once per result. The
test process computes what numpy says the results must be; this process only
reports what TensorFlow did.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import tensorflow as tf

import tf_crossdevice
from tests import contract
from tf_crossdevice.cluster import _in_graph as multi_worker
from tf_crossdevice.cluster import processes

# (shape, dtype) of each value in the batch: scalars to a few KB, two dtypes.
BATCH = (
    ((), "float32"),
    ((7,), "float32"),
    ((3, 5), "float32"),
    ((300,), "float32"),
    ((1000,), "float32"),
    ((4, 2), "int64"),
)


def make_inputs(seed: int, num_replicas: int) -> list[list[np.ndarray]]:
    """inputs[k][r]: value k on replica r (small integers: exact sums)."""
    rng = np.random.default_rng(seed)
    return [
        [
            rng.integers(-8, 9, size=shape).astype(dtype)
            for _ in range(num_replicas)
        ]
        for shape, dtype in BATCH
    ]


def spec_from_json(spec):
    """JSON has no tuples: a list of lists is a list of ranges."""
    if isinstance(spec, list):
        if spec and isinstance(spec[0], list):
            return [tuple(r) for r in spec]
        return tuple(spec)
    return spec


def make_ops(case, replicas):
    agg_bytes, agg_group = case.get("agg", (0, 10))
    extra = {}
    if "powersgd" in case:  # [rank, min_compression_size, rate]
        rank, min_size, rate = case["powersgd"]
        extra["compression"] = tf_crossdevice.compression.PowerSGD(
            rank=rank, min_compression_size=min_size, min_compression_rate=rate
        )
    return tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices,
        0,
        spec_from_json(case["spec"]),
        num_packs=case.get("num_packs", 0),
        agg_small_grads_max_bytes=agg_bytes,
        agg_small_grads_max_group=agg_group,
        **extra,
    )


def make_step(ops, inputs, replicas, placed, reduce_op):
    @tf.function(autograph=False)
    def step():
        values = [
            replicas.per_replica(lambda r, a=arrays: tf.constant(a[r]))
            for arrays in inputs
        ]
        reduced = ops.batch_reduce(reduce_op, [(v, None) for v in values])
        placed[:] = [[c.device for c in r.values] for r in reduced]
        return [list(r.values) for r in reduced]

    return step


def run_cases(job):
    first = True
    replicas_by_count = {}
    for case in job["cases"]:
        count = case["replicas_per_worker"]
        if count not in replicas_by_count:
            replicas_by_count[count] = multi_worker.WorkerReplicas(
                job["cluster"], replicas_per_worker=count, connect=first
            )
            first = False
        replicas = replicas_by_count[count]
        ops = make_ops(case, replicas)
        inputs = make_inputs(case["seed"], replicas.num_replicas)
        placed: list = []
        step = make_step(ops, inputs, replicas, placed, case["reduce_op"])
        out = replicas.run(step, timeout_seconds=120)
        processes.reply(
            {
                "name": case["name"],
                "devices": placed,
                "results": [[c.numpy().tolist() for c in r] for r in out],
                "dtypes": [[c.dtype.name for c in r] for r in out],
            }
        )


# PowerSGD over several steps: a float32 8x6 matrix (compressed at rank 1)
# and its (6,) bias, new values every step.
POWERSGD_SHAPES = ((8, 6), (6,))


def powersgd_inputs(step: int, num_replicas: int) -> list[list[np.ndarray]]:
    """inputs[k][r]: value k of POWERSGD_SHAPES on replica r at `step`."""
    rng = np.random.default_rng(1000 + step)
    return [
        [rng.normal(size=shape).astype(np.float32) for _ in range(num_replicas)]
        for shape in POWERSGD_SHAPES
    ]


def run_powersgd_steps(job):
    """MultiWorkerAllReduce with PowerSGD(start_step=...): one traced step,
    called job["steps"] times on new inputs; one reply per call, with every
    replica's sums and error (of the matrix) and the compressor's step."""
    replicas = multi_worker.WorkerReplicas(
        job["cluster"], replicas_per_worker=job["replicas_per_worker"]
    )
    compressor = tf_crossdevice.compression.PowerSGD(
        rank=job["rank"], start_step=job["start_step"], min_compression_size=0
    )
    ops = tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices,
        0,
        spec_from_json(job["spec"]),
        compression=compressor,
    )

    @tf.function(autograph=False)
    def step(arrays):
        values = [
            replicas.per_replica(lambda r, a=a: tf.identity(a[r]))
            for a in arrays
        ]
        reduced = ops.batch_reduce("sum", [(v, None) for v in values])
        return [list(r.values) for r in reduced]

    for s in range(job["steps"]):
        arrays = [
            [tf.constant(a) for a in per_replica]
            for per_replica in powersgd_inputs(s, replicas.num_replicas)
        ]
        out = replicas.run(step, arrays, timeout_seconds=120)
        processes.reply(
            {
                "step": s,
                "results": [[c.numpy().tolist() for c in r] for r in out],
                "errors": [
                    e.numpy().tolist() for e in compressor.state(0).errors
                ],
                "compressor_step": int(compressor.step.numpy()),
                "traces": step.experimental_get_tracing_count(),
            }
        )
    replicas.release()


def run_until_failure(job):
    """Repeats a large reduction until a worker dies or is stopped."""
    replicas = multi_worker.WorkerReplicas(job["cluster"])
    ops = tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices, 0, spec_from_json(job.get("spec", "xring"))
    )

    @tf.function(autograph=False)
    def step():
        value = replicas.per_replica(
            lambda r: tf.random.uniform([job["elements"]])
        )
        return [tf.reduce_sum(c) for c in ops.reduce("sum", value).values]

    replicas.run(step)  # Traced and warm.
    processes.reply({"ready": True})
    start = time.monotonic()
    try:
        while time.monotonic() - start < job["seconds"]:
            replicas.run(step, timeout_seconds=job.get("timeout_seconds"))
        result = {"error": None}
    except Exception as e:  # Reported to the test, which checks the type.
        result = {
            "error": type(e).__name__,
            "message": str(e),
            "workers": list(getattr(e, "workers", ())),
        }
    result["elapsed"] = time.monotonic() - start
    processes.reply(result)
    os._exit(0)  # A stuck step's thread must not keep the process alive.


def run_release(job):
    """Drops a function traced for the workers while worker 0 is stopped
    (SIGSTOP), resumes it `job["resume_after"]` seconds later, and reports
    how long `release` took; then kills the worker, so that a release
    still unanswered would fail now and TensorFlow would log it."""
    replicas = multi_worker.WorkerReplicas(job["cluster"])
    worker = job["worker_pid"]

    @tf.function
    def step():
        with tf.device(replicas.devices[0]):
            return tf.reduce_sum(tf.range(10))

    replicas.run(step)
    cycle = [step]
    cycle.append(cycle)  # Freed by a collection only, as steps often are.
    del step, cycle
    os.kill(worker, signal.SIGSTOP)
    threading.Timer(
        job["resume_after"], os.kill, (worker, signal.SIGCONT)
    ).start()
    start = time.monotonic()
    replicas.release()
    waited = time.monotonic() - start
    os.kill(worker, signal.SIGKILL)
    time.sleep(1.0)  # A late release's error line would come meanwhile.
    processes.reply({"waited": waited})
    os._exit(0)  # The context still names the killed worker.


def run_legacy_graph(job):
    """TF 1 style: in-graph MirroredStrategy over the workers' devices."""
    spec = job["cluster"]
    num_workers = len(spec["worker"])
    devices = [
        f"/job:worker/replica:0/task:{t}/device:CPU:{i}"
        for t in range(num_workers)
        for i in range(job["replicas_per_worker"])
    ]
    ops = tf_crossdevice.MultiWorkerAllReduce(
        [f"/job:worker/task:{t}" for t in range(num_workers)],
        0,
        spec_from_json(job["spec"]),
    )
    calls = contract.count_batch_reduce_calls(ops)
    with tf.Graph().as_default():
        strategy = tf.compat.v1.distribute.MirroredStrategy(
            devices, cross_device_ops=ops
        )

        def replica_fn():
            ctx = tf.distribute.get_replica_context()
            x = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
            return ctx.all_reduce(job["reduce_op"], x * tf.ones([4]))

        result = strategy.run(replica_fn)
        fetches = list(strategy.experimental_local_results(result))
        placed = [f.device for f in fetches]
        target = "grpc://" + spec["worker"][0]
        with tf.compat.v1.Session(target) as session:
            values = session.run(fetches)
        try:  # TF 1's distribute-coordinator route.
            tf.compat.v1.distribute.MirroredStrategy(
                devices, cross_device_ops=ops
            ).extended._configure(cluster_spec=spec)
            configure_error = None
        except ValueError as e:
            configure_error = str(e)
    processes.reply(
        {
            "calls": len(calls),
            "devices": placed,
            "values": [v.tolist() for v in values],
            "configure_error": configure_error,
        }
    )


if __name__ == "__main__":
    processes.exit_when_parent_goes()
    tf.get_logger().setLevel("ERROR")  # Each case traces its own function.
    job = next(processes.commands())
    {
        "cases": run_cases,
        "until_failure": run_until_failure,
        "legacy_graph": run_legacy_graph,
        "release": run_release,
        "powersgd_steps": run_powersgd_steps,
    }[job["mode"]](job)
