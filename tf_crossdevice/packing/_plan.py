"""Plans for packing a list of tensors into fewer, larger ones.

Pure Python over element counts, byte sizes and dtype names; no TensorFlow.
`tf_crossdevice.packing._pack` applies a plan with TensorFlow ops.

A plan is a tuple of `PackGroup`s. Each group takes some input tensors (its
`members`, all of one dtype, in their original order), flattens and
concatenates them, and splits the result into packs of `pack_sizes` elements.
A group with `concat=False` has one member that passes through unchanged.
Packs are numbered group by group, so unpacking concatenates a group's packs
and splits them back into its members. Concatenation and splitting commute
with elementwise summation, so packs summed across devices unpack to the sums
of the original tensors.

Example: two float32 tensors of 3 and 2 elements and one int32 tensor of 4,
in 3 packs per dtype:

>>> from tf_crossdevice.packing import _plan as packing
>>> infos = [(3, 4, "float32"), (2, 4, "float32"), (4, 4, "int32")]
>>> for group in packing.concat_and_split_plan(infos, num_packs=3):
...     print(group.members, group.member_sizes, group.pack_sizes)
(0, 1) (3, 2) (2, 2, 1)
(2,) (4,) (2, 1, 1)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import NamedTuple

from tf_crossdevice._core import checks


class TensorInfo(NamedTuple):
    """What a plan needs to know about one tensor (a plain tuple works too).

    Attributes:
        num_elements: how many elements the tensor has, at least 0.
        itemsize: bytes per element of its dtype.
        dtype_key: a name for its dtype; tensors are grouped by equal keys.
    """

    num_elements: int
    itemsize: int
    dtype_key: str


@dataclasses.dataclass(frozen=True)
class PackGroup:
    """Input tensors of one dtype that become consecutive packs.

    Attributes:
        members: positions of the group's tensors in the input list, ascending.
        member_sizes: element count of each member.
        pack_sizes: element count of each pack the group yields; they sum to
            `sum(member_sizes)`. A concat-and-split group whose members have
            no elements yields no packs; small-tensor groups always yield one.
        concat: True if the members are flattened and concatenated; False if
            the group's single member is its single pack, unchanged.
    """

    members: tuple[int, ...]
    member_sizes: tuple[int, ...]
    pack_sizes: tuple[int, ...]
    concat: bool = True


PackPlan = tuple[PackGroup, ...]


class PackingScheme(enum.Enum):
    """Which packing `packing_scheme` selects."""

    IDENTITY = "identity"
    CONCAT_AND_SPLIT = "concat_and_split"
    AGGREGATE_SMALL = "aggregate_small"


def packing_scheme(
    *,
    num_packs: int,
    agg_small_grads_max_bytes: int,
    agg_small_grads_max_group: int,
) -> PackingScheme:
    """Validates the packing arguments and says which scheme they select.

    Args:
        num_packs: packs per dtype for concat-and-split, or 0 for none.
        agg_small_grads_max_bytes: largest tensor size in bytes that
            small-tensor aggregation packs, or 0 for none.
        agg_small_grads_max_group: most tensors per aggregated pack; at least
            1 when `agg_small_grads_max_bytes > 0`, ignored otherwise.

    Returns:
        CONCAT_AND_SPLIT if `num_packs > 0`, AGGREGATE_SMALL if
        `agg_small_grads_max_bytes > 0`, else IDENTITY.

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is negative, `agg_small_grads_max_group < 1`
            while aggregation is on, or both schemes are on.

    >>> packing_scheme(num_packs=2, agg_small_grads_max_bytes=0,
    ...                agg_small_grads_max_group=10)
    <PackingScheme.CONCAT_AND_SPLIT: 'concat_and_split'>
    """
    checks.non_negative_int(num_packs, "num_packs")
    checks.non_negative_int(
        agg_small_grads_max_bytes, "agg_small_grads_max_bytes"
    )
    checks.non_negative_int(
        agg_small_grads_max_group, "agg_small_grads_max_group"
    )
    if num_packs > 0 and agg_small_grads_max_bytes > 0:
        raise ValueError(
            f"num_packs={num_packs} and agg_small_grads_max_bytes="
            f"{agg_small_grads_max_bytes}: the two packing schemes are "
            "exclusive; set one of them to 0"
        )
    if num_packs > 0:
        return PackingScheme.CONCAT_AND_SPLIT
    if agg_small_grads_max_bytes > 0:
        checks.positive_int(
            agg_small_grads_max_group, "agg_small_grads_max_group"
        )
        return PackingScheme.AGGREGATE_SMALL
    return PackingScheme.IDENTITY


def split_sizes(total: int, num_pieces: int) -> tuple[int, ...]:
    """Splits `total` elements into `min(num_pieces, total)` near-equal pieces.

    Piece sizes differ by at most 1; the larger ones come first.

    Args:
        total: elements to split, at least 0.
        num_pieces: pieces wanted, at least 1.

    Returns:
        The piece sizes; empty if `total` is 0.

    Raises:
        ValueError: `total < 0` or `num_pieces < 1`.

    >>> split_sizes(10, 4)
    (3, 3, 2, 2)
    >>> split_sizes(2, 5)
    (1, 1)
    """
    checks.non_negative_int(total, "total")
    checks.positive_int(num_pieces, "num_pieces")
    count = min(num_pieces, total)
    if count == 0:
        return ()
    base, extra = divmod(total, count)
    return (base + 1,) * extra + (base,) * (count - extra)


def _as_infos(tensors: Sequence[tuple[int, int, str]]) -> list[TensorInfo]:
    infos = [TensorInfo(*info) for info in tensors]
    for i, info in enumerate(infos):
        checks.non_negative_int(info.num_elements, f"tensors[{i}].num_elements")
        checks.positive_int(info.itemsize, f"tensors[{i}].itemsize")
    return infos


def _positions_by_dtype(infos: Sequence[TensorInfo]) -> dict[str, list[int]]:
    """Positions of each dtype's tensors; dtypes in order of first use."""
    by_dtype: dict[str, list[int]] = {}
    for i, info in enumerate(infos):
        by_dtype.setdefault(info.dtype_key, []).append(i)
    return by_dtype


def concat_and_split_plan(
    tensors: Sequence[tuple[int, int, str]], num_packs: int
) -> PackPlan:
    """Plans concat-and-split packing: `num_packs` packs per dtype.

    The tensors of each dtype are concatenated in order and split into
    `split_sizes(total, num_packs)` packs. Groups come in the order of each
    dtype's first tensor.

    Args:
        tensors: `(num_elements, itemsize, dtype_key)` for each tensor.
        num_packs: packs per dtype, at least 1 (fewer if a dtype has fewer
            elements).

    Returns:
        One concatenating group per dtype.

    Raises:
        ValueError: `num_packs < 1` or a negative size.

    >>> plan = concat_and_split_plan([(5, 4, "float32"), (0, 4, "float32")], 2)
    >>> plan[0].pack_sizes
    (3, 2)
    """
    checks.positive_int(num_packs, "num_packs")
    infos = _as_infos(tensors)
    plan = []
    for positions in _positions_by_dtype(infos).values():
        sizes = tuple(infos[i].num_elements for i in positions)
        plan.append(
            PackGroup(
                members=tuple(positions),
                member_sizes=sizes,
                pack_sizes=split_sizes(sum(sizes), num_packs),
            )
        )
    return tuple(plan)


def small_tensor_plan(
    tensors: Sequence[tuple[int, int, str]],
    max_bytes: int,
    max_group: int,
) -> PackPlan:
    """Plans small-tensor aggregation.

    A tensor of at most `max_bytes` bytes (`num_elements * itemsize`) is
    small. Runs of consecutive small tensors of one dtype are cut into runs
    of at most `max_group` (TF 1's `extract_ranges`); each run of two or
    more becomes one concatenated pack. Every other tensor, and every run
    of one, passes through unchanged. Groups come in the order of their
    first member. Consecutive, as in TF 1: a pack that reached back past a
    large tensor would hold the last layers' small gradients until the
    backward pass reaches the first layers, so none of it could overlap.

    Args:
        tensors: `(num_elements, itemsize, dtype_key)` for each tensor.
        max_bytes: size limit in bytes, at least 1.
        max_group: most tensors per pack, at least 1.

    Returns:
        The plan.

    Raises:
        ValueError: `max_bytes < 1`, `max_group < 1` or a bad size.

    >>> infos = [(1, 4, "float32"), (2, 4, "float32"), (100, 4, "float32"),
    ...          (2, 4, "float32")]
    >>> for group in small_tensor_plan(infos, max_bytes=8, max_group=4):
    ...     print(group.members, group.concat)
    (0, 1) True
    (2,) False
    (3,) False
    """
    checks.positive_int(max_bytes, "max_bytes")
    checks.positive_int(max_group, "max_group")
    infos = _as_infos(tensors)
    small = [info.num_elements * info.itemsize <= max_bytes for info in infos]
    runs: list[list[int]] = []
    for i, info in enumerate(infos):
        joins = (
            small[i]
            and i > 0
            and small[i - 1]
            and infos[i - 1].dtype_key == info.dtype_key
            and len(runs[-1]) < max_group
        )
        if joins:
            runs[-1].append(i)
        else:
            runs.append([i])
    plan = []
    for run in runs:
        sizes = tuple(infos[i].num_elements for i in run)
        plan.append(
            PackGroup(
                members=tuple(run),
                member_sizes=sizes,
                pack_sizes=(sum(sizes),),
                concat=len(run) > 1,
            )
        )
    return tuple(plan)


def num_packs(plan: PackPlan) -> int:
    """How many packs `plan` yields.

    >>> num_packs(concat_and_split_plan([(7, 4, "float32")], 3))
    3
    """
    return sum(len(group.pack_sizes) for group in plan)
