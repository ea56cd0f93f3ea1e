"""Gram-Schmidt for PowerSGD's factors: `orthogonalize` makes a matrix's
columns (or each matrix's of a batch) orthonormal, twice over ("twice is
enough"), so that a gradient of rank below the factors' still gives
orthogonal columns.
"""

from __future__ import annotations

import tensorflow as tf


def orthogonalize(matrix: tf.Tensor) -> tf.Tensor:
    """`matrix`'s columns made orthonormal, left to right (Gram-Schmidt);
    a batch of matrices (..., n, r) one by one.

    Two passes of modified Gram-Schmidt: the second removes what rounding
    left of the earlier columns, so a nearly dependent column still comes
    out orthogonal. A column that is (or becomes) exactly zero stays zero.
    For a matrix of full column rank this is the Q of its QR factorization
    with R's diagonal positive.

    >>> p = orthogonalize(tf.constant([[3.0, 1.0], [4.0, 1.0]], tf.float64))
    >>> np.round(p.numpy(), 4).tolist()
    [[0.6, 0.8], [0.8, -0.6]]
    """
    columns = tf.unstack(matrix, axis=-1)
    done: list[tf.Tensor] = []
    for column in columns:
        for _ in range(2):
            for previous in done:
                dot = tf.reduce_sum(previous * column, axis=-1, keepdims=True)
                column -= dot * previous
        norm = tf.norm(column, axis=-1, keepdims=True)
        done.append(tf.math.divide_no_nan(column, norm))
    return tf.stack(done, axis=-1)


def orthogonalize_each(matrices: list[tf.Tensor]) -> list[tf.Tensor]:
    """`orthogonalize` of each of `matrices` (one shape), in one batch."""
    batch = orthogonalize(tf.stack(matrices))
    return tf.unstack(batch, num=len(matrices))
