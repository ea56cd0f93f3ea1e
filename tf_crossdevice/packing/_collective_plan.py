"""Which values share one collective: the packs of the collective classes.

Pure Python. A pack is a list of value indices; its values are flattened,
concatenated, all-reduced by one collective and split again, so a pack
holds values of one dtype only.

Values are taken last to first, as TensorFlow's CollectiveAllReduce takes
them: gradients arrive in reverse order of the layers during back
propagation, so the first pack is ready first and its collective runs
while later gradients are still being computed, and a finished pack's
update can start while later packs are still on the wire.

- `bytes_per_pack > 0`: TensorFlow's rule (`group_by_size`): a pack is
  closed once it holds more than `bytes_per_pack` bytes, so every pack but
  the last is at least that large (it overshoots by at most one value).
- `bytes_per_pack == 0` and a `merge_scope`: TF 1's
  `all_reduce_merge_scope`: every `merge_scope` consecutive values share a
  pack (1: one collective per value).
- `bytes_per_pack == 0` and no `merge_scope` (the classes' default): packs
  of DEFAULT_BYTES_PER_PACK, the size that measured fastest between hosts
  (docs/guides/choosing-an-algorithm.md says how it was chosen).

In both, a value whose size is not known when the graph is built gets a
pack of its own.

>>> collective_packs([4, 4, 4, 4, 4], ["f"] * 5, bytes_per_pack=6)
[[4, 3], [2, 1], [0]]
>>> collective_packs([4, 4, 4], ["f", "h", "h"], bytes_per_pack=0)
[[2, 1], [0]]
>>> collective_packs([3 << 19] * 4, ["f"] * 4, bytes_per_pack=0)
[[3, 2], [1, 0]]
>>> collective_packs([4, 4, 4], ["f"] * 3, bytes_per_pack=0, merge_scope=2)
[[2, 1], [0]]
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from tf_crossdevice._core import checks

# Between hosts, packs of this size kept the wire busiest at 2, 3 and 4
# hosts alike (benchmarks/records/hosts_pack_sizes_1gbit.json): small
# enough that the first collective starts while later gradients are
# computed, large enough that each collective's fixed cost is a small share.
DEFAULT_BYTES_PER_PACK = 2 << 20


def collective_packs(
    num_bytes: Sequence[int | None],
    dtypes: Sequence[Hashable],
    bytes_per_pack: int,
    merge_scope: int | None = None,
) -> list[list[int]]:
    """Packs of value indices, in the order their collectives are issued.

    Args:
        num_bytes: each value's size in bytes, None where unknown.
        dtypes: each value's dtype (anything comparable).
        bytes_per_pack: TensorFlow's `CommunicationOptions.bytes_per_pack`.
        merge_scope: values per pack when `bytes_per_pack` is 0; None:
            packs of DEFAULT_BYTES_PER_PACK then.

    Returns:
        Every index exactly once.
    """
    checks.non_negative_int(bytes_per_pack, "bytes_per_pack")
    scope = 0
    if merge_scope is not None:
        scope = checks.positive_int(merge_scope, "all_reduce_merge_scope")
    elif not bytes_per_pack:
        bytes_per_pack = DEFAULT_BYTES_PER_PACK
    if len(num_bytes) != len(dtypes):
        raise ValueError(
            f"dtypes: expected one per value ({len(num_bytes)}), got "
            f"{len(dtypes)}"
        )
    packs: list[list[int]] = []
    size = 0
    for i in reversed(range(len(num_bytes))):
        n = num_bytes[i]
        if not packs:
            full = True
        elif bytes_per_pack:
            full = size > bytes_per_pack
        else:
            full = len(packs[-1]) >= scope
        if (
            full
            or n is None
            or dtypes[packs[-1][-1]] != dtypes[i]
            or num_bytes[packs[-1][-1]] is None
        ):
            packs.append([])
            size = 0
        packs[-1].append(i)
        size += n or 0
    return packs
