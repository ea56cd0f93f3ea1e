"""TF 1's value types (PerDevice, Mirrored) and its destination helpers.

TF 1 built distributed values from a `{device: value}` dict; TensorFlow 2's
PerReplica and Mirrored hold a tuple of values, one per replica, each placed
on its device. These build TF 2's from the dict, placing each value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tf_crossdevice import ops, testing


def _placed(index: Any, argument: str) -> tuple[Any, ...]:
    if not isinstance(index, Mapping) or not index:
        raise ValueError(
            f"{argument}: expected a non-empty {{device: value}} dict, got "
            f"{index!r}"
        )
    devices = ops.resolve_destinations(list(index), (), argument)
    return testing.per_replica(list(index.values()), devices).values


def per_device(index: Mapping[str, Any]) -> Any:
    """TF 1's `PerDevice({device: value})`: TF 2's PerReplica value.

    >>> value = per_device({"/cpu:0": tf.constant(1.0),
    ...                     "/cpu:1": tf.constant(3.0)})
    >>> [v.device[-5:] for v in value.values]
    ['CPU:0', 'CPU:1']
    """
    return ops.PerReplica(_placed(index, "index"))


def mirrored(index: Mapping[str, Any]) -> Any:
    """TF 1's `Mirrored({device: value})`: TF 2's Mirrored value.

    >>> value = mirrored({"/cpu:0": tf.constant(2.0),
    ...                   "/cpu:1": tf.constant(2.0)})
    >>> type(value).__name__
    'Mirrored'
    """
    return ops.Mirrored(_placed(index, "index"))


def check_destinations(destinations: Any) -> bool:
    """TF 1's test that `destinations` name some device.

    >>> check_destinations("/cpu:0"), check_destinations([])
    (True, False)
    """
    if isinstance(destinations, (tf.Variable, tf.Tensor)):
        return bool(destinations.device)
    return bool(destinations)


def validate_destinations(destinations: Any) -> None:
    """Raises ValueError unless `destinations` name devices, as TF 1 did.

    Destinations are a distributed value, a tf.Variable or tensor, a device
    string, or a list or tuple of device strings.

    >>> validate_destinations([])
    Traceback (most recent call last):
    ...
    ValueError: destinations: expected at least one device, got []
    """
    if not isinstance(
        destinations,
        (
            tf.distribute.DistributedValues,
            tf.Variable,
            tf.Tensor,
            str,
            list,
            tuple,
        ),
    ):
        raise ValueError(
            "destinations: expected a distributed value, a tf.Variable, a "
            "device string, or a list or tuple of device strings; got "
            f"{type(destinations).__name__}"
        )
    if not check_destinations(destinations):
        raise ValueError(
            f"destinations: expected at least one device, got {destinations!r}"
        )


def get_devices_from(destinations: Any) -> list[str]:
    """The canonical device strings that `destinations` name.

    >>> get_devices_from(["/cpu:0", "/cpu:1"])
    ['/job:localhost/replica:0/task:0/device:CPU:0', \
'/job:localhost/replica:0/task:0/device:CPU:1']
    """
    validate_destinations(destinations)
    return list(ops.resolve_destinations(destinations, ()))
