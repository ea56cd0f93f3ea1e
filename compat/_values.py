"""TF 1's value types (PerDevice, Mirrored) and its destination helpers.

TF 1 built distributed values from a `{device: value}` dict; TensorFlow 2's
PerReplica and Mirrored hold a tuple of values, one per replica, each placed
on its device. These build TF 2's from the dict, placing each value.

`Mirrored` is TF 1's value contract on TF 2's class: what the legacy
CrossTowerOps classes return from reduce, batch_reduce and broadcast, one
destination included, with TF 1's `get(device=None)`, `devices` and
`on_device(device)`.
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


def _device_string(device: Any) -> str:
    if isinstance(device, tf.DeviceSpec):
        return device.to_string()
    if not isinstance(device, str):
        raise TypeError(
            "device: expected None, a device string such as '/cpu:0' or a "
            f"tf.DeviceSpec, got {type(device).__name__}"
        )
    return device


def _same_device(a: str, b: str) -> bool:
    """Whether canonical devices `a` and `b` are one device.

    A TF 1 graph's canonical names may lack the job; a missing job matches
    any job.
    """
    if a == b:
        return True
    x, y = tf.DeviceSpec.from_string(a), tf.DeviceSpec.from_string(b)
    if x.job is not None and y.job is not None and x.job != y.job:
        return False
    return x.replace(job=None) == y.replace(job=None)


def current_device() -> str:
    """The canonical device of the enclosing `tf.device` scope.

    Without a scope: the host's first CPU, as TF 1's `device_util.current`
    canonicalised it.

    >>> with tf.device("/cpu:1"):
    ...     current_device()
    '/job:localhost/replica:0/task:0/device:CPU:1'
    """
    # "/" names no field, so every field comes from the scope (or from the
    # defaults), by the rule that resolves destination strings.
    return ops.resolve_destinations("/", (), "device")[0]


def _resolve(device: Any) -> str:
    """`device` as a canonical string; None: the current device."""
    if device is None:
        return current_device()
    return ops.resolve_destinations(_device_string(device), (), "device")[0]


class Mirrored(ops.Mirrored):  # type: ignore[misc]
    """TF 1's Mirrored value: TF 2's, plus `get`, `devices`, `on_device`.

    A subclass of TensorFlow 2's Mirrored, so TF 2 code that receives one
    (`.values`, `strategy.experimental_local_results`, isinstance checks,
    arithmetic on the local value) works as before.

    Args:
        index: TF 1's `{device: value}` dict (each value is copied onto its
            device), or TF 2's tuple of values, one per replica.

    >>> value = Mirrored({"/cpu:0": tf.constant(2.0),
    ...                   "/cpu:1": tf.constant(2.0)})
    >>> isinstance(value, tf.distribute.DistributedValues)
    True
    >>> [float(value.get(d)) for d in ("/cpu:1", "/device:CPU:0")]
    [2.0, 2.0]
    >>> value = Mirrored((tf.constant(2.0),))
    >>> value.devices
    ('/job:localhost/replica:0/task:0/device:CPU:0',)
    >>> float(value.get("/cpu:0")), float(value.get())
    (2.0, 2.0)
    >>> value.get("/cpu:1")
    Traceback (most recent call last):
    ...
    ValueError: device: '/cpu:1' (/job:localhost/replica:0/task:0/device:\
CPU:1) is not a device of this Mirrored value; expected one of \
/job:localhost/replica:0/task:0/device:CPU:0
    """

    def __init__(self, index: Any) -> None:
        if isinstance(index, Mapping):
            index = _placed(index, "index")
        elif not isinstance(index, (tuple, list)) or not index:
            raise ValueError(
                "index: expected a non-empty {device: value} dict or a "
                f"tuple of values, one per replica; got {index!r}"
            )
        super().__init__(tuple(index))

    @property
    def devices(self) -> tuple[str, ...]:
        """The canonical device string of each value, in order."""
        return ops.resolve_destinations(self, (), "devices")

    def _find(self, device: str) -> int | None:
        for i, candidate in enumerate(self.devices):
            if candidate and _same_device(candidate, device):
                return i
        return None

    def on_device(self, device: Any) -> bool:
        """Whether the value has a copy on `device` (a string or DeviceSpec)."""
        return self._find(_resolve(device)) is not None

    def get(self, device: Any = None) -> Any:
        """The value on `device`, as TF 1's `DistributedValues.get`.

        Args:
            device: a device string (in any spelling TensorFlow accepts,
                resolved against the enclosing `tf.device` scope as
                destinations are) or a `tf.DeviceSpec`; None: the current
                device (the `tf.device` scope's; without one, the host's
                first CPU). In a strategy's cross-replica context a value
                not on the current device gives its first value, as TF 1's
                Mirrored did.

        Raises:
            ValueError: the value has no copy on `device`.
            TypeError: `device` is not None, a string or a DeviceSpec.
        """
        resolved = _resolve(device)
        index = self._find(resolved)
        if index is not None:
            return self.values[index]
        if device is None and tf.distribute.in_cross_replica_context():
            return self.values[0]
        given = (
            "None (the current device, "
            if device is None
            else f"{_device_string(device)!r} ("
        )
        raise ValueError(
            f"device: {given}{resolved}) is not a device of this Mirrored "
            f"value; expected one of {', '.join(self.devices)}"
        )


def tf1_mirrored(result: Any) -> Any:
    """A reduce or broadcast result as TF 1 returned it: a `Mirrored`.

    TF 2 gives a plain tensor for one destination and its own Mirrored for
    several; TF 1 gave a Mirrored for both.

    >>> tf1_mirrored(tf.constant(1.0)).devices
    ('/job:localhost/replica:0/task:0/device:CPU:0',)
    """
    if isinstance(result, Mirrored):
        return result
    if isinstance(result, tf.distribute.DistributedValues):
        return Mirrored(tuple(result.values))  # type: ignore[attr-defined]
    return Mirrored((result,))


def per_device(index: Mapping[str, Any]) -> Any:
    """TF 1's `PerDevice({device: value})`: TF 2's PerReplica value.

    >>> value = per_device({"/cpu:0": tf.constant(1.0),
    ...                     "/cpu:1": tf.constant(3.0)})
    >>> [v.device[-5:] for v in value.values]
    ['CPU:0', 'CPU:1']
    """
    return ops.PerReplica(_placed(index, "index"))


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
