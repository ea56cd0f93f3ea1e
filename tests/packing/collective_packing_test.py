"""Tests of the collective classes' packs (a pure schedule).

The rule is restated here from TensorFlow's `group_by_size` and TF 1's
`all_reduce_merge_scope`, independently of the code under test.
"""

from __future__ import annotations

import hypothesis
import pytest
from hypothesis import strategies as st

from tf_crossdevice.packing._collective_plan import collective_packs

sizes_and_dtypes = st.lists(
    st.tuples(
        st.one_of(st.none(), st.integers(0, 4096)), st.sampled_from("abc")
    ),
    max_size=40,
)


def reference(num_bytes, dtypes, bytes_per_pack, merge_scope):
    """Pack by pack, as written in the schedule's docstring."""
    packs, size = [], 0
    for i in reversed(range(len(num_bytes))):
        last = packs[-1] if packs else None
        starts = (
            last is None
            or dtypes[last[-1]] != dtypes[i]
            or num_bytes[i] is None
            or num_bytes[last[-1]] is None
            or (bytes_per_pack and size > bytes_per_pack)
            or (not bytes_per_pack and len(last) == merge_scope)
        )
        if starts:
            packs.append([])
            size = 0
        packs[-1].append(i)
        size += num_bytes[i] or 0
    return packs


def test_tensorflow_group_by_size_example():
    # Reversed order; a pack closes once it holds more than 6 bytes.
    assert collective_packs([4] * 5, ["f"] * 5, bytes_per_pack=6) == [
        [4, 3],
        [2, 1],
        [0],
    ]


def test_a_pack_below_one_tensor_gives_one_pack_per_value():
    assert collective_packs([400, 400, 400], ["f"] * 3, 1) == [[2], [1], [0]]


def test_a_large_pack_holds_everything():
    assert collective_packs([4, 8, 12], ["f"] * 3, 1 << 30) == [[2, 1, 0]]


def test_merge_scope_counts_values():
    assert collective_packs([1] * 7, ["f"] * 7, 0, merge_scope=3) == [
        [6, 5, 4],
        [3, 2, 1],
        [0],
    ]


def test_dtypes_never_share_a_pack():
    assert collective_packs([4] * 4, ["f", "h", "h", "f"], 0) == [
        [3],
        [2, 1],
        [0],
    ]


def test_unknown_size_gets_its_own_pack_when_packing_by_bytes():
    assert collective_packs([4, None, 4], ["f"] * 3, 100) == [[2], [1], [0]]


def test_unknown_size_gets_its_own_pack_in_a_merge_scope():
    # Found by hypothesis: an unknown size after a known one joined its pack.
    assert collective_packs([None, 0], ["f"] * 2, 0, merge_scope=2) == [
        [1],
        [0],
    ]


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"bytes_per_pack": -1}, ValueError, "bytes_per_pack"),
        ({"bytes_per_pack": 1.5}, TypeError, "bytes_per_pack"),
        ({"bytes_per_pack": 0, "merge_scope": 0}, ValueError, "merge_scope"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        collective_packs([4], ["f"], **kwargs)


@hypothesis.given(
    sizes_and_dtypes,
    st.integers(0, 5000),
    st.integers(1, 6),
)
def test_matches_the_rule_and_covers_every_value(values, per_pack, scope):
    num_bytes = [n for n, _ in values]
    dtypes = [d for _, d in values]
    packs = collective_packs(num_bytes, dtypes, per_pack, scope)
    assert packs == reference(num_bytes, dtypes, per_pack, scope)
    flat = [i for p in packs for i in p]
    assert flat == list(reversed(range(len(values))))
    for p in packs:
        assert len({dtypes[i] for i in p}) == 1
        if per_pack == 0:
            assert len(p) <= scope
