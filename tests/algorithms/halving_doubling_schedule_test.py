"""The halving-doubling schedule (algorithms/_halving_doubling_schedule.py),
simulated with sets."""

from __future__ import annotations

import pytest

from tf_crossdevice.algorithms import _halving_doubling_schedule as hd

DEVICE_COUNTS = range(1, 17)
SHARD_COUNTS = range(1, 5)
POWERS_OF_TWO = {1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 7: 4, 8: 8, 9: 8, 16: 16}


def _reduce(data, transfers):
    updates = {}
    for t in transfers:
        for c in t.chunks:
            mine, theirs = data[(t.dst, c)], data[(t.src, c)]
            assert not mine & theirs, f"{t} adds a contribution twice"
            updates[(t.dst, c)] = mine | theirs
    data.update(updates)


def _copy(data, transfers):
    data.update(
        {(t.dst, c): data[(t.src, c)] for t in transfers for c in t.chunks}
    )


def _simulate(order):
    """Runs one instance; a chunk is the set of ranks whose data it holds."""
    n = len(order)
    p = hd.num_chunks(n)
    data = {(rank, c): frozenset([rank]) for rank in range(n) for c in range(p)}
    _reduce(data, hd.fold_in(order))
    for step in hd.reduce_scatter_steps(order):
        _reduce(data, step)
    after_reduce_scatter = dict(data)
    for step in hd.all_gather_steps(order):
        _copy(data, step)
    _copy(data, hd.fold_out(order))
    return after_reduce_scatter, data


def _largest_power_of_two(n):
    p = 1
    while 2 * p <= n:
        p *= 2
    return p


def _bit_reverse(v, num_bits):
    return int(format(v, f"0{num_bits}b")[::-1], 2) if num_bits else 0


@pytest.mark.parametrize("n, p", sorted(POWERS_OF_TWO.items()))
def test_num_chunks_is_the_largest_power_of_two_not_above_n(n, p):
    assert hd.num_chunks(n) == p
    assert hd.largest_power_of_two(n) == p


@pytest.mark.parametrize("num_shards", SHARD_COUNTS, ids="shards{}".format)
@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_every_rank_ends_with_the_full_sum_of_every_chunk(n, num_shards):
    orders = hd.rank_orders(n, num_shards)
    assert len(orders) == num_shards
    everyone = frozenset(range(n))
    for order in orders:
        assert sorted(order) == list(range(n))
        _, final = _simulate(order)
        for (rank, chunk), contributors in final.items():
            assert contributors == everyone, (order, rank, chunk)


@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_reduce_scatter_leaves_chunk_bit_reverse_v_at_virtual_rank_v(n):
    p = _largest_power_of_two(n)
    num_bits = p.bit_length() - 1
    for order in hd.rank_orders(n, num_shards=3):
        after, _ = _simulate(order)
        for v in range(p):
            chunk = _bit_reverse(v, num_bits)
            assert after[(order[v], chunk)] == frozenset(range(n))


@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_steps_are_pairwise_exchanges_at_distance_two_to_the_k(n):
    p = _largest_power_of_two(n)
    for order in hd.rank_orders(n, num_shards=3):
        virtual = {rank: v for v, rank in enumerate(order)}
        rs = hd.reduce_scatter_steps(order)
        ag = hd.all_gather_steps(order)
        assert len(rs) == len(ag) == p.bit_length() - 1
        distances = [1 << k for k in range(p.bit_length() - 1)]
        schedule = rs + ag
        for step, distance in zip(
            schedule, distances + distances[::-1], strict=True
        ):
            pairs = {(virtual[t.src], virtual[t.dst]) for t in step}
            assert len(pairs) == p  # every core rank receives exactly once
            assert {dst for _, dst in pairs} == set(range(p))
            for src, dst in pairs:
                assert src ^ dst == distance
                assert (dst, src) in pairs


@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_core_ranks_send_2_p_minus_1_chunks_and_halves_then_doubles(n):
    p = _largest_power_of_two(n)
    order = tuple(range(n))
    sent = {rank: 0 for rank in range(n)}
    rs, ag = hd.reduce_scatter_steps(order), hd.all_gather_steps(order)
    for k, step in enumerate(rs):
        for t in step:
            assert len(t.chunks) == p >> (k + 1)
            sent[t.src] += len(t.chunks)
    for k, step in enumerate(ag):
        for t in step:
            assert len(t.chunks) == 1 << k
            sent[t.src] += len(t.chunks)
    assert sent == {rank: 2 * (p - 1) if rank < p else 0 for rank in range(n)}


@pytest.mark.parametrize("num_shards", SHARD_COUNTS, ids="shards{}".format)
@pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
def test_fold_pairs_extra_p_plus_i_with_i_rotated_by_shard(n, num_shards):
    p = _largest_power_of_two(n)
    extra = n - p
    for shard, order in enumerate(hd.rank_orders(n, num_shards)):
        assert order == tuple((v + shard * extra) % n for v in range(n))
        expected = [(order[p + i], order[i], range(p)) for i in range(extra)]
        got_in = [(t.src, t.dst, t.chunks) for t in hd.fold_in(order)]
        got_out = [(t.dst, t.src, t.chunks) for t in hd.fold_out(order)]
        assert got_in == expected
        assert got_out == expected


def test_rotation_gives_each_rank_the_extra_role_once_over_n_shards():
    n = 5  # p = 4, one extra rank per shard
    extras = [hd.fold_in(order)[0].src for order in hd.rank_orders(n, n)]
    assert sorted(extras) == list(range(n))


@pytest.mark.parametrize(
    "call, error, argument",
    [
        pytest.param(
            lambda: hd.rank_orders(0), ValueError, "num_devices", id="zero"
        ),
        pytest.param(
            lambda: hd.rank_orders(True), TypeError, "num_devices", id="bool"
        ),
        pytest.param(
            lambda: hd.rank_orders(3, 0), ValueError, "num_shards", id="zero_s"
        ),
        pytest.param(
            lambda: hd.rank_orders(3, 1.0), TypeError, "num_shards", id="float"
        ),
        pytest.param(
            lambda: hd.num_chunks(-1), ValueError, "num_devices", id="negative"
        ),
        pytest.param(
            lambda: hd.largest_power_of_two(0), ValueError, "n", id="power"
        ),
    ],
)
def test_rejects_bad_counts(call, error, argument):
    """A count of the wrong type is a TypeError, below 1 a ValueError."""
    with pytest.raises(error, match=f"^{argument}: expected an int >= 1"):
        call()


@pytest.mark.parametrize(
    "order",
    [(), (0, 0), (1, 2), (0, 2, 1, 4)],
    ids=["empty", "repeated", "not_from_zero", "gap"],
)
@pytest.mark.parametrize(
    "steps",
    [hd.fold_in, hd.reduce_scatter_steps, hd.all_gather_steps, hd.fold_out],
    ids=["fold_in", "reduce_scatter", "all_gather", "fold_out"],
)
def test_steps_reject_non_permutations(steps, order):
    with pytest.raises(ValueError, match="order: expected a permutation"):
        steps(order)
