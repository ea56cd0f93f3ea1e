r"""Trains a Keras model data-parallel with tf_crossdevice: every mode, one job.

With no flags this is README's main job: it starts 2 local worker processes
on 127.0.0.1, each with its share of this machine's GPUs (or 2 logical CPU
devices, where there is not one GPU for each), and they train a small
ResNet-style CNN between-graph (`tf_crossdevice.MultiWorkerMirroredStrategy`
with `HierarchicalCollectiveAllReduce`) on a learnable synthetic task with
Keras `model.fit`, write TensorBoard scalars and checkpoints to a fresh
--model_dir, print progress and a closing summary, and stop.

    python examples/train.py                       # the main job
    python examples/train.py --mode=in_graph       # MultiWorkerAllReduce
    python examples/train.py --mode=mirrored --cross_device_ops=SpecAllReduce \
        --all_reduce_spec=pscpu:32k:xring --loop=custom

Modes:
  mirrored    one process, tf.distribute.MirroredStrategy over
              --devices_per_worker local devices (default: every GPU, else
              2 logical CPUs), any single-worker class.
  collective  between-graph, one process per worker (--job_name=worker or
              chief, --task_index; or TF_CONFIG). Without --job_name the job
              starts --num_workers local workers itself.
  in_graph    a controller (--job_name=controller) drives worker servers
              (--job_name=worker) with MultiWorkerAllReduce; without
              --job_name the job starts local worker servers and drives them.

With --link_rate (e.g. 1gbit; as root on Linux), the workers the job starts
run on emulated hosts, one each: a network namespace on a link shaped to
that rate and an equal share of the cores (tf_crossdevice.cluster.hosts),
so the wire, not the shared cores, bounds what crosses between workers.

On real hosts run one command per host with the same --worker_hosts (see
README.md). Bad flags and bad combinations exit with status 1 and a message
naming the flag.

Preemption: SIGTERM to any worker (or to this launcher, which passes it on
to its workers; in_graph: to the controller or a worker server, which
records it for the controller; mirrored: to the one training process) makes
every worker stop at one agreed step, save a checkpoint there, print
"preempted: checkpoint saved at step N of M" and exit 0. The same command
with the same --model_dir resumes from that step to the weights of an
uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import psutil  # noqa: E402
import train_flags  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from train_flags import class_of, cluster_of, task_of  # noqa: E402


def total_steps(v: Any, num_train: int) -> int:
    """--steps, or --epochs in steps (a last partial batch counts as one)."""
    if not v.epochs:
        return v.steps
    return -(-v.epochs * num_train // v.batch_size)


def make_cross_device_ops(
    v: Any, devices: list[str] | None = None, compress: bool = True
) -> Any:
    """The --cross_device_ops object the flags describe (without
    --compression if not `compress`)."""
    import tf_crossdevice

    name = class_of(v.flag_values_dict())
    extra = compression_of(v) if compress else {}
    packing = {
        "agg_small_grads_max_bytes": v.agg_small_grads_max_bytes,
        "agg_small_grads_max_group": v.agg_small_grads_max_group,
    }
    if v.num_packs is not None:
        packing["num_packs"] = v.num_packs
    if name == "auto":
        return tf_crossdevice.select_cross_device_ops(devices)
    if name == "ReductionToOneDevice":
        return tf_crossdevice.ReductionToOneDevice()
    if name in ("NcclAllReduce", "HierarchicalCopyAllReduce"):
        cls = getattr(tf_crossdevice, name)
        packs = {} if v.num_packs is None else {"num_packs": v.num_packs}
        return cls(**packs)
    if name == "AllReduceCrossDeviceOps":
        return tf_crossdevice.AllReduceCrossDeviceOps(
            v.all_reduce_spec or "hierarchical_copy", **packing
        )
    if name == "SpecAllReduce":
        return tf_crossdevice.SpecAllReduce(
            v.all_reduce_spec or "xring", **packing, **extra
        )
    options = communication_options(v)
    if name == "CollectiveAllReduce":
        return tf_crossdevice.CollectiveAllReduce(options=options, **extra)
    local = None
    if v.all_reduce_spec is not None:
        local = tf_crossdevice.SpecAllReduce(v.all_reduce_spec, **packing)
    return tf_crossdevice.HierarchicalCollectiveAllReduce(
        local, options=options, **extra
    )


def compression_of(v: Any) -> dict[str, Any]:
    """The `compression` argument --compression describes, if any: a
    PowerSGD compressor (a new one: it holds the job's state) or a codec."""
    import tf_crossdevice

    if v.compression == "powersgd":
        compressor = tf_crossdevice.compression.PowerSGD(
            rank=v.powersgd_rank, start_step=v.powersgd_start_step
        )
        return {"compression": compressor}
    if v.compression != "none":
        return {"compression": v.compression}
    return {}


def communication_options(v: Any) -> Any:
    """The collectives' options the flags describe."""
    import tensorflow as tf

    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=v.bytes_per_pack,
        timeout_seconds=v.timeout_seconds,
        implementation=getattr(
            tf.distribute.experimental.CommunicationImplementation,
            v.implementation,
        ),
    )


def local_devices(v: Any) -> list[str]:
    """This worker's replica devices (train_flags.local_devices_of): its
    GPUs, the others hidden, or logical CPUs, every GPU hidden so that
    workers sharing a host leave its GPUs alone. Call before TF runs ops."""
    import tensorflow as tf

    chosen = train_flags.local_devices_of(v.flag_values_dict())
    gpus = tf.config.list_physical_devices("GPU")
    if chosen.device_type == "GPU":
        mine = gpus[chosen.first_gpu : chosen.first_gpu + chosen.count]
        tf.config.set_visible_devices(mine, "GPU")
        return [f"/gpu:{i}" for i in range(chosen.count)]
    tf.config.set_visible_devices([], "GPU")
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * chosen.count
    )
    return [f"/cpu:{i}" for i in range(chosen.count)]


def load_data(v: Any) -> Any:
    import train_data

    if v.data_dir:
        return train_data.from_directory(v.data_dir, v.image_size, v.seed)
    return train_data.synthetic(
        v.image_size, v.num_classes, v.num_examples, v.seed, v.eval_examples
    )


def loop_config(
    v: Any, data: Any, ops: Any = None, sync_ops: Any = None
) -> Any:
    """The training loop's settings; `ops` reduce the steps and `sync_ops`
    (--sync: the syncs; None: the strategy's) whatever crosses between
    workers at a sync."""
    import train_loops

    import tf_crossdevice

    compressing = sync_ops if v.sync != "every_step" else ops
    powersgd = tf_crossdevice.ops.wire_of(compressing).powersgd
    values = v.flag_values_dict()
    return train_loops.Config(
        loop=train_flags.loop_of(values),
        model=v.model,
        depth=v.depth,
        width=v.width,
        steps=total_steps(v, data.num_train),
        batch_size=train_flags.global_batch_of(values),
        accumulation_steps=v.accumulation_steps,
        learning_rate=train_flags.learning_rate_of(values),
        lr_schedule=v.lr_schedule,
        eval_every=v.eval_every,
        log_every=v.log_every,
        seed=v.seed,
        model_dir=v.model_dir,
        timeout_seconds=v.timeout_seconds,
        compression_state=powersgd,
        timing_steps=v.timing_steps,
        timeline=v.timeline,
        timeline_step=v.timeline_step,
        worker=train_flags.worker_rank(values),
        num_workers=train_flags.num_workers_of(values),
        uneven_data=v.uneven_data,
        sync=train_loops.SyncConfig(
            v.sync,
            v.sync_period,
            v.sync_warmup_steps,
            v.outer_learning_rate,
            v.outer_momentum,
            sync_ops,
        ),
    )


def run_mirrored(v: Any) -> int:
    import tensorflow as tf
    import train_loops

    devices = local_devices(v)
    ops = make_cross_device_ops(v, devices)
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    print(f"mode=mirrored: {len(devices)} devices, {type(ops).__name__}")
    data = load_data(v)
    print(f"data: {data.description}", flush=True)
    summary = train_loops.train_with_strategy(
        strategy, loop_config(v, data), data, is_chief=True, task=0
    )
    if summary:  # Empty when preempted.
        print(summary, flush=True)
    return 0


def run_collective_worker(v: Any) -> int:
    import tensorflow as tf
    import train_loops

    import tf_crossdevice

    job, index = task_of(v.flag_values_dict())
    if v.cluster_spec or v.worker_hosts:
        cluster, _ = cluster_of(v.flag_values_dict())
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster),
            task_type=job,
            task_id=index,
            rpc_layer="grpc",
        )
    else:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    devices = local_devices(v)
    sync_ops = None
    if class_of(v.flag_values_dict()) == train_flags.BASELINE:
        ops = None
        described = "TensorFlow's MultiWorkerMirroredStrategy"
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver,
            communication_options=communication_options(v),
        )
    else:
        # With --sync, --compression compresses the syncs: a class of
        # their own, whose PowerSGD state is apart from the steps'.
        syncing = v.sync != "every_step"
        ops = make_cross_device_ops(v, compress=not syncing)
        if syncing and v.compression != "none":
            sync_ops = make_cross_device_ops(v)
        described = type(ops).__name__
        if syncing:
            described += (
                f"; --sync={v.sync}, every {v.sync_period} steps after "
                f"{v.sync_warmup_steps} synchronous ones"
            )
        # The class brings its own options; the strategy's are the default
        # of the rest, and bound the wait for the other workers at start.
        timeout = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=v.timeout_seconds
        )
        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=ops,
            cluster_resolver=resolver,
            communication_options=timeout,
            local_devices=devices,
        )
    is_chief = (job == "chief") or (
        job == "worker"
        and index == 0
        and "chief" not in resolver.cluster_spec().jobs
    )
    if is_chief:
        workers = strategy.num_replicas_in_sync // len(devices)
        print(
            f"mode=collective: {workers} workers x {len(devices)} devices, "
            f"{described}",
            flush=True,
        )
    data = load_data(v)
    if is_chief:
        print(f"data: {data.description}", flush=True)
    summary = train_loops.train_with_strategy(
        strategy,
        loop_config(v, data, ops, sync_ops),
        data,
        is_chief=is_chief,
        task=index,
    )
    if is_chief and summary:  # Empty when preempted.
        print(summary, flush=True)
    return 0


def run_in_graph_controller(
    v: Any,
    cluster: dict[str, list[str]],
    cpu_seconds: Callable[[], float] | None = None,
) -> int:
    """Drives the workers of `cluster`; `cpu_seconds`, where given, is the
    first worker's CPU clock (--timing_steps then says how busy it was)."""
    import tensorflow as tf
    import train_loops

    import tf_crossdevice
    from tf_crossdevice import cluster as cluster_lib

    chosen = train_flags.local_devices_of(v.flag_values_dict())
    device_type, per_worker = chosen.device_type, chosen.count
    replicas = cluster_lib.WorkerReplicas(
        cluster,
        replicas_per_worker=per_worker,
        device_type=device_type,
    )
    spec = v.all_reduce_spec or "pscpu/pscpu#2"
    ops = tf_crossdevice.MultiWorkerAllReduce(
        replicas.worker_devices,
        per_worker if device_type == "GPU" else 0,
        spec,
        num_packs=v.num_packs or 0,
        agg_small_grads_max_bytes=v.agg_small_grads_max_bytes,
        agg_small_grads_max_group=v.agg_small_grads_max_group,
        **compression_of(v),
    )
    print(
        f"mode=in_graph: {len(replicas.worker_devices)} workers x "
        f"{per_worker} devices, MultiWorkerAllReduce "
        f"all_reduce_spec={spec!r}",
        flush=True,
    )
    with tf.device("/job:localhost/replica:0/task:0/device:CPU:0"):
        data = load_data(v)
    print(f"data: {data.description}", flush=True)
    config = loop_config(v, data)
    if cpu_seconds is not None:
        config = dataclasses.replace(config, worker_cpu_seconds=cpu_seconds)
    summary = train_loops.train_in_graph(replicas, ops, config, data)
    if summary:  # Empty when preempted.
        print(summary, flush=True)
    # What the job placed on the workers is freed while they still answer;
    # later, TensorFlow would log an error line for each function it could
    # no longer free there.
    del ops, config, data
    replicas.release()
    return 0


def serve_in_graph_worker(v: Any, cluster: dict[str, list[str]]) -> int:
    """A worker server of an in-graph job; serves until it is stopped."""
    import tensorflow as tf

    from tf_crossdevice import cluster as cluster_lib

    devices = local_devices(v)
    cpus = len(devices) if devices[0].startswith("/cpu") else 1
    config = tf.compat.v1.ConfigProto(device_count={"CPU": cpus})
    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name="worker",
        task_index=v.task_index,
        config=config,
    )
    print(f"worker {v.task_index} serving at {server.target}", flush=True)
    # A SIGTERM (a preemption notice) is recorded for the controller, which
    # saves at its next step while this server still holds its variables.
    cluster_lib.serve(server)
    return 0


def launch_collective(v: Any) -> int:
    """Starts --num_workers local workers running this job; their status."""
    from tf_crossdevice import launch

    argv = [
        sys.executable,
        os.path.abspath(__file__),
        *sys.argv[1:],
        "--job_name=worker",
        f"--model_dir={v.model_dir}",
        "--link_rate=",  # The workers run on the hosts; they make none.
        "--max_restarts=0",  # This launcher restarts them...
        "--stall_seconds=0",  # ...and watches them.
    ]
    start = time.perf_counter()
    where = f"emulated hosts at {v.link_rate}" if v.link_rate else "127.0.0.1"
    print(f"starting {v.num_workers} local workers on {where}", flush=True)
    # A preemption notice to the job goes to every worker: they agree on a
    # step, save there and exit 0, and this launcher with them.
    signal.signal(signal.SIGTERM, _forward_to_workers)
    codes = launch.run_local_job(
        argv,
        v.num_workers,
        env={"PYTHONUNBUFFERED": "1"},
        link_rate=v.link_rate or None,
        min_workers=v.min_workers,
        max_restarts=v.max_restarts,
        stall_seconds=v.stall_seconds or None,
    )
    failed = next((c for c in codes if c != 0), 0)
    print(
        f"workers stopped (exit statuses {codes}); wall time "
        f"{time.perf_counter() - start:.1f} s",
        flush=True,
    )
    return 1 if failed else 0


def _forward_to_workers(signum: int, frame: Any) -> None:
    del frame
    for worker in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            worker.send_signal(signum)


def launch_in_graph(v: Any) -> int:
    """Starts local worker servers and drives them from this process."""
    from tf_crossdevice import cluster as cluster_lib

    start = time.perf_counter()
    chosen = train_flags.local_devices_of(v.flag_values_dict())
    cpus = chosen.count if chosen.device_type == "CPU" else 1
    # This process, the controller, reaches emulated hosts over their bridge;
    # its CPU time counts against the first host's share, so that the job
    # gets no CPU beyond the hosts' (as a controller on that host would).
    hosts = (
        cluster_lib.hosts.EmulatedHosts(v.num_workers, v.link_rate)
        if v.link_rate
        else contextlib.nullcontext()
    )
    with (
        hosts as bed,
        bed.charged(0) if bed is not None else contextlib.nullcontext(),
        cluster_lib.start_local_cluster(
            v.num_workers, cpus_per_worker=cpus, hosts=bed
        ) as local,
    ):
        print(
            f"started {local.num_workers} local worker servers: "
            f"{json.dumps(local.cluster_spec.as_dict())}",
            flush=True,
        )
        code = run_in_graph_controller(
            v,
            local.cluster_spec.as_dict(),
            functools.partial(local.cpu_seconds, 0),
        )
    print(
        f"workers stopped; wall time {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    # The eager context still names the stopped workers: leave without
    # tearing it down (which would try to reach them).
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    v = flags.FLAGS
    if not v["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # TF logs configs at INFO.
    if not v.model_dir:
        v.model_dir = tempfile.mkdtemp(prefix="tf_crossdevice_train_")
    job, _ = task_of(v.flag_values_dict())
    if job is None:
        print(
            f"model_dir: {v.model_dir} (tensorboard --logdir={v.model_dir})",
            flush=True,
        )
        note = train_flags.local_devices_of(v.flag_values_dict()).note
        if note:
            print(f"--devices_per_worker unset: {note}", flush=True)
    if v.mode == "mirrored":
        return run_mirrored(v)
    if v.mode == "collective":
        if job is None:
            return launch_collective(v)
        # A launcher that stops this worker for a stall asks first where
        # its threads wait (SIGUSR1), and prints the answer.
        faulthandler.register(signal.SIGUSR1, all_threads=True)
        return run_collective_worker(v)
    cluster, _ = cluster_of(v.flag_values_dict())
    if job is None:
        return launch_in_graph(v)
    assert cluster is not None
    if job == "worker":
        return serve_in_graph_worker(v, cluster)
    return run_in_graph_controller(v, cluster)


if __name__ == "__main__":
    train_flags.define_flags()
    # --helpshort lists the main module's flags: the job's are defined in
    # train_flags.
    flags.adopt_module_key_flags(train_flags)
    app.run(main, flags_parser=train_flags.parse_flags)
