"""Tests for the two-level (hierarchical) all-reduce builder.

The registry's 'inner/outer' builders pass the builder contract in
tests/algorithms/builders_test.py; this file checks the composition itself.

Several workers are faked with groups of local logical CPUs. The inputs,
the exactness argument (tolerance zero) and the numpy check come from
tests/exact_cases.py.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tests import traffic_util
from tests.exact_cases import CASES, check_sums, problem, random_values
from tf_crossdevice import testing
from tf_crossdevice.algorithms._shuffle import shuffle_all_reduce
from tf_crossdevice.algorithms._two_level import (
    check_groups,
    two_level_all_reduce,
)

# Device counts of the traced all-reduce tests: one, the odd primes up to
# 7 and the powers of two 2 and 8 (uneven shards over odd counts, even
# splits over the others; 4 and 6 add no case of their own).
DEVICE_COUNTS = (1, 2, 3, 5, 7, 8)


def add_n_all_reduce(tensors, index=0):
    """A trivial all-reduce: sum on the first device, copy to the others."""
    with tf.device(tensors[0].device):
        total = tf.add_n(tensors)
    results = []
    for t in tensors:
        with tf.device(t.device):
            results.append(tf.identity(total))
    return results


def shuffle_on_last(num_shards):
    """Shuffle all-reduce gathered on the last input's device."""
    return lambda ts, index: shuffle_all_reduce(ts, [ts[-1].device], num_shards)


def interleaved_groups(n, num_workers):
    """Device i belongs to worker i % num_workers: groups are not ranges."""
    return [list(range(w, n, num_workers)) for w in range(num_workers)]


def run_in_function(n, groups, inner, outer):
    """Reduces every case of problem(n) in one tf.function; checks numbers."""
    devices = testing.cpu_devices(n)
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
            results.append(two_level_all_reduce(placed, groups, inner, outer))
            traced_devices.append([r.device for r in results[-1]])
        return results

    check_sums(reduce_all(tensors), sums, devices, check_device=False)
    assert traced_devices == [devices] * len(CASES)


@pytest.mark.parametrize(
    "n, num_shards", list(itertools.product(DEVICE_COUNTS, [1, 2, 3]))
)
def test_shuffle_inside_add_n_across(n, num_shards):
    groups = interleaved_groups(n, min(n, 3))
    run_in_function(n, groups, shuffle_on_last(num_shards), add_n_all_reduce)


@pytest.mark.parametrize("n, num_shards", [(2, 3), (5, 2), (8, 1)])
def test_add_n_inside_shuffle_across(n, num_shards):
    groups = [list(range(n // 2)), list(range(n // 2, n))]
    run_in_function(n, groups, add_n_all_reduce, shuffle_on_last(num_shards))


@pytest.mark.parametrize(
    "groups",
    [[[0, 1, 2, 3, 4, 5, 6, 7]], [[i] for i in range(8)], [[4, 0], [3, 1, 2]]],
    ids=["one_worker", "one_device_per_worker", "unsorted_groups"],
)
def test_group_shapes_eagerly(groups):
    n = sum(len(g) for g in groups)
    devices = testing.cpu_devices(n)
    tensors, sums = problem(n)
    results = [
        two_level_all_reduce(case, groups, shuffle_on_last(2), add_n_all_reduce)
        for case in tensors
    ]
    check_sums(results, sums, devices)


def test_in_tf1_graph():
    devices = testing.cpu_devices(4)
    arrays = [
        random_values(np.random.default_rng(3), tf.int64, (5, 2))
        for _ in devices
    ]
    graph = tf.Graph()
    with graph.as_default():
        placeholders = []
        for d in devices:
            with tf.device(d):
                placeholders.append(tf.compat.v1.placeholder(tf.int64, None))
        sums = two_level_all_reduce(
            placeholders, [[0, 2], [1, 3]], shuffle_on_last(3), add_n_all_reduce
        )
    assert [s.device for s in sums] == devices
    with tf.compat.v1.Session(graph=graph) as session:
        got = session.run(sums, dict(zip(placeholders, arrays, strict=True)))
    for g in got:
        np.testing.assert_array_equal(g, np.sum(arrays, axis=0))


def test_calls_inner_per_group_and_outer_once_with_representatives():
    devices = testing.cpu_devices(6)
    tensors = []
    for i, d in enumerate(devices):
        with tf.device(d):
            tensors.append(tf.fill([3], float(i)))
    calls = []

    def recording(name):
        def all_reduce(ts, index):
            calls.append((name, [t.device for t in ts], index))
            return add_n_all_reduce(ts)

        return all_reduce

    groups = [[1, 4], [0], [2, 3, 5]]
    sums = two_level_all_reduce(
        tensors, groups, recording("inner"), recording("outer"), index=7
    )
    assert calls == [
        ("inner", [devices[1], devices[4]], 7),
        ("inner", [devices[2], devices[3], devices[5]], 7),
        ("outer", [devices[1], devices[0], devices[2]], 7),
    ]
    for s, d in zip(sums, devices, strict=True):
        assert s.device == d
        np.testing.assert_array_equal(s.numpy(), [15.0] * 3)


# Traffic: one tensor per worker crosses workers.


def cross_group_traffic(graph, devices, groups):
    """Bytes each group sends to / receives from other groups."""
    group_of = {
        traffic_util.canonical_device(devices[i]): g
        for g, members in enumerate(groups)
        for i in members
    }
    sent = [0] * len(groups)
    received = [0] * len(groups)
    for (src, dst), size in traffic_util.cross_device_bytes(graph).items():
        if group_of[src] != group_of[dst]:
            sent[group_of[src]] += size
            received[group_of[dst]] += size
    return sent, received


def traced_graph(devices, reduce_fn, num_elements=1000):
    @tf.function(autograph=False)
    def fn():
        tensors = []
        for d in devices:
            with tf.device(d):
                tensors.append(tf.ones([num_elements]))
        return reduce_fn(tensors)

    return fn.get_concrete_function().graph


@pytest.mark.parametrize("num_shards", [1, 3])
@pytest.mark.parametrize(
    "groups",
    [[[0, 1, 2], [3, 4, 5]], [[0, 1], [2, 3], [4, 5]], [[0, 2, 4, 5], [1, 3]]],
    ids=["2x3", "3x2", "4+2_interleaved"],
)
def test_one_tensor_per_worker_crosses_workers(groups, num_shards):
    """pscpu/pscpu-like: shuffle inside, shuffle across on worker 0's rep."""
    n = sum(len(g) for g in groups)
    devices = testing.cpu_devices(n)
    size = 1000 * 4  # float32 bytes per tensor.

    def outer(ts, index):
        return shuffle_all_reduce(ts, [ts[0].device], num_shards)

    graph = traced_graph(
        devices,
        lambda ts: two_level_all_reduce(
            ts, groups, shuffle_on_last(num_shards), outer
        ),
    )
    sent, received = cross_group_traffic(graph, devices, groups)
    workers = len(groups)
    # Worker 0 hosts the outer sum: it receives one tensor from every other
    # worker and sends one back to each; every other worker sends and
    # receives exactly one tensor.
    assert sent == [(workers - 1) * size] + [size] * (workers - 1)
    assert received == sent

    # A flat shuffle over all devices, for contrast, sends every device's
    # tensor across.
    flat = traced_graph(devices, lambda ts: outer(ts, 0))
    flat_sent, _ = cross_group_traffic(flat, devices, groups)
    assert flat_sent[1:] == [len(g) * size for g in groups[1:]]


# Argument checks.


@pytest.mark.parametrize(
    "groups, num_tensors, error, message",
    [
        ([[0], [0, 1]], 2, ValueError, "position 0 is in more than one"),
        ([[0], [2]], 2, ValueError, "position 2 is out of range"),
        ([[-1], [0, 1]], 2, ValueError, "position -1 is out of range"),
        ([[0]], 2, ValueError, r"positions \[1\] are in no group"),
        ([[0, 1], []], 2, ValueError, r"groups\[1\] is empty"),
        ([], 1, ValueError, r"positions \[0\] are in no group"),
        ([[0, 1.0]], 2, TypeError, r"groups\[0\]\[1\]: expected an int, got"),
        ([[0, True]], 2, TypeError, r"groups\[0\]\[1\]: expected an int"),
        ([0, 1], 2, TypeError, r"groups\[0\]: expected a list"),
        ("01", 2, TypeError, "groups: expected a list of lists"),
        (None, 2, TypeError, "groups: expected a list of lists"),
    ],
    ids=[
        "repeated",
        "out_of_range",
        "negative",
        "missing",
        "empty_group",
        "no_groups",
        "float_position",
        "bool_position",
        "flat_list",
        "string",
        "none",
    ],
)
def test_check_groups_rejects(groups, num_tensors, error, message):
    with pytest.raises(error, match=message):
        check_groups(groups, num_tensors)


def test_wrong_result_count_raises():
    tensors = [tf.ones([2])] * 4
    with pytest.raises(ValueError, match="inner: an all-reduce must return"):
        two_level_all_reduce(
            tensors, [[0, 1], [2, 3]], lambda ts, i: ts[:1], add_n_all_reduce
        )
    with pytest.raises(ValueError, match="outer: .* got 2 and returned 3"):
        two_level_all_reduce(
            tensors,
            [[0, 1], [2, 3]],
            add_n_all_reduce,
            lambda ts, i: [*ts, ts[0]],
        )


@pytest.mark.parametrize("which", ["inner", "outer"])
def test_non_callable_raises(which):
    kwargs = {"inner": add_n_all_reduce, "outer": add_n_all_reduce}
    kwargs[which] = "pscpu"
    with pytest.raises(TypeError, match=f"{which}: expected a callable"):
        two_level_all_reduce([tf.ones([2])] * 2, [[0], [1]], **kwargs)


def test_bad_tensors_raise():
    with pytest.raises(ValueError, match="tensors"):
        two_level_all_reduce([], [], add_n_all_reduce, add_n_all_reduce)
    with pytest.raises(ValueError, match="shape"):
        two_level_all_reduce(
            [tf.ones([2]), tf.ones([3])],
            [[0, 1]],
            add_n_all_reduce,
            add_n_all_reduce,
        )
