"""Tests for 16-bit wire compression (tf_crossdevice._builders.compression).

The codec is checked against numpy with random values and the documented
bound; the builders and classes with fake workers (groups of local logical
CPUs declared different workers through `same_worker`).
"""

from __future__ import annotations

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tf_crossdevice import testing
from tf_crossdevice._builders import compression

FLOATS = {"float32": np.float32, "float64": np.float64}


def unit_roundoff(codec, dtype):
    """u of one transfer: float64 is rounded to float32 first."""
    u = compression.RELATIVE_ERROR[codec]
    return u + 2.0**-23 if dtype == np.float64 else u


def transfer_bound(x, codec):
    """The documented bound on |decode(encode(x)) - x|, per element."""
    finite = np.abs(x[np.isfinite(x)])
    m = finite.max() if finite.size else 0.0
    scaled = codec == "fp16" or x.dtype == np.float64
    a = 2.0**-39 if scaled else 0.0
    tiny = np.finfo(x.dtype).tiny
    return unit_roundoff(codec, x.dtype) * np.abs(x) + a * m + tiny


def round_trip(x, codec):
    tensor = tf.constant(x)
    parts = compression.encode(tensor, codec)
    return parts, compression.decode(parts, tensor.dtype, codec).numpy()


def float_arrays(dtype):
    """Arrays of any magnitude, away from the top of the dtype's range."""
    top = float(np.finfo(dtype).max) / 2.0**62  # Scaled by up to 2**60.
    return hnp.arrays(
        dtype,
        st.integers(1, 40),
        elements=st.floats(
            -top, top, width=np.dtype(dtype).itemsize * 8, allow_nan=False
        ),
    )


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("dtype", list(FLOATS))
def test_one_transfer_is_within_the_documented_bound(codec, dtype):
    @hypothesis.settings(max_examples=60, deadline=None)
    @hypothesis.given(float_arrays(FLOATS[dtype]), st.integers(-60, 60))
    def check(x, exponent):
        x = (x * np.asarray(2.0**exponent, x.dtype)).astype(x.dtype)
        parts, got = round_trip(x, codec)
        assert got.dtype == x.dtype
        assert (
            parts[0].dtype == {"bf16": tf.bfloat16, "fp16": tf.float16}[codec]
        )
        err = np.abs(got.astype(np.float64) - x.astype(np.float64))
        assert np.all(err <= transfer_bound(x, codec)), (x, got)

    check()


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("dtype", list(FLOATS))
def test_the_bound_is_tight_on_halfway_values(codec, dtype):
    # 1 + u is halfway between 1 and the next 16-bit number: it rounds to
    # the even neighbour 1, an error of exactly u.
    u = compression.RELATIVE_ERROR[codec]
    x = np.array([1.0 + u, 3.0, 1.0], FLOATS[dtype])
    _, got = round_trip(x, codec)
    np.testing.assert_array_equal(got, [1.0, 3.0, 1.0])


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("dtype", list(FLOATS))
def test_inf_and_nan_survive_and_large_values_do_not_overflow(codec, dtype):
    # Within half's dynamic range (2**28) of the largest value.
    x = np.array([np.inf, -np.inf, np.nan, 1e30, -3e37, 2e34], dtype)
    _, got = round_trip(x, codec)
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2])
    np.testing.assert_allclose(got[3:], x[3:], rtol=unit_roundoff(codec, dtype))


def test_float64_beyond_float32_range_is_scaled_back():
    x = np.array([1e300, -2.5e299, 1e200], np.float64)
    for codec in compression.COMPRESSIONS:
        _, got = round_trip(x, codec)
        np.testing.assert_allclose(got[:2], x[:2], rtol=2.0**-8 + 2.0**-23)


def test_fp16_scale_is_one_float32_scalar_and_a_power_of_two():
    parts, _ = round_trip(np.array([3.0, -0.25, 0.0], np.float32), "fp16")
    wire, scale = (p.numpy() for p in parts)
    assert scale.dtype == np.float32 and scale.shape == ()
    # Largest magnitude 3 = 1.5 * 2**1 lands in [2**14, 2**15): s = 13.
    assert scale == 13.0
    np.testing.assert_array_equal(wire, [3 * 2**13, -(2**11), 0])


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
def test_all_zero_and_empty_messages(codec):
    for x in (np.zeros([3], np.float32), np.zeros([0], np.float64)):
        _, got = round_trip(x, codec)
        np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("dtype", list(FLOATS))
def test_a_rounded_value_round_trips_exactly(codec, dtype):
    x = np.random.default_rng(0).normal(size=100).astype(dtype) * 1e3
    _, once = round_trip(x, codec)
    _, twice = round_trip(once, codec)
    np.testing.assert_array_equal(twice, once)


def test_only_float32_and_float64_are_compressed():
    for dtype in (tf.float32, tf.float64):
        assert compression.compresses(dtype, "bf16")
        assert compression.compresses(dtype, "fp16")
        assert not compression.compresses(dtype, None)
    for dtype in (tf.float16, tf.bfloat16, tf.int32, tf.int64, tf.complex64):
        for codec in (None, *compression.COMPRESSIONS):
            assert not compression.compresses(dtype, codec)
    with pytest.raises(ValueError, match="dtype: int32 is not compressed"):
        compression.encode(tf.constant([1]), "bf16")


@pytest.mark.parametrize("bad", ["bf8", "BF16", "", 16, tf.bfloat16, True])
def test_check_compression_names_the_argument_and_allowed_values(bad):
    with pytest.raises(ValueError) as e:
        compression.check_compression(bad, "options.compression")
    message = str(e.value)
    assert message.startswith("options.compression: unknown value ")
    assert message.endswith("expected one of None, 'bf16', 'fp16'")


def test_check_compression_accepts_the_allowed_values():
    for value in (None, "bf16", "fp16"):
        assert compression.check_compression(value) == value


def test_decode_checks_the_number_of_parts():
    parts = compression.encode(tf.constant([1.0]), "bf16")
    with pytest.raises(ValueError, match="expected 2 tensor"):
        compression.decode(parts, tf.float32, "fp16")
    with pytest.raises(ValueError, match="None means no compression"):
        compression.encode(tf.constant([1.0]), None)  # type: ignore[arg-type]


def fake_workers(devices_per_worker):
    """same_worker for local CPUs: CPU:i is on worker i // that number."""

    def same_worker(a, b):
        index = tf.DeviceSpec.from_string(a).device_index
        other = tf.DeviceSpec.from_string(b).device_index
        return index // devices_per_worker == other // devices_per_worker

    return same_worker


def test_wire_compresses_only_across_fake_workers_and_copies_identically():
    cpus = testing.cpu_devices(4)
    x = np.float32(1.0 + 2.0**-10)
    with tf.device(cpus[0]):
        value = tf.constant([x, 3.0])
    wire = compression.Wire(cpus, tf.float32, "bf16", fake_workers(2))
    assert wire.active and wire.crosses(cpus[1], cpus[2])
    assert not wire.crosses(cpus[0], cpus[1])
    assert wire.receive(value, cpus[1]) is value
    across = wire.receive(value, cpus[2])
    assert across.device == cpus[2]
    np.testing.assert_array_equal(across.numpy(), [1.0, 3.0])
    copies = [wire.copy(value, d) for d in cpus]
    settled = wire.settle(value)
    for c in [*copies, settled]:
        np.testing.assert_array_equal(c.numpy(), [1.0, 3.0])
    assert wire.settle(copies[1]) is copies[1]


def test_wire_is_inactive_inside_one_worker_and_for_other_dtypes():
    cpus = testing.cpu_devices(2)
    assert not compression.Wire(cpus, tf.float32, "fp16").active
    same = fake_workers(1)
    assert not compression.Wire(cpus, tf.int64, "fp16", same).active
    assert not compression.Wire(cpus, tf.bfloat16, "bf16", same).active
    assert not compression.Wire(cpus, tf.float32, None, same).active
    with tf.device(cpus[0]):
        value = tf.constant([1.0 + 2.0**-10])
    copy = compression.Wire(cpus, tf.float32, None, same).copy(value, cpus[1])
    assert copy.device == cpus[1]
    np.testing.assert_array_equal(copy.numpy(), value.numpy())
