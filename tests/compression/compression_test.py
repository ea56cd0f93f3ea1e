"""Tests for 16-bit wire compression (tf_crossdevice.compression._codec).

The codec is checked against numpy with random values and the documented
bound; the builders and classes with fake workers (groups of local logical
CPUs declared different workers through a `WirePolicy`'s `same_worker`).
"""

from __future__ import annotations

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tf_crossdevice
from tests import traffic_util
from tf_crossdevice import testing
from tf_crossdevice.algorithms import _nccl as nccl
from tf_crossdevice.algorithms import _registry as registry
from tf_crossdevice.compression import WirePolicy
from tf_crossdevice.compression import _codec as compression
from tf_crossdevice.compression._wire_policy import Wire

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


def fake_wire(codec, devices_per_worker):
    """A policy with `codec` across fake workers (see `fake_workers`)."""
    return WirePolicy(codec, same_worker=fake_workers(devices_per_worker))


def test_wire_compresses_only_across_fake_workers_and_copies_identically():
    cpus = testing.cpu_devices(4)
    x = np.float32(1.0 + 2.0**-10)
    with tf.device(cpus[0]):
        value = tf.constant([x, 3.0])
    wire = Wire(cpus, tf.float32, fake_wire("bf16", 2))
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
    assert not Wire(cpus, tf.float32, WirePolicy("fp16")).active
    assert not Wire(cpus, tf.int64, fake_wire("fp16", 1)).active
    assert not Wire(cpus, tf.bfloat16, fake_wire("bf16", 1)).active
    assert not Wire(cpus, tf.float32, fake_wire(None, 1)).active
    with tf.device(cpus[0]):
        value = tf.constant([1.0 + 2.0**-10])
    copy = Wire(cpus, tf.float32, fake_wire(None, 1)).copy(value, cpus[1])
    assert copy.device == cpus[1]
    np.testing.assert_array_equal(copy.numpy(), value.numpy())


# Every algorithm, single-level and two-level, on 4 local CPUs posing as
# 2 workers of 2 devices; k bounds how often a value is rounded on its way
# (the README's table; 4 = n is the generic bound for 4 devices).
ROUNDINGS = {
    "pscpu": 2,
    "psgpu": 2,
    "nccl": 2,
    "hierarchical_copy": 3,
    "xring": 4,
    "rechd": 4,
    "pscpu/pscpu": 2,
    "nccl/xring": 3,
    "hierarchical_copy/rechd": 3,
}


def reduce_with(name, arrays, dtype, wire, shards=2):
    cpus = testing.cpu_devices(len(arrays))
    tensors = []
    for a, d in zip(arrays, cpus, strict=True):
        with tf.device(d):
            tensors.append(tf.cast(tf.constant(a), dtype))
    all_reduce = registry.build(name, shards, wire=wire)
    results = all_reduce(tensors, 0)
    assert [r.device for r in results] == cpus
    return [r.numpy() for r in results]


def sum_bound(arrays, codec, dtype, k):
    """|result - sum| bound after k roundings (README "Wire compression")."""
    x = np.asarray(arrays, np.float64)
    magnitude = np.sum(np.abs(x), axis=0)
    u = unit_roundoff(codec, dtype)
    eps = np.finfo(dtype).eps
    growth = (1 + u) ** k - 1 + len(arrays) * eps
    absolute = k * (2.0**-38 * magnitude.max() + np.finfo(dtype).tiny)
    return growth * magnitude + absolute


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("dtype", list(FLOATS))
@pytest.mark.parametrize("name", list(ROUNDINGS))
def test_compressed_sums_within_the_bound_and_identical_on_replicas(
    name, dtype, codec
):
    rng = np.random.default_rng(len(name))
    arrays = [
        rng.normal(size=301) * 10.0 ** rng.integers(-3, 4, size=301)
        for _ in range(4)
    ]
    arrays = [a.astype(dtype) for a in arrays]
    results = reduce_with(name, arrays, dtype, fake_wire(codec, 2))
    want = np.sum(np.asarray(arrays, np.float64), axis=0)
    err = np.abs(results[0].astype(np.float64) - want)
    assert np.all(err <= sum_bound(arrays, codec, dtype, ROUNDINGS[name]))
    # The rounding really happened: float32/64 sums are much closer.
    assert err.max() > 2.0**-16 * np.abs(want).max()
    for r in results:
        assert r.dtype == dtype
        np.testing.assert_array_equal(r, results[0])


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("name", ["xring", "pscpu/pscpu", "hierarchical_copy"])
def test_other_dtypes_pass_unchanged_and_exactly(name, codec):
    rng = np.random.default_rng(0)
    for dtype in (tf.int32, tf.int64, tf.float16, tf.bfloat16):
        arrays = [rng.integers(-8, 9, size=50) / 2 for _ in range(4)]
        if dtype.is_integer:
            arrays = [(a * 2**20).astype(np.int64) for a in arrays]
        results = reduce_with(name, arrays, dtype, fake_wire(codec, 2))
        want = np.sum(np.asarray(arrays, np.float64), axis=0)
        for r in results:
            assert r.dtype == dtype.as_numpy_dtype
            np.testing.assert_array_equal(r.astype(np.float64), want)


@pytest.mark.parametrize("codec", compression.COMPRESSIONS)
@pytest.mark.parametrize("name", ["xring", "rechd", "pscpu", "pscpu/pscpu"])
def test_inside_one_worker_nothing_changes(name, codec):
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=101).astype(np.float32) for _ in range(4)]
    plain = reduce_with(name, arrays, tf.float32, WirePolicy())
    compressed = reduce_with(name, arrays, tf.float32, WirePolicy(codec))
    for p, c in zip(plain, compressed, strict=True):
        np.testing.assert_array_equal(c, p)


def traced_graph(name, codec, n=4, size=1200, dtype=tf.float32):
    cpus = testing.cpu_devices(n)
    all_reduce = registry.build(name, 2, wire=fake_wire(codec, n // 2))

    @tf.function(autograph=False)
    def run():
        tensors = []
        for d in cpus:
            with tf.device(d):
                tensors.append(tf.ones([size], dtype))
        return all_reduce(tensors, 0)

    return run.get_concrete_function().graph


def bytes_across_workers(graph, devices_per_worker):
    same = fake_workers(devices_per_worker)
    return sum(
        size
        for (src, dst), size in traffic_util.cross_device_bytes(graph).items()
        if not same(src, dst)
    )


# (pscpu/pscpu's inner stage would gather on CPU:0, across fake workers.)
@pytest.mark.parametrize("name", ["xring", "rechd", "pscpu", "xring/pscpu"])
def test_bytes_across_workers_halve(name):
    plain = bytes_across_workers(traced_graph(name, None), 2)
    bf16 = bytes_across_workers(traced_graph(name, "bf16"), 2)
    fp16 = bytes_across_workers(traced_graph(name, "fp16"), 2)
    assert plain > 0
    assert bf16 == plain // 2
    # fp16 adds one 4-byte float32 scale per message (at most 64 here).
    assert plain // 2 < fp16 <= plain // 2 + 4 * 64
    assert (fp16 - plain // 2) % 4 == 0


def test_two_level_compresses_only_the_outer_stage():
    # Inside each fake worker the inner xring moves float32 as before.
    graph = traced_graph("xring/pscpu", "bf16")
    same = fake_workers(2)
    crossing = traffic_util.cross_device_bytes(graph)
    inside = {k: v for k, v in crossing.items() if same(*k)}
    plain = traffic_util.cross_device_bytes(traced_graph("xring/pscpu", None))
    assert inside == {k: v for k, v in plain.items() if same(*k)}


def test_nccl_itself_across_workers_refuses_compression(monkeypatch):
    monkeypatch.setattr(
        nccl, "nccl_unavailable_reason", lambda devices, dtype=None: None
    )
    cpus = testing.cpu_devices(2)
    tensors = []
    for d in cpus:
        with tf.device(d):
            tensors.append(tf.ones([3]))
    all_reduce = registry.build("nccl", wire=fake_wire("bf16", 1))
    with pytest.raises(
        ValueError, match="compression: 'bf16' cannot apply to NCCL"
    ):
        all_reduce(tensors, 0)


def test_registered_algorithm_without_compression_is_refused():
    registry.register("plain_test_alg", lambda shards: None)
    try:
        with pytest.raises(ValueError, match="compression: algorithm 'plain"):
            registry.build("plain_test_alg", wire=WirePolicy("fp16"))
    finally:
        registry.unregister("plain_test_alg")


@pytest.mark.parametrize(
    ("make", "allowed"),
    [
        (
            lambda c: tf_crossdevice.SpecAllReduce("xring", compression=c),
            "None, 'bf16', 'fp16'",
        ),
        (
            lambda c: tf_crossdevice.MultiWorkerAllReduce(
                ["/job:localhost/task:0"], 0, compression=c
            ),
            "None, 'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD",
        ),
    ],
    ids=["SpecAllReduce", "MultiWorkerAllReduce"],
)
def test_classes_check_compression(make, allowed):
    with pytest.raises(ValueError) as e:
        make("bf8")
    assert str(e.value) == (
        f"compression: unknown value 'bf8'; expected one of {allowed}"
    )
    assert make("fp16").compression == "fp16"
    assert make(None).compression is None


def test_classes_reduce_in_one_worker_exactly_as_uncompressed():
    value = testing.per_replica(
        [tf.constant([1.0 + 2.0**-12, 2.0]), tf.constant([3.0, 4.0])]
    )
    for spec in ("xring", ("pscpu/pscpu", 2, -1)):
        ops = tf_crossdevice.MultiWorkerAllReduce(
            ["/job:localhost/replica:0/task:0"], 0, spec, compression="bf16"
        )
        got = [v.numpy().tolist() for v in ops.reduce("sum", value).values]
        assert got == [[4.0 + 2.0**-12, 6.0]] * 2


def test_benchmark_compression_targets_compare_bf16_with_its_twin():
    from benchmarks import records, targets

    group = records.Group("multi_worker", "resnet50", "", 2, 1, 8, 2, "float32")
    mw = "ours MultiWorkerAllReduce xring num_packs=1"

    def entry(name, family, seconds):
        return records.entry_of(name, family, "base", [seconds] * 3)

    records.add_results(
        group,
        [
            records.entry_of("base", "baseline", None, [1.0] * 3),
            records.entry_of("roof", "roofline", None, [0.8] * 3),
            entry("TF MWMS default", "tf", 9.0),
            entry(mw, "ours", 5.0),
            entry(mw + " compression=bf16", "ours", 3.0),
            entry(mw + " compression=fp16", "ours", 4.0),
        ],
    )
    by_name = {t.name.split(": ", 1)[1]: t for t in targets.evaluate([group])}
    twin = by_name["bf16 vs the same uncompressed"]
    assert twin.measured == pytest.approx(4.0 / 2.0) and twin.met
    roof = by_name["ours best / TCP loopback roofline"]
    assert roof.measured == pytest.approx(0.8 / 2.0) and not roof.met
