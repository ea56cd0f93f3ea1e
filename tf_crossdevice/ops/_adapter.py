"""CrossDeviceOpsAdapter: TensorFlow's CrossDeviceOps hooks on a reducer.

Every public class of the package is this adapter configured with a
reducer (`tf_crossdevice._core.reducer.Reducer`). The adapter does what
every class does alike: it checks the arguments, turns values and
destinations into `Item`s (`_core.values`), copies a one-replica value that
is already in place (TensorFlow's shortcut, which MirroredStrategy relies
on), asks the reducer which local devices sum each value, has the reducer
sum them, divides for MEAN, and copies each result to its destinations.
Values the reducer declines (`devices_for` None: IndexedSlices or other
destinations in one process) are summed on one device. Batch reductions
(the path of optimizers' gradients) go through the wire policy's PowerSGD
compressor when it has one and the sums cross workers.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, reprs, values
from tf_crossdevice._core.reducer import Batch, Devices, Reducer
from tf_crossdevice._core.values import Item, ReduceOp, no_autograph
from tf_crossdevice.algorithms import sum_on_device
from tf_crossdevice.compression import WirePolicy


class CrossDeviceOpsAdapter(
    reprs.ConstructorRepr, tf.distribute.CrossDeviceOps
):
    """A `tf.distribute.CrossDeviceOps` whose reductions its reducer does.

    The package's classes (`ReductionToOneDevice`, `CollectiveAllReduce`,
    ...) are this adapter with their own reducer; `reducer` gives it back.
    An in-process reducer with no algorithm sums every value on one device:

    >>> ops = tf_crossdevice.ops.CrossDeviceOpsAdapter(
    ...     tf_crossdevice.ops.InProcessReducer("OnOneDevice"))
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])])
    >>> ops.reduce("mean", value, "/cpu:0").numpy()
    array([2., 3.], dtype=float32)
    >>> type(tf_crossdevice.CollectiveAllReduce().reducer).__name__
    'CollectiveReducer'

    Args:
        reducer: decides which devices sum each value and sums a batch
            (see `tf_crossdevice._core.reducer.Reducer`).
    """

    def __init__(self, reducer: Reducer) -> None:
        super().__init__()
        self._reducer = reducer

    @property
    def reducer(self) -> Reducer:
        """The reducer that sums this object's values."""
        return self._reducer

    @property
    def wire(self) -> Any:
        """The `tf_crossdevice.compression.WirePolicy`: how values cross
        workers (its default compresses nothing)."""
        return self._reducer.wire

    @property
    def compression(self) -> Any:
        """None, the 16-bit codec ('bf16' or 'fp16') or the PowerSGD
        compressor: the `compression` the object was built with."""
        return self._reducer.wire.compression

    def with_reducer(self, reducer: Reducer) -> CrossDeviceOpsAdapter:
        """A copy of this object that reduces with `reducer`."""
        other = copy.copy(self)
        other._reducer = reducer
        return other

    @property
    def _num_between_graph_workers(self) -> int:
        return self._reducer.num_workers

    def __bool__(self) -> bool:
        # tf.distribute.MirroredStrategy tests `if cross_device_ops:` in its
        # constructor. That is the only hook TensorFlow offers to refuse a
        # reducer MirroredStrategy must not drive (a collective across
        # several workers: MirroredStrategy would count only this process's
        # replicas), so the refusal rides on truth-testing.
        self._reducer.check_mirrored_strategy()
        return True

    # ---- The public methods MirroredStrategy and users call -------------

    @no_autograph
    def reduce(
        self,
        reduce_op: Any,
        per_replica_value: Any,
        destinations: Any = None,
        options: Any = None,
    ) -> Any:
        """Reduces `per_replica_value` to `destinations` (None: its devices).

        Returns:
            The reduced tensor when there is one destination device, else a
            Mirrored value with one component per destination device.
        """
        reduce_op = values.check_reduce_op(reduce_op)
        values.check_options(options)
        item = values.make_item(
            per_replica_value, destinations, "per_replica_value"
        )
        return self._reduce(reduce_op, [item], options, approximate=False)[0]

    @no_autograph
    def batch_reduce(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any = None
    ) -> list[Any]:
        """Reduces several (value, destinations) pairs in one go.

        An empty list gives an empty list. With a PowerSGD compressor in
        the wire policy and sums that cross workers, the sums of the
        float32/float64 matrices it compresses are its low-rank
        approximations (see `tf_crossdevice.compression.PowerSGD`): batch
        reductions are what optimizers' gradients go through. Everything
        else, and `reduce`, `broadcast` and `gather` always, is exact.
        """
        reduce_op = values.check_reduce_op(reduce_op)
        values.check_options(options)
        items = values.items_from_pairs(value_destination_pairs)
        return self._reduce(reduce_op, items, options, approximate=True)

    @no_autograph
    def broadcast(self, tensor: Any, destinations: Any = None) -> Any:
        """Mirrors `tensor` onto `destinations` (None: the tensor's device)."""
        return self.broadcast_implementation(tensor, destinations)

    @no_autograph
    def gather(
        self,
        per_replica_value: Any,
        destinations: Any = None,
        axis: int = 0,
        options: Any = None,
    ) -> Any:
        """Concatenates the replicas' values along `axis` on `destinations`.

        `IndexedSlices` are gathered along axis 0 only: replica r's indices
        are shifted by r times the dense first dimension.
        """
        return self._gather(per_replica_value, destinations, axis, options)

    # ---- TensorFlow's hooks ---------------------------------------------

    @no_autograph
    def reduce_implementation(
        self,
        reduce_op: Any,
        per_replica_value: Any,
        destinations: Any,
        options: Any,
    ) -> Any:
        return self.reduce(reduce_op, per_replica_value, destinations, options)

    @no_autograph
    def batch_reduce_implementation(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any
    ) -> list[Any]:
        return self.batch_reduce(reduce_op, value_destination_pairs, options)

    @no_autograph
    def broadcast_implementation(self, tensor: Any, destinations: Any) -> Any:
        component = values.as_component(tensor, "tensor")
        source = (
            values.canonical_device(component.device, "tensor")
            if component.device
            else ""
        )
        devices = values.resolve_destinations(destinations, [source])
        return values.regroup(
            [values.copy_value(component, d) for d in devices]
        )

    @no_autograph
    def _gather(
        self,
        per_replica_value: Any,
        destinations: Any,
        axis: int,
        options: Any = None,
    ) -> Any:
        values.check_options(options)
        return self._gather_implementation(
            per_replica_value, destinations, axis, options
        )

    @no_autograph
    def _gather_implementation(
        self, per_replica_value: Any, destinations: Any, axis: int, options: Any
    ) -> Any:
        checks.integer(axis, "axis")
        options = self._reducer.options(options)
        item = values.make_item(
            per_replica_value,
            values.unplaced_to_none(per_replica_value, destinations),
            "per_replica_value",
            axis,
        )
        return self._reducer.gather(item, axis, options)

    def _all_reduce(
        self, reduce_op: Any, value: Any, replica_id: int, options: Any
    ) -> Any:
        return self._reducer.replica_all_reduce(
            reduce_op, value, replica_id, options
        )

    # ---- Reducing -------------------------------------------------------

    def _reduce(
        self,
        reduce_op: ReduceOp,
        items: list[Item],
        options: Any,
        approximate: bool,
    ) -> list[Any]:
        """Results in order.

        A one-replica value already in place is copied, as TensorFlow's base
        reduce and batch_reduce do: MirroredStrategy hands over the one
        tensor every replica all-reduces and expects it back. Like
        TensorFlow, the copy keeps the dtype even for MEAN.
        """
        results: list[Any] = [None] * len(items)
        summed: list[int] = []
        devices_of: list[Devices] = []
        for i, item in enumerate(items):
            if (
                len(item.components) == 1
                and item.destinations == item.devices
                and self._reducer.num_workers == 1
            ):
                results[i] = values.copy_value(
                    item.components[0], item.devices[0]
                )
                continue
            devices = self._reducer.devices_for(item)
            if devices is None:
                results[i] = self._reduce_on_one_device(reduce_op, item)
            else:
                summed.append(i)
                devices_of.append(devices)
        if summed:
            reduced = self._all_reduce_items(
                reduce_op,
                [items[i] for i in summed],
                devices_of,
                options,
                approximate,
            )
            for i, result in zip(summed, reduced, strict=True):
                results[i] = result
        return results

    def _all_reduce_items(
        self,
        reduce_op: ReduceOp,
        items: list[Item],
        devices_of: list[Devices],
        options: Any,
        approximate: bool,
    ) -> list[Any]:
        """Each item summed over the devices `devices_of` names for it,
        divided for MEAN, then copied to its destinations."""
        options = self._reducer.options(options)
        by_devices: dict[Devices, list[int]] = {}
        for i, devices in enumerate(devices_of):
            by_devices.setdefault(devices, []).append(i)
        powersgd = self._reducer.wire.powersgd
        if not (approximate and self._reducer.crosses_workers):
            powersgd = None

        def run(components: Batch) -> Batch:
            sums: Batch = [[] for _ in components]
            for devices, indices in by_devices.items():
                batch = [list(components[i]) for i in indices]
                if powersgd is None:
                    summed = self._reducer.sum(batch, devices, options)
                else:
                    all_sum = functools.partial(
                        self._reducer.sum, devices=devices, options=options
                    )
                    summed = powersgd.sum(batch, all_sum, devices)
                for i, per_device in zip(indices, summed, strict=True):
                    if reduce_op == ReduceOp.MEAN:
                        count = len(devices) * self._reducer.num_workers
                        per_device = [
                            values.divide_on_device(v, d, count)
                            for v, d in zip(per_device, devices, strict=True)
                        ]
                    sums[i] = list(per_device)
            return sums

        components = [list(item.components) for item in items]
        signature = (
            "reduce",
            powersgd is not None,
            reduce_op,
            tuple(devices_of),
            values.options_key(options),
            values.type_specs(components),
        )
        sums = self._reducer.run(
            signature, run, components, [list(d) for d in devices_of]
        )
        return [
            values.route(sums[i], devices_of[i], item.destinations)
            for i, item in enumerate(items)
        ]

    def _reduce_on_one_device(self, reduce_op: ReduceOp, item: Item) -> Any:
        one_device = self._reducer.one_device
        device = one_device.device or item.destinations[0]
        if item.sparse:
            total = values.sum_sparse(item.components, device)
        else:
            total = sum_on_device(
                item.components, device, one_device.accumulation_fn
            )
        if reduce_op == ReduceOp.MEAN:
            count = len(item.components) * self._reducer.num_workers
            total = values.divide_on_device(total, device, count)
        return values.regroup(
            [values.copy_value(total, d) for d in item.destinations]
        )


def wire_of(cross_device_ops: Any) -> Any:
    """The `tf_crossdevice.compression.WirePolicy` of any CrossDeviceOps.

    Ours report the policy they were built with; TensorFlow's own classes,
    and None (a strategy's default), send values as they are: the default
    policy.

    >>> tf_crossdevice.ops.wire_of(
    ...     tf_crossdevice.CollectiveAllReduce(compression="bf16")).codec
    'bf16'
    >>> tf_crossdevice.ops.wire_of(
    ...     tf.distribute.ReductionToOneDevice()).compression is None
    True
    """
    if isinstance(cross_device_ops, CrossDeviceOpsAdapter):
        return cross_device_ops.wire
    if cross_device_ops is None or isinstance(
        cross_device_ops, tf.distribute.CrossDeviceOps
    ):
        return WirePolicy()
    raise TypeError(
        "cross_device_ops: expected None or a tf.distribute.CrossDeviceOps, "
        f"got {type(cross_device_ops).__name__} {cross_device_ops!r}"
    )
