"""The legacy CrossDeviceOps classes, TF 1's strategy call, CollectiveHints.

Each class is the new one plus `LegacyArguments`: the same algorithm, the
old arguments. `CrossTowerOps` (TF 1) and `CrossDeviceOps` (tf.compat.v1)
are the base for legacy subclasses: a TF 1 subclass implements `_reduce`,
`_batch_reduce` and maybe `_broadcast`; a TF 2 one the `*_implementation`
hooks.

Each name keeps its own TensorFlow's value contract. TF 1's names (the
`*CrossTowerOps` classes, `MultiWorkerAllReduce`, `CollectiveAllReduce`) add
`TF1Results`: reduce, batch_reduce and broadcast give a TF 1 `Mirrored`
(see `_values`) for every destination count. The tf.compat.v1 and TF 2.2
names (`CrossDeviceOps`, `ReductionToOneDevice`, `NcclAllReduce`,
`HierarchicalCopyAllReduce`) give what TF 2 gives: a plain tensor for one
destination.
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

import tf_crossdevice

from ._arguments import LegacyArguments
from ._values import tf1_mirrored


class TF1Results:
    """Mixin: TF 1's value contract for reduce, batch_reduce and broadcast.

    TF 1's cross_tower_ops returned a `Mirrored` whatever the number of
    destinations (TF 2 returns the plain tensor for one). Mixed in after
    `LegacyArguments` (whose deprecation warnings count stack frames), it
    wraps what the class below returns in
    `tf_crossdevice.compat`'s `Mirrored`, which has TF 1's `get(device)`,
    `devices` and `on_device(device)`. batch_reduce gives a list of them.
    """

    def reduce(self, *args: Any, **kwargs: Any) -> Any:
        return tf1_mirrored(super().reduce(*args, **kwargs))  # type: ignore[misc]

    def batch_reduce(self, *args: Any, **kwargs: Any) -> list[Any]:
        results = super().batch_reduce(*args, **kwargs)  # type: ignore[misc]
        return [tf1_mirrored(result) for result in results]

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        return tf1_mirrored(super().broadcast(*args, **kwargs))  # type: ignore[misc]


class CrossDeviceOps(
    LegacyArguments, tf.distribute.CrossDeviceOps, metaclass=abc.ABCMeta
):
    """TF 1's CrossTowerOps and tf.compat.v1's CrossDeviceOps: a base class.

    A subclass implements TF 2's `reduce_implementation` (and the other
    hooks), or TF 1's `_reduce(reduce_op, per_replica_value, destinations)`
    and `_batch_reduce(reduce_op, value_destination_pairs)`; TF 1's hooks
    get a `tf.distribute.ReduceOp`, where contrib passed a
    VariableAggregation. Every legacy class of `tf_crossdevice.compat` is an
    instance of this one.
    """

    def reduce_implementation(
        self,
        reduce_op: Any,
        per_replica_value: Any,
        destinations: Any,
        options: Any,
    ) -> Any:
        return self._reduce(reduce_op, per_replica_value, destinations)

    def batch_reduce_implementation(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any
    ) -> Any:
        return self._batch_reduce(reduce_op, value_destination_pairs)

    def broadcast_implementation(self, tensor: Any, destinations: Any) -> Any:
        return self._broadcast(tensor, destinations)

    def _reduce(
        self, reduce_op: Any, per_replica_value: Any, destinations: Any
    ) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__}: implement reduce_implementation (TF 2) "
            "or _reduce (TF 1)"
        )

    def _batch_reduce(
        self, reduce_op: Any, value_destination_pairs: Any
    ) -> Any:
        return [
            self._reduce(reduce_op, v, d) for v, d in value_destination_pairs
        ]

    def _broadcast(self, tensor: Any, destinations: Any) -> Any:
        return super().broadcast_implementation(tensor, destinations)

    def __repr__(self) -> str:
        # The base classes take no arguments; a subclass's own constructor
        # is unknown here, so it keeps Python's repr.
        if type(self) in (CrossDeviceOps, CrossTowerOps):
            return f"{type(self).__name__}()"
        return super().__repr__()


class CrossTowerOps(CrossDeviceOps, TF1Results, tf.distribute.CrossDeviceOps):
    """TF 1's CrossTowerOps: the base class, with TF 1's value contract.

    As `CrossDeviceOps` (TF 1's `_reduce` / `_batch_reduce` hooks, or TF 2's
    `*_implementation` ones), but reduce, batch_reduce and broadcast give a
    TF 1 `Mirrored` for every destination count, as TF 1 did.
    """


class ReductionToOneDeviceCrossTowerOps(
    LegacyArguments, TF1Results, tf_crossdevice.ReductionToOneDevice
):
    """TF 1's name for `tf_crossdevice.ReductionToOneDevice`.

    Results are TF 1 `Mirrored` values, one destination included:

    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant(1.0), tf.constant(3.0)])
    >>> ops = ReductionToOneDeviceCrossTowerOps()
    >>> float(ops.reduce(ReduceOp.MEAN, value, "/cpu:0").get("/cpu:0"))
    2.0
    >>> total = ops.reduce("sum", value, None)
    >>> [float(total.get(d)) for d in ("/cpu:0", "/cpu:1")]
    [4.0, 4.0]
    """


class ReductionToOneDevice(
    LegacyArguments, tf_crossdevice.ReductionToOneDevice
):
    """tf.compat.v1's name for `tf_crossdevice.ReductionToOneDevice`."""


class AllReduceCrossTowerOps(
    LegacyArguments, TF1Results, tf_crossdevice.AllReduceCrossDeviceOps
):
    """TF 1's name for `tf_crossdevice.AllReduceCrossDeviceOps`."""


class NcclAllReduce(LegacyArguments, tf_crossdevice.NcclAllReduce):
    """tf.compat.v1's name for `tf_crossdevice.NcclAllReduce`."""


class HierarchicalCopyAllReduce(
    LegacyArguments, tf_crossdevice.HierarchicalCopyAllReduce
):
    """tf.compat.v1's name for `tf_crossdevice.HierarchicalCopyAllReduce`."""


class MultiWorkerAllReduce(
    LegacyArguments, TF1Results, tf_crossdevice.MultiWorkerAllReduce
):
    """TF 1's `MultiWorkerAllReduce`: TF 1's arguments and results."""


class CollectiveAllReduce(
    LegacyArguments, TF1Results, tf_crossdevice.CollectiveAllReduce
):
    """TF 1's `CollectiveAllReduce`: TF 1's arguments, defaults and results.

    TF 1's default groups every 32 values into one collective; the new
    name's default packs by size instead (see
    `tf_crossdevice.CollectiveAllReduce`).
    """

    def __init__(
        self,
        num_workers: Any = 1,
        num_gpus_per_worker: Any = 0,
        all_reduce_merge_scope: Any = 32,
        collective_keys: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            num_workers,
            num_gpus_per_worker,
            all_reduce_merge_scope,
            collective_keys,
            **kwargs,
        )


# isinstance(ops, CrossTowerOps) holds for every legacy class, as TF 1 code
# checks; only TF 1's names (and CrossTowerOps subclasses) give TF 1 values.
for _legacy in (
    ReductionToOneDeviceCrossTowerOps,
    ReductionToOneDevice,
    AllReduceCrossTowerOps,
    NcclAllReduce,
    HierarchicalCopyAllReduce,
    MultiWorkerAllReduce,
    CollectiveAllReduce,
):
    CrossTowerOps.register(_legacy)

ReduceOp = tf.distribute.ReduceOp

AllReduceSpecTuple = collections.namedtuple(
    "AllReduceSpecTuple", ["alg", "shards", "limit"]
)
AllReduceSpecTuple.__doc__ = """TF 1's named (alg, shards, limit) spec tuple.

`all_reduce_spec` takes it like any tuple:

>>> spec = AllReduceSpecTuple("pscpu", 1, -1)
>>> tf_crossdevice.MultiWorkerAllReduce(["/job:localhost"], 0, [spec])
MultiWorkerAllReduce(worker_devices=['/job:localhost'], \
num_gpus_per_worker=0, all_reduce_spec=[AllReduceSpecTuple(alg='pscpu', \
shards=1, limit=-1)])
"""


def choose_the_best(
    devices: Sequence[str], session_config: Any = None
) -> tf.distribute.CrossDeviceOps:
    """TF 1's `select_cross_device_ops`; `session_config` is ignored.

    TensorFlow 2 reads device links without a Session.

    >>> ops = choose_the_best(["/cpu:0", "/cpu:1"], session_config=None)
    >>> isinstance(ops, tf.distribute.CrossDeviceOps)
    True
    """
    del session_config
    return tf_crossdevice.select_cross_device_ops(list(devices))


def collective_hints(
    bytes_per_pack: int = 0, timeout_seconds: float | None = None
) -> Any:
    """TF 2.2's `CollectiveHints`: now `CommunicationOptions`.

    >>> collective_hints(bytes_per_pack=1024).bytes_per_pack
    1024
    """
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds
    )


def mirrored_strategy(
    devices: Sequence[str] | None = None,
    num_gpus: int | None = None,
    cross_tower_ops: tf.distribute.CrossDeviceOps | None = None,
) -> tf.distribute.MirroredStrategy:
    """TF 1's `tf.contrib.distribute.MirroredStrategy`: TF 2's strategy.

    Args:
        devices: the devices to mirror on; None: see `num_gpus`.
        num_gpus: with `devices` None, mirror on "/gpu:0" ... (0: "/cpu:0");
            both None: every GPU, else the CPU (TF 2's default).
        cross_tower_ops: the `cross_device_ops` of TF 2's strategy.

    Raises:
        TypeError: `num_gpus` is not an int.
        ValueError: both `devices` and `num_gpus` are given, or `num_gpus`
            is negative.

    >>> strategy = mirrored_strategy(
    ...     ["/cpu:0", "/cpu:1"], cross_tower_ops=ReductionToOneDevice())
    >>> strategy.num_replicas_in_sync
    2
    """
    if devices is not None and num_gpus is not None:
        raise ValueError(
            f"num_gpus: give devices or num_gpus, not both (got devices="
            f"{list(devices)!r} and num_gpus={num_gpus!r})"
        )
    if num_gpus is not None:
        # range() refuses what is not an int, as TF 1's strategy did; TF 1
        # failed on a negative count with an assertion, this names it.
        gpus = [f"/gpu:{i}" for i in range(num_gpus)]
        if num_gpus < 0:
            raise ValueError(
                f"num_gpus: expected 0 or more GPUs, got {num_gpus!r}"
            )
        devices = gpus or ["/cpu:0"]
    if cross_tower_ops is not None and not isinstance(
        cross_tower_ops, tf.distribute.CrossDeviceOps
    ):
        raise TypeError(
            "cross_tower_ops: expected None or a tf.distribute.CrossDeviceOps "
            f"(e.g. tf_crossdevice.compat.AllReduceCrossTowerOps()), got "
            f"{type(cross_tower_ops).__name__}"
        )
    return tf.distribute.MirroredStrategy(
        devices=None if devices is None else list(devices),
        cross_device_ops=cross_tower_ops,
    )
