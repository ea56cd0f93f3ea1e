"""The single-worker CrossDeviceOps classes: thin, validating wrappers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _registry as registry
from tf_crossdevice.ops import _base
from tf_crossdevice.packing import _pack as _packing


def check_packing(
    num_packs: Any,
    agg_small_grads_max_bytes: Any,
    agg_small_grads_max_group: Any,
) -> tuple[int, int, int]:
    """Validates the packing arguments shared by the all-reduce classes."""
    num_packs = checks.non_negative_int(num_packs, "num_packs")
    max_bytes = checks.non_negative_int(
        agg_small_grads_max_bytes, "agg_small_grads_max_bytes"
    )
    max_group = checks.non_negative_int(
        agg_small_grads_max_group, "agg_small_grads_max_group"
    )
    if max_bytes > 0 and max_group < 1:
        raise ValueError(
            "agg_small_grads_max_group: expected >= 1 when "
            f"agg_small_grads_max_bytes > 0, got {max_group}"
        )
    if num_packs > 0 and max_bytes > 0:
        raise ValueError(
            f"agg_small_grads_max_bytes={max_bytes} has no effect while "
            f"num_packs={num_packs} concatenates every tensor into packs; "
            "pass num_packs=0 to aggregate small tensors instead"
        )
    return num_packs, max_bytes, max_group


class ReductionToOneDevice(_base.CrossDeviceOpsBase):
    """Sums every value on one device, then copies the sum out.

    Args:
        reduce_to_device: the device that sums; None means the first
            destination device of each value.
        accumulation_fn: how to sum a list of tensors on that device;
            default `tf.math.add_n`.

    Raises:
        TypeError: `reduce_to_device` is not a device string, or
            `accumulation_fn` is not callable.
        ValueError: `reduce_to_device` is not a parsable device string.

    Example (4 logical CPU devices):

    >>> devices = tf_crossdevice.testing.cpu_devices(4)
    >>> strategy = tf.distribute.MirroredStrategy(
    ...     devices, cross_device_ops=tf_crossdevice.ReductionToOneDevice())
    >>> @tf.function
    ... def step():
    ...     ctx = tf.distribute.get_replica_context()
    ...     value = tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32)
    ...     return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)
    >>> result = strategy.run(step)
    >>> [float(v) for v in strategy.experimental_local_results(result)]
    [10.0, 10.0, 10.0, 10.0]
    """

    def __init__(
        self,
        reduce_to_device: str | None = None,
        accumulation_fn: Callable[[list[tf.Tensor]], tf.Tensor] | None = None,
    ):
        super().__init__()
        if reduce_to_device is not None:
            reduce_to_device = _base.canonical_device(
                reduce_to_device, "reduce_to_device"
            )
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise TypeError(
                "accumulation_fn: expected None or a callable that sums a "
                f"list of tensors, got {accumulation_fn!r}"
            )
        self._reduce_to_device = reduce_to_device
        self._accumulation_fn = accumulation_fn
        self._checked_device = False

    def _reduce_on_one_device(self, reduce_op, item):
        if self._reduce_to_device is not None and not self._checked_device:
            _base.check_devices_exist(
                [self._reduce_to_device], "reduce_to_device"
            )
            self._checked_device = True
        return super()._reduce_on_one_device(reduce_op, item)

    def _reduce_batch(self, reduce_op, items, options):
        # Every value takes the one-device path; the all-reduce path would
        # only add a copy.
        return [self._reduce_on_one_device(reduce_op, item) for item in items]


class AllReduceCrossDeviceOps(_base.CrossDeviceOpsBase):
    """All-reduce with one algorithm (TF's: NCCL or hierarchical copy).

    Packs first if asked (see `num_packs` and the small-tensor arguments).

    Args:
        all_reduce_alg: "nccl" or "hierarchical_copy" as in TensorFlow, or
            any other registered algorithm ("xring", "pscpu/xring", ...; see
            `SpecAllReduce`), with one shard. NCCL runs on distinct GPUs of
            a CUDA build; elsewhere (CPU devices) it logs one warning and
            sums on the first device instead.
        num_packs: if > 0, each dtype's tensors are concatenated and split
            into this many packs before the all-reduce (0: no packing).
        agg_small_grads_max_bytes: with num_packs=0, tensors of at most this
            many bytes are concatenated into groups before the all-reduce
            (0: off).
        agg_small_grads_max_group: the most tensors in one such group.

    Raises:
        ValueError: unknown `all_reduce_alg`, a negative count, or both
            packing schemes at once.
        TypeError: an argument of the wrong type.

    Example (4 logical CPU devices):

    >>> devices = tf_crossdevice.testing.cpu_devices(4)
    >>> ops = tf_crossdevice.AllReduceCrossDeviceOps("hierarchical_copy")
    >>> strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]) * (i + 1) for i in range(4)], devices)
    >>> total = ops.reduce(tf.distribute.ReduceOp.MEAN, value)
    >>> strategy.experimental_local_results(total)[3].numpy()
    array([2.5, 5. ], dtype=float32)
    """

    def __init__(
        self,
        all_reduce_alg: str = "nccl",
        num_packs: int = 1,
        agg_small_grads_max_bytes: int = 0,
        agg_small_grads_max_group: int = 10,
    ):
        super().__init__()
        self._builder = registry.build(
            all_reduce_alg, argument="all_reduce_alg"
        )
        (
            self._num_packs,
            self._agg_small_grads_max_bytes,
            self._agg_small_grads_max_group,
        ) = check_packing(
            num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group
        )

    def _all_reduce_dense(self, batch):
        return packed_all_reduce(
            batch,
            self._builder,
            num_packs=self._num_packs,
            agg_small_grads_max_bytes=self._agg_small_grads_max_bytes,
            agg_small_grads_max_group=self._agg_small_grads_max_group,
        )


def packed_all_reduce(
    batch: Sequence[Sequence[tf.Tensor]],
    all_reduce: registry.AllReduceBuilder,
    *,
    num_packs: int,
    agg_small_grads_max_bytes: int,
    agg_small_grads_max_group: int,
    all_reduce_batch: protocol.BatchAllReduce | None = None,
) -> list[list[tf.Tensor]]:
    """Packs each device's tensors, all-reduces the packs, unpacks.

    With packing on, each pack is all-reduced on its own (packing sets how
    many all-reduces run and how big they are). With packing off, the
    values (and those that cannot be packed) are all-reduced as one batch
    (`protocol.all_reduce_batch`: one layout per dtype), so that the graph
    does not grow with values x devices x algorithm steps.

    Args:
        batch: `batch[k][d]` is value k on device d (same devices for all k).
        all_reduce: sums one pack across devices; gets the pack's index too.
        all_reduce_batch: sums a batch of packs, given their indices;
            default `protocol.all_reduce_batch` of `all_reduce`.

    Returns:
        `result[k][d]`, the sum of value k, on device d.

    Values whose static shape is not fully known cannot be packed; each of
    them is all-reduced on its own (as TensorFlow's packers do).
    """
    if all_reduce_batch is None:

        def all_reduce_batch(values, indices):
            return protocol.all_reduce_batch(all_reduce, values, indices)

    static = [k for k, v in enumerate(batch) if v[0].shape.is_fully_defined()]
    results: list[list[tf.Tensor]] = [[] for _ in batch]
    if static:
        packed = _pack_and_all_reduce(
            [batch[k] for k in static],
            all_reduce_batch,
            num_packs=num_packs,
            agg_small_grads_max_bytes=agg_small_grads_max_bytes,
            agg_small_grads_max_group=agg_small_grads_max_group,
        )
        for k, summed in zip(static, packed, strict=True):
            results[k] = summed
    dynamic = [k for k in range(len(batch)) if k not in set(static)]
    if dynamic:
        summed = all_reduce_batch(
            [batch[k] for k in dynamic],
            [len(static) + j for j in range(len(dynamic))],
        )
        for k, sums in zip(dynamic, summed, strict=True):
            results[k] = sums
    return results


def _pack_and_all_reduce(
    batch: Sequence[Sequence[tf.Tensor]],
    all_reduce_batch: protocol.BatchAllReduce,
    *,
    num_packs: int,
    agg_small_grads_max_bytes: int,
    agg_small_grads_max_group: int,
) -> list[list[tf.Tensor]]:
    num_devices = len(batch[0])
    devices = [t.device for t in batch[0]]
    packer = _packing.make_packer(
        [value[0] for value in batch],
        num_packs=num_packs,
        agg_small_grads_max_bytes=agg_small_grads_max_bytes,
        agg_small_grads_max_group=agg_small_grads_max_group,
    )
    packs_per_device = []
    for d, device in enumerate(devices):
        with tf.device(device):
            packs_per_device.append(packer.pack([value[d] for value in batch]))
    packs = [
        [packs[j] for packs in packs_per_device]
        for j in range(packer.num_packs)
    ]
    if num_packs or agg_small_grads_max_bytes:
        # Packing decides how many all-reduces run and how big they are:
        # each pack keeps its own (few packs, so a small graph).
        summed_packs = [
            all_reduce_batch([p], [j])[0] for j, p in enumerate(packs)
        ]
    else:
        # No packing: every value is a "pack"; one batched all-reduce per
        # dtype and range keeps the graph from growing with the values.
        summed_packs = all_reduce_batch(packs, list(range(packer.num_packs)))
    per_device = []
    for d, device in enumerate(devices):
        with tf.device(device):
            per_device.append(packer.unpack([pack[d] for pack in summed_packs]))
    return [
        [per_device[d][k] for d in range(num_devices)]
        for k in range(len(batch))
    ]


class NcclAllReduce(AllReduceCrossDeviceOps):
    """NCCL all-reduce on GPUs, with packing into `num_packs` packs.

    Without GPUs (or without a CUDA build) it logs one warning naming the
    devices and sums on the first device instead, so the same program runs
    on a laptop and on a GPU server.

    Args:
        num_packs: see `AllReduceCrossDeviceOps` (0: no packing).

    >>> ops = tf_crossdevice.NcclAllReduce(num_packs=2)
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])])
    >>> [v.numpy().tolist() for v in ops.reduce("sum", value).values]
    [[4.0, 6.0], [4.0, 6.0]]
    """

    def __init__(self, num_packs: int = 1):
        super().__init__("nccl", num_packs=num_packs)


class HierarchicalCopyAllReduce(AllReduceCrossDeviceOps):
    """TF 1's DGX-1 hierarchical copy, for any device count >= 1.

    Per tensor a main device (rotating over all devices) sums its half of
    the devices, a partner sums the other half, the two sums meet and flow
    back. Runs on GPUs and on logical CPU devices alike.

    Args:
        num_packs: see `AllReduceCrossDeviceOps` (0: no packing).

    >>> ops = tf_crossdevice.HierarchicalCopyAllReduce(num_packs=0)
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1, 2], tf.int64), tf.constant([3, 4], tf.int64),
    ...      tf.constant([5, 6], tf.int64)])
    >>> [v.numpy().tolist() for v in ops.reduce("sum", value).values]
    [[9, 12], [9, 12], [9, 12]]
    """

    def __init__(self, num_packs: int = 1):
        super().__init__("hierarchical_copy", num_packs=num_packs)
