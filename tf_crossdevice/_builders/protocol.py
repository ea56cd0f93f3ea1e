"""The one call shape every all-reduce builder has.

An `AllReduceBuilder` takes one dense tensor per device (distinct devices,
same shape and dtype) and the index of that value (or pack) in its batch,
and returns the elementwise sums, the i-th on `tensors[i].device`, with the
inputs' shape and dtype. The index lets an algorithm spread work over a
batch (hierarchical copy rotates its main device with it); others ignore it.

Options an algorithm needs (how many shards, where a shuffle gathers) are
bound when the builder is made: a `BuilderFactory` takes the shard count and
returns the builder. `registry.py` maps each algorithm name to its factory.

`shard_wise` gives any builder shards for free: it splits each tensor into
`shards` flat pieces and all-reduces each piece on its own. `bind_shards`
adapts a builder that shards natively, `f(tensors, num_shards)`.

>>> from tf_crossdevice._builders import protocol
>>> from tf_crossdevice._builders import reduction_to_one_device as one
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

from collections.abc import Callable, Sequence
from typing import TypeAlias

import tensorflow as tf

from tf_crossdevice import _checks
from tf_crossdevice._builders import _flat

AllReduceBuilder: TypeAlias = Callable[
    [Sequence[tf.Tensor], int], list[tf.Tensor]
]
"""(tensors, index in the batch) -> sums, the i-th on tensors[i].device."""

BuilderFactory: TypeAlias = Callable[[int], AllReduceBuilder]
"""shards -> the builder; registered under an algorithm name."""


def bind_shards(
    all_reduce: Callable[[Sequence[tf.Tensor], int], list[tf.Tensor]],
    shards: int,
) -> AllReduceBuilder:
    """A builder calling `all_reduce(tensors, shards)`, for builders that
    shard natively (ring, rechd, shuffle) and have no use for the index.

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

    return sharded_all_reduce
