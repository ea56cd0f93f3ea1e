"""Tests for the builders' call shape: `bind_shards`'s batches in groups.

A batch of values is laid out and reduced in groups of at most
`GROUP_BYTES` per device: no message carries more than a group's shard,
a value that large is never copied into a layout, and the sums keep every
bit they had when the whole batch was one layout or each value was reduced
alone.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import traffic_util
from tf_crossdevice import testing
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _registry as registry

MIB = 2**20
GROUP_BYTES = protocol.GROUP_BYTES  # as shipped, whatever a test patches

# byte_groups (pure Python).


@pytest.mark.parametrize(
    "sizes, max_bytes",
    [
        ([], 4),
        ([5], 4),
        ([1, 1, 1, 1, 1], 2),
        ([3, 4, 1, 9, 2, 2, 8, 0, 1], 8),
        ([7, 7, 7], 8),
    ],
    ids=repr,
)
def test_byte_groups_partition_in_order_within_the_limit(sizes, max_bytes):
    groups = protocol.byte_groups(sizes, max_bytes)
    assert sorted(itertools.chain(*groups)) == list(range(len(sizes)))
    assert [g[0] for g in groups] == sorted(g[0] for g in groups)
    for g in groups:
        assert g == list(range(g[0], g[-1] + 1))  # consecutive
        if len(g) > 1:
            assert sum(sizes[k] for k in g) <= max_bytes
        if any(sizes[k] >= max_bytes for k in g):
            assert len(g) == 1


def test_byte_groups_close_a_group_when_the_next_overflows_or_is_large():
    # Greedy: [3, 4] fits 8, 1 still fits, the 9 is alone, 2 + 2 stop at
    # the 8 that is alone too (a group never reaches past it), 0 + 1 last.
    sizes = [3, 4, 1, 9, 2, 2, 8, 0, 1]
    assert protocol.byte_groups(sizes, 8) == [
        [0, 1, 2],
        [3],
        [4, 5],
        [6],
        [7, 8],
    ]


# The batch of a bound builder, traced (nothing runs): large static shapes
# cost nothing to trace.

DEVICES = 3
# A model's gradients in miniature: ten 1 MiB values (three groups), a
# 5 MiB and a 6 MiB one (alone each), a small one; 21 MiB per device.
LARGE_BATCH = [(MIB // 4,)] * 10 + [(5 * MIB // 4,), (3, MIB // 2)] + [(7,)]


def _traced_batch(alg: str, shards: int, shapes):
    devices = testing.cpu_devices(DEVICES)
    builder = registry.build(alg, shards)

    @tf.function(autograph=False)
    def fn():
        values = []
        for shape in shapes:
            per_device = []
            for d in devices:
                with tf.device(d):
                    per_device.append(tf.ones(shape))
            values.append(per_device)
        return protocol.all_reduce_batch(
            builder, values, list(range(len(values)))
        )

    return fn.get_concrete_function().graph


def _crossing_tensors(graph):
    """(bytes, op type) of each tensor an op reads from another device."""
    out = []
    for op in graph.get_operations():
        for t in op.inputs:
            if t.op.device and op.device and t.op.device != op.device:
                out.append((t.shape.num_elements() * t.dtype.size, t.op.type))
    return out


@pytest.mark.parametrize(
    "alg, shards", [("pscpu", 3), ("psgpu", 3), ("xring", 1)]
)
def test_no_message_carries_more_than_a_group(alg, shards):
    # One layout of the whole batch made every message a shard of the whole
    # batch: across workers each such step waited for the one before it on
    # every worker, and the all-reduce took several times as long.
    graph = _traced_batch(alg, shards, LARGE_BATCH)
    largest_value = max(int(np.prod(s)) for s in LARGE_BATCH) * 4
    bound = max(GROUP_BYTES, largest_value) // shards + 4
    messages = _crossing_tensors(graph)
    assert messages
    assert max(size for size, _ in messages) <= bound


def test_batches_keep_each_device_sending_what_one_value_at_a_time_does():
    # A shuffle summing one shard on each device (psgpu here; pscpu across
    # workers of one device each): every device sends its two foreign
    # shards and returns its own shard's sum to the other two, 4/3 S.
    graph = _traced_batch("psgpu", DEVICES, LARGE_BATCH)
    total = sum(int(np.prod(s)) * 4 for s in LARGE_BATCH)
    sent = traffic_util.bytes_sent_by_device(graph)
    assert len(sent) == DEVICES
    for device, size in sent.items():
        # Shard sizes differ by at most one element per value.
        assert abs(size - 4 * total / DEVICES) <= 4 * 4 * len(LARGE_BATCH), (
            device
        )


def test_a_value_of_a_group_or_more_is_not_laid_out():
    # Reduced alone, a large value goes straight to the builder: its shards
    # are views of it, and no concatenation copies it on the way in.
    graph = _traced_batch("psgpu", DEVICES, LARGE_BATCH)
    large_sizes = {5 * MIB // 4, 3 * MIB // 2}  # elements
    layouts = [
        op
        for op in graph.get_operations()
        if op.type in ("ConcatV2", "Pack")
        # Not the concatenation of the summed shards on the way out.
        and "AddN" not in {t.op.type for t in op.inputs}
    ]
    assert layouts  # the small values are laid out
    for op in layouts:
        sizes = {t.shape.num_elements() for t in op.inputs}
        assert not sizes & large_sizes, op.name


# The sums, bit for bit.


def _float_values(shapes, seed):
    """Floats of mixed magnitudes: every change of summation order shows."""
    rng = np.random.default_rng(seed)
    return [
        [
            (rng.standard_normal(s) * 10.0 ** rng.integers(-3, 4)).astype(
                np.float32
            )
            for _ in range(4)
        ]
        for s in shapes
    ]


def _run_batch(builder, arrays, devices):
    @tf.function(autograph=False)
    def fn():
        values = []
        for per_device in arrays:
            tensors = []
            for x, d in zip(per_device, devices, strict=True):
                with tf.device(d):
                    tensors.append(tf.constant(x))
            values.append(tensors)
        return protocol.all_reduce_batch(
            builder, values, list(range(len(values)))
        )

    return [[t.numpy() for t in per] for per in fn()]


def _run_one_by_one(builder, arrays, devices):
    @tf.function(autograph=False)
    def fn():
        out = []
        for k, per_device in enumerate(arrays):
            tensors = []
            for x, d in zip(per_device, devices, strict=True):
                with tf.device(d):
                    tensors.append(tf.constant(x))
            out.append(builder(tensors, k))
        return out

    return [[t.numpy() for t in per] for per in fn()]


def _run_three_ways(monkeypatch, alg, shards, arrays, devices):
    """The batch's sums as one layout, in groups, and value by value."""
    builder = registry.build(alg, shards)
    monkeypatch.setattr(protocol, "GROUP_BYTES", 2**62)
    one_layout = _run_batch(builder, arrays, devices)
    # Sizes around this limit: values alone, groups of several, a value
    # larger than the rest of its group's room, odd sizes, a scalar.
    monkeypatch.setattr(protocol, "GROUP_BYTES", 128)
    grouped = _run_batch(builder, arrays, devices)
    alone = _run_one_by_one(builder, arrays, devices)
    return grouped, one_layout, alone


SHAPES = [(5,), (3, 7), (), (40,), (2, 3, 4), (64,), (9,), (11, 3), (1,)]


@pytest.mark.parametrize(
    "alg, shards, num_devices",
    [("xring", 2, 3), ("xring", 1, 4), ("rechd", 1, 3), ("rechd", 2, 4)],
)
def test_groups_change_no_bit_of_a_chunked_sum(
    monkeypatch, alg, shards, num_devices
):
    # The chunk-major layout keeps each element in its chunk, so a ring or
    # halving-doubling sums it in the same order however values are grouped.
    devices = testing.cpu_devices(num_devices)
    arrays = [per[:num_devices] for per in _float_values(SHAPES, seed=3)]
    results = _run_three_ways(monkeypatch, alg, shards, arrays, devices)
    for grouped, one_layout, alone in zip(*results, strict=True):
        for x, y, z in zip(grouped, one_layout, alone, strict=True):
            assert x.shape == y.shape == z.shape
            np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))
            np.testing.assert_array_equal(x.view(np.uint32), z.view(np.uint32))


@pytest.mark.parametrize(
    "alg, shards, num_devices", [("pscpu", 3, 3), ("psgpu", 2, 4)]
)
def test_groups_give_a_shuffle_numpys_sums(
    monkeypatch, alg, shards, num_devices
):
    # Integers in float32: exact in every order. TensorFlow's CPU AddN
    # moves the first input whose buffer it can reuse to the front, so a
    # shuffle's float bits with three or more devices follow which of its
    # inputs' buffers are free when it runs, in any layout.
    devices = testing.cpu_devices(num_devices)
    rng = np.random.default_rng(4)
    arrays = [
        [
            rng.integers(-1000, 1000, s).astype(np.float32)
            for _ in range(num_devices)
        ]
        for s in SHAPES
    ]
    results = _run_three_ways(monkeypatch, alg, shards, arrays, devices)
    for per_device, *ways in zip(arrays, *results, strict=True):
        want = np.sum(per_device, axis=0)
        for way in ways:
            for got in way:
                np.testing.assert_array_equal(got, want)
