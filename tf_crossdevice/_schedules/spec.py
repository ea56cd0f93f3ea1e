"""Parses `all_reduce_spec`: which all-reduce algorithm reduces which tensors.

Pure Python; no TensorFlow.

A spec is a list of ranges. Each range names an `Algorithm`, a shard count
(each packed tensor is split into that many shards, reduced in parallel and
concatenated again) and a size limit in BYTES. A tensor goes to the first
range whose limit it does not exceed (`size_in_bytes <= limit`); the last
range has limit -1, meaning no limit, so every tensor has a range.

(TensorFlow 1's `tf_cnn_benchmarks` documented these limits as bytes in one
place and elements in another, and compared element counts. Here they are
bytes, always.)

Two forms are accepted and mean the same thing:

- Tuples, as TensorFlow 1's `MultiWorkerAllReduce` took them: a string
  `"xring"`; a tuple `(alg,)`, `(alg, shards)` or `(alg, shards, limit)`
  (defaults `shards=1`, `limit=-1`); or a list of such tuples whose limits
  strictly increase and end with -1.
- The `tf_cnn_benchmarks` string grammar::

      spec   ::= range (":" size ":" range)*
      range  ::= alg ("#" shards)?          e.g. "pscpu/pscpu#2"
      size   ::= digits ("k" | "K" | "M" | "G" | "T")?   k = K = 1024 bytes
      shards ::= digits                      a positive integer

  `"pscpu:32k:xring"` reduces tensors of at most 32768 bytes with pscpu and
  the rest with xring.

>>> from tf_crossdevice._schedules import spec
>>> parsed = spec.parse_all_reduce_spec("pscpu:2k:pscpu#2:64k:xring")
>>> for r in parsed:
...     print(r.alg.value, r.shards, r.limit)
pscpu 1 2048
pscpu 2 65536
xring 1 -1
>>> spec.select_range(parsed, 2048).shards
1
>>> spec.select_range(parsed, 2049).shards
2
>>> spec.format_all_reduce_spec([("nccl", 2, 1024), ("pscpu/pscpu", 2, -1)])
'nccl#2:1k:pscpu/pscpu#2'
"""

from __future__ import annotations

import dataclasses
import enum
import operator
import re
from collections.abc import Sequence
from typing import SupportsIndex, TypeAlias


class Algorithm(str, enum.Enum):
    """The all-reduce algorithms an `all_reduce_spec` can name.

    Names with a '/' are hierarchical: the part before the '/' reduces
    within each worker, the part after it across workers.
    """

    NCCL = "nccl"
    NCCL_XRING = "nccl/xring"
    NCCL_RECHD = "nccl/rechd"
    NCCL_PSCPU = "nccl/pscpu"
    XRING = "xring"
    RECHD = "rechd"
    PSCPU = "pscpu"
    PSGPU = "psgpu"
    PSCPU_PSCPU = "pscpu/pscpu"


_VALID_NAMES = ", ".join(sorted(a.value for a in Algorithm))
_BY_NAME = {a.value: a for a in Algorithm}

AlgorithmLike: TypeAlias = Algorithm | str


def to_algorithm(alg: AlgorithmLike) -> Algorithm:
    """Returns the `Algorithm` named by `alg`.

    Args:
        alg: an `Algorithm` or its name, e.g. "pscpu/pscpu".

    Raises:
        ValueError: `alg` names no algorithm (the message lists the valid
            names).

    >>> to_algorithm("nccl/xring")
    <Algorithm.NCCL_XRING: 'nccl/xring'>
    """
    if isinstance(alg, Algorithm):
        return alg
    if isinstance(alg, str) and alg in _BY_NAME:
        return _BY_NAME[alg]
    raise ValueError(
        f"alg: unknown algorithm {alg!r}; expected one of {_VALID_NAMES}"
    )


def is_hierarchical(alg: AlgorithmLike) -> tuple[Algorithm, Algorithm] | None:
    """Splits a hierarchical algorithm into its (inner, outer) parts.

    Args:
        alg: an `Algorithm` or its name.

    Returns:
        `(inner, outer)`: `inner` reduces within each worker, `outer` across
        workers. None if `alg` is not hierarchical.

    Raises:
        ValueError: `alg` names no algorithm.

    >>> is_hierarchical("nccl/xring")
    (<Algorithm.NCCL: 'nccl'>, <Algorithm.XRING: 'xring'>)
    >>> is_hierarchical("xring") is None
    True
    """
    name = to_algorithm(alg).value
    if "/" not in name:
        return None
    inner, outer = name.split("/")
    return _BY_NAME[inner], _BY_NAME[outer]


def uses_nccl(alg: AlgorithmLike) -> bool:
    """Whether `alg` (or its inner or outer part) is NCCL.

    Args:
        alg: an `Algorithm` or its name.

    Raises:
        ValueError: `alg` names no algorithm.

    >>> uses_nccl("nccl/pscpu"), uses_nccl("pscpu/pscpu")
    (True, False)
    """
    return "nccl" in to_algorithm(alg).value.split("/")


@dataclasses.dataclass(frozen=True)
class AllReduceSpecTuple:
    """One range of an all_reduce_spec.

    Attributes:
        alg: the algorithm (a name is converted to an `Algorithm`).
        shards: how many shards each tensor is split into, at least 1.
        limit: the largest tensor, in bytes, this range takes; -1 for no
            limit.

    Raises:
        ValueError: a field is out of range (see Attributes).
    """

    alg: AlgorithmLike
    shards: int = 1
    limit: int = -1

    def __post_init__(self) -> None:
        object.__setattr__(self, "alg", to_algorithm(self.alg))
        object.__setattr__(self, "shards", _check_shards(self.shards))
        object.__setattr__(self, "limit", _check_limit(self.limit))


class _SpecError(Exception):
    """A bad part of a spec; `parse_all_reduce_spec` adds the context."""

    def __init__(self, problem: str, allowed: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.allowed = allowed


def _as_int(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        return None
    try:
        return operator.index(value)  # int, numpy integers
    except TypeError:
        return None


def _check_shards(value: object) -> int:
    n = _as_int(value)
    if n is None or n < 1:
        raise ValueError(f"shards: expected a positive integer, got {value!r}")
    return n


def _check_limit(value: object) -> int:
    n = _as_int(value)
    if n is None or (n < 1 and n != -1):
        raise ValueError(
            "limit: expected a positive number of bytes or -1 (no limit), "
            f"got {value!r}"
        )
    return n


# At most 19 digits: nothing sensible is larger, and int() of a huge digit
# string raises its own ValueError.
_DIGITS = re.compile(r"[0-9]{1,19}", re.ASCII)
# tf_cnn_benchmarks' grammar: int[KkMGT]?.
_SIZE = re.compile(r"([0-9]{1,19})([kKMGT]?)", re.ASCII)
_UNITS = {
    "": 1,
    "k": 1024,
    "K": 1024,
    "M": 1024**2,
    "G": 1024**3,
    "T": 1024**4,
}


def _to_algorithm_or_bad(name: object) -> Algorithm:
    if isinstance(name, str) and name == "":
        raise _SpecError("missing algorithm", f"one of {_VALID_NAMES}")
    try:
        return to_algorithm(name)  # type: ignore[arg-type]
    except ValueError:
        raise _SpecError(
            f"unknown algorithm {name!r}", f"one of {_VALID_NAMES}"
        ) from None


def _parse_range_string(token: str) -> tuple[Algorithm, int]:
    name, hash_sign, shards = token.partition("#")
    alg = _to_algorithm_or_bad(name)
    if not hash_sign:
        return alg, 1
    if not _DIGITS.fullmatch(shards) or int(shards) < 1:
        raise _SpecError(
            f"bad shard count {shards!r} after '#'",
            "a positive integer, e.g. 'xring#2'",
        )
    return alg, int(shards)


def _parse_size_string(token: str) -> int:
    match = _SIZE.fullmatch(token)
    if not match or int(match.group(1)) < 1:
        raise _SpecError(
            f"bad size limit {token!r}",
            "a positive number of bytes, optionally with a suffix k, K "
            "(1024), M (1024**2), G (1024**3) or T (1024**4), e.g. '32k'",
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def _parse_string(spec: str) -> list[tuple[AllReduceSpecTuple, str]]:
    """Returns each range and where it starts, for error messages."""
    parts = spec.split(":")
    if len(parts) % 2 == 0:
        raise _SpecError(
            f"{len(parts) - 1} ':' separator(s); the spec ends in a size "
            "limit with no range after it",
            "alg[#shards] followed by any number of ':size:alg[#shards]'",
        )
    ranges = []
    offset = 0
    for i in range(0, len(parts), 2):
        where = f"in range {i // 2} (character {offset})"
        try:
            alg, shards = _parse_range_string(parts[i])
        except _SpecError as e:
            e.problem = f"{e.problem} {where}"
            raise
        offset += len(parts[i]) + 1
        limit = -1
        if i + 1 < len(parts):
            try:
                limit = _parse_size_string(parts[i + 1])
            except _SpecError as e:
                e.problem = (
                    f"{e.problem} after range {i // 2} (character {offset})"
                )
                raise
            offset += len(parts[i + 1]) + 1
        ranges.append((AllReduceSpecTuple(alg, shards, limit), where))
    return ranges


def _parse_tuple(item: object, where: str) -> AllReduceSpecTuple:
    if isinstance(item, AllReduceSpecTuple):
        return item
    if isinstance(item, str):
        item = (item,)
    if not isinstance(item, tuple) or not 1 <= len(item) <= 3:
        raise _SpecError(
            f"bad range {item!r} {where}",
            "a tuple (alg,), (alg, shards) or (alg, shards, limit)",
        )
    try:
        alg = _to_algorithm_or_bad(item[0])
    except _SpecError as e:
        e.problem = f"{e.problem} {where}"
        raise
    shards = item[1] if len(item) > 1 else 1
    limit = item[2] if len(item) > 2 else -1
    n = _as_int(shards)
    if n is None or n < 1:
        raise _SpecError(
            f"bad shard count {shards!r} {where}", "a positive integer"
        )
    m = _as_int(limit)
    if m is None or (m < 1 and m != -1):
        raise _SpecError(
            f"bad size limit {limit!r} {where}",
            "a positive number of bytes or -1 (no limit)",
        )
    return AllReduceSpecTuple(alg, n, m)


def _check_limits(ranges: list[tuple[AllReduceSpecTuple, str]]) -> None:
    for i, (r, where) in enumerate(ranges):
        last = i == len(ranges) - 1
        if last and r.limit != -1:
            raise _SpecError(
                f"the last range has limit {r.limit}, so larger tensors "
                "would have no algorithm",
                "limit -1 (no limit) on the last range",
            )
        if not last and r.limit == -1:
            raise _SpecError(
                f"limit -1 (no limit) {where}, but more ranges follow",
                "-1 only on the last range",
            )
        if i and not last and r.limit <= ranges[i - 1][0].limit:
            raise _SpecError(
                f"limit {r.limit} {where} does not exceed the previous "
                f"range's limit {ranges[i - 1][0].limit}",
                "limits that strictly increase",
            )


SpecLike: TypeAlias = (
    str | AllReduceSpecTuple | tuple | Sequence[tuple | AllReduceSpecTuple]
)


def parse_all_reduce_spec(spec: SpecLike) -> tuple[AllReduceSpecTuple, ...]:
    """Parses an all_reduce_spec in either form (see the module docstring).

    Args:
        spec: a spec string such as "pscpu:32k:xring"; a tuple
            `(alg[, shards[, limit]])`; an `AllReduceSpecTuple`; or a list or
            tuple of these whose limits strictly increase and end with -1.
            Limits are in bytes.

    Returns:
        One `AllReduceSpecTuple` per range, limits strictly increasing, the
        last -1.

    Raises:
        TypeError: `spec` is not a string, tuple, list or
            `AllReduceSpecTuple`.
        ValueError: `spec` is malformed; the message quotes the spec, names
            the bad range and token, and says what is allowed.

    >>> parse_all_reduce_spec("pscpu/pscpu#2")
    (AllReduceSpecTuple(alg=<Algorithm.PSCPU_PSCPU: 'pscpu/pscpu'>, shards=2, limit=-1),)
    >>> parse_all_reduce_spec("pscpu:32k:xrign")
    Traceback (most recent call last):
    ...
    ValueError: all_reduce_spec 'pscpu:32k:xrign': unknown algorithm 'xrign' in range 1 (character 10); expected one of nccl, nccl/pscpu, nccl/rechd, nccl/xring, pscpu, pscpu/pscpu, psgpu, rechd, xring
    """  # noqa: E501
    try:
        if isinstance(spec, str):
            ranges = _parse_string(spec)
        elif isinstance(spec, AllReduceSpecTuple):
            ranges = [(spec, "in range 0")]
        elif isinstance(spec, tuple | list):
            if not spec:
                raise _SpecError("it is empty", "at least one range")
            # A tuple starting with a name is one range, (alg, shards,
            # limit); a list, or a tuple of tuples, is a list of ranges.
            one = isinstance(spec, tuple) and isinstance(spec[0], str)
            items = [spec] if one else list(spec)
            ranges = [
                (_parse_tuple(item, f"in range {i}"), f"in range {i}")
                for i, item in enumerate(items)
            ]
        else:
            raise TypeError(
                f"all_reduce_spec: expected a string, a tuple or a list of "
                f"tuples, got {type(spec).__name__} {spec!r}"
            )
        _check_limits(ranges)
    except _SpecError as e:
        raise ValueError(
            f"all_reduce_spec {spec!r}: {e.problem}; expected {e.allowed}"
        ) from None
    return tuple(r for r, _ in ranges)


def _format_size(num_bytes: int) -> str:
    for suffix, unit in (
        ("T", 1024**4),
        ("G", 1024**3),
        ("M", 1024**2),
        ("k", 1024),
    ):
        if num_bytes % unit == 0:
            return f"{num_bytes // unit}{suffix}"
    return str(num_bytes)


def format_all_reduce_spec(parsed: SpecLike) -> str:
    """Writes a spec in the canonical string grammar.

    `#1` is left out and sizes use the largest of the suffixes T, G, M, k that
    divides them, so `parse_all_reduce_spec` of the result gives back the
    same ranges.

    Args:
        parsed: anything `parse_all_reduce_spec` accepts, e.g. its result.

    Returns:
        A string such as "pscpu:2k:pscpu#2:64k:xring".

    Raises:
        TypeError, ValueError: as `parse_all_reduce_spec`.

    >>> format_all_reduce_spec([("pscpu", 1, 2048), ("xring", 3, -1)])
    'pscpu:2k:xring#3'
    """
    pieces = []
    for r in parse_all_reduce_spec(parsed):
        alg = to_algorithm(r.alg).value
        pieces.append(alg if r.shards == 1 else f"{alg}#{r.shards}")
        if r.limit != -1:
            pieces.append(_format_size(r.limit))
    return ":".join(pieces)


def select_range(
    parsed: Sequence[AllReduceSpecTuple], size_in_bytes: int
) -> AllReduceSpecTuple:
    """Returns the range that reduces a tensor of `size_in_bytes` bytes.

    That is the first range with `size_in_bytes <= limit` or limit -1.

    Args:
        parsed: the result of `parse_all_reduce_spec`.
        size_in_bytes: the tensor's size in bytes (elements x itemsize), at
            least 0.

    Raises:
        ValueError: `size_in_bytes` is not a non-negative integer, or no
            range takes it (`parsed` did not come from
            `parse_all_reduce_spec`).

    >>> ranges = parse_all_reduce_spec([("nccl", 2, 1024), ("pscpu/pscpu",)])
    >>> select_range(ranges, 1024).alg.value
    'nccl'
    >>> select_range(ranges, 1025).alg.value
    'pscpu/pscpu'
    """
    size = _as_int(size_in_bytes)
    if size is None or size < 0:
        raise ValueError(
            "size_in_bytes: expected a non-negative integer, got "
            f"{size_in_bytes!r}"
        )
    for r in parsed:
        if r.limit == -1 or size <= r.limit:
            return r
    raise ValueError(
        f"parsed: no range takes a tensor of {size} bytes in {parsed!r}; "
        "the last range must have limit -1 (use parse_all_reduce_spec)"
    )
