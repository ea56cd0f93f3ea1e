"""Recursive halving-doubling ("rechd"): the traffic that makes it so.

Its numbers, placement and argument checks come from the builder contract,
which builders_test.py runs for every registered algorithm; this file
checks the bytes each device sends, including the fold-in / fold-out cost
for device counts that are not powers of two.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests import traffic_util
from tests.builder_contract import TRAFFIC_ELEMENTS, traced_graph
from tf_crossdevice import testing
from tf_crossdevice.algorithms import _halving_doubling as halving_doubling

TOTAL_BYTES = TRAFFIC_ELEMENTS * tf.float32.size


def _largest_power_of_two(n):
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def _graph(devices, shards):
    return traced_graph(halving_doubling.builder(shards), devices)


@pytest.mark.parametrize("n", range(2, 9), ids="n{}".format)
@pytest.mark.parametrize("shards", (1, 2, 3), ids="shards{}".format)
def test_bytes_sent_per_device(shards, n):
    # Per shard of B bytes: core ranks send 2 (p - 1) / p * B; extra
    # virtual rank p + i sends B to virtual rank i (fold-in), which also
    # sends B back (fold-out). Shard s rotates virtual ranks by s * r.
    devices = testing.cpu_devices(n)
    p = _largest_power_of_two(n)
    r = n - p
    shard_bytes = TOTAL_BYTES // shards
    core = 2 * (p - 1) * shard_bytes // p
    sent = dict.fromkeys(range(n), 0)
    for shard in range(shards):
        device = [(v + shard * r) % n for v in range(n)]
        for v in range(p):
            sent[device[v]] += core + (shard_bytes if v < r else 0)
        for v in range(p, n):
            sent[device[v]] += shard_bytes
    assert traffic_util.bytes_sent_by_device(_graph(devices, shards)) == {
        devices[i]: b for i, b in sent.items() if b
    }


@pytest.mark.parametrize("n", (2, 4, 8), ids="n{}".format)
def test_power_of_two_sends_2_shard_over_2_to_the_k_at_distance_2_to_the_k(
    n,
):
    devices = testing.cpu_devices(n)
    links = traffic_util.cross_device_bytes(_graph(devices, 1))
    expected = {}
    distance = 1
    while distance < n:
        # Halving sends B / (2 * distance) each way, doubling as much.
        for a in range(n):
            expected[(devices[a], devices[a ^ distance])] = (
                TOTAL_BYTES // distance
            )
        distance *= 2
    assert links == expected


@pytest.mark.parametrize("n", (3, 5, 6, 7), ids="n{}".format)
def test_non_power_of_two_folds_extra_ranks_into_the_first_ones(n):
    devices = testing.cpu_devices(n)
    p = _largest_power_of_two(n)
    links = traffic_util.cross_device_bytes(_graph(devices, 1))
    expected = {}
    distance = 1
    while distance < p:
        for a in range(p):
            expected[(devices[a], devices[a ^ distance])] = (
                TOTAL_BYTES // distance
            )
        distance *= 2
    for i in range(n - p):
        expected[(devices[p + i], devices[i])] = TOTAL_BYTES
        expected[(devices[i], devices[p + i])] = TOTAL_BYTES
    assert links == expected


def test_shards_rotate_the_extra_role_over_all_devices():
    # n = 5: p = 4, one extra device per shard; 5 shards make each device
    # the extra once and the partner once.
    n = shards = 5
    devices = testing.cpu_devices(n)
    shard = TOTAL_BYTES // shards
    # Core in 4 shards (1.5 shards each), extra once, partner once.
    per_device = 4 * (3 * shard // 2) + shard + shard
    assert traffic_util.bytes_sent_by_device(
        _graph(devices, shards)
    ) == dict.fromkeys(devices, per_device)
