"""Helpers for tests and examples that need several devices on one host.

TensorFlow fixes its device list when the runtime initialises (the first op,
or the first call that lists logical devices). `request_cpu_devices` must run
before that; afterwards it can only confirm what is already there.

Example:

>>> import tf_crossdevice.testing as tfcd_testing
>>> tfcd_testing.request_cpu_devices(4)  # doctest: +SKIP
>>> for name in tfcd_testing.cpu_devices(2):
...     print(name)
/job:localhost/replica:0/task:0/device:CPU:0
/job:localhost/replica:0/task:0/device:CPU:1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal

__all__ = [
    "cpu_devices",
    "per_replica",
    "request_cpu_devices",
]


def request_cpu_devices(n: int) -> None:
    """Splits the host CPU into `n` logical CPU devices.

    Args:
        n: how many logical CPU devices the process should have, at least 1.

    Raises:
        TypeError: `n` is not an int.
        ValueError: `n` is less than 1.
        RuntimeError: TensorFlow has already initialised with fewer than `n`
            logical CPU devices.
    """
    checks.positive_int(n, "n")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n
        )
    except RuntimeError as e:
        have = len(tf.config.list_logical_devices("CPU"))
        if have >= n:
            return
        raise RuntimeError(
            f"request_cpu_devices({n}): TensorFlow already initialised with "
            f"{have} logical CPU device(s); call it before any TensorFlow op "
            "runs (for tests: in conftest.py)"
        ) from e


def cpu_devices(n: int) -> list[str]:
    """Returns the canonical names of the first `n` logical CPU devices.

    Args:
        n: how many devices, at least 1.

    Raises:
        ValueError: the process has fewer than `n` logical CPU devices (the
            message says how many it has and how to get more).
    """
    have = [d.name for d in tf.config.list_logical_devices("CPU")]
    if n < 1 or n > len(have):
        raise ValueError(
            f"n: asked for {n} logical CPU devices, this process has "
            f"{len(have)}; call request_cpu_devices({n}) before TensorFlow "
            "initialises"
        )
    return [tf_internal.canonicalize_device(d) for d in have[:n]]


def per_replica(
    values: Sequence[tf.Tensor], devices: Sequence[str] | None = None
) -> Any:
    """A PerReplica value: `values[i]` copied onto `devices[i]`.

    Args:
        values: one tensor (or `tf.IndexedSlices`) per replica.
        devices: where each replica lives; default the first `len(values)`
            logical CPU devices.

    >>> value = per_replica([tf.constant(1.0), tf.constant(2.0)])
    >>> [v.device[-5:] for v in value.values]
    ['CPU:0', 'CPU:1']
    """
    if not values:
        raise ValueError("values: expected at least one tensor, got none")
    if devices is None:
        devices = cpu_devices(len(values))
    if len(devices) != len(values):
        raise ValueError(
            f"devices: expected {len(values)} devices (one per value), got "
            f"{len(devices)}"
        )
    placed = []
    for value, device in zip(values, devices, strict=True):
        with tf.device(device):
            if isinstance(value, tf.IndexedSlices):
                placed.append(
                    tf.IndexedSlices(
                        tf.identity(value.values),
                        tf.identity(value.indices),
                        value.dense_shape,
                    )
                )
            else:
                placed.append(tf.identity(value))
    return tf_internal.PerReplica(tuple(placed))
