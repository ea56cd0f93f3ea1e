"""Tests for tf_crossdevice.algorithms._spec (all_reduce_spec parsing)."""

from __future__ import annotations

import functools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_crossdevice.algorithms import _spec as spec_lib
from tf_crossdevice.algorithms._spec import AllReduceSpecTuple

# The single-level names the parser is told about (SpecAllReduce passes the
# builder registry's); the spec schedule itself knows none.
NAMES = frozenset(
    {"hierarchical_copy", "nccl", "pscpu", "psgpu", "rechd", "xring"}
)
parse = functools.partial(spec_lib.parse_all_reduce_spec, algorithms=NAMES)
# TensorFlow 1's names.
ALL_NAMES = [
    "nccl",
    "nccl/xring",
    "nccl/rechd",
    "nccl/pscpu",
    "xring",
    "rechd",
    "pscpu",
    "psgpu",
    "pscpu/pscpu",
]
VALID_LIST = (
    "hierarchical_copy, nccl, pscpu, psgpu, rechd, xring, or 'inner/outer' "
    "naming two of them (e.g. 'hierarchical_copy/xring')"
)
K = 1024


def ranges(*triples):
    return tuple(AllReduceSpecTuple(a, s, lim) for a, s, lim in triples)


def test_names_are_the_callers():
    assert spec_lib.parse_all_reduce_spec("naive/x", {"naive", "x"}) == (
        AllReduceSpecTuple("naive/x"),
    )
    with pytest.raises(ValueError, match="unknown algorithm 'nccl'.* of x,"):
        spec_lib.parse_all_reduce_spec("nccl", {"x"})


@pytest.mark.parametrize("name", ["xring/rechd", "psgpu/nccl", "rechd/rechd"])
def test_any_two_known_names_make_a_two_level_name(name):
    assert parse(name) == ranges((name, 1, -1))


@pytest.mark.parametrize("name", ALL_NAMES)
def test_every_algorithm_parses_in_every_form(name):
    expected = ranges((name, 1, -1))
    assert parse(name) == expected
    assert parse((name,)) == expected
    assert parse((name, 1)) == expected
    assert parse((name, 1, -1)) == expected
    assert parse([(name, 1, -1)]) == expected
    assert parse(f"{name}#3") == ranges((name, 3, -1))
    assert spec_lib.format_all_reduce_spec(name) == name


@pytest.mark.parametrize(
    "name, parts",
    [
        ("nccl", None),
        ("nccl/xring", ("nccl", "xring")),
        ("pscpu/pscpu", ("pscpu", "pscpu")),
    ],
)
def test_split_two_level(name, parts):
    assert spec_lib.split_two_level(name) == parts
    assert spec_lib.check_algorithm(name, NAMES) == name


@pytest.mark.parametrize(
    "name, problem",
    [
        ("ring", "unknown algorithm 'ring'"),
        ("ring/xring", "unknown algorithm 'ring' (the inner part of"),
        ("nccl/ncl", "unknown algorithm 'ncl' (the outer part of 'nccl/ncl')"),
        ("a/b/c", "unknown algorithm 'a/b/c' (more than two levels)"),
        ("", "missing algorithm"),
        (None, "unknown algorithm None"),
    ],
)
def test_check_algorithm_rejects_unknown(name, problem):
    with pytest.raises(ValueError) as info:
        spec_lib.check_algorithm(name, NAMES, "all_reduce_alg")
    assert str(info.value).startswith(f"all_reduce_alg: {problem}")
    assert str(info.value).endswith(f"; expected one of {VALID_LIST}")


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("xring", [("xring", 1, -1)]),
        ("xring#2", [("xring", 2, -1)]),
        ("pscpu/pscpu#2", [("pscpu/pscpu", 2, -1)]),
        ("pscpu:32k:xring", [("pscpu", 1, 32 * K), ("xring", 1, -1)]),
        (
            "pscpu:2k:pscpu#2:64k:xring",
            [("pscpu", 1, 2 * K), ("pscpu", 2, 64 * K), ("xring", 1, -1)],
        ),
        ("nccl:1:xring", [("nccl", 1, 1), ("xring", 1, -1)]),
        ("nccl:1000:xring", [("nccl", 1, 1000), ("xring", 1, -1)]),
        ("nccl:3K:xring", [("nccl", 1, 3 * K), ("xring", 1, -1)]),
        ("nccl:5M:xring", [("nccl", 1, 5 * K**2), ("xring", 1, -1)]),
        ("nccl:2G:xring", [("nccl", 1, 2 * K**3), ("xring", 1, -1)]),
        # tf_cnn_benchmarks' grammar is int[KkMGT]?.
        ("pscpu:1T:xring", [("pscpu", 1, K**4), ("xring", 1, -1)]),
        ("rechd#07", [("rechd", 7, -1)]),
        (("xring",), [("xring", 1, -1)]),
        (("xring", 4), [("xring", 4, -1)]),
        (("xring", 4, -1), [("xring", 4, -1)]),
        (
            [("nccl", 2, 1024), ("pscpu/pscpu", 2, -1)],
            [("nccl", 2, 1024), ("pscpu/pscpu", 2, -1)],
        ),
        (
            (("nccl", 2, 1024), ("pscpu/pscpu", 2)),
            [("nccl", 2, 1024), ("pscpu/pscpu", 2, -1)],
        ),
        ([("psgpu",)], [("psgpu", 1, -1)]),
        (["psgpu"], [("psgpu", 1, -1)]),
        (("rechd", 3), [("rechd", 3, -1)]),
        (AllReduceSpecTuple("nccl/rechd", 2), [("nccl/rechd", 2, -1)]),
        (
            [AllReduceSpecTuple("nccl", 1, 10), ("xring", 2, -1)],
            [("nccl", 1, 10), ("xring", 2, -1)],
        ),
    ],
    ids=repr,
)
def test_parse_named_examples(spec, expected):
    got = parse(spec)
    assert got == ranges(*expected)
    assert all(isinstance(r.alg, str) for r in got)
    # The canonical string parses back to the same ranges.
    assert parse(spec_lib.format_all_reduce_spec(got)) == ranges(*expected)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("pscpu:32768:xring", "pscpu:32k:xring"),
        ("pscpu:1025:xring#1", "pscpu:1025:xring"),
        ("pscpu#1:2048k:xring", "pscpu:2M:xring"),
        ("pscpu:1024M:xring#4", "pscpu:1G:xring#4"),
        ("pscpu:2048G:xring", "pscpu:2T:xring"),
        ("pscpu:1536:xring", "pscpu:1536:xring"),
        (
            [("nccl", 2, 1024), ("pscpu/pscpu", 2, -1)],
            "nccl#2:1k:pscpu/pscpu#2",
        ),
    ],
    ids=repr,
)
def test_format_is_canonical(spec, expected):
    assert spec_lib.format_all_reduce_spec(spec) == expected


@pytest.mark.parametrize(
    "spec, limit",
    [
        ("nccl:1024:xring", 1024),
        ("nccl:1k:xring", 1024),
        ("nccl:32k:xring", 32 * K),
        ("nccl:1:xring", 1),
        ([("nccl", 1, 4096), ("xring",)], 4096),
    ],
    ids=repr,
)
def test_select_range_boundary_is_inclusive_in_bytes(spec, limit):
    parsed = parse(spec)
    assert spec_lib.select_range(parsed, 0).alg == "nccl"
    assert spec_lib.select_range(parsed, limit).alg == "nccl"
    assert spec_lib.select_range(parsed, limit + 1).alg == "xring"
    assert spec_lib.select_range(parsed, 10**15).alg == "xring"


def test_select_range_three_ranges():
    parsed = parse("pscpu:2k:pscpu#2:64k:xring")
    picks = {
        size: (r.alg, r.shards)
        for size in (1, 2048, 2049, 65536, 65537)
        for r in [spec_lib.select_range(parsed, size)]
    }
    assert picks == {
        1: ("pscpu", 1),
        2048: ("pscpu", 1),
        2049: ("pscpu", 2),
        65536: ("pscpu", 2),
        65537: ("xring", 1),
    }


@pytest.mark.parametrize(
    "size, error",
    [
        (-1, ValueError),
        (1.5, TypeError),
        ("8", TypeError),
        (None, TypeError),
        (True, TypeError),
    ],
)
def test_select_range_rejects_bad_size(size, error):
    parsed = parse("xring")
    with pytest.raises(error, match="^size_in_bytes: expected an int >= 0"):
        spec_lib.select_range(parsed, size)


def test_select_range_without_catch_all_raises():
    parsed = (AllReduceSpecTuple("nccl", 1, 10),)
    with pytest.raises(ValueError, match="no range takes a tensor of 11"):
        spec_lib.select_range(parsed, 11)


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "pscpu:32k:xrign",
            "all_reduce_spec 'pscpu:32k:xrign': unknown algorithm 'xrign' in "
            f"range 1 (character 10); expected one of {VALID_LIST}",
        ),
        ("xrign", "unknown algorithm 'xrign' in range 0 (character 0)"),
        ("XRING", "unknown algorithm 'XRING' in range 0"),
        (
            "xring:1k:nccl/ncl",
            "unknown algorithm 'ncl' (the outer part of 'nccl/ncl') in range "
            "1 (character 14)",
        ),
        ("xring/", "unknown algorithm '' (the outer part of 'xring/')"),
        (
            "nccl/xring/rechd",
            "unknown algorithm 'nccl/xring/rechd' (more than two levels)",
        ),
        ("", "all_reduce_spec '': missing algorithm in range 0"),
        ("pscpu:32k:", "missing algorithm in range 1 (character 10)"),
        ("xring#0", "bad shard count '0' after '#' in range 0"),
        ("xring#", "bad shard count '' after '#'"),
        ("xring#-2", "bad shard count '-2'"),
        ("xring#2#3", "bad shard count '2#3'"),
        ("xring#two", "bad shard count 'two'"),
        ("pscpu:32k", "ends in a size limit with no range after it"),
        ("pscpu:", "ends in a size limit"),
        ("pscpu::xring", "bad size limit '' after range 0 (character 6)"),
        ("pscpu:0:xring", "bad size limit '0' after range 0"),
        ("pscpu:-1:xring", "bad size limit '-1'"),
        ("pscpu:32x:xring", "bad size limit '32x'"),
        ("pscpu:32t:xring", "bad size limit '32t'"),
        ("pscpu:32P:xring", "bad size limit '32P'"),
        ("pscpu:1.5k:xring", "bad size limit '1.5k'"),
        ("pscpu: 32k:xring", "bad size limit ' 32k'"),
        ("pscpu:\u0663:xring", "bad size limit"),  # A non-ASCII digit.
        ("xring#" + "9" * 5000, "bad shard count '9999"),
        ("pscpu:" + "9" * 5000 + ":xring", "bad size limit '9999"),
        (
            "pscpu:2k:pscpu#2:2k:xring",
            "limit 2048 in range 1 (character 9) does not exceed the "
            "previous range's limit 2048; expected limits that strictly "
            "increase",
        ),
        ("pscpu:64k:nccl:32k:xring", "limit 32768 in range 1"),
        (("xrign",), "unknown algorithm 'xrign' in range 0; expected one of"),
        (("xring", 0), "bad shard count 0 in range 0"),
        (("xring", True), "bad shard count True"),
        (("xring", 2.0), "bad shard count 2.0"),
        (("xring", "2"), "bad shard count '2'"),
        (("xring", 1, 0), "bad size limit 0 in range 0"),
        (("xring", 1, -2), "bad size limit -2"),
        (("xring", 1, 1024), "the last range has limit 1024"),
        (("xring", 1, -1, "extra"), "bad range ('xring', 1, -1, 'extra')"),
        ((), "it is empty; expected at least one range"),
        ([], "it is empty"),
        ([("nccl", 2, 1024), ("xring", 2, 1024)], "the last range has limit"),
        (
            [("nccl", 2, 4096), ("pscpu", 1, 1024), ("xring",)],
            "limit 1024 in range 1 does not exceed the previous range's "
            "limit 4096",
        ),
        ([("nccl",), ("xring",)], "limit -1 (no limit) in range 0, but more"),
        ([("nccl", 1, 10), "pscpu:32k:xring"], "unknown algorithm 'pscpu:32k"),
        ([("nccl", 1, 10), 42], "bad range 42 in range 1"),
        ([("nccl", 1, 10), ("xring", 1, -1), ()], "bad range () in range 2"),
        ((("nccl", 1, 10), (None,)), "unknown algorithm None in range 1"),
    ],
    ids=lambda value: repr(value)[:60],
)
def test_bad_spec_message(spec, message):
    with pytest.raises(ValueError) as info:
        parse(spec)
    text = str(info.value)
    assert text.startswith(f"all_reduce_spec {spec!r}: ")
    assert message in text


@pytest.mark.parametrize("spec", [None, 3, 2.5, {"alg": "xring"}, b"xring"])
def test_wrong_type_is_type_error(spec):
    with pytest.raises(TypeError, match="all_reduce_spec: expected a string"):
        parse(spec)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"alg": "a:b"}, "alg: expected an algorithm name"),
        ({"alg": "a/b/c"}, "alg: expected an algorithm name"),
        ({"alg": 3}, "alg: expected an algorithm name"),
        ({"alg": "xring", "shards": 0}, "shards: expected an int >= 1"),
        ({"alg": "xring", "limit": 0}, "limit: expected a positive"),
    ],
    ids=repr,
)
def test_spec_tuple_validates(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        AllReduceSpecTuple(**kwargs)


# Hypothesis: valid specs built from known parts, in both forms.

_UNIT_SUFFIXES = {1: [""], K: ["k", "K"], K**2: ["M"], K**3: ["G"]}


@st.composite
def valid_specs(draw):
    """Returns (spec in some form, the ranges it must parse to)."""
    n = draw(st.integers(1, 5))
    algs = draw(st.lists(st.sampled_from(ALL_NAMES), min_size=n, max_size=n))
    shards = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    # Limits as (count, unit) so that suffixed strings can be generated.
    units = draw(
        st.lists(
            st.sampled_from(sorted(_UNIT_SUFFIXES)),
            min_size=n - 1,
            max_size=n - 1,
        )
    )
    counts = draw(
        st.lists(st.integers(1, 5000), min_size=n - 1, max_size=n - 1)
    )
    sized = sorted({(c * u, c, u) for c, u in zip(counts, units, strict=True)})
    sized = list({b: (b, c, u) for b, c, u in sized}.values())
    n = len(sized) + 1
    algs, shards = algs[:n], shards[:n]
    limits = [b for b, _, _ in sized] + [-1]
    expected = tuple(
        AllReduceSpecTuple(a, s, lim)
        for a, s, lim in zip(algs, shards, limits, strict=True)
    )
    form = draw(st.sampled_from(["string", "tuples", "records"]))
    if form == "string":
        pieces = []
        for i in range(n):
            explicit = shards[i] != 1 or draw(st.booleans())
            pieces.append(f"{algs[i]}#{shards[i]}" if explicit else algs[i])
            if i < n - 1:
                _, c, u = sized[i]
                suffix = draw(st.sampled_from(_UNIT_SUFFIXES[u]))
                pieces.append(f"{c}{suffix}" if suffix else str(c * u))
        return ":".join(pieces), expected
    if form == "records":
        return list(expected), expected
    tuples = []
    for i in range(n):
        if limits[i] == -1 and draw(st.booleans()):
            tuples.append(
                (algs[i], shards[i])
                if shards[i] > 1 or draw(st.booleans())
                else (algs[i],)
            )
        else:
            tuples.append((algs[i], shards[i], limits[i]))
    if n == 1 and draw(st.booleans()):
        return tuples[0], expected  # A bare tuple, not a list.
    return tuples, expected


@settings(max_examples=300, deadline=None)
@given(valid_specs())
def test_round_trip(case):
    spec, expected = case
    parsed = parse(spec)
    assert parsed == expected
    text = spec_lib.format_all_reduce_spec(parsed)
    assert parse(text) == expected
    assert spec_lib.format_all_reduce_spec(text) == text
    # The tuple form written out by hand parses to the same ranges too.
    as_tuples = [(r.alg, r.shards, r.limit) for r in parsed]
    assert parse(as_tuples) == expected
    # Each range's own limit selects it; one byte more selects the next.
    for i, r in enumerate(parsed[:-1]):
        assert spec_lib.select_range(parsed, r.limit) is parsed[i]
        assert spec_lib.select_range(parsed, r.limit + 1) is parsed[i + 1]


def _check_parsed(parsed):
    assert parsed and parsed[-1].limit == -1
    limits = [r.limit for r in parsed[:-1]]
    assert all(lim > 0 for lim in limits)
    assert limits == sorted(set(limits))
    assert all(isinstance(r.alg, str) and r.shards >= 1 for r in parsed)


_SPEC_CHARS = "ncclxringrechdpscpupsgpu/#:0123456789kKMGT-. "


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.text(alphabet=_SPEC_CHARS, max_size=40)))
def test_garbage_strings_give_value_error(text):
    try:
        parsed = parse(text)
    except ValueError as e:
        assert str(e).startswith(f"all_reduce_spec {text!r}: ")
        assert "expected" in str(e)
    else:
        _check_parsed(parsed)


_atoms = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(ALL_NAMES),
    st.binary(max_size=4),
)
_items = st.one_of(
    _atoms,
    st.tuples(st.sampled_from(ALL_NAMES)),
    st.tuples(st.sampled_from(ALL_NAMES), _atoms),
    st.tuples(st.sampled_from(ALL_NAMES), _atoms, _atoms),
    st.lists(_atoms, max_size=4).map(tuple),
    st.dictionaries(st.text(max_size=3), _atoms, max_size=2),
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.lists(_items, max_size=4),
        st.lists(_items).map(tuple),
        st.lists(_atoms, max_size=4).map(tuple),
    )
)
def test_garbage_tuples_give_value_error(spec):
    try:
        parsed = parse(spec)
    except ValueError as e:
        assert str(e).startswith(f"all_reduce_spec {spec!r}: ")
    else:
        _check_parsed(parsed)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.floats(),
        st.binary(),
        st.dictionaries(st.text(), st.integers()),
        st.sets(_atoms),
    )
)
def test_garbage_of_wrong_type_gives_type_error(spec):
    with pytest.raises(TypeError, match="all_reduce_spec"):
        parse(spec)
