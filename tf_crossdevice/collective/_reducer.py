"""The reducer of the collective classes: every worker's replicas.

A collective reducer sums the replicas of every worker: each worker process
holds only its own replicas' values and the processes meet in TensorFlow's
collective ops. So every value runs the collectives, whatever its
destinations (TensorFlow's CollectiveAllReduce does the same), and the
adapter copies the result to the destinations. MEAN divides by every
replica of every worker: local replicas times `num_workers`.

What sums a batch is the reducer's `step` (`FlatStep`: one collective
group of every replica; `HierarchicalStep`: a local reduction, one member
per worker, a local copy back); this module holds what both share: the
workers and local devices, the merged options, the collective groups and
keys, the traced functions and gather.

How many workers there are and which local devices take part come from the
strategy: `tf_crossdevice.MultiWorkerMirroredStrategy` hands each
collective object a bound copy (`bound`). A reducer nobody bound reduces
over the value's own devices and its constructor's worker count; under
`tf.distribute.MirroredStrategy` that is right for one worker only, so
with several workers it refuses there (`check_mirrored_strategy`).

Options are merged as TensorFlow merges CommunicationOptions (a field the
later one leaves at its default keeps the earlier one's value): the
strategy's `communication_options`, then the constructor's `options`, then
the call's `options`.

In eager mode the collectives of one call run inside a tf.function:
eagerly, one device's collective would block before the next device's was
even issued. The traced function is kept per call signature (what the
traced body depends on: reduce op, the values' type specs, devices and
options), so repeated eager calls reuse it instead of tracing anew; the
values are its arguments, never captured constants. Reusing it keeps the
workers' keys in step: group keys are drawn while tracing, from devices
alone, and instance keys when the function is called (`_group`), so a
cached call draws the same keys in the same order as a fresh trace would,
on every worker. TensorFlow's own CollectiveAllReduce runs eager calls in
one thread per device instead.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import tensorflow as tf

from tf_crossdevice._core import tf_internal, values
from tf_crossdevice._core.reducer import Batch, Devices, OneDevice
from tf_crossdevice._core.values import Item, Value
from tf_crossdevice.collective import _runtime as collective_runtime
from tf_crossdevice.collective._group import Group, Options
from tf_crossdevice.collective._sparse import all_gather_sparse
from tf_crossdevice.compression import WirePolicy

_STRATEGY = "tf_crossdevice.MultiWorkerMirroredStrategy"
# Traced functions one reducer keeps; the oldest goes first beyond that.
_TRACED_LIMIT = 64
_shared_keys: Any = None


def shared_collective_keys() -> Any:
    """The process's CollectiveKeys for objects given none.

    Group keys start at 2**20, far above those TensorFlow's own strategies
    draw (from 1), so both can live in one process.
    """
    global _shared_keys
    if _shared_keys is None:
        _shared_keys = tf_internal.collective_keys(group_key_start=2**20)
    return _shared_keys


class Step(Protocol):
    """What sums a batch over every worker's replicas (see the module)."""

    def sum(
        self,
        reducer: CollectiveReducer,
        batch: Batch,
        devices: Devices,
        options: Options,
    ) -> Batch:
        """`result[k][d]`: value k (dense or IndexedSlices) summed over
        every replica of every worker, on `devices[d]`."""

    def replica_all_reduce(
        self,
        reducer: CollectiveReducer,
        reduce_op: Any,
        value: Any,
        replica_id: int,
        options: Any,
    ) -> Any:
        """One replica's share of a replica-context all-reduce."""


class CollectiveReducer:
    """Sums with TensorFlow's collective ops over every worker's replicas.

    Args:
        name: the class that uses it, for messages and group names.
        step: what sums a batch (`FlatStep` or `HierarchicalStep`).
        num_workers: worker processes, until a strategy binds it.
        options: the constructor's CommunicationOptions.
        collective_keys: TensorFlow's CollectiveKeys; None: the process's.
        wire: the wire policy.
    """

    def __init__(
        self,
        name: str,
        step: Step,
        *,
        num_workers: int,
        options: Options,
        collective_keys: Any,
        wire: WirePolicy,
    ) -> None:
        self.name = name
        self.step = step
        self._num_workers = num_workers
        self.constructor_options = options
        self.keys = collective_keys or shared_collective_keys()
        self._wire = wire
        self.local_devices: tuple[str, ...] | None = None
        self._strategy_options = values.check_options(None)
        self._groups: dict[tuple[Any, ...], Group] = {}
        self.traced: dict[tuple[Any, ...], Any] = {}

    # ---- Binding to a strategy ------------------------------------------

    def bound(
        self,
        local_devices: Sequence[str],
        num_workers: int,
        strategy_options: Options,
    ) -> CollectiveReducer:
        """A copy for a strategy: its local devices, workers and options."""
        bound = copy.copy(self)
        bound.local_devices = tuple(
            values.canonical_device(d, "local_devices") for d in local_devices
        )
        bound._num_workers = num_workers
        bound._strategy_options = strategy_options
        bound._groups = {}
        bound.traced = {}
        # A step may keep what it chose for the devices it met (the
        # hierarchical step's local reduction): each copy chooses for its own.
        bound.step = copy.copy(self.step)
        return bound

    def check_mirrored_strategy(self) -> None:
        workers = self._num_workers
        enabled = collective_runtime.enabled_cluster()
        if enabled is not None:
            workers = max(workers, enabled.num_workers)
        # Bound (local devices known) means our strategy drives it.
        if workers > 1 and self.local_devices is None:
            raise ValueError(
                f"{self.name} reduces across {workers} worker "
                "processes, but tf.distribute.MirroredStrategy counts only "
                "this process's replicas (its num_replicas_in_sync, dataset "
                "sharding and loss scaling would be wrong). Use "
                f"{_STRATEGY}(cross_device_ops=...) instead."
            )

    # ---- The reducer protocol -------------------------------------------

    @property
    def num_workers(self) -> int:
        return self._num_workers

    @property
    def crosses_workers(self) -> bool:
        # One worker: nothing crosses a worker boundary, so nothing is
        # worth approximating.
        return self._num_workers > 1

    @property
    def wire(self) -> WirePolicy:
        return self._wire

    @property
    def one_device(self) -> OneDevice:
        return OneDevice()

    def options(self, options: Any) -> Options:
        per_call = values.check_options(options)
        return self._strategy_options.merge(self.constructor_options).merge(
            per_call
        )

    def devices_for(self, item: Item) -> Devices:
        """The local devices whose collectives reduce the item's components.

        Under a strategy, component i is replica i's, whatever device the
        tensor reports (TensorFlow's CollectiveAllReduce also launches by
        position): eager results of `strategy.run` may sit on one device.
        """
        bound = self.local_devices
        if bound is None and tf.distribute.has_strategy():
            # Under tf.distribute.MirroredStrategy: its replicas, in order.
            bound = tuple(
                values.canonical_device(d, "devices")
                for d in tf.distribute.get_strategy().extended.worker_devices
            )
        if bound is not None and len(bound) == len(item.devices):
            return bound
        if len(item.devices) == 1:
            return item.devices if item.devices[0] else ("/device:CPU:0",)
        # Without a strategy the components' devices are the group's
        # members: an unplaced one would put its collective on the client.
        values.check_placed(
            item,
            f"outside a strategy {self.name} runs one collective "
            "on each component's device",
        )
        if len(set(item.devices)) == len(item.devices):
            return item.devices
        raise ValueError(
            f"{item.argument}: its {len(item.devices)} components must be "
            f"on distinct devices, one per replica; got {list(item.devices)}"
        )

    def sum(self, batch: Batch, devices: Devices, options: Options) -> Batch:
        return self.step.sum(self, batch, devices, options)

    def run(
        self,
        signature: tuple[Any, ...],
        fn: Callable[[Any], Any],
        args: Any,
        devices: Any,
    ) -> Any:
        """`fn(args)`, inside a tf.function when executing eagerly.

        The function is traced once per `signature`, which must name all
        that `fn`'s body depends on besides `args`' values. `devices` has
        the structure of `fn`'s result, a device per value: a tf.function's
        eager results come back on the caller's device, so each is copied
        to where it was computed (free between a process's CPUs).
        """
        if not tf.executing_eagerly():
            return fn(args)
        traced = self.traced.get(signature)
        if traced is None:
            if len(self.traced) >= _TRACED_LIMIT:
                del self.traced[next(iter(self.traced))]
            traced = tf.function(fn, autograph=False)
            self.traced[signature] = traced
        results = traced(args)
        return tf.nest.map_structure(
            lambda value, device: (
                value
                if values.canonical_device(values.first_device(value), "value")
                == device
                else values.copy_value(value, device)
            ),
            results,
            devices,
            check_types=False,
        )

    def gather(self, item: Item, axis: int, options: Options) -> Any:
        devices = self.devices_for(item)
        axis = values.check_gather_axis(item, axis)
        group = self.group(devices, len(devices) * self._num_workers)

        def run(components: list[Value]) -> list[Value]:
            return [
                _gather_one(group, d, c, axis, options)
                for d, c in enumerate(components)
            ]

        components = list(item.components)
        signature = (
            "gather",
            axis,
            devices,
            values.options_key(options),
            values.type_specs(components),
        )
        gathered = self.run(signature, run, components, list(devices))
        return values.route(gathered, devices, item.destinations)

    def replica_all_reduce(
        self, reduce_op: Any, value: Any, replica_id: int, options: Any
    ) -> Any:
        return self.step.replica_all_reduce(
            self, reduce_op, value, replica_id, options
        )

    # ---- What the steps share -------------------------------------------

    def group(
        self, devices: Sequence[str], size: int, name: str | None = None
    ) -> Group:
        """The collective group of `size` members whose local members are
        `devices`, named after the class unless `name` is given."""
        key = (tuple(devices), size, name or self.name)
        if key not in self._groups:
            self._groups[key] = Group(self.keys, devices, size, key[2])
        return self._groups[key]


def _gather_one(
    group: Group, index: int, value: Value, axis: int, options: Options
) -> Value:
    with tf.device(group.devices[index]):
        if isinstance(value, tf.IndexedSlices):
            return all_gather_sparse(group, index, value, options)
        if value.shape.rank == 0:
            gathered, _ = group.all_gather_ragged(
                index, tf.reshape(value, [1]), options
            )
            return gathered
        if axis == 0:
            return group.all_gather_ragged(index, value, options)[0]
        rank = value.shape.rank
        perm = [axis, *range(axis), *range(axis + 1, rank)]
        gathered, _ = group.all_gather_ragged(
            index, tf.transpose(value, perm), options
        )
        inverse = [perm.index(i) for i in range(rank)]
        return tf.transpose(gathered, inverse)
