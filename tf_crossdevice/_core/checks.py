"""Argument checks shared by every public entry point, in one place.

Pure Python (no TensorFlow), so schedules, builders, classes and the
launcher all call the same checks. One exception type per mistake: a value
of the wrong type is a `TypeError`, a value of the right type outside what
is allowed a `ValueError`. Every message starts with the argument's name as
the caller wrote it, index included (`worker_devices[1]: ...`), then the bad
value and what is allowed.

>>> from tf_crossdevice._core import checks as _checks
>>> _checks.non_negative_int(3, "num_packs")
3
>>> _checks.non_negative_int(-1, "num_packs")
Traceback (most recent call last):
...
ValueError: num_packs: expected an int >= 0, got -1
>>> _checks.positive_int(True, "shards")
Traceback (most recent call last):
...
TypeError: shards: expected an int >= 1, got bool True
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def integer(value: Any, argument: str, minimum: int | None = None) -> int:
    """`value` as an int, if it is one (not a bool) and at least `minimum`.

    Numpy integers count (anything with `__index__`).

    Raises:
        TypeError: `value` is not an integer (a bool is not one here).
        ValueError: `value` is below `minimum`.
    """
    allowed = "an int" if minimum is None else f"an int >= {minimum}"
    try:
        if isinstance(value, bool):
            raise TypeError
        number = operator.index(value)
    except TypeError:
        raise TypeError(
            f"{argument}: expected {allowed}, got {type(value).__name__} "
            f"{value!r}"
        ) from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{argument}: expected {allowed}, got {number}")
    return number


def non_negative_int(value: Any, argument: str) -> int:
    """`value` if it is an int >= 0; see `integer`."""
    return integer(value, argument, minimum=0)


def positive_int(value: Any, argument: str) -> int:
    """`value` if it is an int >= 1; see `integer`."""
    return integer(value, argument, minimum=1)


def index(value: Any, argument: str, count: int, what: str) -> int:
    """`value` if it indexes one of `count` things (`what`, as in "a host
    index"); see `integer`.

    Raises:
        ValueError: `value` is negative or not below `count`.
    """
    number = integer(value, argument, minimum=0)
    if number >= count:
        raise ValueError(
            f"{argument}: expected {what} index below {count}, got {number}"
        )
    return number


def positive_number(value: Any, argument: str) -> float:
    """`value` if it is an int or float (not a bool) greater than 0.

    Raises:
        TypeError: `value` is not a number.
        ValueError: `value` is not greater than 0 (or is NaN).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{argument}: expected a number > 0, got {type(value).__name__} "
            f"{value!r}"
        )
    if not value > 0:
        raise ValueError(f"{argument}: expected a number > 0, got {value}")
    return value


def number_at_least(value: Any, argument: str, least: float) -> float:
    """`value` as a float, if it is an int or float (not a bool) of at
    least `least`.

    >>> number_at_least(2, "rate", 1)
    2.0

    Raises:
        TypeError: `value` is not a number.
        ValueError: `value` is below `least` (or is NaN).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{argument}: expected a number >= {least:g}, got "
            f"{type(value).__name__} {value!r}"
        )
    if not value >= least:  # NaN too
        raise ValueError(
            f"{argument}: expected a number >= {least:g}, got {value}"
        )
    return float(value)


def one_of(value: T, argument: str, allowed: Collection[T]) -> T:
    """`value` if it is one of `allowed` (listed in the message if not).

    Raises:
        ValueError: `value` is not in `allowed`.

    >>> one_of("ring", "implementation", ("AUTO", "RING", "NCCL"))
    Traceback (most recent call last):
    ...
    ValueError: implementation: unknown value 'ring'; expected one of \
AUTO, RING, NCCL
    """
    if value not in allowed:
        raise ValueError(
            f"{argument}: unknown value {value!r}; expected one of "
            f"{', '.join(str(a) for a in allowed)}"
        )
    return value


def string_list(
    value: Any, argument: str, what: str = "string", allow_empty: bool = False
) -> list[str]:
    """`value` as a list, if it is a list or tuple of strings.

    Args:
        value: the argument.
        argument: its name.
        what: what each string is, for the message ("device string").
        allow_empty: whether an empty list is allowed.

    Raises:
        TypeError: `value` is a single string, not a list or tuple, or holds
            something other than a string (named by its index).
        ValueError: `value` is empty and `allow_empty` is false.
    """
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise TypeError(
            f"{argument}: expected a list of {what}s, got "
            f"{type(value).__name__} {value!r}"
        )
    if not value and not allow_empty:
        raise ValueError(f"{argument}: expected at least one {what}, got none")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(
                f"{argument}[{i}]: expected a {what}, got "
                f"{type(item).__name__} {item!r}"
            )
    return list(value)
