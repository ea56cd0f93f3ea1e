"""Recursive halving-doubling all-reduce schedule for any number of ranks.

Pure Python over integers (no TensorFlow). A rank is an index into the list
of devices; an `order` maps virtual ranks to ranks: virtual rank `v` is rank
`order[v]`.

With `n` ranks, let `p` be the largest power of two `<= n` and `r = n - p`.
Each shard of the data is cut into `p` chunks and reduced in four phases:

1. fold-in: virtual rank `p + i` (`i < r`, the "extra" ranks) sends its whole
   shard to virtual rank `i`, which adds it to its own.
2. reduce-scatter by recursive halving over virtual ranks `0 .. p - 1`: at
   step `k` (`k = 0 .. log2(p) - 1`) virtual rank `v` exchanges with
   `v XOR 2**k`. Each keeps half of its current chunk range (the lower half
   if bit `k` of `v` is 0, else the upper half), sends the other half and
   adds what it receives. The distance doubles while the message halves, so
   the largest messages go to the nearest ranks (as in TensorFlow 1). After
   the last step virtual rank `v` holds the full sum of chunk
   `bit_reverse(v)`.
3. all-gather by recursive doubling: the same pairs in reverse order
   (distance `p / 2` first); each rank sends the range it holds, receives the
   partner's, and the held range doubles.
4. fold-out: virtual rank `i` sends the full result to virtual rank `p + i`.

For a power of two each rank sends `2 (p - 1) / p` of the shard. Otherwise an
extra rank sends the shard once (fold-in), its partner sends
`2 (p - 1) / p + 1` shards (core phases plus fold-out), and the other ranks
`2 (p - 1) / p`. Shard `s` rotates the virtual ranks by `s * r` so that
different shards give the extra and partner roles to different ranks.

Example:

>>> from tf_crossdevice.algorithms import _halving_doubling_schedule as hd
>>> hd.rank_orders(3, num_shards=2)
[(0, 1, 2), (1, 2, 0)]
>>> hd.fold_in((0, 1, 2))
(Transfer(src=2, dst=0, chunks=range(0, 2)),)
>>> for transfer in hd.reduce_scatter_steps((0, 1, 2))[0]:
...     print(transfer)
Transfer(src=1, dst=0, chunks=range(0, 1))
Transfer(src=0, dst=1, chunks=range(1, 2))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tf_crossdevice._core import checks


@dataclasses.dataclass(frozen=True)
class Transfer:
    """Chunks `chunks` moving from rank `src` to rank `dst` in one step.

    In fold-in and reduce-scatter the receiver adds them to its own copies;
    in all-gather and fold-out it replaces its copies with them.
    """

    src: int
    dst: int
    chunks: range


def _check_order(order: Sequence[int]) -> tuple[int, ...]:
    order = tuple(order)
    if sorted(order) != list(range(len(order))) or not order:
        raise ValueError(
            f"order: expected a permutation of range(n) with n >= 1, got "
            f"{order!r}"
        )
    return order


def largest_power_of_two(n: int) -> int:
    """Returns the largest power of two `<= n`.

    Args:
        n: a positive integer.

    Raises:
        TypeError: `n` is not an int.
        ValueError: `n` is less than 1.

    Example:

    >>> [largest_power_of_two(n) for n in (1, 2, 3, 7, 8, 9)]
    [1, 2, 2, 4, 8, 8]
    """
    return 1 << (checks.positive_int(n, "n").bit_length() - 1)


def num_chunks(num_devices: int) -> int:
    """Returns how many chunks each shard is cut into: `p` for `n` ranks.

    Example:

    >>> num_chunks(6)
    4
    """
    return largest_power_of_two(checks.positive_int(num_devices, "num_devices"))


def rank_orders(num_devices: int, num_shards: int = 1) -> list[tuple[int, ...]]:
    """Returns the virtual-rank order of each shard (rotated by `s * r`).

    Args:
        num_devices: number of ranks `n`, at least 1.
        num_shards: number of independent instances, at least 1.

    Returns:
        `num_shards` permutations of `range(num_devices)`; shard `s` maps
        virtual rank `v` to rank `(v + s * r) % n`.

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is less than 1.

    Example:

    >>> rank_orders(5, num_shards=3)
    [(0, 1, 2, 3, 4), (1, 2, 3, 4, 0), (2, 3, 4, 0, 1)]
    """
    n = checks.positive_int(num_devices, "num_devices")
    checks.positive_int(num_shards, "num_shards")
    extra = n - largest_power_of_two(n)
    return [
        tuple((v + shard * extra) % n for v in range(n))
        for shard in range(num_shards)
    ]


def fold_in(order: Sequence[int]) -> tuple[Transfer, ...]:
    """Returns the fold-in transfers: extra virtual rank `p + i` to `i`.

    Args:
        order: virtual rank to rank, a permutation of `range(n)`.

    Returns:
        `n - p` transfers of all `p` chunks (empty for a power of two).

    Raises:
        ValueError: `order` is not a permutation of `range(n)`.

    Example:

    >>> for transfer in fold_in((0, 1, 2, 3, 4, 5)):
    ...     print(transfer)
    Transfer(src=4, dst=0, chunks=range(0, 4))
    Transfer(src=5, dst=1, chunks=range(0, 4))
    """
    order = _check_order(order)
    p = largest_power_of_two(len(order))
    return tuple(
        Transfer(order[p + i], order[i], range(p))
        for i in range(len(order) - p)
    )


def fold_out(order: Sequence[int]) -> tuple[Transfer, ...]:
    """Returns the fold-out transfers: virtual rank `i` to extra `p + i`.

    Args:
        order: virtual rank to rank, a permutation of `range(n)`.

    Returns:
        The reverse of `fold_in(order)`.

    Raises:
        ValueError: `order` is not a permutation of `range(n)`.

    Example:

    >>> fold_out((0, 1, 2))
    (Transfer(src=0, dst=2, chunks=range(0, 2)),)
    """
    return tuple(
        Transfer(t.dst, t.src, t.chunks) for t in fold_in(_check_order(order))
    )


def _held_ranges(p: int, num_steps: int) -> list[range]:
    """Chunk range each virtual rank holds after `num_steps` halving steps."""
    held = [range(p)] * p
    for k in range(num_steps):
        held = [_keep(held[v], v, k) for v in range(p)]
    return held


def _keep(chunks: range, v: int, k: int) -> range:
    middle = chunks.start + len(chunks) // 2
    if (v >> k) & 1:
        return range(middle, chunks.stop)
    return range(chunks.start, middle)


def reduce_scatter_steps(
    order: Sequence[int],
) -> tuple[tuple[Transfer, ...], ...]:
    """Returns the `log2(p)` recursive-halving steps.

    Args:
        order: virtual rank to rank, a permutation of `range(n)`.

    Returns:
        Per step, one transfer into each of the `p` core ranks carrying the
        half that the receiver keeps.

    Raises:
        ValueError: `order` is not a permutation of `range(n)`.

    Example:

    >>> [[t.chunks for t in step] for step in reduce_scatter_steps(range(4))]
    ... # doctest: +NORMALIZE_WHITESPACE
    [[range(0, 2), range(2, 4), range(0, 2), range(2, 4)],
     [range(0, 1), range(2, 3), range(1, 2), range(3, 4)]]
    """
    order = _check_order(order)
    p = largest_power_of_two(len(order))
    steps = []
    for k in range(p.bit_length() - 1):
        held = _held_ranges(p, k)
        steps.append(
            tuple(
                Transfer(order[v ^ (1 << k)], order[v], _keep(held[v], v, k))
                for v in range(p)
            )
        )
    return tuple(steps)


def all_gather_steps(
    order: Sequence[int],
) -> tuple[tuple[Transfer, ...], ...]:
    """Returns the `log2(p)` recursive-doubling steps.

    Args:
        order: virtual rank to rank, a permutation of `range(n)`.

    Returns:
        Per step, one transfer from each of the `p` core ranks carrying the
        chunk range it holds to its partner.

    Raises:
        ValueError: `order` is not a permutation of `range(n)`.

    Example:

    >>> [[t.chunks for t in step] for step in all_gather_steps(range(4))]
    ... # doctest: +NORMALIZE_WHITESPACE
    [[range(0, 1), range(2, 3), range(1, 2), range(3, 4)],
     [range(0, 2), range(2, 4), range(0, 2), range(2, 4)]]
    """
    order = _check_order(order)
    p = largest_power_of_two(len(order))
    num_steps = p.bit_length() - 1
    steps = []
    for k in reversed(range(num_steps)):
        held = _held_ranges(p, k + 1)
        steps.append(
            tuple(
                Transfer(order[v], order[v ^ (1 << k)], held[v])
                for v in range(p)
            )
        )
    return tuple(steps)
