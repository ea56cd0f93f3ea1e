"""IndexedSlices through collectives: all-gathered, never summed densely.

An IndexedSlices' sum is every member's rows, concatenated (as TensorFlow
sums IndexedSlices); its gather shifts member m's indices past the rows of
the members before it.
"""

from __future__ import annotations

import tensorflow as tf

from tf_crossdevice.collective._group import Group, Options


def all_gather_sparse(
    group: Group, index: int, value: tf.IndexedSlices, options: Options
) -> tf.IndexedSlices:
    """Every member's IndexedSlices as one, member m's rows after m-1's."""
    values, lengths = group.all_gather_ragged(index, value.values, options)
    indices, _ = group.all_gather_ragged(index, value.indices, options)
    rows = group.all_gather(
        index, tf.cast(value.dense_shape[:1], tf.int64), options
    )
    offsets = tf.cumsum(rows, exclusive=True)
    shift = tf.repeat(offsets, lengths)
    dense_shape = tf.concat(
        [
            tf.reduce_sum(rows, keepdims=True),
            tf.cast(value.dense_shape[1:], tf.int64),
        ],
        axis=0,
    )
    return tf.IndexedSlices(
        values, indices + tf.cast(shift, indices.dtype), dense_shape
    )


def all_reduce_sparse(
    group: Group, index: int, value: tf.IndexedSlices, options: Options
) -> tf.IndexedSlices:
    """The sum of every member's IndexedSlices: all their rows, unmerged."""
    values, _ = group.all_gather_ragged(index, value.values, options)
    indices, _ = group.all_gather_ragged(index, value.indices, options)
    return tf.IndexedSlices(values, indices, value.dense_shape)
