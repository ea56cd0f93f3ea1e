"""Ring all-reduce ("xring"): the traffic that makes it a ring.

Its numbers, placement and argument checks come from the builder contract,
which builders_test.py runs for every registered algorithm; this file
checks the bytes each device sends and the links they travel.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from tests import traffic_util
from tests.builder_contract import TRAFFIC_ELEMENTS, traced_graph
from tf_crossdevice import testing
from tf_crossdevice.algorithms import _ring as ring

TOTAL_BYTES = TRAFFIC_ELEMENTS * tf.float32.size


@pytest.mark.parametrize("n", range(2, 9), ids="n{}".format)
@pytest.mark.parametrize("shards", (1, 2, 3), ids="shards{}".format)
def test_bytes_sent_per_device(shards, n):
    devices = testing.cpu_devices(n)
    graph = traced_graph(ring.builder(shards), devices)
    # Each ring moves its shard in 2 (n - 1) chunks of 1/n each.
    expected = 2 * (n - 1) * TOTAL_BYTES // n
    assert traffic_util.bytes_sent_by_device(graph) == dict.fromkeys(
        devices, expected
    )


@pytest.mark.parametrize("n", range(3, 9), ids="n{}".format)
def test_one_ring_only_uses_links_to_the_next_device(n):
    devices = testing.cpu_devices(n)
    links = traffic_util.cross_device_bytes(
        traced_graph(ring.builder(1), devices)
    )
    expected = {
        (devices[i], devices[(i + 1) % n]): 2 * (n - 1) * TOTAL_BYTES // n
        for i in range(n)
    }
    assert links == expected


def test_two_rings_use_each_link_both_ways_with_half_the_data():
    n = 4
    devices = testing.cpu_devices(n)
    links = traffic_util.cross_device_bytes(
        traced_graph(ring.builder(2), devices)
    )
    per_link = 2 * (n - 1) * (TOTAL_BYTES // 2) // n
    expected = {}
    for i in range(n):
        expected[(devices[i], devices[(i + 1) % n])] = per_link
        expected[(devices[(i + 1) % n], devices[i])] = per_link
    assert links == expected
