"""Shared helpers for the chunked builders: validate, flatten and split, join.

A builder flattens each device's tensor, zero-pads it to a multiple of the
number of pieces its schedule needs, splits it, runs the schedule on the
pieces and joins them back: concatenate, strip the padding, reshape. Every op
is created under `tf.device` of the tensor it belongs to, so nothing here
moves data between devices. Static shapes give a graph without shape ops;
unknown dimensions fall back to `tf.shape` / `tf.size`.

Example:

>>> from tf_crossdevice.algorithms import _flat
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

from tf_crossdevice._core import checks

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
    checks.positive_int(num_shards, "num_shards")
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


def _shape_groups(tensors: Sequence[tf.Tensor]) -> list[list[int]]:
    """Positions of tensors of equal static shape, by first appearance."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for k, t in enumerate(tensors):
        groups.setdefault(tuple(t.shape.as_list()), []).append(k)
    return list(groups.values())


def chunk_major(tensors: Sequence[tf.Tensor], rows: int) -> tf.Tensor:
    """One device's tensors laid out so that chunk c of each sits in row c.

    Each tensor is flattened, zero-padded to a multiple of `rows` and viewed
    as `[rows, m]` (its chunk c, as `split_flat(t, rows)[c]`, is row c); the
    views are concatenated along axis 1. A builder that cuts the result
    into `rows` flat pieces thus gives every element the chunk index, and
    so the summation order, it would have had alone. With `rows == 1` the
    result is rank 1: the elements of all tensors.

    Tensors of one shape are stacked and laid out together (a transpose),
    so the graph grows with the number of distinct shapes, not of tensors.

    Args:
        tensors: tensors of one dtype with static shapes, on one device
            (the ops go on `tensors[0].device`).
        rows: the number of chunks each tensor is cut into, at least 1.

    Returns:
        `[rows, sum(m)]`, or `[sum(sizes)]` when `rows == 1`; undo it with
        `from_chunk_major`.

    Example:

    >>> a, b = tf.range(4), tf.range(10, 12)
    >>> chunk_major([a, b], 2).numpy().tolist()
    [[0, 1, 10], [2, 3, 11]]
    >>> chunk_major([a, b], 1).numpy().tolist()
    [0, 1, 2, 3, 10, 11]
    """
    with tf.device(tensors[0].device):
        columns = []
        for members in _shape_groups(tensors):
            group = [tensors[k] for k in members]
            size = group[0].shape.num_elements()
            width, count = -(-size // rows), len(group)
            if count == 1:
                t = group[0]
                flat = t if t.shape.rank == 1 else tf.reshape(t, [-1])
                if rows == 1:
                    columns.append(flat)
                    continue
                if width * rows != size:
                    t = tf.pad(flat, [[0, width * rows - size]])
                if t.shape != tf.TensorShape([rows, width]):
                    t = tf.reshape(t, [rows, width])
                columns.append(t)
                continue
            stacked = tf.reshape(tf.stack(group), [count, size])
            if rows == 1:
                columns.append(tf.reshape(stacked, [-1]))
                continue
            if width * rows != size:
                stacked = tf.pad(stacked, [[0, 0], [0, width * rows - size]])
            stacked = tf.reshape(stacked, [count, rows, width])
            columns.append(
                tf.reshape(
                    tf.transpose(stacked, [1, 0, 2]), [rows, count * width]
                )
            )
        if len(columns) == 1:
            return columns[0]
        return tf.concat(columns, axis=1 if rows > 1 else 0)


def from_chunk_major(
    laid_out: tf.Tensor, likes: Sequence[tf.Tensor], rows: int
) -> list[tf.Tensor]:
    """Undoes `chunk_major`: the tensors shaped like `likes`, in order.

    The ops go on `likes[0].device`.

    >>> a, b, c = tf.range(4), tf.range(10, 13), tf.range(20, 24)
    >>> [t.numpy().tolist() for t in from_chunk_major(
    ...     chunk_major([a, b, c], 2), [a, b, c], 2)]
    [[0, 1, 2, 3], [10, 11, 12], [20, 21, 22, 23]]
    """
    groups = _shape_groups(likes)
    out: list[tf.Tensor | None] = [None] * len(likes)
    with tf.device(likes[0].device):
        widths = []
        for members in groups:
            size = likes[members[0]].shape.num_elements()
            widths.append(
                len(members) * (-(-size // rows) if rows > 1 else size)
            )
        if len(groups) == 1:
            blocks = [laid_out]
        else:
            blocks = tf.split(laid_out, widths, axis=1 if rows > 1 else 0)
        for members, block in zip(groups, blocks, strict=True):
            like = likes[members[0]]
            size, count = like.shape.num_elements(), len(members)
            width = -(-size // rows)
            if count == 1:
                if width * rows != size:
                    block = tf.reshape(block, [-1])[:size]
                if block.shape != like.shape:
                    block = tf.reshape(block, like.shape)
                out[members[0]] = block
                continue
            if rows > 1:
                block = tf.reshape(
                    tf.transpose(
                        tf.reshape(block, [rows, count, width]), [1, 0, 2]
                    ),
                    [count, rows * width],
                )
                if width * rows != size:
                    block = block[:, :size]
            block = tf.reshape(block, [count, *like.shape.as_list()])
            for k, t in zip(members, tf.unstack(block), strict=True):
                out[k] = t
    return out  # type: ignore[return-value]
