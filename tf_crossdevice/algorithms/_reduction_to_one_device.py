"""Sum on one device, then copy the sum to every device.

On one host with logical CPU devices the copies share the buffer, so this is
one n-way `add_n` plus free copies; across hosts it is the naive star.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import tensorflow as tf

AccumulationFn = Callable[[list[tf.Tensor]], tf.Tensor]


def sum_on_device(
    tensors: Sequence[tf.Tensor],
    device: str,
    accumulation_fn: AccumulationFn | None = None,
) -> tf.Tensor:
    """Sums `tensors` on `device` with `accumulation_fn` (default add_n).

    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> with tf.device(devices[0]):
    ...     a = tf.constant([1.0, 2.0])
    >>> with tf.device(devices[1]):
    ...     b = tf.constant([10.0, 20.0])
    >>> sum_on_device([a, b], devices[1]).numpy()
    array([11., 22.], dtype=float32)
    """
    if not tensors:
        raise ValueError("tensors: expected at least one tensor, got none")
    accumulate = accumulation_fn or tf.math.add_n
    with tf.device(device):
        if len(tensors) == 1:
            return tf.identity(tensors[0])
        return accumulate(list(tensors))


def copy_to_devices(
    tensor: tf.Tensor, devices: Sequence[str]
) -> list[tf.Tensor]:
    """One `tf.identity` of `tensor` on each device, in order."""
    copies = []
    for device in devices:
        with tf.device(device):
            copies.append(tf.identity(tensor))
    return copies


def reduce_to_one_device_all_reduce(
    tensors: Sequence[tf.Tensor],
    device: str | None = None,
    accumulation_fn: AccumulationFn | None = None,
) -> list[tf.Tensor]:
    """All-reduce (sum) by summing on `device` (default: the first tensor's).

    Returns one sum per input, the i-th on `tensors[i].device`.

    >>> devices = tf_crossdevice.testing.cpu_devices(3)
    >>> tensors = []
    >>> for i, d in enumerate(devices):
    ...     with tf.device(d):
    ...         tensors.append(tf.fill([2], float(i + 1)))
    >>> [t.numpy().tolist() for t in reduce_to_one_device_all_reduce(tensors)]
    [[6.0, 6.0], [6.0, 6.0], [6.0, 6.0]]
    """
    if not tensors:
        raise ValueError("tensors: expected at least one tensor, got none")
    total = sum_on_device(tensors, device or tensors[0].device, accumulation_fn)
    return copy_to_devices(total, [t.device for t in tensors])
