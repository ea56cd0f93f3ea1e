"""Where autotune's replicas are, and what they reduce.

`Topology` is the replicas' layout (device type, workers, devices per
worker): what a search and its cache are keyed on. `topology_of` reads it
from device strings of this process or a connected cluster, or from a
cluster spec (connecting to it); `normalize_gradients` turns what the user
passes as gradients (a model, tensors, variables, `(shape, dtype)` pairs)
into `GradientList`, the `(shape, dtype name)` pairs the rest works on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, TypeAlias

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import checks as _checks
from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core import tf_internal
from tf_crossdevice._core import values as values_lib
from tf_crossdevice.cluster import WorkerReplicas

GradientList: TypeAlias = list[tuple[tuple[int, ...], str]]


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


def num_bytes(gradient: tuple[tuple[int, ...], str]) -> int:
    """The size of one gradient in bytes.

    >>> num_bytes(((10, 10), "float32"))
    400
    """
    shape, dtype = gradient
    return math.prod(shape) * tf.as_dtype(dtype).size


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
        values_lib.canonical_device(d, f"{argument}[{i}]")
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
    replicas = WorkerReplicas(cluster, 1, job_name=job)
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
