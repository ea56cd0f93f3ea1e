"""Tests for the shuffle all-reduce (pscpu / psgpu): schedule and builder.

The registry's pscpu and psgpu pass the builder contract
(builders_test.py); here `shuffle_all_reduce` runs with gather devices
of the test's choosing, on the exact inputs of tests/exact_cases.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import traffic_util
from tests.exact_cases import (
    CASES,
    check_sums,
    on_device,
    problem,
    random_values,
)
from tf_crossdevice import testing
from tf_crossdevice.algorithms import _shuffle_schedule as schedule
from tf_crossdevice.algorithms._shuffle import shuffle_all_reduce

# Device counts of the traced all-reduce tests: one, the odd primes up to
# 7 and the powers of two 2 and 8 (uneven shards over odd counts, even
# splits over the others; 4 and 6 add no case of their own).
DEVICE_COUNTS = (1, 2, 3, 5, 7, 8)

# Schedule (pure Python).


@pytest.mark.parametrize(
    "num_elements, num_shards, expected",
    [
        (0, 1, [0]),
        (0, 3, [0, 0, 0]),
        (1, 1, [1]),
        (1, 3, [1, 0, 0]),
        (7, 3, [3, 2, 2]),
        (9, 3, [3, 3, 3]),
        (10, 4, [3, 3, 2, 2]),
        (1000003, 2, [500002, 500001]),
    ],
    ids=repr,
)
def test_shard_sizes(num_elements, num_shards, expected):
    assert schedule.shard_sizes(num_elements, num_shards) == expected


@pytest.mark.parametrize(
    "num_elements, num_shards",
    list(itertools.product([0, 1, 2, 5, 64, 1000003], [1, 2, 3, 7, 64])),
)
def test_shard_sizes_properties(num_elements, num_shards):
    sizes = schedule.shard_sizes(num_elements, num_shards)
    assert len(sizes) == num_shards
    assert sum(sizes) == num_elements
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize(
    "num_shards, num_gather, expected",
    [(1, 1, [0]), (1, 4, [0]), (3, 1, [0, 0, 0]), (5, 2, [0, 1, 0, 1, 0])],
    ids=repr,
)
def test_shard_gather_devices(num_shards, num_gather, expected):
    assert schedule.shard_gather_devices(num_shards, num_gather) == expected


@pytest.mark.parametrize(
    "call, error, message",
    [
        (
            lambda: schedule.shard_sizes(-1, 2),
            ValueError,
            "num_elements: expected an int >= 0",
        ),
        (
            lambda: schedule.shard_sizes(4, 0),
            ValueError,
            "num_shards: expected an int >= 1",
        ),
        (lambda: schedule.shard_sizes(4, True), TypeError, "num_shards"),
        (lambda: schedule.shard_sizes(4.0, 2), TypeError, "num_elements"),
        (
            lambda: schedule.shard_gather_devices(2, 0),
            ValueError,
            "num_gather_devices",
        ),
    ],
    ids=["negative_size", "zero_shards", "bool", "float", "zero_gather"],
)
def test_schedule_rejects_bad_arguments(call, error, message):
    with pytest.raises(error, match=f"^{message}"):
        call()


# Builder: numbers.


def gather_devices_for(n):
    """Two auxiliary CPUs, after the n input devices (wrapping around)."""
    cpus = testing.cpu_devices(8)
    return [cpus[(n + k) % 8] for k in range(2)]


@pytest.mark.parametrize(
    "n, num_shards", list(itertools.product(DEVICE_COUNTS, [1, 2, 3]))
)
def test_sums_in_tf_function(n, num_shards):
    devices = testing.cpu_devices(n)
    gather = gather_devices_for(n)
    tensors, sums = problem(n)
    traced_devices = []

    @tf.function(autograph=False)
    def reduce_all(values):
        results = []
        for case in values:
            placed = []
            for device, value in zip(devices, case, strict=True):
                with tf.device(device):  # Arguments have no device.
                    placed.append(tf.identity(value))
            results.append(shuffle_all_reduce(placed, gather, num_shards))
            traced_devices.append([r.device for r in results[-1]])
        return results

    check_sums(reduce_all(tensors), sums, devices, check_device=False)
    assert traced_devices == [devices] * len(CASES)


@pytest.mark.parametrize("n, num_shards", [(1, 1), (3, 3), (8, 1), (8, 3)])
def test_sums_eagerly(n, num_shards):
    devices = testing.cpu_devices(n)
    tensors, sums = problem(n)
    results = [
        shuffle_all_reduce(case, gather_devices_for(n), num_shards)
        for case in tensors
    ]
    check_sums(results, sums, devices)


@pytest.mark.parametrize(
    "static_shape",
    [(10, 100), (None, 100), None],
    ids=["static", "unknown_rows", "unknown_rank"],
)
@pytest.mark.parametrize("num_shards", [1, 3])
def test_sums_in_tf1_graph(static_shape, num_shards):
    """A Session graph; unknown sizes take the zero-padding path."""
    n = 3
    devices = testing.cpu_devices(n)
    rng = np.random.default_rng(7)
    feeds = {}
    graph = tf.Graph()
    with graph.as_default():
        placeholders = []
        for d in devices:
            with tf.device(d):
                placeholders.append(
                    tf.compat.v1.placeholder(tf.float32, static_shape)
                )
        sums = shuffle_all_reduce(
            placeholders, ["/device:CPU:5", devices[1]], num_shards
        )
    assert [s.device for s in sums] == devices
    arrays = [random_values(rng, tf.float32, (10, 100)) for _ in devices]
    feeds = dict(zip(placeholders, arrays, strict=True))
    with tf.compat.v1.Session(graph=graph) as session:
        got = session.run(sums, feeds)
    for g in got:
        np.testing.assert_array_equal(g, np.sum(arrays, axis=0))


@pytest.mark.parametrize("n", [1, 4])
def test_empty_tensors(n):
    devices = testing.cpu_devices(n)
    tensors = [on_device(np.zeros((0, 3)), tf.float32, d) for d in devices]
    sums = shuffle_all_reduce(tensors, [devices[0]], num_shards=3)
    assert [s.shape for s in sums] == [(0, 3)] * n
    assert [s.device for s in sums] == devices


def test_gather_device_may_be_an_input_device():
    devices = testing.cpu_devices(4)
    tensors = [
        on_device(np.full(5, i + 1.0), tf.float64, d)
        for i, d in enumerate(devices)
    ]
    sums = shuffle_all_reduce(tensors, devices, num_shards=4)
    for s in sums:
        np.testing.assert_array_equal(s.numpy(), np.full(5, 10.0))


@pytest.mark.parametrize(
    "n, num_shards, num_elements",
    [(1, 1, 7), (3, 3, 1000), (4, 3, 1000), (4, 2, 7), (5, 4, 3)],
    ids=repr,
)
def test_traffic_and_add_placement(n, num_shards, num_elements):
    """pscpu: sums on the gather devices; each device sends and gets S."""
    devices = testing.cpu_devices(n)
    gather = testing.cpu_devices(8)[6:]  # Auxiliary: not input devices.
    itemsize = 4  # float32

    @tf.function(autograph=False)
    def fn():
        tensors = []
        for d in devices:
            with tf.device(d):
                tensors.append(tf.ones([num_elements]))
        return shuffle_all_reduce(tensors, gather, num_shards)

    graph = fn.get_concrete_function().graph
    # Every AddN sits on its shard's gather device (shard j on j % 2) and
    # adds one shard from every device. Shard j is empty, and gets no AddN,
    # when j >= num_elements.
    adds = [op for op in graph.get_operations() if op.type == "AddN"]
    if n == 1:  # The sum of one tensor is itself: nothing moves.
        assert not adds
        assert traffic_util.cross_device_bytes(graph) == {}
        return
    assert [op.device for op in adds] == [
        gather[j % 2] for j in range(min(num_shards, num_elements))
    ]
    assert all(len(op.inputs) == n for op in adds)

    traffic = traffic_util.cross_device_bytes(graph)
    size = num_elements * itemsize
    for d in devices:
        sent = sum(b for (src, _), b in traffic.items() if src == d)
        got = sum(b for (_, dst), b in traffic.items() if dst == d)
        assert (sent, got) == (size, size), d
    # The gather devices hold what the input devices send: n * S in all.
    gathered = sum(b for (_, dst), b in traffic.items() if dst in gather)
    assert gathered == n * size
    assert sum(traffic.values()) == 2 * n * size


# Builder: argument checks.


def _two_tensors():
    return [tf.zeros([2]), tf.zeros([2])]


@pytest.mark.parametrize(
    "make_args, error, message",
    [
        (lambda: ([], ["/cpu:0"]), ValueError, "tensors: expected one tensor"),
        (lambda: (_two_tensors(), []), ValueError, "gather_devices: expected"),
        (lambda: (_two_tensors(), "/cpu:0"), TypeError, "gather_devices"),
        (lambda: (_two_tensors(), [0]), TypeError, r"gather_devices\[0\]"),
        (
            lambda: (_two_tensors(), ["/cpu:0"], 0),
            ValueError,
            "num_shards: expected an int >= 1, got 0",
        ),
        (
            lambda: ([tf.zeros([2]), tf.zeros([3])], ["/cpu:0"]),
            ValueError,
            "shape",
        ),
        (
            lambda: ([tf.zeros([2]), tf.zeros([2], tf.float64)], ["/cpu:0"]),
            TypeError,
            "dtype",
        ),
        (
            lambda: ([tf.zeros([2], tf.bool)] * 2, ["/cpu:0"]),
            TypeError,
            "dtype bool",
        ),
        (
            lambda: ([np.zeros(2)] * 2, ["/cpu:0"]),
            TypeError,
            "dense tf.Tensor",
        ),
        (
            lambda: (
                [tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0]))] * 2,
                ["/cpu:0"],
            ),
            TypeError,
            "dense tf.Tensor",
        ),
    ],
    ids=[
        "no_tensors",
        "no_gather_devices",
        "gather_devices_is_a_string",
        "gather_device_not_a_string",
        "zero_shards",
        "shapes_differ",
        "dtypes_differ",
        "bool",
        "numpy",
        "indexed_slices",
    ],
)
def test_bad_arguments(make_args, error, message):
    with pytest.raises(error, match=message):
        shuffle_all_reduce(*make_args())
