"""What the collective classes share: options, binding, routing, gather.

A collective class reduces the replicas of every worker: each worker
process holds only its own replicas' values and the processes meet in
TensorFlow's collective ops. So every reduce runs the collectives, whatever
the destinations (TensorFlow's CollectiveAllReduce does the same), and the
result is then copied to the destinations. MEAN divides by every replica
of every worker: local replicas times `_num_between_graph_workers`.

How many workers there are and which local devices take part come from
the strategy: `tf_crossdevice.MultiWorkerMirroredStrategy` hands each
collective object a bound copy (`_bound_to`). An object nobody bound
reduces over the value's own devices and its constructor's worker count;
under `tf.distribute.MirroredStrategy` that is right for one worker only,
so with several workers the object refuses there (see `__bool__`).

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
alone, and instance keys when the function is called
(`_group`), so a cached call draws the same keys in the same
order as a fresh trace would, on every worker. TensorFlow's own
CollectiveAllReduce runs eager calls in one thread per device instead.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal
from tf_crossdevice.collective import _runtime as collective_runtime
from tf_crossdevice.collective._group import Group, Options
from tf_crossdevice.compression._powersgd import PowerSGD, split_compression
from tf_crossdevice.ops import _base
from tf_crossdevice.ops._base import Item, ReduceOp, Value

_STRATEGY = "tf_crossdevice.MultiWorkerMirroredStrategy"
# Traced functions one object keeps; the oldest goes first beyond that.
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


class CollectiveOpsBase(_base.CrossDeviceOpsBase):
    """Binding, options, destinations, MEAN and gather for collectives.

    Subclasses implement `_sum_group`.
    """

    def __init__(
        self,
        num_workers: int,
        options: Any,
        collective_keys: Any,
        compression: str | PowerSGD | None = None,
    ) -> None:
        super().__init__()
        self._num_workers = checks.positive_int(num_workers, "num_workers")
        # A PowerSGD compressor approximates the sums of batch reductions
        # (gradients); the wire codec, if any, applies to every reduction.
        self._compression, self._powersgd = split_compression(compression)
        self._options = _base.check_options(options)
        if collective_keys is not None and not tf_internal.is_collective_keys(
            collective_keys
        ):
            raise TypeError(
                "collective_keys: expected None or TensorFlow's "
                "CollectiveKeys (tensorflow.python.distribute."
                "cross_device_utils.CollectiveKeys), got "
                f"{type(collective_keys).__name__} {collective_keys!r}"
            )
        self._keys = collective_keys or shared_collective_keys()
        self._local_devices: tuple[str, ...] | None = None
        self._strategy_options = _base.check_options(None)
        self._bound = False
        self._groups: dict[tuple[Any, ...], Group] = {}
        self._traced: dict[tuple[Any, ...], Any] = {}

    @property
    def compression(self) -> str | PowerSGD | None:
        """None, the wire codec ("bf16" or "fp16") or the PowerSGD
        compressor of batch reductions."""
        return self._powersgd or self._compression

    # ---- Binding to a strategy ------------------------------------------

    @property
    def _num_between_graph_workers(self) -> int:
        return self._num_workers

    def _bound_to(
        self,
        local_devices: Sequence[str],
        num_workers: int,
        strategy_options: Options,
    ) -> CollectiveOpsBase:
        """A copy for a strategy: its local devices, workers and options."""
        bound = copy.copy(self)
        bound._local_devices = tuple(
            _base.canonical_device(d, "local_devices") for d in local_devices
        )
        bound._num_workers = num_workers
        bound._strategy_options = strategy_options
        bound._bound = True
        bound._groups = {}
        bound._traced = {}
        return bound

    def __bool__(self) -> bool:
        # tf.distribute.MirroredStrategy tests `if cross_device_ops:` in its
        # constructor: the one moment to stop it from training with a
        # gradient scale that ignores the other workers.
        workers = self._num_workers
        enabled = collective_runtime.enabled_cluster()
        if enabled is not None:
            workers = max(workers, enabled.num_workers)
        if workers > 1 and not self._bound:
            raise ValueError(
                f"{type(self).__name__} reduces across {workers} worker "
                "processes, but tf.distribute.MirroredStrategy counts only "
                "this process's replicas (its num_replicas_in_sync, dataset "
                "sharding and loss scaling would be wrong). Use "
                f"{_STRATEGY}(cross_device_ops=...) instead."
            )
        return True

    def _call_options(self, options: Any) -> Options:
        per_call = _base.check_options(options)
        return self._strategy_options.merge(self._options).merge(per_call)

    def _group(self, devices: Sequence[str], size: int, name: str) -> Group:
        key = (tuple(devices), size, name)
        if key not in self._groups:
            self._groups[key] = Group(self._keys, devices, size, name)
        return self._groups[key]

    def _devices_of(self, item: Item) -> tuple[str, ...]:
        """The local devices whose collectives reduce the item's components.

        Under a strategy, component i is replica i's, whatever device the
        tensor reports (TensorFlow's CollectiveAllReduce also launches by
        position): eager results of `strategy.run` may sit on one device.
        """
        bound = self._local_devices
        if bound is None and tf.distribute.has_strategy():
            # Under tf.distribute.MirroredStrategy: its replicas, in order.
            bound = tuple(
                _base.canonical_device(d, "devices")
                for d in tf.distribute.get_strategy().extended.worker_devices
            )
        if bound is not None and len(bound) == len(item.devices):
            return bound
        if len(item.devices) == 1:
            return item.devices if item.devices[0] else ("/device:CPU:0",)
        # Without a strategy the components' devices are the group's
        # members: an unplaced one would put its collective on the client.
        _base.check_placed(
            item,
            f"outside a strategy {type(self).__name__} runs one collective "
            "on each component's device",
        )
        if len(set(item.devices)) == len(item.devices):
            return item.devices
        raise ValueError(
            f"{item.argument}: its {len(item.devices)} components must be "
            f"on distinct devices, one per replica; got {list(item.devices)}"
        )

    # ---- What subclasses implement ----------------------------------------

    def _sum_group(
        self,
        batch: Sequence[Sequence[Value]],
        devices: tuple[str, ...],
        options: Options,
    ) -> list[list[Value]]:
        """Sums every value of `batch` across every worker's replicas.

        Args:
            batch: `batch[k][d]`: value k's component on `devices[d]`; dense
                tensors or IndexedSlices (a value is one or the other).
            devices: this worker's devices, the same for every value.
            options: the merged options.

        Returns:
            `result[k][d]`: value k's sum on `devices[d]`.
        """
        raise NotImplementedError

    # ---- Reduce -----------------------------------------------------------

    @_base._no_autograph
    def batch_reduce(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any = None
    ) -> list[Any]:
        """Reduces several (value, destinations) pairs in one go.

        With a PowerSGD `compression` and more than one worker, the sums of
        the float32/float64 matrices it compresses are its low-rank
        approximations (see `tf_crossdevice.compression.PowerSGD`): batch
        reductions are what optimizers' gradients go through. Everything
        else, and `reduce`, `broadcast` and `gather` always, is exact.
        """
        if self._powersgd is None or self._num_workers == 1:
            # One worker: nothing crosses a worker boundary, so nothing is
            # worth approximating.
            return super().batch_reduce(
                reduce_op, value_destination_pairs, options
            )
        reduce_op = _base.check_reduce_op(reduce_op)
        options = _base.check_options(options)
        items = self._items_from_pairs(value_destination_pairs)
        return self._reduce_batch(reduce_op, items, options, compress=True)

    def _items_from_pairs(self, value_destination_pairs: Any) -> list[Item]:
        if isinstance(value_destination_pairs, (list, tuple)):
            value_destination_pairs = [
                (pair[0], _unplaced_to_none(pair[0], pair[1]))
                if isinstance(pair, (list, tuple)) and len(pair) == 2
                else pair
                for pair in value_destination_pairs
            ]
        return super()._items_from_pairs(value_destination_pairs)

    def _reduce_batch(
        self,
        reduce_op: ReduceOp,
        items: list[Item],
        options: Any,
        compress: bool = False,
    ) -> list[Any]:
        """Every item through the collectives (the base class already
        copied one-replica values in place, when there is one worker);
        through the PowerSGD compressor when `compress`."""
        if not items:
            return []
        options = self._call_options(options)
        devices_of = [self._devices_of(item) for item in items]
        by_devices: dict[tuple[str, ...], list[int]] = {}
        for i, devices in enumerate(devices_of):
            by_devices.setdefault(devices, []).append(i)

        def run(components: list[list[Value]]) -> list[list[Value]]:
            sums: list[Any] = [None] * len(components)
            for devices, indices in by_devices.items():
                batch = [list(components[i]) for i in indices]
                if compress and self._powersgd is not None:
                    summed = self._powersgd.sum(
                        batch,
                        _group_sum(self, devices, options),
                        devices,
                    )
                else:
                    summed = self._sum_group(batch, devices, options)
                for i, per_device in zip(indices, summed, strict=True):
                    if reduce_op == ReduceOp.MEAN:
                        count = len(devices) * self._num_workers
                        per_device = [
                            _on_device(_base.divide, v, d, count)
                            for v, d in zip(per_device, devices, strict=True)
                        ]
                    sums[i] = per_device
            return sums

        components = [list(item.components) for item in items]
        signature = (
            "reduce",
            compress,
            reduce_op,
            tuple(devices_of),
            _options_key(options),
            _specs(components),
        )
        sums = self._run_collectives(
            signature, run, components, [list(d) for d in devices_of]
        )
        return [
            _route(sums[i], devices_of[i], item.destinations)
            for i, item in enumerate(items)
        ]

    def _run_collectives(
        self,
        signature: tuple[Any, ...],
        fn: Any,
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
        traced = self._traced.get(signature)
        if traced is None:
            if len(self._traced) >= _TRACED_LIMIT:
                del self._traced[next(iter(self._traced))]
            traced = tf.function(fn, autograph=False)
            self._traced[signature] = traced
        results = traced(args)
        return tf.nest.map_structure(
            lambda value, device: (
                value
                if _base.canonical_device(_first_device(value), "value")
                == device
                else _base.copy_value(value, device)
            ),
            results,
            devices,
            check_types=False,
        )

    # ---- Gather -----------------------------------------------------------

    @_base._no_autograph
    def _gather_implementation(
        self, per_replica_value, destinations, axis, options
    ):
        checks.integer(axis, "axis")
        options = self._call_options(options)
        item = _base.make_item(
            per_replica_value,
            _unplaced_to_none(per_replica_value, destinations),
            "per_replica_value",
            axis,
        )
        devices = self._devices_of(item)
        axis = _base.check_gather_axis(item, axis)
        group = self._group(
            devices, len(devices) * self._num_workers, type(self).__name__
        )

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
            _options_key(options),
            _specs(components),
        )
        gathered = self._run_collectives(
            signature, run, components, list(devices)
        )
        return _route(gathered, devices, item.destinations)

    # ---- Replica context ----------------------------------------------------

    def _all_reduce(self, reduce_op, value, replica_id, options):
        raise NotImplementedError(
            f"{type(self).__name__} reduces in cross-replica context "
            "(merge_call) only"
        )


def launch_order(units: Sequence[list[int]]) -> list[list[int]]:
    """`units` in the order to issue their collectives: last values first.

    Each unit is the indices of the values one collective (or one
    IndexedSlices' gathers) carries. Values come in variable order and
    backpropagation computes the last variables' gradients first, so a
    unit can start once the gradient of its lowest index exists. A device's
    collectives run in the order they are issued (the ordering token), so
    a unit issued early that waits for the first layer's gradient (an
    Embedding's IndexedSlices, say) would hold every later one until the
    backward pass ends; issued by descending lowest index, the first
    collective needs only the last layers' gradients and the others follow
    as theirs arrive. Every member issues the same order: it depends on
    the values' positions alone. The packing forms dense packs last value
    first already, so among them this keeps its order; what it moves is
    the IndexedSlices, each to where its variable's gradient arrives.

    >>> launch_order([[4, 3], [1, 0], [2]])
    [[4, 3], [2], [1, 0]]
    """
    return sorted(units, key=lambda unit: -min(unit))


def _group_sum(
    ops: CollectiveOpsBase, devices: tuple[str, ...], options: Options
) -> Any:
    """The collective sum of a batch over `devices`, for PowerSGD."""

    def all_sum(batch: list[list[Value]]) -> list[list[Value]]:
        return ops._sum_group(batch, devices, options)

    return all_sum


def _unplaced_to_none(value: Any, destinations: Any) -> Any:
    """None for destinations '' that are an unplaced tensor's own device.

    ReplicaContext.all_reduce and all_gather merge_call with each tensor's
    own device as its destinations (TensorFlow's _batch_reduce_destination).
    With one local replica, inside a tf.function, that device is '': the
    tensor was left for TensorFlow to place, and '' means "where the value
    is", as None does. Refusing it made replica-context all_reduce and
    all_gather fail with one device per worker (TensorFlow's own strategy
    fails there too: "destinations can not be empty").
    """
    if (
        isinstance(destinations, str)
        and destinations == getattr(value, "device", None) == ""
    ):
        return None
    return destinations


def _options_key(options: Options) -> tuple[Any, ...]:
    """The fields of CommunicationOptions (which compare by identity)."""
    return (
        options.bytes_per_pack,
        options.timeout_seconds,
        options.implementation,
    )


def _specs(values: Any) -> tuple[Any, ...]:
    """The type specs (shape, dtype, dense or sparse) of nested values."""
    return tuple(tf.type_spec_from_value(v) for v in tf.nest.flatten(values))


def _first_device(value: Value) -> str:
    if isinstance(value, tf.IndexedSlices):
        return value.values.device
    return value.device


def _on_device(fn: Any, value: Value, device: str, *args: Any) -> Value:
    with tf.device(device):
        return fn(value, *args)


def _route(
    per_device: Sequence[Value],
    devices: tuple[str, ...],
    destinations: tuple[str, ...],
) -> Any:
    """The result on `destinations`: the copy already there, else the first."""
    if destinations == devices:
        return _base.regroup(list(per_device))
    # Every device's collective must run, also those whose result no
    # destination takes: a TF 1 Session prunes what it does not fetch, and
    # the collective of device 0 would wait for its peers for good.
    everyone = [t for v in per_device for t in _tensors(v)]
    out = []
    with tf.control_dependencies(
        everyone if not tf.executing_eagerly() else []
    ):
        for d in destinations:
            source = (
                per_device[devices.index(d)] if d in devices else per_device[0]
            )
            out.append(_base.copy_value(source, d))
    return _base.regroup(out)


def _tensors(value: Value) -> list[tf.Tensor]:
    if isinstance(value, tf.IndexedSlices):
        return [value.values, value.indices]
    return [value]


def all_gather_sparse(
    group: Group, index: int, value: tf.IndexedSlices, options: Options
) -> tf.IndexedSlices:
    """Every member's IndexedSlices as one, member m's rows after m-1's."""
    values, lengths = group.all_gather_ragged(index, value.values, options)
    indices, _ = group.all_gather_ragged(index, value.indices, options)
    rows = group.all_gather(
        index, tf.cast(value.dense_shape[:1], tf.int64), options
    )
    offsets = tf.cumsum(rows, exclusive=True)
    shift = tf.repeat(offsets, lengths)
    dense_shape = tf.concat(
        [
            tf.reduce_sum(rows, keepdims=True),
            tf.cast(value.dense_shape[1:], tf.int64),
        ],
        axis=0,
    )
    return tf.IndexedSlices(
        values, indices + tf.cast(shift, indices.dtype), dense_shape
    )


def all_reduce_sparse(
    group: Group, index: int, value: tf.IndexedSlices, options: Options
) -> tf.IndexedSlices:
    """The sum of every member's IndexedSlices: all their rows, unmerged."""
    values, _ = group.all_gather_ragged(index, value.values, options)
    indices, _ = group.all_gather_ragged(index, value.indices, options)
    return tf.IndexedSlices(values, indices, value.dense_shape)


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
