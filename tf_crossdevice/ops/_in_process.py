"""The reducer of one process or one graph: every replica in view.

`InProcessReducer` all-reduces a dense value of several components on the
components' own devices with an algorithm (a function of a batch, built
from `algorithms` after optional packing), and leaves everything else
(IndexedSlices, other destinations, no algorithm at all) to the adapter's
one-device sum. In one graph the devices may belong to several worker
processes (`MultiWorkerAllReduce`): TensorFlow's runtime moves the tensors
and the reducer only checks where they are (`check`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tf_crossdevice._core import values
from tf_crossdevice._core.reducer import Batch, Devices, OneDevice
from tf_crossdevice._core.values import Item
from tf_crossdevice.compression import WirePolicy


@dataclasses.dataclass(frozen=True)
class InProcessReducer:
    """Sums with `all_reduce` on the values' own devices, else on one.

    Attributes:
        name: the class that uses it, for error messages.
        all_reduce: sums a batch (`batch[k][d]`, every value on the same
            devices) on those devices; None: every value goes to
            `one_device`.
        one_device: where and how values `all_reduce` does not take are
            summed.
        wire: the wire policy the algorithm was built with (its PowerSGD
            compressor, if any, approximates batch reductions).
        check: called with every value that is reduced (not copied in
            place), to refuse it with a message naming the argument.
        crosses_workers: whether the devices span worker processes.
    """

    name: str
    all_reduce: Callable[[Batch], Batch] | None = None
    one_device: OneDevice = OneDevice()
    wire: WirePolicy = WirePolicy()
    check: Callable[[Item], None] | None = None
    crosses_workers: bool = False

    @property
    def num_workers(self) -> int:
        return 1

    def options(self, options: Any) -> Any:
        return values.check_options(options)

    def devices_for(self, item: Item) -> Devices | None:
        if self.check is not None:
            self.check(item)
        if (
            self.all_reduce is None
            or item.sparse
            or len(item.devices) == 1
            or item.destinations != item.devices
        ):
            return None
        values.check_placed(
            item, f"{self.name} all-reduces on the components' own devices"
        )
        return item.devices

    def sum(self, batch: Batch, devices: Devices, options: Any) -> Batch:
        assert self.all_reduce is not None  # devices_for declined otherwise.
        return self.all_reduce(batch)

    def run(
        self,
        signature: tuple[Any, ...],
        fn: Callable[[Any], Any],
        args: Any,
        devices: Any,
    ) -> Any:
        return fn(args)

    def gather(self, item: Item, axis: int, options: Any) -> Any:
        axis = values.check_gather_axis(item, axis)
        gathered = values.gather_on(item, axis, item.destinations[0])
        return values.regroup(
            [values.copy_value(gathered, d) for d in item.destinations]
        )

    def replica_all_reduce(
        self, reduce_op: Any, value: Any, replica_id: int, options: Any
    ) -> Any:
        raise NotImplementedError(
            f"{self.name} reduces in cross-replica context (merge_call) only"
        )

    def check_mirrored_strategy(self) -> None:
        """Every in-process reducer suits MirroredStrategy."""
