"""Shared helpers for the chunked builders: validate, flatten and split, join.

A builder flattens each device's tensor, zero-pads it to a multiple of the
number of pieces its schedule needs, splits it, runs the schedule on the
pieces and joins them back: concatenate, strip the padding, reshape. Every op
is created under `tf.device` of the tensor it belongs to, so nothing here
moves data between devices. Static shapes give a graph without shape ops;
unknown dimensions fall back to `tf.shape` / `tf.size`.

Example:

>>> from tf_crossdevice._builders import _flat
>>> x = tf.reshape(tf.range(5), [1, 5])
>>> pieces = _flat.split_flat(x, 3)
>>> [p.numpy().tolist() for p in pieces]
[[0, 1], [2, 3], [4, 0]]
>>> _flat.join_flat(pieces, like=x).numpy().tolist()
[[0, 1, 2, 3, 4]]
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice import _checks

SUPPORTED_DTYPES = frozenset(
    {
        tf.float16,
        tf.bfloat16,
        tf.float32,
        tf.float64,
        tf.int32,
        tf.int64,
        tf.complex64,
        tf.complex128,
    }
)


def check_inputs(
    tensors: Sequence[tf.Tensor],
    num_shards: int,
    dtypes: frozenset[tf.DType] | None = SUPPORTED_DTYPES,
) -> list[tf.Tensor]:
    """Validates a builder's arguments.

    Args:
        tensors: one dense tensor per device.
        num_shards: number of independent parallel instances.
        dtypes: the dtypes the builder supports; None means any integer,
            floating-point or complex dtype.

    Returns:
        `tensors` as a list.

    Raises:
        ValueError: `tensors` is empty, the shapes are incompatible, or
            `num_shards` is less than 1.
        TypeError: an element is not a dense `tf.Tensor`, the dtypes differ,
            the dtype is not in `dtypes`, or `num_shards` is not an int.

    Example:

    >>> check_inputs([tf.zeros([2])], num_shards=0)
    Traceback (most recent call last):
    ...
    ValueError: num_shards: expected an int >= 1, got 0
    """
    _checks.positive_int(num_shards, "num_shards")
    tensors = list(tensors)
    if not tensors:
        raise ValueError(
            "tensors: expected one tensor per device, got an empty sequence"
        )
    for i, t in enumerate(tensors):
        if not isinstance(t, tf.Tensor):
            raise TypeError(
                f"tensors[{i}]: expected a dense tf.Tensor, got "
                f"{type(t).__name__}"
            )
    dtype, shape = tensors[0].dtype, tensors[0].shape
    if dtypes is None:
        if not (dtype.is_integer or dtype.is_floating or dtype.is_complex):
            raise TypeError(
                f"tensors: dtype {dtype.name} is not supported; expected an "
                "integer, floating-point or complex dtype"
            )
    elif dtype not in dtypes:
        allowed = ", ".join(sorted(d.name for d in dtypes))
        raise TypeError(
            f"tensors: dtype {dtype.name} is not supported; expected one of "
            f"{allowed}"
        )
    for i, t in enumerate(tensors):
        if t.dtype != dtype:
            raise TypeError(
                f"tensors[{i}]: dtype {t.dtype.name} differs from tensors[0]'s "
                f"{dtype.name}; all tensors must have the same dtype"
            )
        if not t.shape.is_compatible_with(shape):
            raise ValueError(
                f"tensors[{i}]: shape {t.shape} differs from tensors[0]'s "
                f"{shape}; all tensors must have the same shape"
            )
    return tensors


def split_flat(tensor: tf.Tensor, num_pieces: int) -> list[tf.Tensor]:
    """Flattens, zero-pads to a multiple of `num_pieces` and splits.

    Args:
        tensor: the tensor; the ops go on `tensor.device`.
        num_pieces: how many equal pieces, at least 1.

    Returns:
        `num_pieces` rank-1 tensors of `ceil(size / num_pieces)` elements.

    Example:

    >>> [p.shape.as_list() for p in split_flat(tf.zeros([7]), 2)]
    [[4], [4]]
    """
    with tf.device(tensor.device):
        flat = tf.reshape(tensor, [-1])
        size = tensor.shape.num_elements()
        if size is None:
            padding = tf.math.floormod(-tf.size(flat), num_pieces)
            flat = tf.pad(flat, [[0, padding]])
        elif size % num_pieces:
            flat = tf.pad(flat, [[0, -size % num_pieces]])
        return tf.split(flat, num_pieces) if num_pieces > 1 else [flat]


def join_flat(pieces: Sequence[tf.Tensor], like: tf.Tensor) -> tf.Tensor:
    """Concatenates `pieces`, strips the padding and reshapes like `like`.

    Args:
        pieces: rank-1 tensors, e.g. from `split_flat`, already on
            `like.device`.
        like: the tensor whose shape (and device) the result takes.

    Returns:
        A tensor on `like.device` with `like`'s shape.

    Example:

    >>> x = tf.zeros([2, 3])
    >>> join_flat(split_flat(x, 4), like=x).shape
    TensorShape([2, 3])
    """
    with tf.device(like.device):
        flat = tf.concat(list(pieces), 0) if len(pieces) > 1 else pieces[0]
        size = like.shape.num_elements()
        if size is None:
            flat = flat[: tf.size(like)]
            return tf.reshape(flat, tf.shape(like))
        if flat.shape.num_elements() != size:
            flat = flat[:size]
        return tf.reshape(flat, like.shape)
