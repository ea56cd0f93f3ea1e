"""Tests of the collective classes' packs in TensorFlow: plan, flatten and
unflatten (`tf_crossdevice.packing._collective_pack`), checked with numpy."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_crossdevice.packing._collective_pack import (
    flatten_pack,
    plan_packs,
    unflatten_pack,
)

SHAPES = [(2, 3), (), (4,), (1, 2, 2), (0,), (3, 1)]


def _arrays(dtype=np.float32):
    rng = np.random.default_rng(0)
    return [rng.normal(size=shape).astype(dtype) for shape in SHAPES]


def test_flatten_is_numpy_concatenate_of_the_raveled_tensors():
    arrays = _arrays()
    flat = flatten_pack([tf.constant(a) for a in arrays])
    np.testing.assert_array_equal(
        flat.numpy(), np.concatenate([a.ravel() for a in arrays])
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_unflatten_inverts_flatten_for_mixed_shapes(dtype):
    arrays = _arrays(dtype)
    tensors = [tf.constant(a) for a in arrays]
    pieces = unflatten_pack(flatten_pack(tensors), tensors)
    assert len(pieces) == len(arrays)
    for piece, a in zip(pieces, arrays, strict=True):
        assert piece.dtype == tf.as_dtype(dtype)
        np.testing.assert_array_equal(piece.numpy(), a)


def test_one_tensor_round_trips():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    flat = flatten_pack([tf.constant(a)])
    np.testing.assert_array_equal(flat.numpy(), a.ravel())
    (piece,) = unflatten_pack(flat, [tf.constant(a)])
    np.testing.assert_array_equal(piece.numpy(), a)


def test_sum_of_flat_packs_unflattens_to_the_sums():
    """What the collectives rely on: flatten, add, unflatten = add."""
    per_device = [_arrays(), [2 * a for a in _arrays()]]
    flats = [flatten_pack([tf.constant(a) for a in d]) for d in per_device]
    pieces = unflatten_pack(
        tf.add_n(flats), [tf.constant(a) for a in per_device[0]]
    )
    for piece, a, b in zip(pieces, *per_device, strict=True):
        np.testing.assert_allclose(piece.numpy(), a + b, rtol=1e-6)


def test_round_trip_with_unknown_static_shapes():
    arrays = _arrays()
    specs = [tf.TensorSpec(None, tf.float32) for _ in arrays]

    @tf.function(input_signature=[specs])
    def round_trip(tensors):
        return unflatten_pack(flatten_pack(tensors), tensors)

    for piece, a in zip(round_trip(arrays), arrays, strict=True):
        np.testing.assert_array_equal(piece.numpy(), a)


def test_plan_packs_by_bytes_per_pack():
    # 24, 4, 16, 16, 0 and 12 bytes of float32, then one int32 of 8 bytes.
    tensors = [tf.constant(a) for a in _arrays()] + [tf.constant([1, 2])]
    # Last to first; a pack closes once it holds more than 20 bytes, and
    # dtypes never share one.
    assert plan_packs(tensors, bytes_per_pack=20, merge_scope=32) == [
        [6],
        [5, 4, 3],
        [2, 1, 0],
    ]
    # The empty tensor (4) holds no bytes, so the next one joins it.
    assert plan_packs(tensors, bytes_per_pack=1, merge_scope=32) == [
        [6],
        [5],
        [4, 3],
        [2],
        [1],
        [0],
    ]


def test_plan_packs_by_merge_scope_when_bytes_per_pack_is_zero():
    tensors = [tf.constant(a) for a in _arrays()]
    assert plan_packs(tensors, bytes_per_pack=0, merge_scope=2) == [
        [5, 4],
        [3, 2],
        [1, 0],
    ]
    assert plan_packs(tensors, bytes_per_pack=0, merge_scope=32) == [
        [5, 4, 3, 2, 1, 0]
    ]


def test_plan_packs_gives_unknown_sizes_their_own_pack():
    specs = [
        tf.TensorSpec([2], tf.float32),
        tf.TensorSpec(None, tf.float32),
        tf.TensorSpec([2], tf.float32),
    ]
    packs = []

    @tf.function(input_signature=[specs])
    def plan(tensors):
        packs.extend(plan_packs(tensors, bytes_per_pack=0, merge_scope=32))
        return tensors

    plan([np.zeros(2, np.float32)] * 3)
    assert packs == [[2], [1], [0]]


def test_plan_packs_rejects_negative_bytes_per_pack():
    with pytest.raises(ValueError, match="bytes_per_pack"):
        plan_packs([tf.ones([2])], bytes_per_pack=-1, merge_scope=32)
