"""The one call shape every all-reduce builder has.

An `AllReduceBuilder` takes one dense tensor per device (distinct devices,
same shape and dtype) and the index of that value (or pack) in its batch,
and returns the elementwise sums, the i-th on `tensors[i].device`, with the
inputs' shape and dtype. The index lets an algorithm spread work over a
batch (hierarchical copy rotates its main device with it); others ignore it.

Options an algorithm needs (how many shards, where a shuffle gathers) are
bound when the builder is made: a `BuilderFactory` takes the shard count and
returns the builder. `_registry` maps each algorithm name to its factory.

`shard_wise` gives any builder shards for free: it splits each tensor into
`shards` flat pieces and all-reduces each piece on its own. `bind_shards`
adapts a builder that shards natively, `f(tensors, num_shards)`.

>>> from tf_crossdevice.algorithms import _protocol as protocol
>>> from tf_crossdevice.algorithms import _reduction_to_one_device as one
>>> def sum_on_first(tensors, index):
...     return one.reduce_to_one_device_all_reduce(tensors)
>>> all_reduce = protocol.shard_wise(sum_on_first, shards=2)
>>> tensors = []
>>> for i, d in enumerate(tf_crossdevice.testing.cpu_devices(3)):
...     with tf.device(d):
...         tensors.append(tf.constant([1, 2, 3]) * (i + 1))
>>> [t.numpy().tolist() for t in all_reduce(tensors, 0)]
[[6, 12, 18], [6, 12, 18], [6, 12, 18]]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TypeAlias

import tensorflow as tf

from tf_crossdevice._core import checks as _checks
from tf_crossdevice.algorithms import _flat

AllReduceBuilder: TypeAlias = Callable[
    [Sequence[tf.Tensor], int], list[tf.Tensor]
]
"""(tensors, index in the batch) -> sums, the i-th on tensors[i].device."""

BuilderFactory: TypeAlias = Callable[[int], AllReduceBuilder]
"""shards -> the builder; registered under an algorithm name."""

# A builder may carry a `packing._packed_all_reduce.BatchAllReduce` as its
# `all_reduce_batch` attribute: it reduces a whole batch with a graph whose
# size does not grow with the number of values times devices times steps
# (`all_reduce_batch`).


def all_reduce_batch(
    all_reduce: AllReduceBuilder,
    values: Sequence[Sequence[tf.Tensor]],
    indices: Sequence[int],
) -> list[list[tf.Tensor]]:
    """Sums every value of a batch: `result[k][d]` on `values[k][d].device`.

    Uses the builder's `all_reduce_batch` when it has one (the builders made
    by `bind_shards` and `shard_wise` do), else calls it once per value.

    >>> from tf_crossdevice.algorithms import _ring as ring
    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> values = []
    >>> for k in range(3):
    ...     per_device = []
    ...     for d in devices:
    ...         with tf.device(d):
    ...             per_device.append(tf.fill([k + 1], float(k)))
    ...     values.append(per_device)
    >>> sums = all_reduce_batch(ring.builder(1), values, [0, 1, 2])
    >>> [s[1].numpy().tolist() for s in sums]
    [[0.0], [2.0, 2.0], [4.0, 4.0, 4.0]]
    """
    batched = getattr(all_reduce, "all_reduce_batch", None)
    if batched is not None:
        return batched(values, indices)
    return [
        list(all_reduce(v, i)) for v, i in zip(values, indices, strict=True)
    ]


# The most bytes (per device) that `bind_shards` lays out into one tensor
# and reduces with one call. One layout of a whole batch makes every message
# as large as a shard of the whole model, and across workers each of those
# steps waits for the one before it on every worker: the layout copy, then
# the transfer of each shard, the sum, the transfer back, the unlayout. Bounded
# groups let one group's transfer overlap another's arithmetic, and a value
# at least this large is reduced on its own, so it is never copied into a
# layout at all.
GROUP_BYTES = 4 * 2**20


def byte_groups(sizes: Sequence[int], max_bytes: int) -> list[list[int]]:
    """Runs of consecutive positions of `sizes`, each of at most
    `max_bytes` in total.

    A size of at least `max_bytes` is a group of its own; the others fill
    groups in order, a new group starting when the next would overflow or
    a large one comes between. Consecutive, so that a group of gradients
    waits only for the layers it holds: one reaching back past a large
    value would hold the last layers' small gradients until the backward
    pass reaches the first layers.

    >>> byte_groups([1, 2, 9, 3, 4, 1], max_bytes=6)
    [[0, 1], [2], [3], [4, 5]]
    >>> byte_groups([6, 5, 1], max_bytes=6)
    [[0], [1, 2]]
    """
    groups: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for k, size in enumerate(sizes):
        if current and (size >= max_bytes or current_bytes + size > max_bytes):
            groups.append(current)
            current, current_bytes = [], 0
        if size >= max_bytes:
            groups.append([k])
            continue
        current.append(k)
        current_bytes += size
    if current:
        groups.append(current)
    return groups


def _num_bytes(tensor: tf.Tensor) -> int:
    """Static size in bytes (the values `bind_shards` lays out are static)."""
    return tensor.shape.num_elements() * tensor.dtype.size


def _batchable(values: Sequence[Sequence[tf.Tensor]]) -> dict:
    """dtype -> positions of the values that can share one layout: static
    shapes, the devices of `values[0]`; the rest map to None, one by one."""
    groups: dict = {}
    devices = [t.device for t in values[0]] if values else []
    for k, value in enumerate(values):
        static = all(t.shape.is_fully_defined() for t in value)
        same = [t.device for t in value] == devices
        key = value[0].dtype.base_dtype if static and same else (None, k)
        groups.setdefault(key, []).append(k)
    return groups


def _with_index(
    all_reduce: AllReduceBuilder, tensors: list[tf.Tensor], *, index: int
) -> list[tf.Tensor]:
    return list(all_reduce(tensors, index))


def _laid_out_all_reduce(
    all_reduce: Callable[[list[tf.Tensor]], Sequence[tf.Tensor]],
    values: Sequence[Sequence[tf.Tensor]],
    rows: int,
) -> list[list[tf.Tensor]]:
    """One call of `all_reduce` on each device's `_flat.chunk_major` layout
    of `values` (static shapes, one dtype), split back into the values."""
    num_devices = len(values[0])
    laid_out = [
        _flat.chunk_major([v[d] for v in values], rows)
        for d in range(num_devices)
    ]
    summed = list(all_reduce(laid_out))
    per_device = [
        _flat.from_chunk_major(summed[d], [v[d] for v in values], rows)
        for d in range(num_devices)
    ]
    return [
        [per_device[d][k] for d in range(num_devices)]
        for k in range(len(values))
    ]


def bind_shards(
    all_reduce: Callable[[Sequence[tf.Tensor], int], list[tf.Tensor]],
    shards: int,
    chunks: Callable[[int], int] | None = None,
) -> AllReduceBuilder:
    """A builder calling `all_reduce(tensors, shards)`, for builders that
    shard natively (ring, rechd, shuffle) and have no use for the index.

    Its `all_reduce_batch` reduces the values of one dtype in groups of at
    most `GROUP_BYTES` per device (`byte_groups`), one call per group: each
    device lays a group's values out with `_flat.chunk_major` in
    `shards * chunks(num_devices)` rows, so that a builder cutting its
    input into that many flat chunks gives every element the chunk, and so
    the summation order, it had when reduced alone (bit-identical floats).
    A value of at least `GROUP_BYTES` is reduced alone, with no layout.

    Args:
        all_reduce: `(tensors, shards) -> sums`.
        shards: passed to `all_reduce`.
        chunks: devices -> chunks per shard the builder cuts a tensor into
            (ring: the device count); None: the builder sums each element
            with one `add_n` of the devices' values (a shuffle), so the
            values are just concatenated. (TensorFlow's CPU AddN moves the
            first input whose buffer it may reuse to the front, so with
            three or more devices the last bit of a float sum follows
            which buffers are free when it runs, in any layout; integer
            sums are exact.)

    Raises:
        TypeError: `shards` is not an int.
        ValueError: `shards` is less than 1.
    """
    _checks.positive_int(shards, "shards")

    def all_reduce_with_shards(
        tensors: Sequence[tf.Tensor], index: int
    ) -> list[tf.Tensor]:
        del index  # Every value is reduced alike.
        return all_reduce(_flat.check_inputs(tensors, shards), shards)

    def batch(
        values: Sequence[Sequence[tf.Tensor]], indices: Sequence[int]
    ) -> list[list[tf.Tensor]]:
        values = [_flat.check_inputs(v, shards) for v in values]
        results: list[list[tf.Tensor]] = [[] for _ in values]
        for key, members in _batchable(values).items():
            if (
                isinstance(key, tuple)
                or len(members) == 1
                or (len(values[members[0]]) == 1)
            ):
                for k in members:
                    results[k] = all_reduce(values[k], shards)
                continue
            n = len(values[members[0]])
            rows = shards * chunks(n) if chunks is not None else 1
            for group in byte_groups(
                [_num_bytes(values[k][0]) for k in members], GROUP_BYTES
            ):
                if len(group) == 1:
                    k = members[group[0]]
                    results[k] = all_reduce(values[k], shards)
                    continue
                summed = _laid_out_all_reduce(
                    lambda laid_out: all_reduce(laid_out, shards),
                    [values[members[g]] for g in group],
                    rows,
                )
                for g, sums in zip(group, summed, strict=True):
                    results[members[g]] = sums
        return results

    all_reduce_with_shards.all_reduce_batch = batch  # type: ignore[attr-defined]
    return all_reduce_with_shards


def shard_wise(all_reduce: AllReduceBuilder, shards: int) -> AllReduceBuilder:
    """A builder that runs `all_reduce` once per flat shard of the tensors.

    Args:
        all_reduce: any builder; shard `s` of the value with index `k` gets
            index `k * shards + s`.
        shards: how many pieces each tensor is cut into, at least 1.

    Returns:
        The sharded builder. It checks its inputs as the chunked builders do
        (any numeric dtype, though) and gives one input back as a copy.

    Raises:
        TypeError: `shards` is not an int.
        ValueError: `shards` is less than 1.
    """
    _checks.positive_int(shards, "shards")

    def sharded_all_reduce(
        tensors: Sequence[tf.Tensor], index: int
    ) -> list[tf.Tensor]:
        tensors = _flat.check_inputs(tensors, shards, dtypes=None)
        if shards == 1:
            return list(all_reduce(tensors, index))
        pieces = [_flat.split_flat(t, shards) for t in tensors]
        summed = [
            list(all_reduce([p[s] for p in pieces], index * shards + s))
            for s in range(shards)
        ]
        return [
            _flat.join_flat([summed[s][i] for s in range(shards)], like=t)
            for i, t in enumerate(tensors)
        ]

    def batch(
        values: Sequence[Sequence[tf.Tensor]], indices: Sequence[int]
    ) -> list[list[tf.Tensor]]:
        # Shard s of value k goes to `all_reduce` with index k * shards + s;
        # the pieces whose indices agree modulo the device count (the
        # hierarchical copy's main device) are concatenated and reduced in
        # one call. Sums are elementwise, so the layout changes no bit.
        values = [_flat.check_inputs(v, shards, dtypes=None) for v in values]
        results: list[list[tf.Tensor]] = [[] for _ in values]
        for key, members in _batchable(values).items():
            n = len(values[members[0]])
            if isinstance(key, tuple) or len(members) == 1 or n == 1:
                for k in members:
                    results[k] = sharded_all_reduce(values[k], indices[k])
                continue
            pieces = {
                k: [
                    [t] if shards == 1 else _flat.split_flat(t, shards)
                    for t in values[k]
                ]
                for k in members
            }
            by_main: dict[int, list[tuple[int, int]]] = {}
            for k in members:
                for s in range(shards):
                    by_main.setdefault(
                        (indices[k] * shards + s) % n, []
                    ).append((k, s))
            summed: dict[tuple[int, int], list[tf.Tensor]] = {}
            for group in by_main.values():
                index = indices[group[0][0]] * shards + group[0][1]
                sums = _laid_out_all_reduce(
                    functools.partial(_with_index, all_reduce, index=index),
                    [[p[s] for p in pieces[k]] for k, s in group],
                    1,
                )
                summed.update(zip(group, sums, strict=True))
            for k in members:
                if shards == 1:
                    results[k] = summed[(k, 0)]
                    continue
                results[k] = [
                    _flat.join_flat(
                        [summed[(k, s)][d] for s in range(shards)],
                        like=t,
                    )
                    for d, t in enumerate(values[k])
                ]
        return results

    sharded_all_reduce.all_reduce_batch = batch  # type: ignore[attr-defined]
    return sharded_all_reduce
