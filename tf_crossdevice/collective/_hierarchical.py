"""HierarchicalCollectiveAllReduce: reduce locally, one collective per worker.

Three steps per pack of values:
1. inside each worker, one of our single-worker classes sums the pack of
   every local device onto the worker's first device (`reduce` to that one
   destination);
2. the first devices of all workers all-reduce the local sums with one
   collective (a group of one member per worker);
3. the first device's result is copied to the worker's other devices.

With k local devices per worker, each worker hands one pack to the
cross-worker collective where TensorFlow's collective all-reduce has k
members per worker in a ring of k x workers: k times fewer bytes enter the
collectives that cross worker boundaries, and the ring between workers has
workers members instead of k x workers (fewer, larger messages). IndexedSlices
are concatenated locally and all-gathered between the first devices.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tf_crossdevice._core import tf_internal, values
from tf_crossdevice._core.reducer import Batch, Devices
from tf_crossdevice.collective._entering import pack_label, unit
from tf_crossdevice.collective._group import Options
from tf_crossdevice.collective._launch_order import launch_units
from tf_crossdevice.collective._reducer import CollectiveReducer
from tf_crossdevice.collective._sparse import all_reduce_sparse
from tf_crossdevice.compression import PowerSGD, WirePolicy
from tf_crossdevice.ops import CrossDeviceOpsAdapter, default_cross_device_ops
from tf_crossdevice.packing import flatten_pack, unflatten_pack


class HierarchicalCollectiveAllReduce(CrossDeviceOpsAdapter):
    """Local reduce, one collective per worker, local broadcast.

    Pass it to `tf_crossdevice.MultiWorkerMirroredStrategy` on every worker;
    the strategy tells it the workers and the local devices:

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.HierarchicalCollectiveAllReduce(),
            local_devices=["/cpu:0", "/cpu:1"])

    Within one process (one worker) it is the local reduction plus a
    collective of one:

    >>> ops = tf_crossdevice.HierarchicalCollectiveAllReduce(
    ...     tf_crossdevice.ReductionToOneDevice())
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])])
    >>> [v.numpy().tolist() for v in ops.reduce("sum", value).values]
    [[4.0, 6.0], [4.0, 6.0]]

    Args:
        local_cross_device_ops: sums each pack inside a worker: any
            single-worker CrossDeviceOps (its `reduce` to the first local
            device). None: the one `select_cross_device_ops` picks for the
            local devices.
        options: default `tf.distribute.experimental.CommunicationOptions`
            (or `compat.CollectiveHints`). `bytes_per_pack` > 0 packs values
            into collectives of about that many bytes; 0 (TensorFlow's
            default) packs by `tf_crossdevice.packing.
            DEFAULT_BYTES_PER_PACK` (2 MiB), which measured fastest between
            hosts, where one pack of everything could not start before the
            last gradient exists.
            `timeout_seconds` and `implementation` as for
            `CollectiveAllReduce`; a call's own `options` override these.
        compression: None (default), "bf16" or "fp16": the collective
            between workers carries float32 and float64 packs as 16 bits
            and sums them in their own dtype, as `CollectiveAllReduce`'s
            `compression` does, with one member per worker (so it applies
            up to 3 workers; more reduce uncompressed, logged once). The
            reduce inside a worker and the copies to its other devices are
            not compressed. Or a `tf_crossdevice.compression.PowerSGD`
            compressor, for batch reductions, as in `CollectiveAllReduce`.

    >>> ops = tf_crossdevice.HierarchicalCollectiveAllReduce(
    ...     tf_crossdevice.ReductionToOneDevice(), compression="fp16")
    >>> ops.compression
    'fp16'
    """

    def __init__(
        self,
        local_cross_device_ops: Any = None,
        *,
        options: Any = None,
        compression: str | PowerSGD | None = None,
    ) -> None:
        wire = WirePolicy.from_compression(compression)
        options = values.check_options(options)
        if local_cross_device_ops is not None and not isinstance(
            local_cross_device_ops, tf.distribute.CrossDeviceOps
        ):
            raise TypeError(
                "local_cross_device_ops: expected None or a "
                "tf.distribute.CrossDeviceOps, got "
                f"{type(local_cross_device_ops).__name__} "
                f"{local_cross_device_ops!r}"
            )
        if isinstance(local_cross_device_ops, CrossDeviceOpsAdapter) and (
            isinstance(local_cross_device_ops.reducer, CollectiveReducer)
        ):
            raise ValueError(
                "local_cross_device_ops: expected a single-worker "
                "CrossDeviceOps (e.g. tf_crossdevice.ReductionToOneDevice), "
                f"got the collective {type(local_cross_device_ops).__name__}"
            )
        super().__init__(
            CollectiveReducer(
                type(self).__name__,
                HierarchicalStep(local_cross_device_ops),
                num_workers=1,
                options=options,
                collective_keys=None,
                wire=wire,
            )
        )


class HierarchicalStep:
    """A local reduction, one collective member per worker, a local copy.

    Args:
        local_ops: sums each pack inside a worker; None: the class that
            suits the local devices, chosen at the first reduction.
    """

    def __init__(self, local_ops: Any) -> None:
        self.local_ops = local_ops

    def sum(
        self,
        reducer: CollectiveReducer,
        batch: Batch,
        devices: Devices,
        options: Options,
    ) -> Batch:
        first = devices[0]
        workers = reducer.group((first,), reducer.num_workers)
        results: Batch = [[None] * len(devices) for _ in batch]
        # Last values first (see `launch_order`): the first collective
        # waits for the last layers' gradients only.
        units = launch_units(
            [value[0] for value in batch], options.bytes_per_pack, None
        )
        for position, keys in enumerate(units):
            sparse = values.is_sparse(batch[keys[0]][0])
            label = pack_label(position, len(units), len(keys), sparse)
            if sparse:
                value = batch[keys[0]]
                local = values.sum_sparse(value, first)
                with tf.device(first), unit(label):
                    total = all_reduce_sparse(workers, 0, local, options)
                results[keys[0]] = [
                    values.copy_value(total, d) for d in devices
                ]
                continue
            flat = []
            for d, device in enumerate(devices):
                with tf.device(device):
                    flat.append(flatten_pack([batch[k][d] for k in keys]))
            local = self._local_sum(flat, devices)
            with tf.device(first), unit(label):
                total = workers.all_reduce(
                    0, local, options, reducer.wire.codec
                )
            for d, device in enumerate(devices):
                with tf.device(device):
                    pieces = unflatten_pack(
                        tf.identity(total), [batch[k][d] for k in keys]
                    )
                for k, piece in zip(keys, pieces, strict=True):
                    results[k][d] = piece
        return results

    def _local_sum(self, flat: list[tf.Tensor], devices: Devices) -> tf.Tensor:
        if len(devices) == 1:
            return flat[0]
        if self.local_ops is None:
            self.local_ops = default_cross_device_ops(list(devices))
        summed = self.local_ops.reduce(
            tf.distribute.ReduceOp.SUM,
            tf_internal.PerReplica(tuple(flat)),
            destinations=devices[0],
        )
        return values.per_destination(summed)[0]

    def replica_all_reduce(
        self,
        reducer: CollectiveReducer,
        reduce_op: Any,
        value: Any,
        replica_id: int,
        options: Any,
    ) -> Any:
        raise NotImplementedError(
            f"{reducer.name} reduces in cross-replica context (merge_call) only"
        )
