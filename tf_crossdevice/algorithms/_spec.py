"""Parses `all_reduce_spec`: which all-reduce algorithm reduces which tensors.

Pure Python; no TensorFlow.

A spec is a list of ranges. Each range names an algorithm, a shard count
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

>>> from tf_crossdevice.algorithms import _spec as spec
>>> names = {"pscpu", "xring"}  # SpecAllReduce passes the registry's names.
>>> parsed = spec.parse_all_reduce_spec("pscpu:2k:pscpu#2:64k:xring", names)
>>> for r in parsed:
...     print(r.alg, r.shards, r.limit)
pscpu 1 2048
pscpu 2 65536
xring 1 -1
>>> spec.select_range(parsed, 2048).shards
1
>>> spec.select_range(parsed, 2049).shards
2
>>> spec.format_all_reduce_spec([("xring", 2, 1024), ("pscpu/xring", 2, -1)])
'xring#2:1k:pscpu/xring#2'

Algorithm names are a closed set that this module does not fix: the caller
passes the single-level names it knows (the builder registry's), and a name
is one of them or `inner/outer`, two of them joined by '/': `inner` reduces
within each worker, `outer` across one device per worker. TensorFlow 1 had
nccl/xring, nccl/rechd, nccl/pscpu and pscpu/pscpu; any other pair works the
same way here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Sequence
from typing import TypeAlias

from tf_crossdevice._core import checks as _checks


def split_two_level(alg: str) -> tuple[str, str] | None:
    """Splits a two-level name into (inner, outer); None for one level.

    >>> split_two_level("nccl/xring")
    ('nccl', 'xring')
    >>> split_two_level("xring") is None
    True
    """
    inner, slash, outer = alg.partition("/")
    return (inner, outer) if slash else None


def describe_algorithms(algorithms: Collection[str]) -> str:
    """What an algorithm name may be, for error messages.

    >>> describe_algorithms({"xring", "nccl"})
    "one of nccl, xring, or 'inner/outer' naming two of them (e.g. 'nccl/xring')"
    """  # noqa: E501
    names = sorted(algorithms)
    example = f"{names[0]}/{names[-1]}"
    return (
        f"one of {', '.join(names)}, or 'inner/outer' naming two of them "
        f"(e.g. {example!r})"
    )


def algorithm_problem(
    alg: object, algorithms: Collection[str]
) -> tuple[str, int] | None:
    """Why `alg` names no algorithm, and where in it; None if it does.

    Args:
        alg: a candidate name, e.g. "nccl/xring".
        algorithms: the known single-level names.

    Returns:
        None, or (the problem, the character offset of the bad part).

    >>> algorithm_problem("nccl/xrign", {"nccl", "xring"})
    ("unknown algorithm 'xrign' (the outer part of 'nccl/xrign')", 5)
    """
    if isinstance(alg, str) and alg == "":
        return "missing algorithm", 0
    if not isinstance(alg, str):
        return f"unknown algorithm {alg!r}", 0
    parts = alg.split("/")
    if len(parts) == 1:
        return None if alg in algorithms else (f"unknown algorithm {alg!r}", 0)
    if len(parts) > 2:
        return f"unknown algorithm {alg!r} (more than two levels)", 0
    offset = 0
    for role, part in zip(("inner", "outer"), parts, strict=True):
        if part not in algorithms:
            return (
                f"unknown algorithm {part!r} (the {role} part of {alg!r})",
                offset,
            )
        offset += len(part) + 1
    return None


def check_algorithm(
    alg: object, algorithms: Collection[str], argument: str = "alg"
) -> str:
    """Returns `alg` if it names an algorithm; else raises ValueError.

    >>> check_algorithm("xrign", {"xring"}, "all_reduce_alg")
    Traceback (most recent call last):
    ...
    ValueError: all_reduce_alg: unknown algorithm 'xrign'; expected one of xring, or 'inner/outer' naming two of them (e.g. 'xring/xring')
    """  # noqa: E501
    problem = algorithm_problem(alg, algorithms)
    if problem is not None:
        raise ValueError(
            f"{argument}: {problem[0]}; expected "
            f"{describe_algorithms(algorithms)}"
        )
    assert isinstance(alg, str)
    return alg


_NAME = re.compile(r"[^/#:]+(/[^/#:]+)?")


@dataclasses.dataclass(frozen=True)
class AllReduceSpecTuple:
    """One range of an all_reduce_spec.

    Attributes:
        alg: the algorithm's name, "name" or "inner/outer"; whether the
            names are known is checked by `parse_all_reduce_spec`.
        shards: how many shards each tensor is split into, at least 1.
        limit: the largest tensor, in bytes, this range takes; -1 for no
            limit.

    Raises:
        ValueError: a field is out of range (see Attributes).
    """

    alg: str
    shards: int = 1
    limit: int = -1

    def __post_init__(self) -> None:
        if not isinstance(self.alg, str) or not _NAME.fullmatch(self.alg):
            raise ValueError(
                f"alg: expected an algorithm name such as 'xring' or "
                f"'nccl/xring', got {self.alg!r}"
            )
        object.__setattr__(self, "shards", _check_shards(self.shards))
        object.__setattr__(self, "limit", _check_limit(self.limit))


class _SpecError(Exception):
    """A bad part of a spec; `parse_all_reduce_spec` adds the context."""

    def __init__(self, problem: str, allowed: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.allowed = allowed


def _as_int(value: object) -> int | None:
    """An integer (numpy's too, not a bool) for spec errors; else None."""
    try:
        return _checks.integer(value, "")
    except TypeError:
        return None


def _check_shards(value: object) -> int:
    return _checks.positive_int(value, "shards")


def _check_limit(value: object) -> int:
    n = _checks.integer(value, "limit")
    if n < 1 and n != -1:
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


def _known_algorithm(name: object, algorithms: Collection[str] | None) -> str:
    if algorithms is None:  # Formatting: only the name's form matters.
        if isinstance(name, str) and _NAME.fullmatch(name):
            return name
        raise _SpecError(
            f"bad algorithm name {name!r}", "a name such as 'nccl/xring'"
        )
    problem = algorithm_problem(name, algorithms)
    if problem is not None:
        raise _SpecError(problem[0], describe_algorithms(algorithms))
    assert isinstance(name, str)
    return name


def _parse_range_string(
    token: str, algorithms: Collection[str] | None
) -> tuple[str, int]:
    name, hash_sign, shards = token.partition("#")
    alg = _known_algorithm(name, algorithms)
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


def _parse_string(
    spec: str, algorithms: Collection[str] | None
) -> list[tuple[AllReduceSpecTuple, str]]:
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
            alg, shards = _parse_range_string(parts[i], algorithms)
        except _SpecError as e:
            name = parts[i].partition("#")[0]
            bad = algorithms and algorithm_problem(name, algorithms)
            at = offset + (bad[1] if bad else 0)
            e.problem = f"{e.problem} in range {i // 2} (character {at})"
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


def _parse_tuple(
    item: object, where: str, algorithms: Collection[str] | None
) -> AllReduceSpecTuple:
    if isinstance(item, AllReduceSpecTuple):
        item = (item.alg, item.shards, item.limit)
    if isinstance(item, str):
        item = (item,)
    if not isinstance(item, tuple) or not 1 <= len(item) <= 3:
        raise _SpecError(
            f"bad range {item!r} {where}",
            "a tuple (alg,), (alg, shards) or (alg, shards, limit)",
        )
    try:
        alg = _known_algorithm(item[0], algorithms)
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


def parse_all_reduce_spec(
    spec: SpecLike, algorithms: Collection[str]
) -> tuple[AllReduceSpecTuple, ...]:
    """Parses an all_reduce_spec in either form (see the module docstring).

    Args:
        spec: a spec string such as "pscpu:32k:xring"; a tuple
            `(alg[, shards[, limit]])`; an `AllReduceSpecTuple`; or a list or
            tuple of these whose limits strictly increase and end with -1.
            Limits are in bytes.
        algorithms: the known single-level algorithm names; a range's
            algorithm is one of them or two of them as 'inner/outer'.

    Returns:
        One `AllReduceSpecTuple` per range, limits strictly increasing, the
        last -1.

    Raises:
        TypeError: `spec` is not a string, tuple, list or
            `AllReduceSpecTuple`.
        ValueError: `spec` is malformed; the message quotes the spec, names
            the bad range and token, and says what is allowed.

    >>> names = {"nccl", "pscpu", "xring"}
    >>> parse_all_reduce_spec("pscpu/xring#2", names)
    (AllReduceSpecTuple(alg='pscpu/xring', shards=2, limit=-1),)
    >>> parse_all_reduce_spec("pscpu:32k:nccl/xrign", names)
    Traceback (most recent call last):
    ...
    ValueError: all_reduce_spec 'pscpu:32k:nccl/xrign': unknown algorithm 'xrign' (the outer part of 'nccl/xrign') in range 1 (character 15); expected one of nccl, pscpu, xring, or 'inner/outer' naming two of them (e.g. 'nccl/xring')
    """  # noqa: E501
    return _parse(spec, algorithms)


def _parse(
    spec: SpecLike, algorithms: Collection[str] | None
) -> tuple[AllReduceSpecTuple, ...]:
    """`parse_all_reduce_spec`; None `algorithms` checks names' form only."""
    try:
        if isinstance(spec, str):
            ranges = _parse_string(spec, algorithms)
        elif isinstance(spec, AllReduceSpecTuple):
            ranges = [(_parse_tuple(spec, "in range 0", algorithms), "")]
        elif isinstance(spec, tuple | list):
            if not spec:
                raise _SpecError("it is empty", "at least one range")
            # A tuple starting with a name is one range, (alg, shards,
            # limit); a list, or a tuple of tuples, is a list of ranges.
            one = isinstance(spec, tuple) and isinstance(spec[0], str)
            items = [spec] if one else list(spec)
            ranges = [
                (
                    _parse_tuple(item, f"in range {i}", algorithms),
                    f"in range {i}",
                )
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
    for r in _parse(parsed, None):
        alg = r.alg
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

    >>> ranges = parse_all_reduce_spec(
    ...     [("nccl", 2, 1024), ("pscpu/pscpu",)], {"nccl", "pscpu"})
    >>> select_range(ranges, 1024).alg
    'nccl'
    >>> select_range(ranges, 1025).alg
    'pscpu/pscpu'
    """
    size = _checks.non_negative_int(size_in_bytes, "size_in_bytes")
    for r in parsed:
        if r.limit == -1 or size <= r.limit:
            return r
    raise ValueError(
        f"parsed: no range takes a tensor of {size} bytes in {parsed!r}; "
        "the last range must have limit -1 (use parse_all_reduce_spec)"
    )
