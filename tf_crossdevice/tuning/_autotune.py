"""autotune: time candidate CrossDeviceOps on the real devices, keep the best.

A configuration is a constructor call as plain data, `(class name, kwargs)`
(the cost model's format, see `tf_crossdevice.cost_model` when installed).
`autotune` lists the candidates for the topology, orders them (the cost
model's prediction when that module is importable, else the benchmark's
findings), builds and checks each against numpy within the time budget,
times the survivors in interleaved rounds (`_measure`), caches the winner
in a JSON file and returns it as a ready CrossDeviceOps.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import statistics
import tempfile
import time
from collections.abc import Hashable, Mapping, Sequence
from typing import Any, TypeAlias, TypeVar

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import checks as _checks
from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core import requirements, tf_internal
from tf_crossdevice.cluster import _in_graph
from tf_crossdevice.collective import _all_reduce as _collective_ops
from tf_crossdevice.collective import (
    _hierarchical as _hierarchical_collective_ops,
)
from tf_crossdevice.compression import _codec as compression
from tf_crossdevice.ops import _base
from tf_crossdevice.ops import _multi_worker as _multi_worker_ops
from tf_crossdevice.ops import _single_host as _ops
from tf_crossdevice.ops import _spec as _spec_ops
from tf_crossdevice.tuning import cost_model
from tf_crossdevice.tuning import measure as _measure

Config: TypeAlias = tuple[str, dict[str, Any]]
GradientList: TypeAlias = list[tuple[tuple[int, ...], str]]
Key = TypeVar("Key", bound=Hashable)

CACHE_FORMAT = 1
# Small-tensor aggregation as the benchmark ran it: up to 64 KiB, 1024 a group.
AGGREGATE = {
    "agg_small_grads_max_bytes": 64 << 10,
    "agg_small_grads_max_group": 1024,
}
_ROUNDS = 5
# Confirmation among the finalists: those within this of the best median.
_WITHIN = 0.15
_FINALISTS = 3
_CONFIRM_ROUNDS = (3, 2 * _ROUNDS)  # fewest worth running, most
_TARGET_SECONDS = 0.02  # one measurement repeats a step about this long
_MAX_REPS = 50
_SAFETY = 1.25  # on estimated build times and on planned rounds


@dataclasses.dataclass(frozen=True)
class Topology:
    """Where the replicas are: what autotune's cache key is made of.

    Attributes:
        devices: the replicas' canonical device names, worker by worker.
        worker_devices: one '/job:J/replica:R/task:T' per worker.
        device_type: "CPU", "GPU" (or "CPU/GPU" for a mix).
        devices_per_worker: replicas on each worker, in worker order.
    """

    devices: tuple[str, ...]
    worker_devices: tuple[str, ...]
    device_type: str
    devices_per_worker: tuple[int, ...]

    @classmethod
    def of(cls, devices: Sequence[str]) -> Topology:
        """The topology of canonical device names (not checked to exist)."""
        names = [devices_lib.parse_device(d) for d in devices]
        workers: dict[tuple[str, int, int], int] = {}
        for name in names:
            workers[name.worker] = workers.get(name.worker, 0) + 1
        kinds = sorted({n.device_type or "CPU" for n in names})
        return cls(
            devices=tuple(devices),
            worker_devices=tuple(
                f"/job:{j}/replica:{r}/task:{t}" for j, r, t in workers
            ),
            device_type="/".join(kinds),
            devices_per_worker=tuple(workers.values()),
        )

    @property
    def num_workers(self) -> int:
        return len(self.worker_devices)

    @property
    def local_devices(self) -> int:
        """Replicas per worker (the most any worker has)."""
        return max(self.devices_per_worker)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One candidate as autotune saw it.

    Attributes:
        label: e.g. "SpecAllReduce pscpu agg_small=64KiBx1024".
        config: (class name, kwargs).
        predicted_seconds: the cost model's prediction (None: none).
        verified: matched numpy (None: not built, see `error`).
        error: why it has no time (failed, or skipped for the budget).
        build_seconds: tracing, the first runs and the check.
        median_seconds: median over all its timed rounds (the first
            interleaved rounds and, for a finalist, the confirmation).
        confirmation_rounds: rounds it was timed again as a finalist
            (0: not a finalist, or no budget left to confirm).
    """

    label: str
    config: Config
    predicted_seconds: float | None = None
    verified: bool | None = None
    error: str | None = None
    build_seconds: float = 0.0
    median_seconds: float | None = None
    confirmation_rounds: int = 0


@dataclasses.dataclass(frozen=True)
class AutotuneResult:
    """What `autotune` measured; the returned ops' `autotune_result`.

    Attributes:
        config: the chosen (class name, kwargs).
        label: its label.
        measurements: every candidate, in the order considered.
        budget_seconds: the budget it was measured with.
        elapsed_seconds: how long this call took.
        complete: every candidate was measured.
        from_cache: read from `cache_file`, nothing measured.
        cache_file: where the result is cached.
    """

    config: Config
    label: str
    measurements: tuple[Measurement, ...]
    budget_seconds: float
    elapsed_seconds: float
    complete: bool
    from_cache: bool
    cache_file: str


# --- Arguments -------------------------------------------------------------

_GRADIENTS_ALLOWED = (
    "expected a Keras model, or a non-empty list of (shape, dtype) pairs, "
    "tensors or variables"
)


def normalize_gradients(gradients: Any) -> GradientList:
    """`gradients` as a list of (shape tuple, dtype name) pairs.

    Args:
        gradients: a Keras model or `tf.Module` (its trainable weights), or
            a list of (shape, dtype) pairs, tensors or variables (numpy
            arrays too), all of fully known shape.

    Raises:
        TypeError: something else; the message names the entry.
        ValueError: an empty list, an unknown shape or a bad dtype.

    >>> normalize_gradients([((2, 3), "float32"), tf.zeros([4], tf.int64)])
    [((2, 3), 'float32'), ((4,), 'int64')]
    """
    if isinstance(gradients, tf.Module) or hasattr(
        gradients, "trainable_weights"
    ):
        weights = getattr(gradients, "trainable_weights", None)
        if weights is None:
            weights = gradients.trainable_variables
        if not weights:
            raise ValueError(
                "gradients: the model has no trainable weights (build it "
                "first, e.g. by calling it on a batch)"
            )
        return [
            _entry(w, f"gradients (weight {i})") for i, w in enumerate(weights)
        ]
    if isinstance(gradients, (str, bytes)) or not isinstance(
        gradients, Sequence
    ):
        raise TypeError(
            f"gradients: {_GRADIENTS_ALLOWED}, got "
            f"{type(gradients).__name__} {gradients!r:.80}"
        )
    if not gradients:
        raise ValueError(f"gradients: {_GRADIENTS_ALLOWED}, got an empty list")
    return [_entry(g, f"gradients[{i}]") for i, g in enumerate(gradients)]


def _entry(value: Any, argument: str) -> tuple[tuple[int, ...], str]:
    if isinstance(value, (tuple, list)) and len(value) == 2:
        shape, dtype = value
        if isinstance(dtype, int):  # tf.as_dtype would read an enum value
            raise TypeError(
                f"{argument}: expected a dtype such as 'float32' second, got "
                f"{dtype!r}; a gradient is a (shape, dtype) pair"
            )
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        shape, dtype = value.shape, value.dtype
    else:
        raise TypeError(
            f"{argument}: expected a (shape, dtype) pair, a tensor or a "
            f"variable, got {type(value).__name__} {value!r:.80}"
        )
    try:
        dims = tf.TensorShape(shape)
        name = tf.as_dtype(dtype).name
    except (TypeError, ValueError) as e:
        raise ValueError(
            f"{argument}: shape {shape!r} and dtype {dtype!r} do not make a "
            f"tensor type ({e})"
        ) from None
    if not dims.is_fully_defined():
        raise ValueError(
            f"{argument}: shape {dims} is not fully known; autotune needs "
            "every gradient's size"
        )
    return tuple(int(d) for d in dims.as_list()), name


def topology_of(devices: Any, argument: str = "devices") -> Topology:
    """The replicas' topology; a cluster spec is connected to first.

    Raises:
        TypeError: not a list of device strings nor a cluster spec.
        ValueError: an unparsable, repeated or unknown device, or a cluster
            spec without a clear worker job.
    """
    if isinstance(devices, (dict, tf.train.ClusterSpec)):
        return _connect(devices, argument)
    if isinstance(devices, str) or not isinstance(devices, Sequence):
        raise TypeError(
            f"{argument}: expected a list of device strings (local devices, "
            "or '/job:worker/task:i/device:CPU:0' of a connected cluster) "
            "or a cluster spec (dict or tf.train.ClusterSpec), got "
            f"{type(devices).__name__} {devices!r:.80}"
        )
    _checks.string_list(devices, argument, "device string")
    canonical = [
        _base.canonical_device(d, f"{argument}[{i}]")
        for i, d in enumerate(devices)
    ]
    known = {
        tf_internal.canonicalize_device(d.name)
        for d in tf.config.list_logical_devices()
    }
    for i, device in enumerate(canonical):
        if device not in known:
            raise ValueError(
                f"{argument}[{i}]: {devices[i]!r} is not a device of this "
                f"process or of a cluster it is connected to; it has "
                f"{', '.join(sorted(known))}. For a cluster, pass its spec "
                "(autotune connects) or connect first "
                "(tf.config.experimental_connect_to_cluster)"
            )
        if device in canonical[:i]:
            raise ValueError(
                f"{argument}[{i}]: {device} is listed twice; one replica "
                "per device"
            )
    return Topology.of(canonical)


def _connect(spec: Any, argument: str) -> Topology:
    cluster = tf.train.ClusterSpec(spec) if isinstance(spec, dict) else spec
    jobs = sorted(cluster.jobs)
    if "worker" in jobs:
        job = "worker"
    elif len(jobs) == 1:
        (job,) = jobs
    else:
        raise ValueError(
            f"{argument}: the cluster spec has jobs {jobs} and no 'worker' "
            "job; autotune runs replicas on the 'worker' job's tasks"
        )
    replicas = _in_graph.WorkerReplicas(cluster, 1, job_name=job)
    by_worker: dict[str, dict[str, list[str]]] = {
        w: {"CPU": [], "GPU": []} for w in replicas.worker_devices
    }
    for d in tf.config.list_logical_devices():
        name = tf_internal.canonicalize_device(d.name)
        worker, _, _ = name.partition("/device:")
        if worker in by_worker and d.device_type in ("CPU", "GPU"):
            by_worker[worker][d.device_type].append(name)
    kind = "GPU" if all(v["GPU"] for v in by_worker.values()) else "CPU"
    count = min(len(v[kind]) for v in by_worker.values())
    chosen = [
        d
        for v in by_worker.values()
        for d in sorted(v[kind], key=lambda n: int(n.rsplit(":", 1)[1]))[:count]
    ]
    logging.info(
        "autotune: connected to %d workers of job %r; %d %s replica(s) each",
        len(by_worker),
        job,
        count,
        kind,
    )
    return Topology.of(chosen)


# --- Candidates ------------------------------------------------------------


def candidates(topology: Topology, gradients: GradientList) -> list[Config]:
    """Every configuration to try, in the benchmark's order of merit.

    docs/benchmark/results.md (2-core machine, logical CPUs): small-tensor
    aggregation with pscpu, psgpu or hierarchical copy was fastest or near
    it on every workload; one pack next; unpacked ring and halving-doubling
    are slowest and take minutes to trace on 1000 tensors, so they come
    last. Across workers: pscpu with aggregation, then the two-level
    default.
    """
    packings: list[dict[str, int]] = [AGGREGATE, {"num_packs": 1}]
    if topology.num_workers == 1:
        gpu = topology.device_type == "GPU"
        algs = ["pscpu", "psgpu", "hierarchical_copy"]
        out: list[Config] = [
            ("SpecAllReduce", _spec("nccl", p))
            for p in (packings if gpu else ())
        ]
        out += [("SpecAllReduce", _spec(a, AGGREGATE)) for a in algs]
        out.append(("ReductionToOneDevice", {}))
        out += [
            ("SpecAllReduce", _spec(a, {"num_packs": 1}))
            for a in [*algs, "xring", "rechd", "xring#2"]
        ]
        out += [
            ("SpecAllReduce", _spec(a, AGGREGATE)) for a in ("xring", "rechd")
        ]
        out += [
            ("SpecAllReduce", _spec(a, {"num_packs": 4}))
            for a in ("pscpu", "hierarchical_copy", "xring")
        ]
        out += [
            ("SpecAllReduce", _spec(a, {})) for a in [*algs, "xring", "rechd"]
        ]
        if gpu:
            out.append(("SpecAllReduce", _spec("nccl", {})))
    else:
        specs = ["pscpu", "pscpu/pscpu#2", "xring", "rechd", "xring#2"]
        if topology.local_devices > 1:
            specs[2:2] = ["pscpu/xring", "pscpu/rechd"]
        if topology.device_type == "GPU":
            specs[:0] = ["nccl/pscpu", "nccl/xring", "nccl/rechd"]
        out = [
            ("MultiWorkerAllReduce", _spec(s, p))
            for p in packings
            for s in specs
        ]
        floats = any(d in ("float32", "float64") for _, d in gradients)
        for codec in compression.COMPRESSIONS if floats else ():
            out += [
                ("MultiWorkerAllReduce", _spec(s, p) | {"compression": codec})
                for p in packings
                for s in specs[:2]
            ]
        out += [("MultiWorkerAllReduce", _spec(s, {})) for s in specs]
    return [c for c in out if _changes_something(c, gradients)]


def _spec(alg: str, packing: dict[str, int]) -> dict[str, Any]:
    """kwargs of a spec class; 'alg#n' becomes the tuple (alg, n, -1)."""
    name, _, shards = alg.partition("#")
    spec: Any = (name, int(shards), -1) if shards else name
    return {"all_reduce_spec": spec, "num_packs": 0} | packing


def _from_json(config: Any) -> Config:
    """A configuration read from JSON: its spec's lists become tuples."""
    name, kwargs = config[0], dict(config[1])
    spec = kwargs.get("all_reduce_spec")
    if isinstance(spec, list):
        kwargs["all_reduce_spec"] = (
            [tuple(r) for r in spec]
            if spec and isinstance(spec[0], list)
            else tuple(spec)
        )
    return name, kwargs


def _changes_something(config: Config, gradients: GradientList) -> bool:
    """False for packing that leaves the gradients as they are (one pack of
    one tensor, aggregation with fewer than two small tensors), and for
    aggregation that packs exactly as one pack does (every gradient small
    and few enough for one group per dtype: num_packs=1 is tried)."""
    kwargs = config[1]
    if kwargs.get("num_packs") == 1:
        return len(gradients) > 1
    limit = kwargs.get("agg_small_grads_max_bytes", 0)
    if not limit:
        return True
    small = [g for g in gradients if _num_bytes(g) <= limit]
    per_dtype = collections.Counter(dtype for _, dtype in gradients)
    one_pack = len(small) == len(gradients) and max(
        per_dtype.values()
    ) <= kwargs.get("agg_small_grads_max_group", 0)
    return len(small) >= 2 and not one_pack


def _num_bytes(gradient: tuple[tuple[int, ...], str]) -> int:
    shape, dtype = gradient
    return math.prod(shape) * tf.as_dtype(dtype).size


def label(config: Config) -> str:
    """A short name for a configuration.

    >>> label(("SpecAllReduce", {"all_reduce_spec": "xring", "num_packs": 1}))
    'SpecAllReduce xring num_packs=1'
    """
    name, kwargs = config
    parts = [name]
    spec = kwargs.get("all_reduce_spec")
    if isinstance(spec, (tuple, list)) and len(spec) == 3 and spec[2] == -1:
        parts.append(f"{spec[0]}#{spec[1]}")
    elif spec is not None:
        parts.append(spec if isinstance(spec, str) else json.dumps(spec))
    if kwargs.get("num_packs"):
        parts.append(f"num_packs={kwargs['num_packs']}")
    if kwargs.get("agg_small_grads_max_bytes"):
        parts.append(
            f"agg_small={kwargs['agg_small_grads_max_bytes'] >> 10}KiB"
            f"x{kwargs.get('agg_small_grads_max_group', 10)}"
        )
    if kwargs.get("compression"):
        parts.append(f"compression={kwargs['compression']}")
    other = set(kwargs) - {
        "all_reduce_spec",
        "num_packs",
        "agg_small_grads_max_bytes",
        "agg_small_grads_max_group",
        "compression",
    }
    parts += [f"{k}={kwargs[k]!r}" for k in sorted(other)]
    return " ".join(parts)


def ordered(
    configs: Sequence[Config], topology: Topology, gradients: GradientList
) -> list[tuple[Config, float | None]]:
    """Fastest predicted first (cost model); configurations it cannot
    predict keep their order after them."""
    predictions: list[float | None] = []
    for config in configs:
        try:
            seconds: float | None = float(
                cost_model.predict(
                    config,
                    gradients,
                    devices_per_worker=topology.local_devices,
                    num_workers=topology.num_workers,
                )
            )
        except ValueError:
            seconds = None
        predictions.append(seconds)
    order = sorted(
        range(len(configs)),
        key=lambda i: (predictions[i] is None, predictions[i] or 0.0, i),
    )
    return [(configs[i], predictions[i]) for i in order]


_CLASSES = {
    "SpecAllReduce": _spec_ops.SpecAllReduce,
    "MultiWorkerAllReduce": _multi_worker_ops.MultiWorkerAllReduce,
    "ReductionToOneDevice": _ops.ReductionToOneDevice,
    "AllReduceCrossDeviceOps": _ops.AllReduceCrossDeviceOps,
    "HierarchicalCopyAllReduce": _ops.HierarchicalCopyAllReduce,
    "NcclAllReduce": _ops.NcclAllReduce,
}


def make_ops(config: Any, topology: Topology) -> tf.distribute.CrossDeviceOps:
    """The CrossDeviceOps a configuration names, for `topology`.

    MultiWorkerAllReduce gets the topology's workers; the collective classes
    its worker and device counts.

    Raises:
        ValueError: an unknown class or a bad argument (the class's error).
        TypeError: not a (class name, kwargs) pair, or bad kwargs.
    """
    classes = dict(_CLASSES)
    classes["CollectiveAllReduce"] = _collective_ops.CollectiveAllReduce
    classes["HierarchicalCollectiveAllReduce"] = (
        _hierarchical_collective_ops.HierarchicalCollectiveAllReduce
    )
    if (
        not isinstance(config, (tuple, list))
        or len(config) != 2
        or not isinstance(config[1], dict)
    ):
        raise TypeError(
            f"config: expected (class name, kwargs dict), got {config!r:.120}"
        )
    name, kwargs = _from_json(config)
    cls = classes.get(name)
    if cls is None:
        raise ValueError(
            f"config: unknown class {name!r}; expected one of "
            f"{', '.join(sorted(classes))}"
        )
    if isinstance(kwargs.get("options"), dict):
        kwargs["options"] = tf.distribute.experimental.CommunicationOptions(
            **kwargs["options"]
        )
    gpus = topology.local_devices if topology.device_type == "GPU" else 0
    if name == "MultiWorkerAllReduce":
        return cls(list(topology.worker_devices), gpus, **kwargs)
    if name == "CollectiveAllReduce":
        kwargs.setdefault("num_workers", topology.num_workers)
        kwargs.setdefault("num_gpus_per_worker", gpus)
    return cls(**kwargs)


# --- Cache -----------------------------------------------------------------


def default_cache_dir() -> pathlib.Path:
    """`$XDG_CACHE_HOME` (else ~/.cache) / tf_crossdevice / autotune."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache"
    )
    return pathlib.Path(base) / "tf_crossdevice" / "autotune"


def cache_file(
    topology: Topology, gradients: GradientList, cache_dir: Any = None
) -> pathlib.Path:
    """The cache file of a topology and gradient set.

    The name hashes the device type, the devices per worker, the number of
    workers, TensorFlow's and this package's versions, the gradients'
    shapes and dtypes in order (not the device names or addresses) and the
    candidate list (`candidates_digest`), so a choice made among other
    candidates is measured again.
    """
    key = {
        "candidates": candidates_digest(topology, gradients),
        "format": CACHE_FORMAT,
        "device_type": topology.device_type,
        "devices_per_worker": list(topology.devices_per_worker),
        "num_workers": topology.num_workers,
        "tensorflow": tf.__version__,
        "tf_crossdevice": requirements.__version__,
        "gradients": [[list(s), d] for s, d in gradients],
    }
    digest = hashlib.sha256(
        json.dumps(key, sort_keys=True).encode()
    ).hexdigest()
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(
            f"cache_dir: expected None or a folder path, got "
            f"{type(cache_dir).__name__} {cache_dir!r}"
        )
    folder = default_cache_dir() if cache_dir is None else cache_dir
    return pathlib.Path(folder) / f"{digest[:32]}.json"


def candidates_digest(topology: Topology, gradients: GradientList) -> str:
    """A hash of `candidates` for a topology and gradient set, in order:
    it changes whenever the candidate list does.

    >>> topology = Topology.of(["/job:localhost/replica:0/task:0/device:CPU:0"])
    >>> len(candidates_digest(topology, [((4,), "float32")]))
    16
    """
    configs = json.dumps(candidates(topology, gradients), sort_keys=True)
    return hashlib.sha256(configs.encode()).hexdigest()[:16]


def read_cache(path: pathlib.Path, topology: Topology) -> dict[str, Any] | None:
    """The cached entry, or None (missing; corrupt: with a warning)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        logging.warning("autotune: cannot read cache file %s (%s)", path, e)
        return None
    try:
        entry = json.loads(text)
        if entry.get("format") != CACHE_FORMAT:
            logging.warning(
                "autotune: ignoring cache file %s of format %r (this "
                "version reads %d); measuring again",
                path,
                entry.get("format"),
                CACHE_FORMAT,
            )
            return None
        config = _from_json(entry["config"])
        make_ops(config, topology)
        float(entry["budget_seconds"])
        bool(entry["complete"])
        measurements = [_measurement(m) for m in entry.get("measurements", [])]
    except Exception as e:  # noqa: BLE001 - any damage: ignore the file.
        logging.warning(
            "autotune: ignoring corrupt cache file %s (%s: %s); measuring "
            "again",
            path,
            type(e).__name__,
            _measure.first_line(str(e)),
        )
        return None
    entry["config"] = config
    entry["measurements"] = measurements
    return entry


def write_cache(path: pathlib.Path, entry: dict[str, Any]) -> None:
    """Writes `entry` as JSON atomically (a temporary file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp"
    )
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f, indent=1)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# --- Measuring -------------------------------------------------------------


def _graph_units(
    config: Config, gradients: GradientList, topology: Topology
) -> float:
    """A rough count of the ops a configuration traces, to scale build
    times measured on earlier candidates (only ratios matter)."""
    kwargs = config[1]
    n = len(topology.devices)
    num_tensors = len(gradients)
    packs = num_tensors
    if kwargs.get("num_packs"):
        packs = kwargs["num_packs"] * len({d for _, d in gradients})
    elif kwargs.get("agg_small_grads_max_bytes"):
        limit = kwargs["agg_small_grads_max_bytes"]
        group = kwargs.get("agg_small_grads_max_group", 10)
        small = sum(1 for g in gradients if _num_bytes(g) <= limit)
        packs = num_tensors - small + math.ceil(small / group)
    per_pack = 2.0
    spec = kwargs.get("all_reduce_spec", "")
    if isinstance(spec, (tuple, list)):
        alg, shards = str(spec[0]), int(spec[1]) if len(spec) > 1 else 1
    else:
        alg, _, count = str(spec).partition("#")
        shards = int(count) if count.isdigit() else 1
    for part in alg.split("/"):
        if part == "xring":
            per_pack += 2 * n * shards
        elif part == "rechd":
            per_pack += 2 * math.ceil(math.log2(max(n, 2))) + 2
        elif part in ("pscpu", "psgpu"):
            per_pack += 2 * shards
        elif part:
            per_pack += 4
    packing = num_tensors if packs != num_tensors else 0
    return n * (packs * per_pack + packing)


def _build_estimate(units: float, built: list[tuple[float, float]]) -> float:
    """Seconds to build `units`, scaled from earlier (units, seconds)."""
    scaled = [seconds * units / u for u, seconds in built if u > 0]
    return _SAFETY * statistics.median(scaled) if scaled else 0.0


def finalists(
    medians: Mapping[Key, float],
    within: float = _WITHIN,
    most: int = _FINALISTS,
) -> list[Key]:
    """The candidates to time again: fastest first, those whose median is
    within `within` (relative) of the best, at most `most`, and at least
    two where two or more were timed (the runner-up is always checked).

    >>> finalists({"ring": 1.3, "pscpu": 1.0, "psgpu": 1.1, "rechd": 1.12})
    ['pscpu', 'psgpu', 'rechd']
    >>> finalists({"ring": 3.0, "pscpu": 1.0}), finalists({"pscpu": 1.0})
    (['pscpu', 'ring'], ['pscpu'])
    """
    order = sorted(medians, key=lambda k: medians[k])
    if not order:
        return []
    limit = medians[order[0]] * (1 + within)
    close = [k for k in order if medians[k] <= limit]
    return order[: max(min(len(close), most), min(2, len(order)))]


def confirmation_rounds(
    seconds_per_round: float,
    seconds_left: float,
    least: int = _CONFIRM_ROUNDS[0],
    most: int = _CONFIRM_ROUNDS[1],
) -> int:
    """How many timing rounds fit in the budget left: at most `most`, 0
    where not even `least` fit (confirmation rounds by default; the first
    rounds use least=1, most=_ROUNDS).

    >>> confirmation_rounds(0.1, 2.0), confirmation_rounds(0.1, 0.55)
    (10, 5)
    >>> confirmation_rounds(0.1, 0.25), confirmation_rounds(0.1, -3.0)
    (0, 0)

    The first rounds with a 25% margin on 0.1 s per round, 0.5 s left:

    >>> confirmation_rounds(1.25 * 0.1, 0.5, 1, 5)
    4
    """
    if seconds_per_round <= 0:
        return most
    # 1e-9: 0.6 / 0.2 is 2.999..., three rounds fit.
    fit = math.floor(max(seconds_left, 0.0) / seconds_per_round + 1e-9)
    fit = min(most, fit)
    return fit if fit >= least else 0


def fastest(samples: Mapping[Key, Sequence[float]]) -> Key:
    """The entry with the smallest median of its samples (the first of
    equal ones).

    >>> fastest({"pscpu": [3.4, 2.7, 3.5, 3.3], "psgpu": [2.9, 2.8, 3.0]})
    'psgpu'
    """
    timed = [k for k, v in samples.items() if v]
    if not timed:
        raise ValueError("samples: expected an entry with samples, got none")
    return min(timed, key=lambda k: statistics.median(samples[k]))


def _confirm(
    samples: dict[Key, list[float]],
    timers: Mapping[Key, _measure.TimeFn],
    reps: Mapping[Key, int],
    seconds_left: float,
) -> tuple[list[Key], int, dict[Key, str]]:
    """Times the finalists of `samples` again in interleaved rounds, as
    many as fit in `seconds_left`, and adds the new samples to theirs.

    Returns:
        (the finalists, the rounds run (0: none fit), errors of finalists
        that raised; their samples are dropped from `samples`).
    """
    medians = {k: statistics.median(v) for k, v in samples.items() if v}
    chosen = finalists(medians)
    if len(chosen) < 2:
        return chosen, 0, {}
    # Rounds cost more than their calls (ordering, the timer itself) and
    # medians are noisy: plan with a margin so the search ends within the
    # budget (bert_base at 4 devices overran a 60 s budget by 7 ms).
    per_round = _SAFETY * sum(reps[k] * medians[k] for k in chosen)
    rounds = confirmation_rounds(per_round, seconds_left, *_CONFIRM_ROUNDS)
    if not rounds:
        return chosen, 0, {}
    names = {str(k): k for k in chosen}
    more, failed = _measure.interleaved_rounds(
        {n: timers[k] for n, k in names.items()},
        {n: reps[k] for n, k in names.items()},
        rounds,
        seed=1,
    )
    for name, values in more.items():
        samples[names[name]].extend(values)
    for name in failed:
        samples.pop(names[name])
    return chosen, rounds, {names[n]: e for n, e in failed.items()}


def autotune(
    gradients: Any,
    devices: Any,
    *,
    budget_seconds: float = 60,
    cache_dir: Any = None,
) -> tf.distribute.CrossDeviceOps:
    """Measures candidate all-reduce configurations and returns the fastest.

    Candidates are this package's algorithms (the registry's names through
    `SpecAllReduce`, shards, `ReductionToOneDevice`; across workers
    `MultiWorkerAllReduce` with flat and two-level specs) with each packing
    (one or four packs, small-tensor aggregation of up to 64 KiB in groups
    of 1024, none), and across workers the `compression` codecs where
    `MultiWorkerAllReduce` takes them. They are tried fastest-predicted
    first (`tf_crossdevice.cost_model.predict` when that module is
    installed, else the benchmark's findings: see `candidates`).

    Each candidate reduces random integer gradients of the given shapes on
    the real devices inside a `tf.function`; its result is checked against
    numpy (exactly; within the codec's rounding with compression) before it
    counts. Building and checking count against the budget: a candidate
    whose estimated build (scaled from the builds so far) and timing (the
    first rounds and 3 confirmation rounds, below) would not fit in what is
    left is skipped. Builds cannot be interrupted, so a
    slow one can overrun the estimate; at least one candidate is always
    built, even past the budget, until one verifies. The verified ones are
    then timed in interleaved rounds (every candidate once per round, in a
    new random order). The finalists (up to three within 15% of the best
    median, at least the best two) are timed again in up to 10 more
    interleaved rounds among themselves where the budget left allows at
    least 3 (else a log line says so), so that noise in the short first
    rounds does not decide between near-equal ones. The finalist with the
    smallest median over all its samples wins (without confirmation: the
    candidate with the smallest median).

    Progress is logged with absl logging at INFO, one line per candidate
    ("autotune [3/12] SpecAllReduce xring num_packs=1: 4.21 ms, 31 s of
    budget left") and one per confirmed finalist ("autotune: finalist
    SpecAllReduce psgpu num_packs=1: 2.83 ms, median of 5 + 10
    confirmation rounds"). The returned object's `autotune_result`
    attribute (an `AutotuneResult`) holds every measurement and the cache
    file.

    The choice is cached in a JSON file in `cache_dir` (None:
    `$XDG_CACHE_HOME`, else `~/.cache`, + `/tf_crossdevice/autotune`), named
    by a hash of the topology (device type, devices per worker, workers,
    TensorFlow and package versions), the gradients' shapes and dtypes and
    the list of candidates (a choice among other candidates is not reused).
    A later call with the same ones returns the cached choice without
    measuring, unless that was measured with a smaller budget and left
    candidates out. Delete the file to measure again. Unreadable files are
    ignored with a warning; writes are atomic.

    Across workers only in-graph reductions can be timed from one client:
    between-graph collectives (`CollectiveAllReduce`,
    `HierarchicalCollectiveAllReduce` in
    `tf_crossdevice.MultiWorkerMirroredStrategy`) run in every worker's own
    program and are not measured here; the cost model ranks them
    (`select_cross_device_ops`).

    Args:
        gradients: what will be reduced: a Keras model (its trainable
            weights), or a list of (shape, dtype) pairs, tensors or
            variables.
        devices: the replicas' devices: device strings of this process, or
            of the workers of a cluster this process is connected to
            ('/job:worker/task:1/device:CPU:0'), or a cluster spec (dict or
            `tf.train.ClusterSpec`): then this process connects to the
            cluster (`tf.config.experimental_connect_to_cluster`, which
            changes process-wide state) and uses every worker's GPUs, else
            CPUs (the same count on each).
        budget_seconds: time for building, checking and timing, > 0.
        cache_dir: folder of the cache files (created if missing).

    Returns:
        A new CrossDeviceOps of the fastest configuration, with an
        `autotune_result` attribute.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
        RuntimeError: no candidate reduced correctly (the errors listed).

    >>> import tempfile
    >>> gradients = [((1000,), "float32"), ((10, 10), "float32")]
    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     ops = tf_crossdevice.autotune(
    ...         gradients, devices, budget_seconds=3, cache_dir=cache)
    ...     again = tf_crossdevice.autotune(
    ...         gradients, devices, budget_seconds=3, cache_dir=cache)
    >>> ops.autotune_result.measurements[0].verified
    True
    >>> again.autotune_result.from_cache, type(again) is type(ops)
    (True, True)
    """
    start = time.monotonic()
    _checks.positive_number(budget_seconds, "budget_seconds")
    grads = normalize_gradients(gradients)
    topology = topology_of(devices)
    path = cache_file(topology, grads, cache_dir)
    entry = read_cache(path, topology)
    if entry is not None and (
        entry["complete"] or entry["budget_seconds"] >= budget_seconds
    ):
        logging.info("autotune: %s (cached in %s)", entry["label"], path)
        return _with_result(
            make_ops(entry["config"], topology),
            AutotuneResult(
                config=entry["config"],
                label=entry["label"],
                measurements=tuple(entry["measurements"]),
                budget_seconds=entry["budget_seconds"],
                elapsed_seconds=time.monotonic() - start,
                complete=entry["complete"],
                from_cache=True,
                cache_file=str(path),
            ),
        )
    result = _search(grads, topology, budget_seconds, start, path)
    write_cache(
        path,
        {
            "format": CACHE_FORMAT,
            "config": list(result.config),
            "label": result.label,
            "budget_seconds": budget_seconds,
            "complete": result.complete,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "devices": list(topology.devices),
            "measurements": [
                dataclasses.asdict(m) for m in result.measurements
            ],
        },
    )
    return _with_result(make_ops(result.config, topology), result)


_MEASUREMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Measurement))


def _measurement(data: dict[str, Any]) -> Measurement:
    """A cached record; fields added since it was written take their
    defaults, fields unknown here are dropped."""
    known = {k: v for k, v in data.items() if k in _MEASUREMENT_FIELDS}
    known["config"] = _from_json(known["config"])
    return Measurement(**known)


def _with_result(
    ops: tf.distribute.CrossDeviceOps, result: AutotuneResult
) -> tf.distribute.CrossDeviceOps:
    ops.autotune_result = result  # type: ignore[attr-defined]
    return ops


def _search(
    gradients: GradientList,
    topology: Topology,
    budget: float,
    start: float,
    path: pathlib.Path,
) -> AutotuneResult:
    """Builds, checks and times the candidates within the budget."""
    plan = ordered(candidates(topology, gradients), topology, gradients)
    inputs = _measure.Inputs(gradients, topology.devices)
    total = len(plan)
    records: list[Measurement] = []
    built: list[tuple[float, float]] = []  # (graph units, build seconds)
    timers: dict[int, _measure.TimeFn] = {}
    reps: dict[int, int] = {}
    per_round = 0.0  # seconds one timing round will take
    for i, (config, predicted) in enumerate(plan):
        name = label(config)
        left = budget - (time.monotonic() - start)
        units = _graph_units(config, gradients, topology)
        estimate = _build_estimate(units, built)
        guess = max(_TARGET_SECONDS, per_round / max(len(timers), 1))
        # The first rounds with this one, and the fewest confirmation
        # rounds of the finalists (with the margin the rounds are planned
        # with below).
        timing = _SAFETY * (
            _ROUNDS * (per_round + guess)
            + _CONFIRM_ROUNDS[0] * _FINALISTS * guess
        )
        if timers and estimate + timing > left:
            why = (
                f"skipped: estimated {estimate:.1f} s to build and "
                f"{timing:.1f} s to time, {max(left, 0):.0f} s of budget left"
            )
            logging.info("autotune [%d/%d] %s: %s", i + 1, total, name, why)
            records.append(Measurement(name, config, predicted, error=why))
            continue
        try:
            ops = make_ops(config, topology)
        except (TypeError, ValueError) as e:
            records.append(Measurement(name, config, predicted, False, f"{e}"))
            continue
        check = inputs.check_for(
            config[1].get("compression"), topology.num_workers
        )
        body = _measure.all_reduce_body(ops, inputs)

        def build(body: Any = body, check: Any = check) -> Any:
            step = _measure.Step(body)
            return step.timed, lambda: step.verify(check)

        prepared, call = _measure.prepare(build, warmup=1)
        left = budget - (time.monotonic() - start)
        if call is None:
            logging.info(
                "autotune [%d/%d] %s: failed (%s), %.0f s of budget left",
                i + 1,
                total,
                name,
                prepared.error,
                max(left, 0),
            )
        else:
            built.append((units, prepared.build_seconds))
            timers[i] = _measure.timer(call)
            reps[i] = _measure.reps_for(
                prepared.seconds_per_call, _TARGET_SECONDS, _MAX_REPS
            )
            per_round += reps[i] * prepared.seconds_per_call
            logging.info(
                "autotune [%d/%d] %s: %.2f ms, %.0f s of budget left",
                i + 1,
                total,
                name,
                prepared.seconds_per_call * 1e3,
                max(left, 0),
            )
        records.append(
            Measurement(
                name,
                config,
                predicted,
                prepared.verified,
                prepared.error,
                prepared.build_seconds,
            )
        )
    if not timers:
        failures = "; ".join(f"{m.label}: {m.error}" for m in records)
        raise RuntimeError(f"autotune: no candidate verified: {failures}")
    left = budget - (time.monotonic() - start)
    # A round costs more than its calls (ordering, the timer itself): plan
    # with the margin (resnet50 across 3 workers overran 60 s by 0.4 s).
    rounds = confirmation_rounds(_SAFETY * per_round, left, 1, _ROUNDS) or 1
    timed, errors = _measure.interleaved_rounds(
        {str(i): t for i, t in timers.items()},
        {str(i): r for i, r in reps.items()},
        rounds,
    )
    samples = {int(k): v for k, v in timed.items() if v}
    left = budget - (time.monotonic() - start)
    final, confirmed, failed = _confirm(samples, timers, reps, left)
    errors |= {str(i): e for i, e in failed.items()}
    for k, error in errors.items():
        records[int(k)] = dataclasses.replace(
            records[int(k)], verified=True, error=error
        )
    if len(final) >= 2 and not confirmed:
        logging.info(
            "autotune: no confirmation of the %d finalists (%.1f s of "
            "budget left, too little for %d rounds)",
            len(final),
            max(left, 0),
            _CONFIRM_ROUNDS[0],
        )
    if not samples:
        raise RuntimeError(f"autotune: every candidate failed: {errors}")
    records = [
        dataclasses.replace(
            m,
            median_seconds=(
                statistics.median(samples[i]) if i in samples else None
            ),
            confirmation_rounds=(
                confirmed if i in final and i in samples else 0
            ),
        )
        for i, m in enumerate(records)
    ]
    for i in final if confirmed else ():
        logging.info(
            "autotune: finalist %s: %s",
            records[i].label,
            f"{statistics.median(samples[i]) * 1e3:.2f} ms, median of "
            f"{rounds} + {confirmed} confirmation rounds"
            if i in samples
            else f"failed ({records[i].error})",
        )
    # Confirmed finalists were timed together, later: compare only them.
    contenders = [i for i in final if i in samples] if confirmed else []
    best = fastest(
        {i: samples[i] for i in contenders} if contenders else samples
    )
    chosen = records[best]
    elapsed = time.monotonic() - start
    measured = sum(1 for m in records if m.median_seconds is not None)
    logging.info(
        "autotune: chose %s (%.2f ms, median of %d rounds; %d of %d "
        "candidates timed) in %.0f s of a %g s budget",
        chosen.label,
        statistics.median(samples[best]) * 1e3,
        len(samples[best]),
        measured,
        total,
        elapsed,
        budget,
    )
    return AutotuneResult(
        config=chosen.config,
        label=chosen.label,
        measurements=tuple(records),
        budget_seconds=budget,
        elapsed_seconds=elapsed,
        complete=all(m.verified is not None for m in records),
        from_cache=False,
        cache_file=str(path),
    )
