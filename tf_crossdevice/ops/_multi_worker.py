"""MultiWorkerAllReduce: TF 1's constructor on top of SpecAllReduce."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from absl import logging

from tf_crossdevice._core import checks, values
from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice.compression import PowerSGD, WirePolicy
from tf_crossdevice.ops import _spec as _spec_ops
from tf_crossdevice.ops._in_process import InProcessReducer


def worker_name(device: str, argument: str) -> str:
    """'/job:J/replica:R/task:T' for a worker or device string."""
    if not isinstance(device, str):
        raise TypeError(
            f"{argument}: expected a worker device string such as "
            f"'/job:worker/task:0', got {type(device).__name__} {device!r}"
        )
    if not device:
        raise ValueError(
            f"{argument}: the device string is empty; expected a worker such "
            "as '/job:worker/task:0'"
        )
    job, replica, task = devices_lib.parse_device(device, argument).worker
    return f"/job:{job}/replica:{replica}/task:{task}"


class MultiWorkerAllReduce(_spec_ops.SpecAllReduce):
    """All-reduce across worker processes with an all_reduce_spec.

    TF 1's `MultiWorkerAllReduce`, same arguments in the same order. The
    replicas are `num_gpus_per_worker` GPUs of each worker, or with 0 the
    workers' CPUs (with logical CPU devices a worker holds several replicas).
    The ops are placed on the workers' devices and TensorFlow's distributed
    runtime moves the tensors; run them from a client connected to the
    cluster (see `tf_crossdevice.multi_worker.WorkerReplicas`). MEAN divides
    by the number of replicas across all workers.

    Args:
        worker_devices: one device string per worker, e.g.
            `["/job:worker/task:0", "/job:worker/task:1"]`.
        num_gpus_per_worker: GPUs each worker contributes; 0 uses CPUs. Only
            checked against the values' devices (see below).
        all_reduce_spec: see `SpecAllReduce`. The default reduces inside each
            worker on its CPU, then across workers in 2 shards.
        num_packs: see `SpecAllReduce` (0: no concat-and-split packing).
        agg_small_grads_max_bytes: see `SpecAllReduce`.
        agg_small_grads_max_group: see `SpecAllReduce`.
        compression: keyword-only; None, 'bf16' or 'fp16': float32 and
            float64 values cross workers as 16 bits (see `SpecAllReduce`;
            with the default spec, the sums of the workers travel
            compressed to the CPU that gathers each shard, and back). Or a
            `tf_crossdevice.compression.PowerSGD`: with more than one
            worker, `batch_reduce` (what optimizers' gradients go through)
            all-reduces its low-rank factors instead of the float32 and
            float64 matrices it compresses, keeping each replica's error on
            the replica's device; everything else, and `reduce`,
            `broadcast` and `gather` always, is exact.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: no workers, a worker listed twice, a negative
            `num_gpus_per_worker`, or a bad spec or packing argument. At
            reduce time: a value on a device of an unlisted worker, or a
            value component with no device (built outside any `tf.device`
            scope inside a tf.function or graph).

    The values' devices decide where the reduction runs. Values on CPUs with
    `num_gpus_per_worker > 0` (legacy GPU jobs run on a laptop, as TF 1
    allowed), or on GPUs with 0, log one warning naming the mismatch.

    The same object also reduces values of one local "worker":

    >>> ops = tf_crossdevice.MultiWorkerAllReduce(
    ...     ["/job:localhost/replica:0/task:0"], 0, ("pscpu/pscpu", 2, -1))
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])])
    >>> [v.numpy().tolist() for v in ops.reduce("mean", value).values]
    [[2.0, 3.0], [2.0, 3.0]]
    """

    def __init__(
        self,
        worker_devices: Sequence[str],
        num_gpus_per_worker: int,
        all_reduce_spec: Any = ("pscpu/pscpu", 2, -1),
        num_packs: int = 0,
        agg_small_grads_max_bytes: int = 0,
        agg_small_grads_max_group: int = 10,
        *,
        compression: str | PowerSGD | None = None,
    ):
        wire = WirePolicy.from_compression(compression)
        super().__init__(
            all_reduce_spec,
            num_packs=num_packs,
            agg_small_grads_max_bytes=agg_small_grads_max_bytes,
            agg_small_grads_max_group=agg_small_grads_max_group,
            compression=wire.codec,
        )
        checks.string_list(
            worker_devices, "worker_devices", "worker device string"
        )
        names = [
            worker_name(d, f"worker_devices[{i}]")
            for i, d in enumerate(worker_devices)
        ]
        if len(set(names)) != len(names):
            raise ValueError(
                f"worker_devices: a worker is listed twice in {worker_devices}"
            )
        checks.non_negative_int(num_gpus_per_worker, "num_gpus_per_worker")
        self._worker_names = tuple(names)
        self._num_gpus_per_worker = num_gpus_per_worker
        self._warned_device_type = False
        spec_reducer = self.reducer
        assert isinstance(spec_reducer, InProcessReducer)
        self._reducer = dataclasses.replace(
            spec_reducer,
            wire=wire,
            check=self._check_item,
            crosses_workers=len(names) > 1,
        )

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """The workers, as '/job:J/replica:R/task:T'."""
        return self._worker_names

    def _check_item(self, item: values.Item) -> None:
        # Unplaced, a component and its share of the reduction would run
        # wherever TensorFlow puts them: the client's CPU, which then
        # receives every worker's whole input.
        values.check_placed(
            item,
            "MultiWorkerAllReduce reduces each component on its own worker",
        )
        self._check_workers(item.argument, item.devices)
        # A destination '' is left for TensorFlow to place.
        self._check_workers("destinations", [d for d in item.destinations if d])
        self._check_device_type(item.devices)

    def _check_workers(self, argument: str, devices: Sequence[str]) -> None:
        for device in devices:
            if worker_name(device, argument) not in self._worker_names:
                raise ValueError(
                    f"{argument}: device {device!r} is not on a worker "
                    f"in worker_devices {list(self._worker_names)}"
                )

    def _check_device_type(self, value_devices: Sequence[str]) -> None:
        """Warns once when the values' devices are not what was declared.

        Only the values count: a destination on the worker's CPU is TF 1's
        usual home for variables, whatever the replicas are.
        """
        if self._warned_device_type:
            return
        want_type = "GPU" if self._num_gpus_per_worker else "CPU"
        for device in value_devices:
            kind = (
                devices_lib.parse_device(device).device_type if device else None
            )
            if kind is not None and kind != want_type:
                # TF 1 reduced wherever the values were, and legacy jobs and
                # TensorFlow's own tests name GPUs but run on CPUs.
                logging.warning(
                    "MultiWorkerAllReduce: num_gpus_per_worker=%d means the "
                    "replicas are %ss, but the value on %r is on a %s; "
                    "reducing on the values' devices.",
                    self._num_gpus_per_worker,
                    want_type,
                    device,
                    kind,
                )
                self._warned_device_type = True
                return
