"""TF 1 `tf.contrib.distribute` behaviour the new classes do not carry.

TF 1's reduce took a `tf.VariableAggregation` (SUM, MEAN) where TF 2 takes a
`tf.distribute.ReduceOp`, and named its arguments `aggregation` and
`per_device_value`. The legacy classes here accept both spellings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice import _ops, _selection

# TF 2's enum and TF 1's (tf.compat.v1.VariableAggregation, which also has
# ONLY_FIRST_TOWER) are different classes in TF 2.21.
_AGGREGATION_TYPES = (tf.VariableAggregation, tf.compat.v1.VariableAggregation)


def as_reduce_op(reduce_op: Any) -> Any:
    """Maps `VariableAggregation.SUM/MEAN` (TF 1's or TF 2's) to the ReduceOp.

    Anything else is returned as is, for the new classes to check.
    """
    if isinstance(reduce_op, _AGGREGATION_TYPES):
        if reduce_op.name not in ("SUM", "MEAN"):
            raise ValueError(
                f"aggregation: {reduce_op} is not a reduction; expected "
                "tf.VariableAggregation.SUM or MEAN (or a "
                "tf.distribute.ReduceOp)"
            )
        return tf.distribute.ReduceOp.from_variable_aggregation(reduce_op)
    return reduce_op


class AcceptsAggregation:
    """Mixin: TF 1 argument names and VariableAggregation reduce ops."""

    def reduce(
        self,
        reduce_op=None,
        per_replica_value=None,
        destinations=None,
        options=None,
        *,
        aggregation=None,
        per_device_value=None,
    ):
        reduce_op = reduce_op if reduce_op is not None else aggregation
        if per_replica_value is None:
            per_replica_value = per_device_value
        return super().reduce(  # type: ignore[misc]
            as_reduce_op(reduce_op), per_replica_value, destinations, options
        )

    def batch_reduce(
        self,
        reduce_op=None,
        value_destination_pairs=None,
        options=None,
        *,
        aggregation=None,
    ):
        reduce_op = reduce_op if reduce_op is not None else aggregation
        return super().batch_reduce(  # type: ignore[misc]
            as_reduce_op(reduce_op), value_destination_pairs, options
        )


class ReductionToOneDeviceCrossTowerOps(
    AcceptsAggregation, _ops.ReductionToOneDevice
):
    """TF 1's name for `tf_crossdevice.ReductionToOneDevice`."""


class AllReduceCrossTowerOps(AcceptsAggregation, _ops.AllReduceCrossDeviceOps):
    """TF 1's name for `tf_crossdevice.AllReduceCrossDeviceOps`."""


def choose_the_best(
    devices: Sequence[str], session_config: Any = None
) -> tf.distribute.CrossDeviceOps:
    """TF 1's name for `select_cross_device_ops`; `session_config` is unused.

    TF 2 reads device links without a session, so the argument only stays
    for old call sites.
    """
    del session_config
    return _selection.select_cross_device_ops(devices)


def collective_hints(
    bytes_per_pack: int = 0, timeout_seconds: float | None = None
) -> Any:
    """TF 2.3's CollectiveHints, now `CommunicationOptions`."""
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds
    )
