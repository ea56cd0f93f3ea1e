"""The single-worker CrossDeviceOps classes: the adapter, configured.

Each class checks its arguments and builds its reducer: one device that
sums (`ReductionToOneDevice`), or an algorithm of the registry after
optional packing (`AllReduceCrossDeviceOps` and its two presets).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tf_crossdevice import algorithms
from tf_crossdevice._core import values
from tf_crossdevice._core.reducer import OneDevice
from tf_crossdevice._core.values import Item
from tf_crossdevice.ops._adapter import CrossDeviceOpsAdapter
from tf_crossdevice.ops._in_process import InProcessReducer
from tf_crossdevice.packing import PackedAllReduce, check_packing

# The classes whose constructors take `compression=`, for the message of
# those that do not.
COMPRESSING_CLASSES = (
    "SpecAllReduce",
    "MultiWorkerAllReduce",
    "CollectiveAllReduce",
    "HierarchicalCollectiveAllReduce",
)
_WIRE_KEYWORDS = ("compression", "codec", "wire")


class Uncompressed:
    """Mixin for the classes that send values as they are.

    A `compression=` (or `codec=`, `wire=`) is a TypeError that names the
    classes that compress, not Python's bare "unexpected keyword argument".
    It is checked in `__new__`, which sees the call before any constructor
    (NcclAllReduce's own would raise Python's error first).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        for keyword in _WIRE_KEYWORDS:
            if keyword in kwargs:
                raise TypeError(
                    f"{keyword}: {cls.__name__} sends values as they are "
                    f"and takes no {keyword}= (got {kwargs[keyword]!r}); "
                    f"the classes that compress take compression=: "
                    f"{', '.join(COMPRESSING_CLASSES)}"
                )
        return super().__new__(cls, *args, **kwargs)


class ReductionToOneDevice(Uncompressed, CrossDeviceOpsAdapter):
    """Sums every value on one device, then copies the sum out.

    Args:
        reduce_to_device: the device that sums; None means the first
            destination device of each value.
        accumulation_fn: how to sum a list of tensors on that device;
            default `tf.math.add_n`.

    Raises:
        TypeError: `reduce_to_device` is not a device string,
            `accumulation_fn` is not callable, or a `compression=` (see
            `Uncompressed`).
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
        if reduce_to_device is not None:
            reduce_to_device = values.canonical_device(
                reduce_to_device, "reduce_to_device"
            )
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise TypeError(
                "accumulation_fn: expected None or a callable that sums a "
                f"list of tensors, got {accumulation_fn!r}"
            )
        self._reduce_to_device = reduce_to_device
        self._accumulation_fn = accumulation_fn
        super().__init__(
            InProcessReducer(
                type(self).__name__,
                one_device=OneDevice(reduce_to_device, accumulation_fn),
                check=_DeviceExists(reduce_to_device),
            )
        )


class _DeviceExists:
    """Checks once, at the first reduction, that the device exists.

    Not in the constructor: listing the devices initializes TensorFlow's
    runtime, after which logical devices can no longer be configured, and
    TF 1 code builds its CrossDeviceOps before it configures devices.
    """

    def __init__(self, device: str | None) -> None:
        self._device = device
        self._checked = device is None

    def __call__(self, item: Item) -> None:
        if not self._checked and self._device is not None:
            values.check_devices_exist([self._device], "reduce_to_device")
            self._checked = True


class AllReduceCrossDeviceOps(Uncompressed, CrossDeviceOpsAdapter):
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
        TypeError: an argument of the wrong type, or a `compression=`:
            this class and its presets send values as they are.

    Example (4 logical CPU devices):

    >>> devices = tf_crossdevice.testing.cpu_devices(4)
    >>> ops = tf_crossdevice.AllReduceCrossDeviceOps("hierarchical_copy")
    >>> strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]) * (i + 1) for i in range(4)], devices)
    >>> total = ops.reduce(tf.distribute.ReduceOp.MEAN, value)
    >>> strategy.experimental_local_results(total)[3].numpy()
    array([2.5, 5. ], dtype=float32)

    A `compression=` is refused with the classes that compress:

    >>> tf_crossdevice.HierarchicalCopyAllReduce(compression="bf16")
    Traceback (most recent call last):
    ...
    TypeError: compression: HierarchicalCopyAllReduce sends values as they \
are and takes no compression= (got 'bf16'); the classes that compress take \
compression=: SpecAllReduce, MultiWorkerAllReduce, CollectiveAllReduce, \
HierarchicalCollectiveAllReduce
    """

    def __init__(
        self,
        all_reduce_alg: str = "nccl",
        num_packs: int = 1,
        agg_small_grads_max_bytes: int = 0,
        agg_small_grads_max_group: int = 10,
    ):
        builder = algorithms.build(all_reduce_alg, argument="all_reduce_alg")
        (
            self._num_packs,
            self._agg_small_grads_max_bytes,
            self._agg_small_grads_max_group,
        ) = check_packing(
            num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group
        )
        super().__init__(
            InProcessReducer(
                type(self).__name__,
                all_reduce=PackedAllReduce(
                    functools.partial(algorithms.all_reduce_batch, builder),
                    self._num_packs,
                    self._agg_small_grads_max_bytes,
                    self._agg_small_grads_max_group,
                ),
            )
        )


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
