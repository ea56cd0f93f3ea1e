"""Which collectives a step issues, and in which order."""

from __future__ import annotations

from collections.abc import Sequence

from tf_crossdevice._core.values import Value, is_sparse
from tf_crossdevice.packing import plan_packs


def launch_units(
    values: Sequence[Value], bytes_per_pack: int, merge_scope: int | None
) -> list[list[int]]:
    """The collectives of one step, as indices into `values`, in order.

    Dense values go in packs (`plan_packs`: by `bytes_per_pack`, or with
    0 every `merge_scope` consecutive values of one dtype, or with 0 and no
    `merge_scope` by the default pack size), each IndexedSlices alone; the
    units come in `launch_order`.
    """
    dense = [k for k, v in enumerate(values) if not is_sparse(v)]
    packs = [
        [dense[j] for j in pack]
        for pack in plan_packs(
            [values[k] for k in dense], bytes_per_pack, merge_scope
        )
    ]
    sparse = [[k] for k, v in enumerate(values) if is_sparse(v)]
    return launch_order([*packs, *sparse])


def launch_order(units: Sequence[list[int]]) -> list[list[int]]:
    """`units` in the order to issue their collectives: last values first.

    Each unit is the indices of the values one collective (or one
    IndexedSlices' gathers) carries. Values come in variable order and
    backpropagation computes the last variables' gradients first, so a
    unit can start once the gradient of its lowest index exists. A device's
    collectives run in the order they are issued (the ordering token), so
    a unit issued early that waits for the first layer's gradient (an
    Embedding's IndexedSlices, say) would hold every later one until the
    backward pass ends; issued by descending lowest index, the first
    collective needs only the last layers' gradients and the others follow
    as theirs arrive. Every member issues the same order: it depends on
    the values' positions alone. The packing forms dense packs last value
    first already, so among them this keeps its order; what it moves is
    the IndexedSlices, each to where its variable's gradient arrives.

    >>> launch_order([[4, 3], [1, 0], [2]])
    [[4, 3], [2], [1, 0]]
    """
    return sorted(units, key=lambda unit: -min(unit))
