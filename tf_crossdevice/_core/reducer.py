"""The reducer protocol: what one family of algorithms does for a reduction.

Every public CrossDeviceOps class of the package is one adapter
(`tf_crossdevice.ops.CrossDeviceOpsAdapter`) configured with a reducer.
The adapter turns TensorFlow's hooks into `values.Item`s, checks the
arguments, resolves destinations, divides for MEAN, routes results and
groups them as TensorFlow does; the reducer decides which local devices
sum a value and sums a batch of values across them (and across the other
workers). The families:

- in one process or in one graph (`ops`): an algorithm of `algorithms`
  after optional packing, or one device that sums;
- between worker processes (`collective`): TensorFlow's collective ops,
  flat or hierarchical.

PowerSGD is not a family: the adapter hands it the reducer's `sum` for
batch reductions when the wire policy asks for it and the sums cross
workers (`tf_crossdevice.compression.PowerSGD.sum`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

import tensorflow as tf

from tf_crossdevice._core.values import Item, Value

# `batch[k][d]`: value k's component on device d.
Batch: TypeAlias = list[list[Value]]
Devices: TypeAlias = tuple[str, ...]
AccumulationFn: TypeAlias = Callable[[list[tf.Tensor]], tf.Tensor]


@dataclasses.dataclass(frozen=True)
class OneDevice:
    """Where and how a value that is not all-reduced is summed.

    `device` None means each value's first destination; `accumulation_fn`
    None means `tf.math.add_n`.
    """

    device: str | None = None
    accumulation_fn: AccumulationFn | None = None


class Reducer(Protocol):
    """How one family sums values across devices and workers."""

    @property
    def num_workers(self) -> int:
        """Processes whose replicas each sum covers (MEAN divides by the
        local devices times this); 1 when every replica is in view."""

    @property
    def crosses_workers(self) -> bool:
        """Whether the sums cross worker boundaries (where PowerSGD and the
        16-bit codec apply)."""

    @property
    def wire(self) -> Any:
        """The `tf_crossdevice.compression.WirePolicy` it applies."""

    @property
    def one_device(self) -> OneDevice:
        """How values `devices_for` declines are summed."""

    def options(self, options: Any) -> Any:
        """A call's CommunicationOptions, checked and merged with the
        reducer's own."""

    def devices_for(self, item: Item) -> Devices | None:
        """The local devices whose reduction sums `item`, one per
        component; None to sum it on one device (`one_device`)."""

    def sum(self, batch: Batch, devices: Devices, options: Any) -> Batch:
        """`result[k][d]`: value k summed over every replica, on
        `devices[d]`."""

    def run(
        self,
        signature: tuple[Any, ...],
        fn: Callable[[Any], Any],
        args: Any,
        devices: Any,
    ) -> Any:
        """`fn(args)`: the ops of one reduction, built where the family
        needs them (the collectives, eagerly: inside one traced function
        per `signature`). `devices` mirrors the result, a device each."""

    def gather(self, item: Item, axis: int, options: Any) -> Any:
        """Every replica's component of `item` concatenated along `axis`
        (checked with `values.check_gather_axis`), on `item.destinations`,
        grouped as TensorFlow groups results."""

    def replica_all_reduce(
        self, reduce_op: Any, value: Any, replica_id: int, options: Any
    ) -> Any:
        """One replica's share of a replica-context all-reduce."""

    def check_mirrored_strategy(self) -> None:
        """Raises where `tf.distribute.MirroredStrategy` must not use it."""
