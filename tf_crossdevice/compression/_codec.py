"""16-bit wire compression: the codec, its error bound and when it pays.

A float32 or float64 value that crosses a worker boundary can travel as 16
bits: the sender `encode`s it on its own device, the receiver `decode`s it
back to the original dtype on its device, and every sum is then taken in
the original dtype. Other dtypes (ints, float16, bfloat16) pass through
unchanged, so their sums stay exact. Which transfers cross workers is a
`WirePolicy`'s decision; `_wire_policy.Wire` applies the codec to them.

Codecs (`COMPRESSIONS`):

- 'bf16': bfloat16 (8 significant bits, float32's exponent range). A float32
  value is cast, nothing else. A float64 value is scaled like 'fp16' (its
  exponent range is wider than bfloat16's), then cast through float32.
- 'fp16': IEEE half (11 significant bits, largest finite 65504). Every
  message is multiplied by a power of two 2**s chosen from its largest
  finite magnitude m so that m * 2**s lies in [2**14, 2**15): nothing
  overflows, small values keep as much precision as half allows, and the
  scaling itself rounds nothing (a power of two only moves the exponent).
  s travels as one extra float32 scalar per message. inf and nan stay inf
  and nan.

Rounding is to nearest (even). One transfer, x -> decode(encode(x)), errs by
at most

    |error| <= u * |x| + a * m + t

with u = 2**-8 for 'bf16' and 2**-11 for 'fp16' (float64 goes through
float32 first: add 2**-23 to u), a = 2**-39 for 'fp16' and for 'bf16' of
float64 (values more than 2**28 below the message's largest, m, fall into
half's subnormals; a = 0 for 'bf16' of float32) and t the dtype's smallest
normal number (TensorFlow flushes subnormals to zero). Finite values within
a factor (1 + u) of the dtype's largest finite number may round to +-inf.

>>> from tf_crossdevice.compression import _codec as compression
>>> x = tf.constant([1.0, 1000.0, 1e6, float("inf")])
>>> parts = compression.encode(x, "fp16")
>>> [p.dtype.name for p in parts]
['float16', 'float32']
>>> compression.decode(parts, tf.float32, "fp16").numpy().tolist()
[1.0, 1000.0, 999936.0, inf]
>>> compression.compresses(tf.int32, "bf16")
False
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

COMPRESSIONS = ("bf16", "fp16")
"""The codecs; None (no compression) is allowed wherever these are."""

_WIRE_DTYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}
_COMPRESSIBLE = (tf.float32, tf.float64)
# The scaled message's largest magnitude lands in [2**14, 2**15): below
# half's largest finite value (65504) even after rounding up.
_TOP_EXPONENT = 14
# (mantissa bits, exponent bias, largest scale exponent whose inverse is
# still a normal number) of the dtypes that get scaled.
_FORMATS = {tf.float32: (23, 127, 126), tf.float64: (52, 1023, 1022)}
_INT_OF = {tf.float32: tf.int32, tf.float64: tf.int64}

RELATIVE_ERROR = {"bf16": 2.0**-8, "fp16": 2.0**-11}
"""u, the relative error of one round to nearest (float32 values)."""


def sum_tolerance(compression: str, num_workers: int) -> float:
    """How far a compressed all-reduce's sums may stray from the exact sum,
    relative to the sum of the replicas' absolute values.

    A value rounded at most k times to 16 bits errs by ((1+u)**k - 1) *
    sum|x_i| (about k*u*sum|x_i|) plus absolute terms (fp16's a*m, the
    smallest normal number) far below u*|x| for values of magnitude 1 or
    more. Across p workers k is 2 (pscpu, psgpu and two-level specs over
    them), 3 (hierarchical_copy), p + 1 (xring), ceil(log2 p) + 2 (rechd)
    and 1 for the collectives (each member's value once): k = p + 2 bounds
    them all, and 2*k*u covers ((1+u)**k - 1), the absolute terms and the
    dtype's own additions with room to spare. Autotune and the benchmark
    check compressed candidates against numpy within this.

    >>> sum_tolerance("bf16", 3) == 2 * 5 * 2.0**-8
    True
    """
    return 2 * (num_workers + 2) * RELATIVE_ERROR[_check_codec(compression)]


def check_compression(value: Any, argument: str = "compression") -> str | None:
    """`value` if it is None, 'bf16' or 'fp16'; else ValueError.

    >>> check_compression("bf16")
    'bf16'
    >>> check_compression("bf8")
    Traceback (most recent call last):
    ...
    ValueError: compression: unknown value 'bf8'; expected one of None, \
'bf16', 'fp16'
    """
    if value is None or (isinstance(value, str) and value in COMPRESSIONS):
        return value
    allowed = ", ".join(["None"] + [repr(c) for c in COMPRESSIONS])
    raise ValueError(
        f"{argument}: unknown value {value!r}; expected one of {allowed}"
    )


def compresses(dtype: tf.DType, compression: str | None) -> bool:
    """Whether values of `dtype` travel compressed under `compression`.

    Only float32 and float64 are; ints, float16 and bfloat16 never are.

    >>> compresses(tf.float64, "fp16"), compresses(tf.float32, None)
    (True, False)
    >>> compresses(tf.bfloat16, "bf16"), compresses(tf.int64, "fp16")
    (False, False)
    """
    return compression is not None and tf.as_dtype(dtype) in _COMPRESSIBLE


def _scaled(dtype: tf.DType, compression: str) -> bool:
    # bfloat16 has float32's exponent range; half and float64 need a scale.
    return compression == "fp16" or dtype == tf.float64


def _power_of_two(exponent: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """2**exponent in `dtype`, exactly (built from its bits)."""
    mantissa_bits, bias, _ = _FORMATS[dtype]
    int_dtype = _INT_OF[dtype]
    biased = tf.cast(exponent, int_dtype) + bias
    return tf.bitcast(tf.bitwise.left_shift(biased, mantissa_bits), dtype)


def _scale_exponent(tensor: tf.Tensor) -> tf.Tensor:
    """s (int32) such that max finite |tensor| * 2**s is in [2**14, 2**15).

    0 when no element is finite and non-zero. Capped so that 2**-s stays
    a normal number; a message whose largest value is that tiny keeps less
    precision (its errors are below the dtype's smallest normal number).
    """
    dtype = tensor.dtype
    mantissa_bits, bias, top = _FORMATS[dtype]
    # Two read-only passes; only a message holding inf or nan pays for a
    # third that leaves them out.
    magnitude = tf.maximum(tf.reduce_max(tensor), -tf.reduce_min(tensor))
    magnitude = tf.cond(
        tf.math.is_finite(magnitude),
        lambda: magnitude,
        lambda: tf.reduce_max(
            tf.where(tf.math.is_finite(tensor), tf.abs(tensor), 0)
        ),
    )
    bits = tf.bitcast(magnitude, _INT_OF[dtype])
    biased = tf.maximum(tf.bitwise.right_shift(bits, mantissa_bits), 1)
    exponent = tf.cast(biased, tf.int32) - bias  # floor(log2(magnitude))
    scale = tf.minimum(_TOP_EXPONENT - exponent, top)
    return tf.where(magnitude > 0, scale, 0)


def encode(tensor: tf.Tensor, compression: str) -> list[tf.Tensor]:
    """The 16-bit wire form of `tensor`; call under `tf.device(sender)`.

    Args:
        tensor: a float32 or float64 tensor (see `compresses`).
        compression: 'bf16' or 'fp16'.

    Returns:
        [the 16-bit tensor], plus for a scaled message (every 'fp16' one,
        and 'bf16' of float64) the scale exponent as a float32 scalar.

    Raises:
        ValueError: `compression` is not 'bf16' or 'fp16', or `tensor`'s
            dtype is not compressed.

    >>> [p.numpy().tolist() for p in encode(tf.constant([3.0, 0.5]), "fp16")]
    [[24576.0, 4096.0], 13.0]
    """
    wire_dtype = _WIRE_DTYPES[_check_codec(compression)]
    dtype = _check_dtype(tensor.dtype, compression)
    if not _scaled(dtype, compression):
        return [tf.cast(tensor, wire_dtype)]
    scale = _scale_exponent(tensor)
    scaled = tensor * _power_of_two(scale, dtype)
    if dtype == tf.float64:
        scaled = tf.cast(scaled, tf.float32)
    return [tf.cast(scaled, wire_dtype), tf.cast(scale, tf.float32)]


def decode(
    parts: Sequence[tf.Tensor], dtype: tf.DType, compression: str
) -> tf.Tensor:
    """`encode`'s inverse, in `dtype`; call under `tf.device(receiver)`.

    Args:
        parts: what `encode` returned (on any device).
        dtype: the original dtype, float32 or float64.
        compression: the codec `encode` used.

    Raises:
        ValueError: as `encode`, or `parts` has the wrong length.

    >>> x = tf.constant([1.0, 1.0 + 2.0**-9], tf.float64)
    >>> decode(encode(x, "bf16"), tf.float64, "bf16").numpy().tolist()
    [1.0, 1.0]
    """
    _check_codec(compression)
    dtype = _check_dtype(dtype, compression)
    want = 2 if _scaled(dtype, compression) else 1
    if len(parts) != want:
        raise ValueError(
            f"parts: expected {want} tensor(s) from encode for {dtype.name} "
            f"with {compression!r}, got {len(parts)}"
        )
    value = tf.cast(parts[0], dtype)
    if want == 1:
        return value
    scale = tf.cast(parts[1], tf.int32)
    return value * _power_of_two(-scale, dtype)


def _check_codec(compression: str) -> str:
    if compression not in COMPRESSIONS:
        check_compression(compression)
        raise ValueError(
            "compression: None means no compression; expected 'bf16' or "
            "'fp16' here"
        )
    return compression


def _check_dtype(dtype: tf.DType, compression: str) -> tf.DType:
    dtype = tf.as_dtype(dtype)
    if not compresses(dtype, compression):
        raise ValueError(
            f"dtype: {dtype.name} is not compressed; expected float32 or "
            "float64 (other dtypes pass through unchanged)"
        )
    return dtype


def gather_compression_pays(group_size: int) -> bool:
    """Whether a collective group gathers 16-bit messages (compression on).

    Per member, an all-gather of p members' S/2-byte messages moves
    (p-1)·S/2 bytes, TensorFlow's ring all-reduce of S bytes 2(p-1)/p·S:
    fewer for p <= 3, as many for p = 4, more beyond (the gap grows with p,
    so larger groups reduce uncompressed).

    >>> [p for p in range(1, 7) if gather_compression_pays(p)]
    [2, 3]
    """
    return 1 < group_size <= 3
