"""Where PowerSGD puts replica i's work: on `devices[i]`, or, without a
list of devices, wherever the caller's scope puts it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf


def replica_device(devices: Sequence[str] | None, i: int) -> Any:
    """A context that places what runs in it on replica i's device."""
    # None keeps the caller's scope (tf.device(None) would clear it).
    return tf.device(devices[i]) if devices else contextlib.nullcontext()


def on_replica(
    devices: Sequence[str] | None, i: int, fn: Callable[..., Any], *args: Any
) -> Any:
    """`fn(*args)`, run on replica i's device."""
    with replica_device(devices, i):
        return fn(*args)
