"""NCCL all-reduce through TensorFlow's NCCL kernels, with a CPU fallback.

TensorFlow registers `NcclAllReduce` for GPUs only (it has no CPU kernel)
and a few dtypes (no bfloat16), and NCCL refuses two ranks on one GPU
(logical GPUs split from one included). `nccl_all_reduce` therefore checks
first: when the devices are not distinct GPUs of a CUDA/ROCm build, or the
dtype is not NCCL's, it logs
once, naming the devices, and sums on the first device instead (see
`_reduction_to_one_device`), which on one host is the fastest CPU path.

Compression: NCCL sums in the dtype it is given, so it never sees 16-bit
data. TensorFlow's NCCL runs inside one worker, so a stage that crosses
workers always takes the one-device fallback, and that fallback compresses
its cross-worker transfers like every other builder (see
`tf_crossdevice.compression.WirePolicy`). Only NCCL itself across devices
that the policy's `same_worker` calls different workers (fake workers)
refuses compression.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core import tf_internal
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _reduction_to_one_device as one_device
from tf_crossdevice.compression import Wire, WirePolicy

# The dtypes TensorFlow's NcclAllReduce kernel takes.
NCCL_DTYPES = (tf.float16, tf.float32, tf.float64, tf.int32, tf.int64)


def nccl_unavailable_reason(
    devices: Sequence[str], dtype: tf.DType | None = None
) -> str | None:
    """Why NCCL cannot all-reduce `dtype` across `devices`, or None if it
    can.

    >>> nccl_unavailable_reason(["/device:CPU:0", "/device:CPU:1"])
    'devices are not all GPUs: /device:CPU:0, /device:CPU:1'
    """
    names = [devices_lib.parse_device(d) for d in devices]
    if any(n.device_type != "GPU" for n in names):
        return "devices are not all GPUs: " + ", ".join(devices)
    if dtype is not None and dtype not in NCCL_DTYPES:
        return f"TensorFlow's NCCL kernel takes no {dtype.name}"
    logical = len(tf.config.list_logical_devices("GPU"))
    physical = len(tf.config.list_physical_devices("GPU"))
    if logical > physical:
        # NCCL refuses two ranks on one GPU ("Duplicate GPU detected").
        return (
            f"this process splits {physical} GPU(s) into {logical} logical "
            "GPUs; NCCL needs one physical GPU per rank"
        )
    canonical = [tf_internal.canonicalize_device(d) for d in devices]
    if len(set(canonical)) != len(canonical):
        return "NCCL needs distinct GPUs, got " + ", ".join(devices)
    if len({devices_lib.parse_device(d).worker for d in canonical}) > 1:
        # TF's NCCL ops form their communicator inside one process.
        return "NCCL runs inside one worker, got " + ", ".join(devices)
    info = tf.sysconfig.get_build_info()
    if not (info.get("is_cuda_build") or info.get("is_rocm_build")):
        return "this TensorFlow build has no NCCL kernel (not a CUDA build)"
    return None


def nccl_all_reduce(
    tensors: Sequence[tf.Tensor],
    *,
    wire: WirePolicy | None = None,
) -> list[tf.Tensor]:
    """All-reduce (sum) with NCCL, or on one device where NCCL cannot run.

    Returns one sum per input, the i-th on `tensors[i].device`.

    `wire` applies to the one-device fallback (see the module docstring);
    with NCCL itself across workers a codec raises ValueError.

    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> tensors = []
    >>> for i, d in enumerate(devices):
    ...     with tf.device(d):
    ...         tensors.append(tf.constant([1.0 + i]))
    >>> [t.numpy().tolist() for t in nccl_all_reduce(tensors)]
    [[3.0], [3.0]]
    """
    if not tensors:
        raise ValueError("tensors: expected at least one tensor, got none")
    devices = [t.device for t in tensors]
    reason = None
    if len(tensors) > 1:
        reason = nccl_unavailable_reason(devices, tensors[0].dtype)
    transfers = Wire(devices, tensors[0].dtype, wire)
    if transfers.active and reason is None:
        assert wire is not None  # Only a codec makes the transfers active.
        raise ValueError(
            f"compression: {wire.codec!r} cannot apply to NCCL, which sums "
            f"in the dtype it is given, across workers ({', '.join(devices)}); "
            "use compression=None or an all_reduce_spec whose stage across "
            "workers is not nccl (e.g. 'nccl/xring')"
        )
    if len(tensors) == 1 or reason is not None:
        if reason is not None:
            logging.log_first_n(
                logging.WARNING,
                "NCCL all-reduce cannot run here (%s); summing on %s and "
                "copying instead.",
                1,
                reason,
                devices[0],
            )
        if transfers.active:
            total = one_device.sum_on_device(
                [transfers.receive(t, devices[0]) for t in tensors], devices[0]
            )
            return [transfers.copy(total, d) for d in devices]
        return one_device.reduce_to_one_device_all_reduce(tensors)
    if tf.executing_eagerly():
        # Every rank's NcclAllReduce must be launched together; one eager op
        # at a time would wait forever for the others.
        return list(_eager_nccl_all_sum()(list(tensors)))
    return list(tf_internal.nccl_all_sum(list(tensors)))


def builder(
    shards: int = 1, *, wire: WirePolicy | None = None
) -> protocol.AllReduceBuilder:
    """The registry's factory: `shards` independent NCCL all-reduces."""

    def nccl(tensors: Sequence[tf.Tensor], index: int) -> list[tf.Tensor]:
        del index  # NCCL reduces every value alike.
        return nccl_all_reduce(tensors, wire=wire)

    return protocol.shard_wise(nccl, shards)


_EAGER_NCCL: list = []


def _eager_nccl_all_sum():
    """One tf.function for every eager call (it retraces per shape only)."""
    if not _EAGER_NCCL:
        _EAGER_NCCL.append(tf.function(tf_internal.nccl_all_sum))
    return _EAGER_NCCL[0]
