"""How values cross workers: the `WirePolicy` and the per-reduction `Wire`.

A reduction between workers sends its values as they are, through the
16-bit codec (`_codec`) or as PowerSGD's low-rank factors (`_powersgd`),
and some pair of devices decides what "between workers" means. That is one
decision, so it is one value: a `WirePolicy`. The algorithms take it as
their `wire=` keyword and read only its codec and its links, through a
`Wire`; PowerSGD is applied around them by the classes that reduce, so an
algorithm never sees it.

`Wire` lives here, beside the policy it applies, because a policy names
PowerSGD and PowerSGD uses the codec: `_codec` stays the codec alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import tensorflow as tf

from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice.compression import _codec as codec
from tf_crossdevice.compression._powersgd import PowerSGD

SameWorker: TypeAlias = Callable[[str, str], bool]
"""(device, device) -> whether both belong to one worker process."""


def default_same_worker(a: str, b: str) -> bool:
    """Whether devices `a` and `b` have the same job, replica and task.

    >>> default_same_worker("/job:worker/task:0/device:CPU:0",
    ...                     "/job:worker/replica:0/task:0/device:CPU:1")
    True
    >>> default_same_worker("/job:w/task:0/cpu:0", "/job:w/task:1/cpu:0")
    False
    """
    return (
        devices_lib.parse_device(a).worker == devices_lib.parse_device(b).worker
    )


@dataclasses.dataclass(frozen=True)
class WirePolicy:
    """How values cross workers: the 16-bit codec or PowerSGD (or neither),
    and which links count as crossing.

    Inside a worker values always move as they are. Between workers, with
    `codec`, float32 and float64 values travel as 16 bits (see
    `tf_crossdevice.compression.sum_tolerance` for the error); with
    `powersgd`, the reducing class sums low-rank factors instead of the
    gradients, and the algorithms under it move those factors uncompressed.
    `WirePolicy()` compresses nothing.

    Args:
        codec: None, 'bf16' or 'fp16'.
        powersgd: None or a `tf_crossdevice.compression.PowerSGD`; at most
            one of `codec` and `powersgd` is set.
        same_worker: (device, device) -> whether the link between them
            stays inside one worker; default by job, replica and task.
            Tests pass fake workers made of local devices.

    Raises:
        ValueError: an unknown `codec`, or both `codec` and `powersgd`.
        TypeError: `powersgd` is not a PowerSGD, or `same_worker` is not
            callable.

    >>> from tf_crossdevice.compression import PowerSGD, WirePolicy
    >>> WirePolicy().compression is None
    True
    >>> WirePolicy.from_compression("bf16").codec
    'bf16'
    >>> WirePolicy.from_compression(PowerSGD(rank=2)).powersgd.rank
    2
    >>> task0, task1 = "/job:w/task:0/cpu:0", "/job:w/task:1/cpu:0"
    >>> WirePolicy().crosses(task0, task1), WirePolicy().crosses(task0, task0)
    (True, False)
    >>> one_worker_per_device = WirePolicy(
    ...     "fp16", same_worker=lambda a, b: a == b)
    >>> one_worker_per_device.crosses("/cpu:0", "/cpu:1")
    True
    >>> WirePolicy(codec="int8")
    Traceback (most recent call last):
    ...
    ValueError: codec: unknown value 'int8'; expected one of None, 'bf16', \
'fp16'
    """

    codec: str | None = None
    powersgd: PowerSGD | None = None
    same_worker: SameWorker = default_same_worker

    def __post_init__(self) -> None:
        codec.check_compression(self.codec, "codec")
        if self.powersgd is not None and not isinstance(
            self.powersgd, PowerSGD
        ):
            raise TypeError(
                "powersgd: expected None or a "
                "tf_crossdevice.compression.PowerSGD, got "
                f"{type(self.powersgd).__name__} {self.powersgd!r}"
            )
        if self.codec is not None and self.powersgd is not None:
            raise ValueError(
                f"codec, powersgd: expected at most one of them, got "
                f"codec={self.codec!r} and powersgd={self.powersgd!r}"
            )
        if not callable(self.same_worker):
            raise TypeError(
                "same_worker: expected a callable (device, device) -> bool, "
                f"got {type(self.same_worker).__name__} {self.same_worker!r}"
            )

    @classmethod
    def from_compression(
        cls, compression: Any, argument: str = "compression"
    ) -> WirePolicy:
        """The policy for a reducing class's `compression=` argument.

        Args:
            compression: None, 'bf16', 'fp16', a
                `tf_crossdevice.compression.PowerSGD`, or a `WirePolicy`
                (returned unchanged).
            argument: the caller's name for `compression`, for the error.

        Raises:
            ValueError: any other value.

        >>> WirePolicy.from_compression("powersgd", "options.compression")
        Traceback (most recent call last):
        ...
        ValueError: options.compression: unknown value 'powersgd'; expected \
one of None, 'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD
        """
        if isinstance(compression, WirePolicy):
            return compression
        if isinstance(compression, PowerSGD):
            return cls(powersgd=compression)
        try:
            return cls(codec=codec.check_compression(compression, argument))
        except ValueError:
            raise ValueError(
                f"{argument}: unknown value {compression!r}; expected one of "
                "None, 'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD"
            ) from None

    @property
    def compression(self) -> str | PowerSGD | None:
        """What `from_compression` took: `powersgd` if set, else `codec`."""
        return self.powersgd if self.powersgd is not None else self.codec

    def crosses(self, a: str, b: str) -> bool:
        """Whether the link between devices `a` and `b` crosses workers."""
        return not self.same_worker(a, b)


def check_wire(value: Any, argument: str = "wire") -> WirePolicy:
    """`value` if it is a `WirePolicy`, `WirePolicy()` for None; else
    TypeError.

    >>> check_wire(None) == WirePolicy()
    True
    >>> check_wire("bf16")
    Traceback (most recent call last):
    ...
    TypeError: wire: expected None or a \
tf_crossdevice.compression.WirePolicy, got str 'bf16'
    """
    if value is None:
        return WirePolicy()
    if not isinstance(value, WirePolicy):
        raise TypeError(
            f"{argument}: expected None or a "
            "tf_crossdevice.compression.WirePolicy, got "
            f"{type(value).__name__} {value!r}"
        )
    return value


class Wire:
    """Moves the values of one reduction between devices, compressing
    exactly the transfers that cross workers.

    Builders route each cross-device read through it:

    - `receive(t, dst)`: a summand for `dst`. Crossing workers (and of a
      compressed dtype), it is encoded on `t.device` and decoded on `dst`;
      otherwise `t` itself comes back and the caller's op on `dst` reads it.
    - `copy(t, dst)`: a finished sum for `dst`, a new tensor there. When the
      reduction crosses workers at all (`active`), every finished sum is
      rounded to 16 bits once, where it is complete, and every copy of it,
      on any device, decodes those same 16 bits: all replicas get identical
      results. Otherwise a plain `tf.identity` on `dst`.
    - `settle(t)`: the finished sum as its own device keeps it (the rounded
      value when `active`).

    Args:
        devices: every device taking part (tensors' and gather devices).
        dtype: the values' dtype.
        policy: its `codec` and `same_worker` apply (its `powersgd` is
            applied around the algorithm, not here); None: `WirePolicy()`,
            nothing compressed.

    Raises:
        TypeError: `policy` is not a `WirePolicy` or None.
    """

    def __init__(
        self,
        devices: Sequence[str],
        dtype: tf.DType,
        policy: WirePolicy | None = None,
    ):
        policy = check_wire(policy)
        self._codec = policy.codec
        self._dtype = tf.as_dtype(dtype)
        self._policy = policy
        distinct = list(dict.fromkeys(devices))
        self.active = codec.compresses(self._dtype, self._codec) and any(
            policy.crosses(distinct[0], d) for d in distinct[1:]
        )
        # The 16-bit parts of each tensor encoded (on its device) or decoded
        # (on the receiver), so that a value is encoded once however many
        # devices it goes to and a rounded value is forwarded, not re-encoded.
        self._parts: dict[Any, list[tf.Tensor]] = {}
        self._rounded: set[Any] = set()

    def crosses(self, src: str, dst: str) -> bool:
        """Whether a transfer from `src` to `dst` is compressed."""
        return self.active and self._policy.crosses(src, dst)

    def _encoded(self, tensor: tf.Tensor) -> list[tf.Tensor]:
        key = tensor.ref()
        if key not in self._parts:
            assert self._codec is not None
            with tf.device(tensor.device):
                self._parts[key] = codec.encode(tensor, self._codec)
        return self._parts[key]

    def _decoded(self, parts: list[tf.Tensor], device: str) -> tf.Tensor:
        assert self._codec is not None
        with tf.device(device):
            if parts[0].device != device:  # The receiver's own copy.
                parts = [tf.identity(p) for p in parts]
            value = codec.decode(parts, self._dtype, self._codec)
        self._parts[value.ref()] = parts
        self._rounded.add(value.ref())
        return value

    def receive(self, tensor: tf.Tensor, device: str) -> tf.Tensor:
        """`tensor` as a summand on `device` (see the class docstring)."""
        if not self.crosses(tensor.device, device):
            return tensor
        return self._decoded(self._encoded(tensor), device)

    def copy(self, tensor: tf.Tensor, device: str) -> tf.Tensor:
        """A finished sum copied onto `device` (see the class docstring)."""
        if not self.active:
            with tf.device(device):
                return tf.identity(tensor)
        return self._decoded(self._encoded(tensor), device)

    def settle(self, tensor: tf.Tensor) -> tf.Tensor:
        """The finished sum where it is (rounded when `active`)."""
        if not self.active or tensor.ref() in self._rounded:
            return tensor
        return self._decoded(self._encoded(tensor), tensor.device)
