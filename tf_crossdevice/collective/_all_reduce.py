"""CollectiveAllReduce: every replica of every worker in one collective.

TF 1's `tf.contrib.distribute` CollectiveAllReduce on TensorFlow 2's
collective ops. Each local device joins one group of (local devices x
workers) members; dense values are packed, all-reduced and split again;
IndexedSlices are all-gathered (values and indices, padded where the
workers' row counts differ). Replica-context all-reduce launches each
replica's collectives from the replica itself, without a merge_call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal, values
from tf_crossdevice._core.reducer import Batch, Devices
from tf_crossdevice._core.values import Value
from tf_crossdevice.collective._entering import pack_label, unit
from tf_crossdevice.collective._group import Group, Options
from tf_crossdevice.collective._launch_order import launch_units
from tf_crossdevice.collective._reducer import CollectiveReducer
from tf_crossdevice.collective._sparse import all_reduce_sparse
from tf_crossdevice.compression import PowerSGD, WirePolicy
from tf_crossdevice.ops import CrossDeviceOpsAdapter
from tf_crossdevice.packing import flatten_pack, unflatten_pack


class CollectiveAllReduce(CrossDeviceOpsAdapter):
    """All-reduce across worker processes with TensorFlow's collective ops.

    Pass it to `tf_crossdevice.MultiWorkerMirroredStrategy` on every worker:

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(
                options=tf.distribute.experimental.CommunicationOptions(
                    timeout_seconds=120)))

    The strategy tells it the workers and the local devices. Under
    `tf.distribute.MirroredStrategy` it reduces between the local devices
    only, and so refuses to be used there when `num_workers` > 1 or
    collectives were enabled for several workers. Within one process:

    >>> ops = tf_crossdevice.CollectiveAllReduce()
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])])
    >>> ops.reduce("mean", value, "/cpu:0").numpy()
    array([2., 3.], dtype=float32)

    Args:
        num_workers: worker processes, when no strategy says (TF 1's
            argument; the strategy counts them from the cluster).
        num_gpus_per_worker: the local devices the strategy uses when given
            no `local_devices`: GPU:0 .. GPU:n-1, or the CPU for 0.
        all_reduce_merge_scope: None (default), or TF 1's grouping: with
            `bytes_per_pack` 0, every this many consecutive values of one
            dtype share one collective (1: one per value). TF 1 defaulted
            to 32; None packs by `tf_crossdevice.packing.
            DEFAULT_BYTES_PER_PACK` (2 MiB) instead, which measured faster
            between hosts (docs/guides/choosing-an-algorithm.md).
        collective_keys: TensorFlow's `CollectiveKeys`; objects given the
            same one never reuse each other's keys. Default: one shared by
            every tf_crossdevice collective object in the process.
        options: default `tf.distribute.experimental.CommunicationOptions`
            (or `compat.CollectiveHints`): `bytes_per_pack` > 0 packs values
            into collectives of about that many bytes (each at least that
            large, the last excepted; 0, TensorFlow's default, leaves the
            packing to `all_reduce_merge_scope`), `timeout_seconds` makes
            a collective that waits longer raise
            `tf.errors.DeadlineExceededError`,
            `implementation` AUTO / RING / NCCL (NCCL on GPUs only; RING
            elsewhere). A call's own `options` override these.
        compression: None (default), "bf16" or "fp16": float32 and
            float64 values travel between the group's members as 16 bits
            and are summed in their own dtype (never in 16 bits): one
            all-gather of every member's encoded pack, then each member
            decodes and sums them (`tf_crossdevice.compression._codec`
            bounds the rounding; fp16 scales each message by a power of two,
            so nothing overflows, and inf and nan stay). Ints, float16 and
            bfloat16 are never compressed. A group of more than 3 members
            (local devices x workers) reduces uncompressed, logged once:
            gathering its 16-bit packs would move more bytes than the fp32
            ring ((p-1)/2 vs 2(p-1)/p of the pack per member); so does one
            worker alone (nothing crosses a worker boundary). IndexedSlices
            and `gather` travel uncompressed. Or a
            `tf_crossdevice.compression.PowerSGD` compressor: the sums of
            batch reductions and replica-context all-reduces (the path of
            optimizers' gradients) become its rank-r approximations with
            error feedback, on every worker alike; `reduce`
            (`strategy.reduce`, sync-on-read variables, mirrored variable
            writes), `broadcast` and `gather` stay exact, and so does
            everything with one worker. Replica-context all-reduces then go
            through a merge_call, so that the compressor sees every local
            replica's gradients at once. See docs/guides/powersgd.md.

    One worker reduces exactly even with compression (nothing crosses):

    >>> ops = tf_crossdevice.CollectiveAllReduce(compression="bf16")
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 1.0 + 2**-10]), tf.constant([1.0, 2.0])])
    >>> ops.reduce("sum", value, "/cpu:0").numpy().tolist()
    [2.0, 3.0009765625]
    >>> tf_crossdevice.CollectiveAllReduce(compression="int8")
    Traceback (most recent call last):
    ...
    ValueError: compression: unknown value 'int8'; expected one of None, \
'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD
    """

    def __init__(
        self,
        num_workers: int = 1,
        num_gpus_per_worker: int = 0,
        all_reduce_merge_scope: int | None = None,
        collective_keys: Any = None,
        *,
        options: Any = None,
        compression: str | PowerSGD | None = None,
    ) -> None:
        # TF 1's order of checks: the workers, the wire, the options and
        # the keys, then this class's own arguments.
        num_workers = checks.positive_int(num_workers, "num_workers")
        wire = WirePolicy.from_compression(compression)
        options = values.check_options(options)
        collective_keys = check_collective_keys(collective_keys)
        self.num_gpus_per_worker = checks.non_negative_int(
            num_gpus_per_worker, "num_gpus_per_worker"
        )
        if all_reduce_merge_scope is not None:
            all_reduce_merge_scope = checks.positive_int(
                all_reduce_merge_scope, "all_reduce_merge_scope"
            )
        step = FlatStep(all_reduce_merge_scope)
        super().__init__(
            CollectiveReducer(
                type(self).__name__,
                step,
                num_workers=num_workers,
                options=options,
                collective_keys=collective_keys,
                wire=wire,
            )
        )


def check_collective_keys(collective_keys: Any) -> Any:
    """`collective_keys`: None or TensorFlow's CollectiveKeys."""
    if collective_keys is not None and not tf_internal.is_collective_keys(
        collective_keys
    ):
        raise TypeError(
            "collective_keys: expected None or TensorFlow's "
            "CollectiveKeys (tensorflow.python.distribute."
            "cross_device_utils.CollectiveKeys), got "
            f"{type(collective_keys).__name__} {collective_keys!r}"
        )
    return collective_keys


class FlatStep:
    """One collective group of every local device of every worker.

    Dense values are packed (`plan_packs`: by `bytes_per_pack`, or with 0
    every `merge_scope` consecutive values of one dtype, or with 0 and no
    `merge_scope` by the default pack size), all-reduced and split again;
    IndexedSlices are all-gathered.
    """

    def __init__(self, merge_scope: int | None) -> None:
        self.merge_scope = merge_scope

    def sum(
        self,
        reducer: CollectiveReducer,
        batch: Batch,
        devices: Devices,
        options: Options,
    ) -> Batch:
        group = _all_members(reducer, devices)
        per_device = [
            self.sum_on_member(
                reducer, group, d, [v[d] for v in batch], options
            )
            for d in range(len(devices))
        ]
        return [list(sums) for sums in zip(*per_device, strict=True)]

    def sum_on_member(
        self,
        reducer: CollectiveReducer,
        group: Group,
        index: int,
        tensors: list[Value],
        options: Options,
    ) -> list[Value]:
        """Member `index`'s share: its values summed over the group.

        Every member issues the same collectives in the same order: packs
        and IndexedSlices in `launch_order`, last values first.
        """
        out: list[Any] = [None] * len(tensors)
        units = launch_units(tensors, options.bytes_per_pack, self.merge_scope)
        for position, keys in enumerate(units):
            sparse = values.is_sparse(tensors[keys[0]])
            label = pack_label(position, len(units), len(keys), sparse)
            if sparse:
                with unit(label):
                    out[keys[0]] = all_reduce_sparse(
                        group, index, tensors[keys[0]], options
                    )
                continue
            with unit(label):
                sums = _all_reduce_pack(
                    group,
                    index,
                    [tensors[k] for k in keys],
                    options,
                    reducer.wire.codec,
                )
            for k, total in zip(keys, sums, strict=True):
                out[k] = total
        return out

    def replica_all_reduce(
        self,
        reducer: CollectiveReducer,
        reduce_op: Any,
        value: Any,
        replica_id: int,
        options: Any,
    ) -> Any:
        """One replica's share of a replica-context all-reduce, launched
        from the replica itself, without a merge_call."""
        reduce_op = values.check_reduce_op(reduce_op)
        if reducer.wire.powersgd is not None and reducer.crosses_workers:
            return _merged_all_reduce(reduce_op, value, options)
        options = reducer.options(options)
        if reducer.local_devices is None:
            raise ValueError(
                "CollectiveAllReduce: replica-context all-reduce needs the "
                "local devices; use it through "
                "tf_crossdevice.MultiWorkerMirroredStrategy"
            )
        group = _all_members(reducer, reducer.local_devices)
        flat = [
            v if values.is_sparse(v) else tf.convert_to_tensor(v)
            for v in tf.nest.flatten(value)
        ]
        out = self.sum_on_member(reducer, group, replica_id, flat, options)
        if reduce_op == values.ReduceOp.MEAN:
            with tf.device(reducer.local_devices[replica_id]):
                out = [values.divide(v, group.size) for v in out]
        return tf.nest.pack_sequence_as(value, out)


def _all_members(reducer: CollectiveReducer, devices: Sequence[str]) -> Group:
    return reducer.group(devices, len(devices) * reducer.num_workers)


def _merged_all_reduce(reduce_op: Any, value: Any, options: Any) -> Any:
    """A replica-context all-reduce as one batch reduction of every local
    replica's values (TensorFlow's generic path: merge_call, then
    batch_reduce_to), where a PowerSGD compressor needs them all."""

    def merge_fn(strategy: Any, flat: list[Any]) -> Any:
        return strategy.extended.batch_reduce_to(
            reduce_op, [(v, v) for v in flat], options
        )

    reduced = tf.distribute.get_replica_context().merge_call(
        merge_fn, args=(tf.nest.flatten(value),)
    )
    return tf.nest.pack_sequence_as(value, reduced)


def _all_reduce_pack(
    group: Group,
    index: int,
    tensors: list[tf.Tensor],
    options: Options,
    compression: str | None,
) -> list[tf.Tensor]:
    with tf.device(group.devices[index]):
        summed = group.all_reduce(
            index, flatten_pack(tensors), options, compression
        )
        return unflatten_pack(summed, tensors)
