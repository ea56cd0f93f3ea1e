"""The example job's flags and the checks of their combinations.

Every check is a pure function of the flag values and raises
`flags.ValidationError` with a message that names the flag. `define_flags`
defines the flags on a FlagValues (absl's FLAGS by default);
`parse_flags`, the job's absl flags parser, parses them and checks their
combinations, so that the job exits with status 1 and that one message
before it starts anything.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
from typing import Any

from absl import app, flags

MODES = ("mirrored", "collective", "in_graph")
LOOPS = ("fit", "custom")
JOBS = ("worker", "chief", "controller")
# --cross_device_ops per mode; the first is the mode's default.
CLASSES = {
    "mirrored": (
        "auto",
        "ReductionToOneDevice",
        "AllReduceCrossDeviceOps",
        "NcclAllReduce",
        "HierarchicalCopyAllReduce",
        "SpecAllReduce",
    ),
    "collective": (
        "HierarchicalCollectiveAllReduce",
        "CollectiveAllReduce",
        "TensorFlow",
    ),
    "in_graph": ("MultiWorkerAllReduce",),
}
# --mode=collective with TensorFlow's own
# tf.distribute.MultiWorkerMirroredStrategy instead of ours: the baseline
# that examples/s and accuracy are compared with.
BASELINE = "TensorFlow"
# Classes whose constructors take these flags.
TAKES_SPEC = (
    "AllReduceCrossDeviceOps",
    "SpecAllReduce",
    "MultiWorkerAllReduce",
    "HierarchicalCollectiveAllReduce",
)
TAKES_COMPRESSION = (
    "SpecAllReduce",
    "MultiWorkerAllReduce",
    "CollectiveAllReduce",
    "HierarchicalCollectiveAllReduce",
)
COMPRESSIONS = ("none", "bf16", "fp16", "powersgd")
SYNCS = ("every_step", "local_sgd", "diloco")
# PowerSGD compresses gradients between workers: the collective classes
# under our MultiWorkerMirroredStrategy.
TAKES_POWERSGD = (
    "CollectiveAllReduce",
    "HierarchicalCollectiveAllReduce",
    "MultiWorkerAllReduce",
)
IMPLEMENTATIONS = ("AUTO", "RING", "NCCL")
# Logical CPU devices per worker where the host has no GPU for each worker.
CPU_DEVICES_PER_WORKER = 2
_LOOPBACK = ("localhost", "[::1]", "::1")


def define_flags(fv: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the job's flags and validators on `fv`."""
    d = flags
    d.DEFINE_enum(
        "mode", "collective", MODES, "How replicas meet.", flag_values=fv
    )
    d.DEFINE_enum(
        "loop",
        None,
        LOOPS,
        "Keras model.fit or a custom loop (default: fit; in_graph and "
        f"{BASELINE}: custom).",
        flag_values=fv,
    )
    d.DEFINE_enum(
        "model",
        "cnn",
        ("cnn", "dense"),
        "ResNet-style CNN or a dense model.",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "depth",
        2,
        "Residual blocks (cnn) or hidden layers (dense).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "width",
        16,
        "Channels (cnn) or units (dense).",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_string(
        "data_dir",
        "",
        "Image folder (one sub-folder per class) or *.tfrecord files; "
        "empty: synthetic data.",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "image_size",
        16,
        "Images are resized to this side.",
        lower_bound=4,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "num_classes",
        4,
        "Classes of the synthetic task.",
        lower_bound=2,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "num_examples",
        8192,
        "Training examples of the synthetic task.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "eval_examples",
        1024,
        "Held-out examples of the synthetic task the chief scores at the "
        "end (the standard error of the accuracy shrinks with the root of "
        "this: 0.7 points at 1024 and 94%).",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_enum(
        "job_name",
        None,
        JOBS,
        "This process's role; empty: start the whole job locally.",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "task_index",
        None,
        "This task's index in its job (default: from TF_CONFIG).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_list(
        "worker_hosts",
        [],
        "host:port of every worker, comma-separated.",
        flag_values=fv,
    )
    d.DEFINE_string(
        "cluster_spec",
        "",
        'JSON cluster, e.g. {"chief": ["h0:2222"], "worker": ["h1:2222"]}.',
        flag_values=fv,
    )
    d.DEFINE_integer(
        "num_workers",
        2,
        "Local workers to start (without --worker_hosts).",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "max_restarts",
        0,
        "Start every local worker again after one fails (a crash, a lost "
        "peer), up to this many times; they resume from the last "
        "checkpoint. For the workers the job starts itself: --mode="
        "collective without --job_name (python -m tf_crossdevice.launch "
        "--max_restarts does the same for any job).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_float(
        "stall_seconds",
        0.0,
        "With --max_restarts: also restart when a worker has finished no "
        "step for this long (a worker hung in TensorFlow's abort path "
        "neither exits nor fails), counted from its first step; 0: never. "
        "After half that long the launcher names the late workers and the "
        "collective the others wait in.",
        lower_bound=0.0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "min_workers",
        None,
        "With --link_rate and --max_restarts: the fewest workers a restart "
        "may run on, the emulated hosts that answer then (default: "
        "--num_workers). --batch_size stays the global batch: it must split "
        "over the replicas of every worker count from here to "
        "--num_workers.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_enum(
        "rescale",
        "global_batch",
        ["global_batch", "per_replica"],
        "When a restart runs on fewer workers than --num_workers "
        "(--min_workers): keep --batch_size as the global batch (each "
        "replica's share grows), or keep each replica's share of it (the "
        "global batch and the learning rate shrink with the worker count; "
        "--num_workers is then the full cluster's).",
        flag_values=fv,
    )
    d.DEFINE_string(
        "link_rate",
        None,
        "Run each local worker on an emulated host of its own: a network "
        "namespace on a link of this rate both ways (e.g. 1gbit) and an "
        "equal share of the cores (root on Linux; "
        "tf_crossdevice.cluster.hosts). For the workers the job starts "
        "itself: --mode=collective or in_graph without --job_name.",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "devices_per_worker",
        None,
        "Replicas per worker: GPUs, or logical CPUs without GPUs (default: "
        "the host's GPUs shared out between its workers, else "
        f"{CPU_DEVICES_PER_WORKER} logical CPUs).",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_string(
        "cross_device_ops",
        None,
        "The tf_crossdevice class: "
        + "; ".join(f"{m}: {', '.join(c)}" for m, c in CLASSES.items())
        + f" (first: default; {BASELINE}: TensorFlow's own "
        "tf.distribute.MultiWorkerMirroredStrategy, the baseline).",
        flag_values=fv,
    )
    d.DEFINE_string(
        "all_reduce_spec",
        None,
        "all_reduce_spec (e.g. xring, pscpu:32k:xring#2); for "
        "HierarchicalCollectiveAllReduce, the local sum's.",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "num_packs",
        None,
        "Concat-and-split packs (class default when unset).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "agg_small_grads_max_bytes",
        0,
        "Aggregate tensors of at most this many bytes.",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "agg_small_grads_max_group",
        10,
        "At most this many tensors per aggregate.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "bytes_per_pack",
        0,
        "Collectives: bytes per pack (0: the class chooses).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_float(
        "timeout_seconds",
        300.0,
        "Fail a collective, a start-up or an in-graph step that waits longer.",
        lower_bound=1e-3,
        flag_values=fv,
    )
    d.DEFINE_enum(
        "implementation",
        "AUTO",
        IMPLEMENTATIONS,
        "Collective implementation.",
        flag_values=fv,
    )
    d.DEFINE_enum(
        "compression",
        "none",
        COMPRESSIONS,
        "Gradients on the wire in 16 bits (bf16, fp16), or as PowerSGD's "
        "rank --powersgd_rank factors with error feedback "
        "(--mode=collective or in_graph).",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "powersgd_rank",
        4,
        "With --compression=powersgd: the rank of each gradient matrix's "
        "approximation.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "powersgd_start_step",
        0,
        "With --compression=powersgd: steps summed exactly before "
        "compression starts (PyTorch's start_powerSGD_iter).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_enum(
        "sync",
        "every_step",
        SYNCS,
        "every_step: the gradients are all-reduced every step. local_sgd: "
        "each worker takes --sync_period steps alone (its devices reduce "
        "among themselves), then the workers' weights are averaged. "
        "diloco: as local_sgd, but the mean change is a step of an outer "
        "Nesterov SGD (--outer_learning_rate, --outer_momentum). With "
        "local_sgd and diloco, --compression compresses the syncs "
        "(--mode=collective, our strategy).",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "sync_period",
        8,
        "With --sync=local_sgd or diloco: steps between syncs; "
        "--log_every, --sync_warmup_steps and the steps must be multiples "
        "of it, so that checkpoints fall on syncs.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "sync_warmup_steps",
        0,
        "With --sync=local_sgd or diloco: synchronous steps first.",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_float(
        "outer_learning_rate",
        0.7,
        "With --sync=diloco: the outer SGD's learning rate.",
        lower_bound=0.0,
        flag_values=fv,
    )
    d.DEFINE_float(
        "outer_momentum",
        0.9,
        "With --sync=diloco: the outer SGD's Nesterov momentum.",
        lower_bound=0.0,
        upper_bound=1.0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "steps",
        400,
        "Training steps (global batches).",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "epochs",
        0,
        "If > 0: train this many epochs (sets --steps).",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "batch_size",
        64,
        "Global batch: examples per step over every replica.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "accumulation_steps",
        1,
        "Micro-batches per update (--loop=custom): each global batch is "
        "split into this many, whose gradients each replica sums locally "
        "and all-reduces once (tf_crossdevice.GradientAccumulator), so the "
        "wire carries 1/k of the gradient traffic; the updates are those "
        "of 1.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_float(
        "learning_rate",
        0.1,
        "SGD learning rate (momentum 0.9).",
        lower_bound=0.0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "eval_every",
        0,
        "If > 0, a multiple of --log_every: the chief also scores the "
        "held-out examples at every checkpoint of a multiple of this "
        "(--mode=collective or mirrored), printing the accuracy and the "
        "seconds it took; 0: only at the end.",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_enum(
        "lr_schedule",
        "constant",
        ["constant", "cosine"],
        "constant: --learning_rate throughout; cosine: from --learning_rate "
        "down to 0 at the last step, a function of the optimizer's step, "
        "so a restart resumes it where the checkpoint left it "
        "(--mode=collective or mirrored).",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "timing_steps",
        0,
        "If > 0 (--mode=collective with --loop=custom, or "
        "--mode=in_graph): after training, time this many steps on one "
        "host alone (a copy of the model on that worker's devices and its "
        "share of the batch; nothing crosses a link) and this many "
        "all-reduces alone, and add to the summary the "
        "all-reduce's share of the step, the overlap (step / the longer of "
        "the two), the scaling efficiency (alone / step) and the cores "
        "each kept busy.",
        lower_bound=0,
        flag_values=fv,
    )
    d.DEFINE_string(
        "timeline",
        "",
        "If set, a PATH.json: every worker traces step --timeline_step with "
        "TensorFlow's profiler (each op of each thread: the forward and "
        "backward passes beside each pack's all-reduce) into a Chrome "
        "trace-event file, PATH with .worker<i> before .json when there "
        "are several workers; the chief merges the files it can read (the "
        "workers on its machine) into PATH, for Perfetto UI, "
        "chrome://tracing or TensorBoard's profile plugin, offline. It adds "
        "the TensorBoard scalars timeline/all_reduce_share (the collective "
        "ops' share of the chief's step) and timeline/sent_bytes_per_second "
        "(bytes the chief's host sent on its interfaces other than "
        "loopback during the step, over its wall time: 0 where the workers "
        "share one machine's loopback). --mode=collective or mirrored. "
        "Profiling and writing slow the traced step, and its progress "
        "line's step time with it.",
        flag_values=fv,
    )
    d.DEFINE_integer(
        "timeline_step",
        3,
        "With --timeline: the step to trace (counted from 1; the first "
        "steps trace the step function and warm up).",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "log_every",
        40,
        "Steps between progress lines and checkpoints.",
        lower_bound=1,
        flag_values=fv,
    )
    d.DEFINE_string(
        "model_dir",
        "",
        "TensorBoard scalars and checkpoints; a restarted job resumes "
        "from it. Empty: a new temporary folder.",
        flag_values=fv,
    )
    d.DEFINE_float(
        "uneven_data",
        None,
        "A fraction in (0, 1]: the job's last worker (the highest task "
        "index; task 1 of the 2 local workers) holds only this fraction of "
        "the other workers' batches, the job's first ones (rounded, at "
        "least 1); once its data runs out its replicas get empty "
        "batches and the others train on, each step's loss averaged over "
        "the examples present (tf_crossdevice.training.AverageOverExamples "
        "in fit, compute_average_loss in the custom loop). --mode="
        "collective, 2 or more workers. Unset: every worker has every "
        "step's data.",
        lower_bound=0.0,
        upper_bound=1.0,
        flag_values=fv,
    )
    d.DEFINE_integer(
        "seed",
        0,
        "Seeds the data, the teacher and the initial weights.",
        flag_values=fv,
    )


# ---- Validation (pure functions of the flag values) ------------------------


def cluster_of(v: dict[str, Any]) -> tuple[dict[str, list[str]] | None, str]:
    """The cluster the flags (or TF_CONFIG) describe, and where it came from."""
    if v["cluster_spec"]:
        try:
            spec = json.loads(v["cluster_spec"])
        except json.JSONDecodeError as e:
            raise flags.ValidationError(
                f"--cluster_spec: not JSON ({e}): {v['cluster_spec']!r}"
            ) from None
        if not isinstance(spec, dict) or not all(
            isinstance(t, list) for t in spec.values()
        ):
            raise flags.ValidationError(
                "--cluster_spec: expected a JSON object of job name to a "
                f"list of host:port, got {v['cluster_spec']!r}"
            )
        return spec, "--cluster_spec"
    if v["worker_hosts"]:
        return {"worker": list(v["worker_hosts"])}, "--worker_hosts"
    if os.environ.get("TF_CONFIG"):
        config = json.loads(os.environ["TF_CONFIG"])
        if config.get("cluster"):
            return config["cluster"], "TF_CONFIG"
    return None, ""


def task_of(v: dict[str, Any]) -> tuple[str | None, int | None]:
    """This process's (job, index): the flags, else TF_CONFIG's task."""
    job, index = v["job_name"], v["task_index"]
    if os.environ.get("TF_CONFIG"):
        task = json.loads(os.environ["TF_CONFIG"]).get("task", {})
        job = job or task.get("type")
        index = index if index is not None else task.get("index")
    return job, index


@dataclasses.dataclass(frozen=True)
class LocalDevices:
    """One worker's replicas: `count` devices of `device_type`.

    Attributes:
        device_type: "GPU" or "CPU" (logical CPU devices).
        count: replicas of this worker.
        first_gpu: this worker's first GPU among the host's (workers on one
            host use disjoint GPUs).
        note: why the default left some of the host's GPUs unused, if it
            did.
    """

    device_type: str
    count: int
    first_gpu: int = 0
    note: str = ""


def resolve_local_devices(
    requested: int | None,
    num_gpus: int,
    *,
    workers_on_host: int = 1,
    rank_on_host: int = 0,
    num_workers: int = 1,
    batch_size: int | None = None,
) -> LocalDevices:
    """One worker's devices: --devices_per_worker, or the default.

    The default shares the host's `num_gpus` GPUs out evenly between the
    `workers_on_host` workers there (as many each as also split
    `batch_size` evenly over the replicas of all `num_workers` workers);
    where that is not one GPU each, every worker gets
    CPU_DEVICES_PER_WORKER logical CPU devices and the GPUs are not used.

    >>> resolve_local_devices(None, 0)
    LocalDevices(device_type='CPU', count=2, first_gpu=0, note='')
    >>> resolve_local_devices(None, 1).count
    1
    >>> d = resolve_local_devices(None, 8, workers_on_host=2, rank_on_host=1,
    ...                           num_workers=2)
    >>> d.device_type, d.count, d.first_gpu
    ('GPU', 4, 4)

    Raises:
        flags.ValidationError: `requested` GPUs for each worker on this
            host are more than it has (the message names the flag).
    """
    share = num_gpus // workers_on_host
    if requested is None:
        if share == 0:
            note = ""
            if num_gpus:
                note = (
                    f"{num_gpus} GPU(s) cannot give each of the "
                    f"{workers_on_host} workers on this host one: each uses "
                    f"{CPU_DEVICES_PER_WORKER} logical CPU devices (fewer "
                    "--num_workers, or --mode=mirrored, uses the GPUs)"
                )
            return LocalDevices("CPU", CPU_DEVICES_PER_WORKER, note=note)
        count = share
        while count > 1 and batch_size and batch_size % (num_workers * count):
            count -= 1
        note = ""
        if count < share:
            note = (
                f"{count} of the {share} GPU(s) each worker could use: "
                f"--batch_size={batch_size} splits evenly over "
                f"{num_workers * count} replicas, not over "
                f"{num_workers * share}"
            )
        return LocalDevices("GPU", count, rank_on_host * share, note)
    if num_gpus == 0:
        return LocalDevices("CPU", requested)
    if requested > share:
        asked = (
            f"{requested} GPU(s)"
            if workers_on_host == 1
            else f"{requested} GPU(s) for each of the {workers_on_host} "
            f"workers on this host ({requested * workers_on_host} in all)"
        )
        raise flags.ValidationError(
            f"--devices_per_worker: {asked}, but this host has {num_gpus} "
            "GPU(s); leave --devices_per_worker unset to use what there is, "
            "or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run on logical CPU "
            "devices"
        )
    return LocalDevices("GPU", requested, rank_on_host * requested)


def _host(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    return "loopback" if host in _LOOPBACK or host.startswith("127.") else host


def host_share(v: dict[str, Any]) -> tuple[int, int]:
    """(workers on this process's host, this worker's rank among them).

    Mirrored runs one worker. A job without --job_name starts
    --num_workers local workers. A worker or chief counts the tasks of the
    cluster at its own host; the in-graph controller, the most worker tasks
    that share one host.
    """
    if v["mode"] == "mirrored":
        return 1, 0
    job, index = task_of(v)
    cluster, _ = cluster_of(v)
    if job is None or cluster is None:
        return v["num_workers"], 0
    tasks = [
        (j, i, _host(a))
        for j in ("chief", "worker")
        for i, a in enumerate(cluster.get(j, []))
    ]
    if job == "controller" or index is None:
        counts = collections.Counter(host for *_, host in tasks)
        return max(counts.values(), default=1), 0
    here = next((h for j, i, h in tasks if (j, i) == (job, index)), None)
    if here is None:  # not a task of the cluster: check_flags says so
        return 1, 0
    sharing = [(j, i) for j, i, h in tasks if h == here]
    return len(sharing), sharing.index((job, index))


def num_workers_of(v: dict[str, Any]) -> int:
    """Workers whose replicas share a global batch."""
    if v["mode"] == "mirrored":
        return 1
    cluster, _ = cluster_of(v)
    if cluster is None:
        return v["num_workers"]
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def worker_rank(v: dict[str, Any]) -> int:
    """This worker's index among the workers of num_workers_of: the chief
    first, then the workers by task index (0 where the process is the only
    worker or the job's launcher)."""
    job, index = task_of(v)
    cluster, _ = cluster_of(v)
    if v["mode"] == "mirrored" or cluster is None or index is None:
        return 0
    if job == "chief":
        return index
    return len(cluster.get("chief", [])) + index


def num_local_gpus() -> int:
    """GPUs TensorFlow sees on this host (CUDA_VISIBLE_DEVICES applies)."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def local_devices_of(v: dict[str, Any]) -> LocalDevices:
    """This worker's devices, by `resolve_local_devices` on this host."""
    workers_on_host, rank = host_share(v)
    return resolve_local_devices(
        v["devices_per_worker"],
        num_local_gpus(),
        workers_on_host=workers_on_host,
        rank_on_host=rank,
        num_workers=num_workers_of(v),
        batch_size=v["batch_size"],
    )


def _per_replica(v: dict[str, Any]) -> bool:
    return v["rescale"] == "per_replica" and v["mode"] == "collective"


def global_batch_of(v: dict[str, Any]) -> int:
    """This run's global batch: --batch_size, or with --rescale=per_replica
    each worker's share of it (--batch_size / --num_workers) times the
    workers this run has."""
    if not _per_replica(v):
        return v["batch_size"]
    return v["batch_size"] // v["num_workers"] * num_workers_of(v)


def learning_rate_of(v: dict[str, Any]) -> float:
    """--learning_rate, scaled as the global batch is (global_batch_of)."""
    if not _per_replica(v):
        return v["learning_rate"]
    return v["learning_rate"] * num_workers_of(v) / v["num_workers"]


def num_replicas(v: dict[str, Any]) -> tuple[int, str]:
    """How many replicas share a global batch, and how that was counted."""
    per = local_devices_of(v).count
    if v["mode"] == "mirrored":
        return per, f"{per} devices_per_worker"
    workers = num_workers_of(v)
    return workers * per, f"{workers} workers x {per} devices_per_worker"


def class_of(v: dict[str, Any]) -> str:
    return v["cross_device_ops"] or CLASSES[v["mode"]][0]


def loop_of(v: dict[str, Any]) -> str:
    """--loop, or its default: custom in_graph and for the baseline (see
    check_flags), else fit."""
    if v["loop"]:
        return v["loop"]
    if v["mode"] == "in_graph" or class_of(v) == BASELINE:
        return "custom"
    return "fit"


def spec_algorithms(spec: str) -> list[str]:
    """The single-level algorithm names of a valid spec."""
    from tf_crossdevice import algorithms

    parsed = algorithms.parse_all_reduce_spec(
        spec, algorithms.algorithm_names()
    )
    return [name for r in parsed for name in r.alg.split("/")]


def check_flags(v: dict[str, Any]) -> None:
    """Raises flags.ValidationError naming the flag for a bad combination."""
    mode, name = v["mode"], class_of(v)
    if name not in CLASSES[mode]:
        raise flags.ValidationError(
            f"--cross_device_ops: {name!r} is not a class of --mode={mode}; "
            f"expected one of {', '.join(CLASSES[mode])}"
        )
    if v["loop"] == "fit" and name == BASELINE:
        raise flags.ValidationError(
            f"--loop: --cross_device_ops={BASELINE} trains with a custom "
            "loop: Keras 3's model.fit fails under TensorFlow's own "
            "MultiWorkerMirroredStrategy with more than one worker "
            "(keras-team/keras#20585); use --loop=custom, or our strategy "
            "(CollectiveAllReduce) with fit"
        )
    if v["loop"] == "fit" and mode == "in_graph":
        raise flags.ValidationError(
            "--loop: --mode=in_graph trains with a custom loop (one "
            "tf.function drives every worker's replicas); use --loop=custom"
        )
    job = v["job_name"]
    allowed_jobs = {
        "mirrored": (),
        "collective": ("worker", "chief"),
        "in_graph": ("worker", "controller"),
    }[mode]
    if job is not None and job not in allowed_jobs:
        raise flags.ValidationError(
            f"--job_name: {job!r} has no role in --mode={mode}; expected "
            + (
                f"one of {', '.join(allowed_jobs)}, or none to start the "
                "job locally"
                if allowed_jobs
                else "none (mirrored runs in one process)"
            )
        )
    if v["cluster_spec"] and v["worker_hosts"]:
        raise flags.ValidationError(
            "--worker_hosts: give the cluster once, with --worker_hosts or "
            "--cluster_spec, not both"
        )
    cluster, source = cluster_of(v)
    job, index = task_of(v)
    if job is None and (v["worker_hosts"] or v["cluster_spec"]):
        given = "--worker_hosts" if v["worker_hosts"] else "--cluster_spec"
        raise flags.ValidationError(
            f"{given}: a cluster of hosts needs --job_name (and "
            "--task_index) on each of them; without --job_name the job "
            "starts its own local workers"
        )
    if job in ("worker", "chief") and mode != "mirrored":
        if cluster is None:
            raise flags.ValidationError(
                f"--job_name: a {job} needs the cluster: --worker_hosts, "
                "--cluster_spec or TF_CONFIG"
            )
        if index is None:
            raise flags.ValidationError(
                f"--task_index: a {job} needs its index in the cluster "
                "(or TF_CONFIG's task)"
            )
        tasks = len(cluster.get(job, []))
        if index >= tasks:
            raise flags.ValidationError(
                f"--task_index: {index} is not a task of job {job!r}, which "
                f"has {tasks} task(s) in {source}"
            )
    if v["link_rate"]:
        if mode == "mirrored" or job is not None:
            raise flags.ValidationError(
                "--link_rate: emulated hosts are for the workers the job "
                "starts itself: --mode=collective or in_graph, without "
                "--job_name"
            )
        from tf_crossdevice.cluster import hosts

        try:
            hosts.parse_rate(v["link_rate"])
        except ValueError as e:
            raise flags.ValidationError(f"--{e}") from None
    if v["max_restarts"] and (mode != "collective" or job is not None):
        raise flags.ValidationError(
            "--max_restarts: restarts the workers the job starts itself: "
            "--mode=collective without --job_name (for a worker you start, "
            "python -m tf_crossdevice.launch --max_restarts=K -- ...)"
        )
    if v["eval_every"] and (
        mode == "in_graph" or v["eval_every"] % v["log_every"]
    ):
        raise flags.ValidationError(
            f"--eval_every: {v['eval_every']} must be a multiple of "
            f"--log_every={v['log_every']} (it scores at checkpoints), in "
            f"--mode=collective or mirrored; got --mode={mode}"
        )
    if v["lr_schedule"] != "constant" and mode == "in_graph":
        raise flags.ValidationError(
            f"--lr_schedule={v['lr_schedule']}: the in-graph step applies "
            "a constant rate; use --mode=collective or mirrored"
        )
    if v["rescale"] == "per_replica":
        if mode != "collective":
            raise flags.ValidationError(
                "--rescale: a restart on fewer workers is for --mode="
                f"collective; got --mode={mode}"
            )
        if job is not None and num_workers_of(v) > v["num_workers"]:
            raise flags.ValidationError(
                f"--num_workers: with --rescale=per_replica, the full "
                f"cluster's worker count; this cluster has "
                f"{num_workers_of(v)}, more than {v['num_workers']}"
            )
    if v["stall_seconds"] and (mode != "collective" or job is not None):
        raise flags.ValidationError(
            "--stall_seconds: watches the workers the job starts itself: "
            "--mode=collective without --job_name (for a worker you start, "
            "python -m tf_crossdevice.launch --stall_seconds=S -- ...)"
        )
    if v["min_workers"] is not None and job is None:
        least = v["min_workers"]
        if not (v["link_rate"] and v["max_restarts"]):
            raise flags.ValidationError(
                "--min_workers: only an emulated host can drop out and a "
                "restart run without it: with --link_rate and --max_restarts"
            )
        if least > v["num_workers"]:
            raise flags.ValidationError(
                f"--min_workers: {least} is more than --num_workers="
                f"{v['num_workers']}"
            )
        per = local_devices_of(v).count
        # With --rescale=per_replica every worker count splits its batch.
        counts = [] if _per_replica(v) else range(least, v["num_workers"])
        for workers in counts:
            if v["batch_size"] % (workers * per):
                raise flags.ValidationError(
                    f"--batch_size: {v['batch_size']} does not split over "
                    f"the {workers * per} replicas of {workers} workers "
                    f"(--min_workers={least}); use a multiple of every "
                    f"replica count from {least * per} to "
                    f"{v['num_workers'] * per}"
                )
    if job == "controller" and cluster is None:
        raise flags.ValidationError(
            "--job_name: the controller needs the workers: --worker_hosts "
            "or --cluster_spec"
        )
    if v["all_reduce_spec"] is not None:
        if name not in TAKES_SPEC:
            raise flags.ValidationError(
                f"--all_reduce_spec: --cross_device_ops={name} takes no "
                f"spec; the classes that do: {', '.join(TAKES_SPEC)}"
            )
        try:
            algorithms = spec_algorithms(v["all_reduce_spec"])
        except (ValueError, TypeError) as e:
            raise flags.ValidationError(f"--all_reduce_spec: {e}") from None
        if name == "AllReduceCrossDeviceOps" and (
            len(algorithms) != 1 or any(c in v["all_reduce_spec"] for c in ":#")
        ):
            raise flags.ValidationError(
                "--all_reduce_spec: AllReduceCrossDeviceOps takes one "
                f"algorithm name, got {v['all_reduce_spec']!r}"
            )
        local_devices = job != "controller"
        on_cpus = local_devices_of(v).device_type == "CPU"
        if "nccl" in algorithms and local_devices and on_cpus:
            raise flags.ValidationError(
                f"--all_reduce_spec: {v['all_reduce_spec']!r} runs NCCL, "
                "which needs GPUs; this machine's workers have only CPUs "
                "(try xring, rechd or pscpu)"
            )
    if name == BASELINE:
        chosen = local_devices_of(v)
        if chosen.device_type == "CPU" and chosen.count != 1:
            raise flags.ValidationError(
                f"--devices_per_worker: --cross_device_ops={BASELINE} is "
                "tf.distribute.MultiWorkerMirroredStrategy, which has one "
                "replica per worker on hosts without GPUs (its CPU); got "
                f"{chosen.count}: pass --devices_per_worker=1"
            )
    if name == "NcclAllReduce" and local_devices_of(v).device_type == "CPU":
        raise flags.ValidationError(
            "--cross_device_ops: NcclAllReduce needs GPUs; this machine has "
            "only CPUs"
        )
    if v["compression"] == "powersgd" and (
        mode == "mirrored" or name not in TAKES_POWERSGD
    ):
        raise flags.ValidationError(
            "--compression: powersgd compresses gradients between workers "
            f"with {', '.join(TAKES_POWERSGD)} in --mode=collective or "
            f"in_graph; got --mode={mode} --cross_device_ops={name}"
        )
    if v["compression"] != "none" and name not in TAKES_COMPRESSION:
        raise flags.ValidationError(
            f"--compression: --cross_device_ops={name} does not compress; "
            f"the classes that do: {', '.join(TAKES_COMPRESSION)}"
        )
    replicas, how = num_replicas(v)
    batch = global_batch_of(v)
    if batch % replicas:
        raise flags.ValidationError(
            f"--batch_size: {batch} does not split over {replicas} "
            f"replicas ({how}); use a multiple of {replicas}"
        )
    loop = loop_of(v)
    k = v["accumulation_steps"]
    if k > 1 and mode == "in_graph":
        raise flags.ValidationError(
            f"--accumulation_steps: {k} micro-batches per update need a "
            "strategy; --mode=in_graph does not accumulate (use "
            "--mode=collective or mirrored with --loop=custom)"
        )
    if k > 1 and loop == "fit":
        raise flags.ValidationError(
            f"--accumulation_steps: {k} micro-batches per update need "
            "--loop=custom; Keras's own gradient_accumulation_steps "
            "all-reduces inside a cond in the replica function, which "
            "tf.distribute refuses (merge_call in control flow)"
        )
    if v["timing_steps"] and (mode == "mirrored" or loop != "custom"):
        raise flags.ValidationError(
            "--timing_steps: compares the custom loop's step between "
            "workers with the same step on one host alone; it needs "
            "--mode=collective with --loop=custom, or --mode=in_graph, got "
            f"--mode={mode} --loop={loop}"
        )
    if k > 1 and v["timing_steps"]:
        raise flags.ValidationError(
            f"--timing_steps: times one all-reduce per step; with "
            f"--accumulation_steps={k} a step all-reduces once per {k} "
            "micro-batches (leave one of the two at its default)"
        )
    if batch % (replicas * k):
        raise flags.ValidationError(
            f"--batch_size: {batch} does not split into "
            f"--accumulation_steps={k} micro-batches over {replicas} "
            f"replicas ({how}); use a multiple of {replicas * k}"
        )
    _check_timeline(v)
    _check_uneven_data(v)
    _check_sync(v)


def _check_uneven_data(v: dict[str, Any]) -> None:
    """--uneven_data."""
    fraction, mode = v["uneven_data"], v["mode"]
    if fraction is None:
        return
    if fraction == 0:
        raise flags.ValidationError(
            "--uneven_data: 0 would leave the last worker no data; expected "
            "a fraction in (0, 1]"
        )
    if mode != "collective":
        raise flags.ValidationError(
            "--uneven_data: gives the workers of --mode=collective different "
            f"amounts of data; got --mode={mode}"
        )
    if class_of(v) == BASELINE:
        raise flags.ValidationError(
            f"--uneven_data: --cross_device_ops={BASELINE} is TensorFlow's "
            "own strategy, which does not agree on the workers' number of "
            "batches; expected one of "
            + ", ".join(c for c in CLASSES[mode] if c != BASELINE)
        )
    if num_workers_of(v) < 2:
        raise flags.ValidationError(
            "--uneven_data: needs 2 or more workers (the last one holds "
            f"less data); this job has {num_workers_of(v)}"
        )
    k = v["accumulation_steps"]
    if k > 1:
        raise flags.ValidationError(
            f"--uneven_data: the loss of --accumulation_steps={k} divides "
            "by every micro-batch's full size; expected "
            "--accumulation_steps=1 (with --loop=fit or custom)"
        )
    if loop_of(v) != "fit":
        return
    # model.fit first reduces a batch of every replica, which fails on the
    # empty batches of a worker whose data ran out: no fit call may start
    # after that (train_loops.fit_epochs: one at each restart, and one for
    # the steps after the last multiple of --log_every).
    if v["max_restarts"]:
        raise flags.ValidationError(
            "--uneven_data: a restart resumes model.fit, which fails once "
            "the last worker's data ran out; with --max_restarts use "
            "--loop=custom"
        )
    import train_data

    steps, every = v["steps"], v["log_every"]
    tail = steps - steps % every
    stop = train_data.uneven_stop(steps, fraction)
    if v["epochs"] == 0 and steps % every and stop <= tail:
        raise flags.ValidationError(
            f"--uneven_data: with --loop=fit, model.fit starts again at step "
            f"{tail} (--steps={steps} is not a multiple of --log_every="
            f"{every}), after the last worker's data ends at step {stop}; "
            "make --steps a multiple of --log_every, or use --loop=custom"
        )


def _check_timeline(v: dict[str, Any]) -> None:
    """--timeline and --timeline_step."""
    path, mode = v["timeline"], v["mode"]
    if not path:
        return
    if mode == "in_graph":
        raise flags.ValidationError(
            "--timeline: traces the workers of --mode=collective or "
            "mirrored; with --mode=in_graph the step's ops run in worker "
            "servers, which the controller's profiler does not see (trace "
            "the same training with --mode=collective)"
        )
    if not path.endswith(".json"):
        raise flags.ValidationError(
            f"--timeline: {path!r} should end in .json (a Chrome "
            "trace-event file; several workers write PATH.worker<i>.json)"
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise flags.ValidationError(
            f"--timeline: {path!r} is in no existing folder ({folder})"
        )
    if v["epochs"] == 0 and v["timeline_step"] > v["steps"]:
        raise flags.ValidationError(
            f"--timeline_step: {v['timeline_step']} is after the last step "
            f"(--steps={v['steps']}); trace one of steps 1 to {v['steps']}"
        )


def parse_flags(argv: list[str]) -> list[str]:
    """Parses `argv` into absl's FLAGS and checks the flags' combinations
    (`check_flags`); the arguments left. For `app.run`'s flags_parser.

    A bad combination ends the process as absl ends it for a bad flag:
    status 1 and the check's message alone (an absl multi-flag validator
    would put every flag's value it was given before the message).
    """
    rest = app.parse_flags_with_usage(argv)
    try:
        check_flags(flags.FLAGS.flag_values_dict())
    except flags.ValidationError as e:
        sys.stderr.write(f"FATAL Flags parsing error: {e}\n")
        sys.stderr.write(
            "Pass --helpshort or --helpfull to see help on flags.\n"
        )
        sys.exit(1)
    return rest


def _check_sync(v: dict[str, Any]) -> None:
    """--sync=local_sgd or diloco: our strategy, and checkpoints on syncs."""
    if v["sync"] == "every_step":
        return
    name = class_of(v)
    if v["mode"] != "collective" or name == BASELINE:
        raise flags.ValidationError(
            f"--sync={v['sync']}: steps that reduce within a worker need "
            "our strategy: --mode=collective with CollectiveAllReduce or "
            f"HierarchicalCollectiveAllReduce; got --mode={v['mode']} "
            f"--cross_device_ops={name}"
        )
    unsupported = {
        "accumulation_steps": v["accumulation_steps"] != 1,
        "uneven_data": v["uneven_data"] is not None,
        "epochs": bool(v["epochs"]),
    }
    for flag, given in unsupported.items():
        if given:
            raise flags.ValidationError(
                f"--{flag}: not with --sync={v['sync']}; leave it at its "
                "default"
            )
    period = v["sync_period"]
    for flag in ("log_every", "sync_warmup_steps", "steps"):
        if v[flag] % period:
            raise flags.ValidationError(
                f"--{flag}: {v[flag]} is not a multiple of --sync_period="
                f"{period}; checkpoints and the end must fall on a sync"
            )
