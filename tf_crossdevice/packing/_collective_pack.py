"""The collective classes' packs in TensorFlow: plan, flatten, unflatten.

`plan_packs` sizes the tensors and asks `_collective_plan` which of them
share a collective; `flatten_pack` makes one flat tensor of a pack, which
is all-reduced, and `unflatten_pack` cuts the sum back into the pack's
shapes. Flattening and splitting commute with elementwise summation, so the
pieces of a summed pack are the sums of its tensors.

>>> tensors = [tf.ones([2, 3]), tf.zeros([4])]
>>> plan_packs(tensors, bytes_per_pack=0, merge_scope=32)
[[1, 0]]
>>> flat = flatten_pack(tensors)
>>> flat.shape.as_list()
[10]
>>> [t.shape.as_list() for t in unflatten_pack(flat, tensors)]
[[2, 3], [4]]
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice.packing import _collective_plan as collective_packing


def plan_packs(
    tensors: Sequence[tf.Tensor], bytes_per_pack: int, merge_scope: int | None
) -> list[list[int]]:
    """`collective_packs` for these tensors.

    Args:
        tensors: one device's tensors; a tensor of unknown static size gets
            a pack of its own.
        bytes_per_pack: TensorFlow's `CommunicationOptions.bytes_per_pack`
            (0: packs of `merge_scope` values).
        merge_scope: values per pack when `bytes_per_pack` is 0; None:
            the default pack size then (`collective_packs`).
    """
    sizes = [
        None
        if t.shape.num_elements() is None
        else t.shape.num_elements() * t.dtype.size
        for t in tensors
    ]
    return collective_packing.collective_packs(
        sizes, [t.dtype for t in tensors], bytes_per_pack, merge_scope
    )


def flatten_pack(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """The tensors as one flat tensor (on the enclosing device)."""
    flat = [tf.reshape(t, [-1]) for t in tensors]
    return flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)


def unflatten_pack(
    flat: tf.Tensor, like: Sequence[tf.Tensor]
) -> list[tf.Tensor]:
    """`flatten_pack`'s inverse: pieces shaped as `like`."""
    sizes = [
        t.shape.num_elements()
        if t.shape.num_elements() is not None
        else tf.size(t)
        for t in like
    ]
    pieces = [flat] if len(like) == 1 else tf.split(flat, sizes)
    return [
        tf.reshape(p, t.shape if t.shape.is_fully_defined() else tf.shape(t))
        for p, t in zip(pieces, like, strict=True)
    ]
