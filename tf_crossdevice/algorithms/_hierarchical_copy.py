"""Hierarchical-copy all-reduce (TF 1's DGX-1 two-group scheme, any n).

See `tf_crossdevice.algorithms._hierarchical_copy_schedule` for the schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice.algorithms import _hierarchical_copy_schedule as schedule
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _reduction_to_one_device as one_device
from tf_crossdevice.compression import Wire, WirePolicy


def hierarchical_copy_all_reduce(
    tensors: Sequence[tf.Tensor],
    tensor_index: int = 0,
    *,
    wire: WirePolicy | None = None,
) -> list[tf.Tensor]:
    """All-reduce (sum) of one tensor per device by hierarchical copy.

    Args:
        tensors: one dense tensor per device, same shape and dtype.
        tensor_index: position of this tensor in its batch; it picks the main
            device (`tensor_index % len(tensors)`) so that a batch spreads the
            summing over all devices.
        wire: how values cross workers: float32 and float64 values travel
            as 16 bits with a codec (see
            `tf_crossdevice.compression.WirePolicy`); None: as they are.

    Returns:
        The sum, the i-th copy on `tensors[i].device`.

    >>> devices = tf_crossdevice.testing.cpu_devices(3)
    >>> tensors = []
    >>> for i, d in enumerate(devices):
    ...     with tf.device(d):
    ...         tensors.append(tf.constant([i, 10 * i], tf.int64))
    >>> [t.numpy().tolist() for t in hierarchical_copy_all_reduce(tensors, 1)]
    [[3, 30], [3, 30], [3, 30]]
    """
    if not tensors:
        raise ValueError("tensors: expected at least one tensor, got none")
    devices = [t.device for t in tensors]
    if len(tensors) == 1:
        return one_device.copy_to_devices(tensors[0], devices)
    plan = schedule.hierarchical_copy_plan(len(tensors), tensor_index)
    transfers = Wire(devices, tensors[0].dtype, wire)
    main_root = devices[plan.main_root]
    main_sum = one_device.sum_on_device(
        [transfers.receive(tensors[i], main_root) for i in plan.main_group],
        main_root,
    )
    assert plan.other_root is not None  # n >= 2: both groups are non-empty.
    other_root = devices[plan.other_root]
    other_sum = one_device.sum_on_device(
        [transfers.receive(tensors[i], other_root) for i in plan.other_group],
        other_root,
    )
    total = one_device.sum_on_device(
        [main_sum, transfers.receive(other_sum, main_root)], main_root
    )
    other_total = transfers.copy(total, other_root)
    roots = {plan.main_root: total, plan.other_root: other_total}
    return [
        transfers.copy(roots[plan.root_of(i)], device)
        for i, device in enumerate(devices)
    ]


def builder(
    shards: int = 1, *, wire: WirePolicy | None = None
) -> protocol.AllReduceBuilder:
    """The registry's factory: one hierarchical copy per shard; shard `s`
    of value `k` rotates the main device to `k * shards + s`."""

    def hierarchical_copy(
        tensors: Sequence[tf.Tensor], index: int
    ) -> list[tf.Tensor]:
        return hierarchical_copy_all_reduce(tensors, index, wire=wire)

    return protocol.shard_wise(hierarchical_copy, shards)
