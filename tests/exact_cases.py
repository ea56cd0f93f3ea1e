"""Inputs whose sums are exact in every dtype, for builder tests.

Inputs are chosen so every partial sum is exactly representable in its
dtype: floats are multiples of 0.5 in [-4, 4] (sums of at most 8 stay within
+-32 and need at most 7 significant bits; bfloat16 has 8, float16 11), and
integers are large enough to catch a narrowing (int32 up to 2**27, int64 up
to 2**40) but cannot overflow. So the stated tolerance is zero: every result
must equal numpy's sum exactly, whatever the summation order.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from tf_crossdevice import testing

DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)
SHAPES = ((), (7,), (10, 100), (1000003,))  # 1, 7, 1000, 1000003 elements.
# The 1000003-element case runs for 2-, 4- and 8-byte dtypes only: it adds
# no code path the small sizes miss (only a size not divisible by 2 or 3),
# and the other three dtypes at 8 devices would cost seconds of the budget.
BIG_DTYPES = (tf.bfloat16, tf.float32, tf.int64)
CASES = [
    (dtype, shape)
    for shape in SHAPES
    for dtype in DTYPES
    if shape != (1000003,) or dtype in BIG_DTYPES
]


def random_values(rng, dtype, shape):
    """Float64 / int64 values that sum exactly in `dtype` (module docstring)."""
    if dtype.is_floating:
        return rng.integers(-8, 9, size=shape).astype(np.float64) / 2
    bound = 2**27 if dtype == tf.int32 else 2**40
    return rng.integers(-bound, bound, size=shape, dtype=np.int64)


def on_device(array, dtype, device):
    with tf.device(device):
        return tf.cast(tf.constant(array), dtype)


@functools.lru_cache(maxsize=1)  # Tests run n by n; keep one n's tensors.
def problem(n):
    """Per case: the n arrays to sum on n devices, as tensors, and the sum."""
    rng = np.random.default_rng(n)
    devices = testing.cpu_devices(n)
    tensors, sums = [], []
    for dtype, shape in CASES:
        arrays = [random_values(rng, dtype, shape) for _ in range(n)]
        tensors.append(
            [
                on_device(a, dtype, d)
                for a, d in zip(arrays, devices, strict=True)
            ]
        )
        sums.append(np.sum(arrays, axis=0))
    return tensors, sums


def check_sums(results, expected_sums, devices, check_device=True):
    """results[c][i] must be the expected sum of case c, on devices[i].

    A tf.function hands its outputs back on the caller's device, so callers
    of a tf.function check placement on the traced tensors instead.
    """
    assert len(results) == len(CASES)
    for (dtype, shape), expected, outs in zip(
        CASES, expected_sums, results, strict=True
    ):
        assert len(outs) == len(devices)
        for out, device in zip(outs, devices, strict=True):
            assert out.dtype == dtype
            assert out.shape == shape
            if check_device:
                assert out.device == device
            got = np.asarray(out.numpy()).astype(expected.dtype)
            if not np.array_equal(got, expected):  # Fast path first.
                np.testing.assert_array_equal(
                    got, expected, err_msg=f"{dtype.name} {shape} on {device}"
                )
