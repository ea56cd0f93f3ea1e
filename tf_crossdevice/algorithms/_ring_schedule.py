"""Ring all-reduce schedule: who sends which chunk to whom, step by step.

Pure Python over integers (no TensorFlow), so it can be checked exhaustively
in milliseconds. A rank is an index into the list of devices.

Each shard of the data is reduced by its own ring. Within one ring of `n`
ranks the shard is cut into `n` chunks and reduced in two phases of `n - 1`
steps each:

- reduce-scatter: at step `t` the rank at ring position `i` sends its
  partial sum of chunk `(i - t) mod n` to the next rank, which adds it to its
  own copy. Afterwards position `i` holds the full sum of chunk
  `(i + 1) mod n`.
- all-gather: at step `t` position `i` sends the fully reduced chunk
  `(i + 1 - t) mod n` to the next rank, which keeps it as is.

Every rank therefore sends `2 (n - 1)` chunks, i.e. `2 (n - 1) / n` of the
shard, and receives as much.

Example:

>>> from tf_crossdevice.algorithms import _ring_schedule as ring
>>> ring.ring_orders(4, num_shards=2)
[(0, 1, 2, 3), (0, 3, 2, 1)]
>>> for transfer in ring.reduce_scatter_steps((0, 1, 2))[0]:
...     print(transfer)
Transfer(src=0, dst=1, chunk=0)
Transfer(src=1, dst=2, chunk=1)
Transfer(src=2, dst=0, chunk=2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tf_crossdevice._core import checks


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One chunk moving from rank `src` to rank `dst` in one step.

    In reduce-scatter the receiver adds the chunk to its own copy; in
    all-gather it replaces its copy with the received one.
    """

    src: int
    dst: int
    chunk: int


def ring_orders(num_devices: int, num_shards: int = 1) -> list[tuple[int, ...]]:
    """Returns one ring order (a permutation of the ranks) per shard.

    `order[i]` sends to `order[(i + 1) % n]`. Shard `s` starts the ring at rank
    `s // 2` and runs forwards for even `s`, backwards for odd `s`: odd shards
    use every link in the opposite direction, so both directions of a
    full-duplex link carry data at the same time, and the rotation changes
    which rank finishes (and first forwards) each chunk.

    Args:
        num_devices: number of ranks `n`, at least 1.
        num_shards: number of independent rings, at least 1.

    Returns:
        `num_shards` tuples, each a permutation of `range(num_devices)`.

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is out of range.

    Example:

    >>> ring_orders(3, num_shards=4)
    [(0, 1, 2), (0, 2, 1), (1, 2, 0), (1, 0, 2)]
    """
    n = checks.positive_int(num_devices, "num_devices")
    checks.positive_int(num_shards, "num_shards")
    orders = []
    for shard in range(num_shards):
        start = (shard // 2) % n
        step = 1 if shard % 2 == 0 else -1
        orders.append(tuple((start + step * i) % n for i in range(n)))
    return orders


def _check_order(order: Sequence[int]) -> tuple[int, ...]:
    order = tuple(order)
    if sorted(order) != list(range(len(order))) or not order:
        raise ValueError(
            f"order: expected a permutation of range(n) with n >= 1, got "
            f"{order!r}"
        )
    return order


def reduce_scatter_steps(
    order: Sequence[int],
) -> tuple[tuple[Transfer, ...], ...]:
    """Returns the `n - 1` reduce-scatter steps of one ring.

    Args:
        order: the ring, a permutation of `range(n)`.

    Returns:
        One tuple of `n` transfers per step (none for `n == 1`); chunks are
        numbered `0 .. n - 1` in data order.

    Raises:
        ValueError: `order` is not a permutation of `range(n)`.

    Example:

    >>> [t.chunk for t in reduce_scatter_steps((0, 1, 2))[1]]
    [2, 0, 1]
    """
    order = _check_order(order)
    n = len(order)
    return tuple(
        tuple(
            Transfer(order[i], order[(i + 1) % n], (i - step) % n)
            for i in range(n)
        )
        for step in range(n - 1)
    )


def all_gather_steps(order: Sequence[int]) -> tuple[tuple[Transfer, ...], ...]:
    """Returns the `n - 1` all-gather steps that follow `reduce_scatter_steps`.

    Args:
        order: the ring, a permutation of `range(n)`.

    Returns:
        One tuple of `n` transfers per step (none for `n == 1`).

    Raises:
        ValueError: `order` is not a permutation of `range(n)`.

    Example:

    >>> [t.chunk for t in all_gather_steps((0, 1, 2))[0]]
    [1, 2, 0]
    """
    order = _check_order(order)
    n = len(order)
    return tuple(
        tuple(
            Transfer(order[i], order[(i + 1) % n], (i + 1 - step) % n)
            for i in range(n)
        )
        for step in range(n - 1)
    )
