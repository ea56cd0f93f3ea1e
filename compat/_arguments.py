"""The arguments legacy code passes to reduce, batch_reduce and broadcast.

TF 1's contrib classes took `reduce(aggregation, per_device_value,
destinations=None)` with a `tf.VariableAggregation` (and TF 1.10 a
`method_string`, "sum" or "mean"); TF 2.2 took `experimental_hints=` where
TF 2.4 takes `options=`. `LegacyArguments` accepts all of them, positional or
keyword, and hands TF 2's arguments to the class it is mixed into.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from . import _names
from ._warnings import warn_once

# TF 2's enum and TF 1's (which also has ONLY_FIRST_TOWER) are different
# classes in TF 2.21.
_AGGREGATIONS = (tf.VariableAggregation, tf.compat.v1.VariableAggregation)
_ALLOWED = (
    "tf.distribute.ReduceOp.SUM or MEAN, tf.VariableAggregation.SUM, MEAN "
    "or ONLY_FIRST_REPLICA (ONLY_FIRST_TOWER), or the strings 'sum', 'mean' "
    "in any case"
)


class FirstReplica:
    """The reduction of ONLY_FIRST_REPLICA: the first replica's value."""

    def __repr__(self) -> str:
        return "ONLY_FIRST_REPLICA"


FIRST_REPLICA = FirstReplica()


def as_reduce_op(value: Any, argument: str = "reduce_op") -> Any:
    """The TF 2 reduce op for a legacy one, or `FIRST_REPLICA`.

    Args:
        value: a `tf.distribute.ReduceOp`; a `tf.VariableAggregation` (TF 2's
            or TF 1's); or a string naming one of those, in any case.
        argument: the argument's name, for errors.

    Raises:
        ValueError: `value` is NONE (nothing to reduce) or not a reduction.

    >>> as_reduce_op(tf.VariableAggregation.MEAN)
    <ReduceOp.MEAN: 'MEAN'>
    >>> as_reduce_op("Sum")
    <ReduceOp.SUM: 'SUM'>
    """
    if isinstance(value, tf.distribute.ReduceOp):
        return value
    if isinstance(value, _AGGREGATIONS):
        name = value.name
        warn_once(
            f"VariableAggregation.{name}",
            f"tf.VariableAggregation.{name} as a reduce op is deprecated; "
            + (
                f"use {_names.AGGREGATIONS[name]}."
                if name in _names.AGGREGATIONS
                else f"{_names.NOT_REDUCTIONS[name]}."
            ),
            stacklevel=4,
        )
    elif isinstance(value, str):
        name = value.upper()
    else:
        raise ValueError(f"{argument}: expected {_ALLOWED}; got {value!r}")
    if name in _names.AGGREGATIONS:
        return tf.distribute.ReduceOp(name)
    if name in ("ONLY_FIRST_REPLICA", "ONLY_FIRST_TOWER"):
        return FIRST_REPLICA
    if name == "NONE":
        raise ValueError(
            f"{argument}: {value!r}: {_names.NOT_REDUCTIONS['NONE']}; "
            f"expected {_ALLOWED}"
        )
    raise ValueError(f"{argument}: expected {_ALLOWED}; got {value!r}")


def renamed(
    method: str,
    new: str,
    new_value: Any,
    legacy: dict[str, Any],
) -> Any:
    """The value of argument `new`, given under its new or its old names.

    Args:
        method: the method, for messages.
        new: the TF 2 name.
        new_value: what was passed as `new` (None: not passed).
        legacy: old name -> what was passed (None: not passed).

    Raises:
        TypeError: the argument came under two names.
    """
    given = [name for name, v in legacy.items() if v is not None]
    if new_value is not None:
        given.insert(0, new)
    if len(given) > 1:
        raise TypeError(
            f"{method}: got {' and '.join(given)}, which name the same "
            f"argument; pass only {new}"
        )
    for name in given:
        if name != new:
            warn_once(
                f"{method}:{name}",
                f"{method}'s keyword {name}= is deprecated; use {new}= "
                "instead.",
                stacklevel=4,
            )
            return legacy[name]
    return new_value


def check_constructor(
    name: str, init: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Raises unless `init` (a bound `__init__`) takes `args` and `kwargs`.

    Args:
        name: the class, for the message.

    Raises:
        TypeError: an unknown keyword, too many positional arguments or one
            given twice; the message names it and the parameters `init`
            takes.
    """
    signature = inspect.signature(init)
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        parameters = signature.parameters.values()
        taken = ", ".join(p.name for p in parameters) or "no arguments"
        unknown = [
            f"{keyword}={value!r}"
            for keyword, value in kwargs.items()
            if keyword not in signature.parameters
        ]
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in parameters):
            problem = f"unknown keyword {', '.join(unknown)}"
        else:
            problem = str(error)
        raise TypeError(f"{name}: {problem}; it takes {taken}") from None


class LegacyArguments:
    """Mixin for CrossDeviceOps: TF 1 and TF 2.2 arguments, and reduce ops.

    `reduce(aggregation, per_device_value, destinations=None)` as in TF 1,
    `reduce(reduce_op, per_replica_value, destinations, experimental_hints)`
    as in TF 2.2, and TF 2.4's `options=`, all reach the class's TF 2
    `reduce`. ONLY_FIRST_REPLICA copies the first replica's value to the
    destinations. Destinations None mean the value's own devices (TF 1).

    The constructor takes the class's own arguments (TF 1's, for its
    names); any other one is a TypeError naming it and those it takes.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init = super().__init__
        check_constructor(type(self).__name__, init, args, kwargs)
        init(*args, **kwargs)

    def reduce(
        self,
        reduce_op: Any = None,
        per_replica_value: Any = None,
        destinations: Any = None,
        options: Any = None,
        *,
        aggregation: Any = None,
        method_string: Any = None,
        per_device_value: Any = None,
        experimental_hints: Any = None,
    ) -> Any:
        op = renamed(
            "reduce",
            "reduce_op",
            reduce_op,
            {"aggregation": aggregation, "method_string": method_string},
        )
        value = renamed(
            "reduce",
            "per_replica_value",
            per_replica_value,
            {"per_device_value": per_device_value},
        )
        options = renamed(
            "reduce",
            "options",
            options,
            {"experimental_hints": experimental_hints},
        )
        if op is None or value is None:
            raise TypeError(
                "reduce: expected reduce_op (or aggregation) and "
                "per_replica_value (or per_device_value)"
            )
        op = as_reduce_op(op)
        if destinations is None:
            destinations = value
        if op is FIRST_REPLICA:
            return self.broadcast(_first(value), destinations)  # type: ignore[attr-defined]
        return super().reduce(op, value, destinations, options)  # type: ignore[misc]

    def batch_reduce(
        self,
        reduce_op: Any = None,
        value_destination_pairs: Any = None,
        options: Any = None,
        *,
        aggregation: Any = None,
        method_string: Any = None,
        experimental_hints: Any = None,
    ) -> list[Any]:
        op = renamed(
            "batch_reduce",
            "reduce_op",
            reduce_op,
            {"aggregation": aggregation, "method_string": method_string},
        )
        options = renamed(
            "batch_reduce",
            "options",
            options,
            {"experimental_hints": experimental_hints},
        )
        if op is None or value_destination_pairs is None:
            raise TypeError(
                "batch_reduce: expected reduce_op (or aggregation) and "
                "value_destination_pairs"
            )
        op = as_reduce_op(op)
        if not isinstance(value_destination_pairs, (list, tuple)):
            raise ValueError(
                "value_destination_pairs: expected a list of (value, "
                "destinations) tuples, got "
                f"{type(value_destination_pairs).__name__}"
            )
        pairs = []
        for pair in value_destination_pairs:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(
                    "value_destination_pairs: expected (value, destinations) "
                    f"tuples, got {pair!r}"
                )
            value, destinations = pair
            pairs.append(
                (value, value if destinations is None else destinations)
            )
        if op is FIRST_REPLICA:
            return [self.broadcast(_first(v), d) for v, d in pairs]  # type: ignore[attr-defined]
        return super().batch_reduce(op, pairs, options)  # type: ignore[misc]


def _first(value: Any) -> Any:
    values = getattr(value, "values", None)
    if isinstance(values, tuple):  # a DistributedValues
        return values[0]
    return value
