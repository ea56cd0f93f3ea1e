"""The ring schedule (algorithms/_ring_schedule.py), simulated with sets."""

from __future__ import annotations

import pytest

from tf_crossdevice.algorithms import _ring_schedule as ring

DEVICE_COUNTS = range(1, 17)
SHARD_COUNTS = range(1, 5)


def _simulate(order):
    """Runs one ring; a chunk is the set of ranks whose data it contains."""
    n = len(order)
    data = {(rank, c): frozenset([rank]) for rank in range(n) for c in range(n)}
    for step in ring.reduce_scatter_steps(order):
        updates = {}
        for t in step:
            mine, theirs = data[(t.dst, t.chunk)], data[(t.src, t.chunk)]
            assert not mine & theirs, f"{t} adds a contribution twice"
            updates[(t.dst, t.chunk)] = mine | theirs
        data.update(updates)
    after_reduce_scatter = dict(data)
    for step in ring.all_gather_steps(order):
        data.update({(t.dst, t.chunk): data[(t.src, t.chunk)] for t in step})
    return after_reduce_scatter, data


@pytest.mark.parametrize("num_shards", SHARD_COUNTS, ids="shards{}".format)
@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_every_rank_ends_with_the_full_sum_of_every_chunk(n, num_shards):
    orders = ring.ring_orders(n, num_shards)
    assert len(orders) == num_shards
    everyone = frozenset(range(n))
    for order in orders:
        assert sorted(order) == list(range(n))
        _, final = _simulate(order)
        for (rank, chunk), contributors in final.items():
            assert contributors == everyone, (order, rank, chunk)


@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_reduce_scatter_leaves_chunk_i_plus_1_fully_reduced_at_position_i(n):
    for order in ring.ring_orders(n, num_shards=4):
        after, _ = _simulate(order)
        for i, rank in enumerate(order):
            assert after[(rank, (i + 1) % n)] == frozenset(range(n))


@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_each_rank_sends_and_receives_one_chunk_per_step_to_its_successor(n):
    for order in ring.ring_orders(n, num_shards=2):
        successor = {order[i]: order[(i + 1) % n] for i in range(n)}
        steps = ring.reduce_scatter_steps(order) + ring.all_gather_steps(order)
        # 2 (n - 1) chunks of size 1/n each: 2 (n - 1) / n of the data.
        assert len(steps) == 2 * (n - 1)
        for step in steps:
            assert sorted(t.src for t in step) == list(range(n))
            assert sorted(t.dst for t in step) == list(range(n))
            for t in step:
                assert t.dst == successor[t.src]
                assert 0 <= t.chunk < n


@pytest.mark.parametrize(
    "n, num_shards, expected",
    [
        pytest.param(1, 1, [(0,)], id="one_device"),
        pytest.param(2, 2, [(0, 1), (0, 1)], id="two_devices"),
        pytest.param(
            4,
            4,
            [(0, 1, 2, 3), (0, 3, 2, 1), (1, 2, 3, 0), (1, 0, 3, 2)],
            id="four_devices_four_shards",
        ),
    ],
)
def test_ring_orders(n, num_shards, expected):
    assert ring.ring_orders(n, num_shards) == expected


@pytest.mark.parametrize("n", range(3, 9), ids="n{}".format)
def test_odd_shards_use_every_link_in_the_other_direction(n):
    forward, backward = ring.ring_orders(n, num_shards=2)
    links = {(forward[i], forward[(i + 1) % n]) for i in range(n)}
    reverse_links = {(backward[i], backward[(i + 1) % n]) for i in range(n)}
    assert reverse_links == {(dst, src) for src, dst in links}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_devices": 0, "num_shards": 1},
        {"num_devices": -2, "num_shards": 1},
        {"num_devices": True, "num_shards": 1},
        {"num_devices": 2.0, "num_shards": 1},
        {"num_devices": 2, "num_shards": 0},
        {"num_devices": 2, "num_shards": "2"},
    ],
    ids=["zero", "negative", "bool", "float", "zero_shards", "str_shards"],
)
def test_ring_orders_rejects_bad_counts(kwargs):
    """A count of the wrong type is a TypeError, below 1 a ValueError."""
    bad = next(k for k, v in kwargs.items() if not (type(v) is int and v > 0))
    error = ValueError if type(kwargs[bad]) is int else TypeError
    with pytest.raises(error, match=f"^{bad}: expected an int >= 1"):
        ring.ring_orders(**kwargs)


@pytest.mark.parametrize(
    "order",
    [(), (0, 0), (1, 2), (0, 2, 1, 4)],
    ids=["empty", "repeated", "not_from_zero", "gap"],
)
@pytest.mark.parametrize(
    "steps",
    [ring.reduce_scatter_steps, ring.all_gather_steps],
    ids=["reduce_scatter", "all_gather"],
)
def test_steps_reject_non_permutations(steps, order):
    with pytest.raises(ValueError, match="order: expected a permutation"):
        steps(order)
