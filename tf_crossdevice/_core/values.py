"""The value model: what a reduction takes and gives back.

A reduction takes values (PerReplica values, tensors, IndexedSlices,
variables) and destinations (None, a DistributedValues, a tensor or
variable, a device string, a list of them). `make_item` turns one pair into
an `Item`: its components, their canonical devices and the destinations'
devices, validated with messages that name the argument. Results are
grouped as TensorFlow groups them (`regroup`: one destination gives the
plain tensor, several a `Mirrored`).

Device strings (and a tensor's device) are completed from the enclosing
`tf.device` scope, as TensorFlow's `device_util.resolve` does. Inside a
tf.function or a TF 1 graph, a tensor built outside any `tf.device` scope
has no device (''); `check_placed` refuses such a component where the
reduction needs its device.

MEAN divides the sum by the number of replicas (`divide`). For integer
dtypes MEAN follows TensorFlow's ReductionToOneDevice and returns the
float64 mean. `IndexedSlices` are summed by concatenating indices and
values, as TensorFlow does, and gathered along axis 0 only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, TypeAlias

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal
from tf_crossdevice._core import devices as devices_lib

ReduceOp: TypeAlias = tf.distribute.ReduceOp
# Nothing here branches on tensor values, so autograph has nothing to convert;
# left to it, it would still rewrite this code on every trace of a user's
# tf.function, which makes tracing slow.
no_autograph = tf.autograph.experimental.do_not_convert
# A dense tensor or tf.IndexedSlices (TensorFlow has no type stubs).
Value: TypeAlias = Any

_VALUE_TYPES = "a DistributedValues, tf.Tensor, tf.IndexedSlices or tf.Variable"
_DESTINATION_TYPES = (
    "None, a DistributedValues, a tf.Tensor or tf.Variable, a device string "
    "or a list of device strings"
)
_PLACE_COMPONENTS = (
    "build each component under `with tf.device(...)`, or use strategy.run "
    "or tf_crossdevice.testing.per_replica"
)


@dataclasses.dataclass(frozen=True)
class Item:
    """One value to reduce: its components, their devices, its destinations.

    `argument` names the value in error messages ("per_replica_value",
    "value_destination_pairs[2]").
    """

    components: tuple[Value, ...]
    devices: tuple[str, ...]
    destinations: tuple[str, ...]
    argument: str = "per_replica_value"

    @property
    def sparse(self) -> bool:
        return is_sparse(self.components[0])


def is_sparse(value: Value) -> bool:
    """Whether `value` is a tf.IndexedSlices (else a dense tensor)."""
    return isinstance(value, tf.IndexedSlices)


def check_reduce_op(reduce_op: Any) -> ReduceOp:
    """Accepts `tf.distribute.ReduceOp` members or the strings 'SUM'/'MEAN'."""
    if isinstance(reduce_op, tf.distribute.ReduceOp):
        return reduce_op
    if isinstance(reduce_op, str) and reduce_op.upper() in ("SUM", "MEAN"):
        return ReduceOp(reduce_op.upper())
    raise ValueError(
        f"reduce_op: expected tf.distribute.ReduceOp.SUM or "
        f"tf.distribute.ReduceOp.MEAN, got {reduce_op!r}"
    )


def check_options(options: Any, argument: str = "options") -> Any:
    """`options`, or default CommunicationOptions for None.

    `tf_crossdevice.compat.CollectiveHints` builds CommunicationOptions too.
    """
    if options is None:
        return tf_internal.CommunicationOptions()
    if not isinstance(options, tf_internal.CommunicationOptions):
        raise TypeError(
            f"{argument}: expected None or "
            "tf.distribute.experimental.CommunicationOptions (or "
            "tf_crossdevice.compat.CollectiveHints), got "
            f"{type(options).__name__} {options!r}"
        )
    return options


def check_gather_axis(item: Item, axis: int) -> int:
    """`axis` if `item` can be gathered along it, counted from 0."""
    if item.sparse:
        if axis != 0:
            raise ValueError(
                f"axis: IndexedSlices can only be gathered along axis 0, "
                f"got {axis}"
            )
        return axis
    rank = item.components[0].shape.rank
    if rank is not None and not -rank <= axis < max(rank, 1):
        raise ValueError(
            f"axis: {axis} is out of range for values of rank {rank}; "
            f"expected {-rank} <= axis < {rank}"
        )
    return axis % rank if rank else axis


def canonical_device(device: Any, argument: str, scoped: bool = False) -> str:
    """Canonical device name; ValueError naming `argument` if unparsable.

    With `scoped`, fields the string leaves out come from the enclosing
    `tf.device` scope, as TensorFlow resolves destination strings.
    """
    if not isinstance(device, str):
        raise TypeError(
            f"{argument}: expected a device string such as "
            f"'/device:CPU:0', got {device!r}"
        )
    if not device:
        raise ValueError(
            f"{argument}: the device string is empty; expected one such as "
            "'/device:CPU:0'"
        )
    try:
        if scoped:
            return tf_internal.resolve_device(device)
        return tf_internal.canonicalize_device(device)
    except (ValueError, TypeError, AssertionError) as e:
        raise ValueError(
            f"{argument}: {device!r} is not a device string such as "
            f"'/device:CPU:0' or '/job:worker/task:1/device:GPU:0' ({e})"
        ) from e


def _device_key(device: str) -> tuple[str, int, int, str, int]:
    name = devices_lib.parse_device(device)
    return (*name.worker, name.device_type or "CPU", name.device_index or 0)


def missing_devices(devices: Sequence[str]) -> list[str]:
    """The devices of `devices` that this process does not have.

    Only devices of jobs this process knows count: those of other jobs (a
    TF 1 Session on a remote cluster, say) cannot be checked here and are
    left to TensorFlow. Listing the devices initializes TensorFlow's
    runtime, after which logical devices can no longer be configured.
    """
    known = {_device_key(d.name) for d in tf.config.list_logical_devices()}
    known_jobs = {key[0] for key in known}
    return [
        device
        for device in devices
        if device
        and _device_key(device)[0] in known_jobs
        and _device_key(device) not in known
    ]


def local_device_names() -> str:
    """This process's devices, for messages: '/device:CPU:0, ...'."""
    return ", ".join(sorted(d.name for d in tf.config.list_logical_devices()))


def check_devices_exist(devices: Sequence[str], argument: str) -> None:
    """ValueError naming `argument` if a device of a known job is missing
    (see `missing_devices`)."""
    missing = missing_devices(devices)
    if missing:
        raise ValueError(
            f"{argument}: device {missing[0]!r} does not exist; this process "
            f"has {local_device_names()}"
        )


def as_component(value: Any, argument: str) -> Value:
    if isinstance(value, tf.IndexedSlices):
        return value
    if isinstance(value, tf.Variable):
        with tf.device(value.device):  # Else the read is unplaced in graphs.
            return value.read_value()
    if isinstance(value, tf.Tensor):
        if value.dtype != value.dtype.base_dtype:
            # A TF 1 reference (float32_ref, from assign_add on a RefVariable):
            # reduce its value, as TensorFlow's own CrossDeviceOps do.
            with tf.device(value.device):
                return tf.identity(value)
        return value
    raise TypeError(
        f"{argument}: expected {_VALUE_TYPES}, got {type(value).__name__} "
        f"{value!r}"
    )


def value_components(
    value: Any, argument: str, concat_axis: int | None = None
) -> tuple[Value, ...]:
    """The per-replica components of `value`, validated.

    Args:
        value: what to reduce or gather.
        argument: the argument's name, for error messages.
        concat_axis: for gather, the axis along which replicas may differ.

    Raises:
        ValueError: no components, or components whose shapes or dtypes differ.
        TypeError: `value` or a component is not a tensor-like value, or its
            dtype is not numeric.
    """
    if isinstance(value, tf_internal.DistributedValues):
        raw = tuple(value.values)
    else:
        raw = (value,)
    if not raw:
        raise ValueError(f"{argument}: has no per-replica values to reduce")
    components = tuple(
        as_component(v, f"{argument} (replica {i})") for i, v in enumerate(raw)
    )
    if any(isinstance(c, tf.IndexedSlices) for c in components) and not all(
        isinstance(c, tf.IndexedSlices) for c in components
    ):
        # A mix of dense and sparse gradients: reduce them densely.
        components = tuple(_densify(c) for c in components)
    components = _same_indices_dtype(components)
    first = components[0]
    dtype = first.dtype
    if not (dtype.is_floating or dtype.is_integer or dtype.is_complex):
        raise TypeError(
            f"{argument}: dtype {dtype.name} cannot be summed; expected a "
            "floating, integer or complex dtype"
        )
    shape = _slice_shape(first, concat_axis)
    for i, c in enumerate(components[1:], start=1):
        if c.dtype != dtype:
            raise ValueError(
                f"{argument}: replica {i} has dtype {c.dtype.name} but "
                f"replica 0 has {dtype.name}; all replicas must match"
            )
        if not _slice_shape(c, concat_axis).is_compatible_with(shape):
            raise ValueError(
                f"{argument}: replica {i} has shape {_shape_of(c)} but "
                f"replica 0 has {_shape_of(first)}; all replicas must match"
            )
    return components


def _slice_shape(value: Value, concat_axis: int | None) -> tf.TensorShape:
    # IndexedSlices of different replicas may hold different numbers of rows,
    # and gather concatenates replicas that differ along its axis.
    if isinstance(value, tf.IndexedSlices):
        return value.values.shape[1:]
    shape = value.shape
    if concat_axis is None or shape.rank is None:
        return shape
    if not -shape.rank <= concat_axis < shape.rank:
        return shape  # gather_on reports the bad axis.
    dims = shape.as_list()
    dims[concat_axis] = None
    return tf.TensorShape(dims)


def _densify(value: Value) -> tf.Tensor:
    with tf.device(value.device):
        return tf.convert_to_tensor(value)


def _same_indices_dtype(components: tuple[Value, ...]) -> tuple[Value, ...]:
    """IndexedSlices of mixed int32/int64 indices, all made int64."""
    if not isinstance(components[0], tf.IndexedSlices):
        return components
    if len({c.indices.dtype for c in components}) == 1:
        return components
    widened = []
    for c in components:
        with tf.device(c.device):
            widened.append(
                tf.IndexedSlices(
                    c.values, tf.cast(c.indices, tf.int64), c.dense_shape
                )
            )
    return tuple(widened)


def _shape_of(value: Value) -> str:
    if isinstance(value, tf.IndexedSlices):
        return f"IndexedSlices rows {value.values.shape[1:]}"
    return str(value.shape)


def resolve_destinations(
    destinations: Any, default: Sequence[str], argument: str = "destinations"
) -> tuple[str, ...]:
    """Canonical destination devices; `default` when destinations is None."""
    if destinations is None:
        devices = list(default)
    elif isinstance(destinations, tf_internal.DistributedValues):
        devices = [v.device for v in destinations.values]
    elif isinstance(destinations, str):
        devices = [destinations]
    elif isinstance(destinations, (tf.Tensor, tf.Variable, tf.IndexedSlices)):
        devices = [destinations.device]
    elif isinstance(destinations, (list, tuple)):
        devices = checks.string_list(destinations, argument, "device string")
    else:
        raise TypeError(
            f"{argument}: expected {_DESTINATION_TYPES}, got "
            f"{type(destinations).__name__}"
        )
    # Devices taken from values may be '' (see make_item); strings may not.
    # Strings and placed tensors resolve against the enclosing tf.device
    # scope (TensorFlow's get_devices_from); a DistributedValues' devices
    # are already complete.
    from_strings = isinstance(destinations, (str, list, tuple))
    scoped = destinations is not None and not isinstance(
        destinations, tf_internal.DistributedValues
    )
    canonical = tuple(
        canonical_device(d, argument, scoped) if d or from_strings else ""
        for d in devices
    )
    check_devices_exist(canonical, argument)
    return canonical


def check_placed(item: Item, reason: str) -> None:
    """ValueError naming `item`'s first component that has no device.

    Inside a tf.function or a TF 1 graph, a tensor built outside any
    `tf.device` scope has device '' (eagerly, every tensor has a device).
    TensorFlow places such a tensor, and whatever consumes it, where it
    likes: usually the client's CPU.

    Args:
        item: the value.
        reason: why the reduction needs each component's device.

    Raises:
        ValueError: a component has device ''.
    """
    for i, device in enumerate(item.devices):
        if not device:
            raise ValueError(
                f"{item.argument}: component {i} of {len(item.devices)} has "
                f"no device (it was built outside any tf.device scope), but "
                f"{reason}; {_PLACE_COMPONENTS}"
            )


def make_item(
    value: Any,
    destinations: Any,
    argument: str,
    concat_axis: int | None = None,
) -> Item:
    """`value` and its destinations, validated, as an Item.

    Raises:
        ValueError: besides `value_components`' and `resolve_destinations`'
            errors, `destinations` is None (the value's own devices) and a
            component of a value of several has no device.
    """
    components = value_components(value, argument, concat_axis)
    # A tensor built without a device scope inside a tf.function or a graph
    # has device ''. Where the reduction does not need the component's
    # device (one device sums, as TensorFlow's ReductionToOneDevice does),
    # TensorFlow places it; where it does, `check_placed` refuses it.
    devices = tuple(
        canonical_device(c.device, argument) if c.device else ""
        for c in components
    )
    dest = resolve_destinations(destinations, devices)
    item = Item(components, devices, dest, argument)
    if destinations is None and len(devices) > 1:
        check_placed(item, "destinations=None means the value's own devices")
    return item


def items_from_pairs(value_destination_pairs: Any) -> list[Item]:
    """`batch_reduce`'s (value, destinations) pairs as Items, validated."""
    if not isinstance(value_destination_pairs, (list, tuple)):
        raise TypeError(
            "value_destination_pairs: expected a list of (value, "
            f"destinations) pairs, got "
            f"{type(value_destination_pairs).__name__}"
        )
    items = []
    for i, pair in enumerate(value_destination_pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise TypeError(
                f"value_destination_pairs[{i}]: expected a (value, "
                f"destinations) pair, got {pair!r}"
            )
        value, destinations = pair
        items.append(
            make_item(
                value,
                unplaced_to_none(value, destinations),
                f"value_destination_pairs[{i}]",
            )
        )
    return items


def divide(value: Value, count: int) -> Value:
    """MEAN's division; integers become the float64 mean, like TensorFlow."""
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            divide(value.values, count), value.indices, value.dense_shape
        )
    if value.dtype.is_integer:
        return tf.math.truediv(tf.cast(value, tf.float64), count)
    return value / tf.cast(count, value.dtype)


def copy_value(value: Value, device: str) -> Value:
    with tf.device(device):
        if isinstance(value, tf.IndexedSlices):
            return tf.IndexedSlices(
                tf.identity(value.values),
                tf.identity(value.indices),
                value.dense_shape,
            )
        return tf.identity(value)


def per_destination(result: Any) -> tuple[Value, ...]:
    """The values of a reduce / broadcast / gather result, one per device.

    The inverse of `regroup`: a plain tensor gives itself, a Mirrored value
    its components.
    """
    if isinstance(result, tf_internal.DistributedValues):
        return tuple(result.values)
    return (result,)


def regroup(values: Sequence[Value]) -> Any:
    """One value per destination, grouped as TensorFlow's `regroup` does.

    One destination gives the plain tensor (or IndexedSlices), several a
    `Mirrored` value: what TensorFlow's own CrossDeviceOps return, so code
    that calls `.numpy()` on a single-device result keeps working.
    """
    if len(values) == 1:
        return values[0]
    return tf_internal.Mirrored(tuple(values))


def sum_sparse(
    components: Sequence[tf.IndexedSlices], device: str
) -> tf.IndexedSlices:
    with tf.device(device):
        return tf.IndexedSlices(
            tf.concat([c.values for c in components], axis=0),
            tf.concat([c.indices for c in components], axis=0),
            components[0].dense_shape,
        )


def _gather_sparse(
    components: Sequence[tf.IndexedSlices], device: str
) -> tf.IndexedSlices:
    """Concatenation along axis 0: replica r's rows follow replica r-1's."""
    with tf.device(device):
        index_dtype = components[0].indices.dtype
        rows = [tf.cast(c.dense_shape[0], index_dtype) for c in components]
        offsets = [tf.constant(0, index_dtype)]
        for r in rows[:-1]:
            offsets.append(offsets[-1] + r)
        dense_shape = tf.concat(
            [
                tf.reshape(tf.cast(tf.add_n(rows), tf.int64), [1]),
                tf.cast(components[0].dense_shape[1:], tf.int64),
            ],
            axis=0,
        )
        return tf.IndexedSlices(
            tf.concat([c.values for c in components], axis=0),
            tf.concat(
                [
                    c.indices + o
                    for c, o in zip(components, offsets, strict=True)
                ],
                axis=0,
            ),
            dense_shape,
        )


def divide_on_device(value: Value, device: str, count: int) -> Value:
    """`divide(value, count)` computed on `device`."""
    with tf.device(device):
        return divide(value, count)


def gather_on(item: Item, axis: int, device: str) -> Value:
    """Gathers on `device`; `axis` as `check_gather_axis` returns it."""
    if item.sparse:
        if any(c.dense_shape is None for c in item.components):
            raise ValueError(
                "per_replica_value: IndexedSlices without dense_shape cannot "
                "be gathered (the row offsets of each replica are unknown)"
            )
        return _gather_sparse(item.components, device)
    with tf.device(device):
        if item.components[0].shape.rank == 0:
            return tf.stack(list(item.components), axis=0)
        return tf.concat(list(item.components), axis=axis)


def unplaced_to_none(value: Any, destinations: Any) -> Any:
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


def options_key(options: Any) -> tuple[Any, ...]:
    """The fields of CommunicationOptions (which compare by identity)."""
    return (
        options.bytes_per_pack,
        options.timeout_seconds,
        options.implementation,
    )


def type_specs(nested: Any) -> tuple[Any, ...]:
    """The type specs (shape, dtype, dense or sparse) of nested values."""
    return tuple(tf.type_spec_from_value(v) for v in tf.nest.flatten(nested))


def first_device(value: Value) -> str:
    """The device of a tensor, or of an IndexedSlices' values."""
    if isinstance(value, tf.IndexedSlices):
        return value.values.device
    return value.device


def route(
    per_device: Sequence[Value],
    devices: tuple[str, ...],
    destinations: tuple[str, ...],
) -> Any:
    """A result summed on `devices`, on `destinations`: the copy already
    there, else the first device's, grouped as `regroup` groups."""
    if destinations == devices:
        return regroup(list(per_device))
    # Every device's part of the reduction must run, also those whose result
    # no destination takes: a TF 1 Session prunes what it does not fetch,
    # and a collective of device 0 would wait for its peers for good.
    everyone = [t for v in per_device for t in _tensors(v)]
    out = []
    with tf.control_dependencies(
        everyone if not tf.executing_eagerly() else []
    ):
        for d in destinations:
            source = (
                per_device[devices.index(d)] if d in devices else per_device[0]
            )
            out.append(copy_value(source, d))
    return regroup(out)


def _tensors(value: Value) -> list[tf.Tensor]:
    if isinstance(value, tf.IndexedSlices):
        return [value.values, value.indices]
    return [value]
