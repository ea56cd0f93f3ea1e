"""The cost model on links of known rate: per-host bytes, incast, the
largest pack, and recovering a link's rate from step times (no TF ops).

Every expected number here is worked out by hand from the schedules, for
one tensor of S bytes on p workers with one device each.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tf_crossdevice.tuning import cost_model
from tf_crossdevice.tuning._traffic import Traffic

S = 1_200_000  # bytes: 300,000 float32 elements, divisible by 2, 3, 4, 8
ONE_TENSOR = [((S // 4,), "float32")]
TWO_HALVES = [((S // 8,), "float32")] * 2


def mwar(spec, **kwargs):
    return ("MultiWorkerAllReduce", {"all_reduce_spec": spec, **kwargs})


def traffic(config, workers, devices=1, grads=ONE_TENSOR):
    return cost_model.traffic_of(
        config, grads, devices_per_worker=devices, num_workers=workers
    )


# (config, workers, devices, bytes the busiest host sends = receives).
BUSIEST_HOST_BYTES = [
    # Shuffle, 2 shards at 3 workers: worker 0 owns shard 0 (S/2); it sends
    # shard 1 to worker 1 (S/2) and its summed shard to 2 others (S).
    (mwar(("pscpu/pscpu", 2, -1)), 3, 1, 1.5 * S),
    # 3 shards at 3 workers: 2 pieces of S/3 out, the sum to 2 others.
    (mwar(("pscpu/pscpu", 3, -1)), 3, 1, 4 / 3 * S),
    # 2 shards at 4 workers: S/2 out, the summed S/2 to 3 others.
    (mwar(("pscpu/pscpu", 2, -1)), 4, 1, 2.0 * S),
    (mwar(("pscpu/pscpu", 2, -1)), 2, 1, 1.0 * S),
    # Ring: 2(p-1) chunks of S/p.
    (mwar("xring"), 2, 1, 1.0 * S),
    (mwar("xring"), 3, 1, 4 / 3 * S),
    (mwar("xring"), 4, 1, 1.5 * S),
    # bf16 halves the wire bytes.
    (mwar(("pscpu/pscpu", 2, -1), compression="bf16"), 4, 1, 1.0 * S),
    (mwar("xring", compression="bf16"), 3, 1, 2 / 3 * S),
    # TF's in-graph reduction to one device: the root sends the sum to the
    # p-1 others.
    (("tf.ReductionToOneDevice", {}), 4, 1, 3.0 * S),
    # TF's ring collective (one replica per worker).
    (("tf.MultiWorkerMirroredStrategy", {}), 4, 1, 1.5 * S),
    # Our flat collective at 2 workers x 2 devices: one ring over 4
    # replicas, a worker's two in a row; each worker has one network hop
    # per direction, that of one replica: 2(4-1)/4 S.
    (("CollectiveAllReduce", {}), 2, 2, 1.5 * S),
    # The hierarchical one reduces inside each worker first: a ring of 2.
    (("HierarchicalCollectiveAllReduce", {}), 2, 2, 1.0 * S),
    # Compressed collectives in groups of 3: one all-gather of the 3
    # half-size messages, each member sends its own to 2 others.
    (("CollectiveAllReduce", {"compression": "bf16"}), 3, 1, 1.0 * S),
]


@pytest.mark.parametrize(
    "config, workers, devices, expected",
    BUSIEST_HOST_BYTES,
    ids=[f"{c[0]}-{c[1]}-{w}x{k}" for c, w, k, _ in BUSIEST_HOST_BYTES],
)
def test_net_bytes_are_what_the_busiest_hosts_link_carries(
    config, workers, devices, expected
):
    t = traffic(config, workers, devices)
    assert t.net_bytes == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "config, workers, expected",
    [
        # The root receives S from each of 3 senders at once: all but one
        # sender's share.
        (("tf.ReductionToOneDevice", {}), 4, 2.0 * S),
        (("tf.ReductionToOneDevice", {}), 3, 1.0 * S),
        (("tf.ReductionToOneDevice", {}), 2, 0.0),
        # Shard 0's owner receives S/2 from each of 3 others.
        (mwar(("pscpu/pscpu", 2, -1)), 4, 1.0 * S),
        (mwar(("pscpu/pscpu", 2, -1)), 3, 0.5 * S),
        (mwar(("pscpu/pscpu", 2, -1), compression="bf16"), 4, 0.5 * S),
        # One sender at a time.
        (mwar("xring"), 4, 0.0),
        (mwar("rechd"), 4, 0.0),
        (("tf.MultiWorkerMirroredStrategy", {}), 4, 0.0),
    ],
)
def test_incast_bytes(config, workers, expected):
    assert traffic(config, workers).incast_bytes == pytest.approx(expected)


@pytest.mark.parametrize(
    "config, grads, workers, expected",
    [
        (mwar("xring", num_packs=1), TWO_HALVES, 2, S),
        (mwar("xring"), TWO_HALVES, 2, S / 2),
        (("tf.ReductionToOneDevice", {}), TWO_HALVES, 3, S / 2),
        (("tf.MultiWorkerMirroredStrategy", {}), TWO_HALVES, 3, S),
        # Gathered compressed in a group of 3: every member decodes the 3
        # messages of the pack to full precision.
        (
            ("HierarchicalCollectiveAllReduce", {"compression": "bf16"}),
            TWO_HALVES,
            3,
            3 * S,
        ),
    ],
)
def test_serial_bytes_are_the_largest_pack(config, grads, workers, expected):
    t = traffic(config, workers, grads=grads)
    assert t.serial_bytes == pytest.approx(expected)


@pytest.mark.parametrize(
    "config, grads, workers, expected",
    [
        # One shard at 2 workers: the owner receives S in the gather and
        # sends S in the broadcast, sending and receiving nothing else.
        (mwar("pscpu"), ONE_TENSOR, 2, S),
        # Two shards at 2 workers: each gathers S/2 while sending S/2.
        (mwar(("pscpu/pscpu", 2, -1)), ONE_TENSOR, 2, 0.0),
        # Two shards at 4 workers: worker 0 receives 3 x S/2 of its shard
        # while sending S/2 of the other: |1.5 S - 0.5 S|.
        (mwar(("pscpu/pscpu", 2, -1)), ONE_TENSOR, 4, S),
        (mwar(("pscpu/pscpu", 2, -1)), ONE_TENSOR, 3, S / 2),
        (mwar("pscpu", compression="bf16"), ONE_TENSOR, 2, S / 2),
        # The root receives S from each of p - 1 workers, then sends; the
        # larger of two tensors counts, not their sum.
        (("tf.ReductionToOneDevice", {}), ONE_TENSOR, 4, 3 * S),
        (("tf.ReductionToOneDevice", {}), TWO_HALVES, 3, S),
        (mwar("pscpu"), TWO_HALVES, 2, S / 2),
        # Three shards at 2 workers: worker 0 owns shards 0 and 2 (2 x S/3
        # in) and sends shard 1 (S/3 out).
        (mwar(("pscpu/pscpu", 3, -1)), ONE_TENSOR, 2, S / 3),
        # Halving-doubling at 3 workers: worker 0 folds in worker 2's S,
        # then sends the result back; at 4 nothing folds in.
        (mwar("rechd"), ONE_TENSOR, 3, S),
        (mwar("rechd"), ONE_TENSOR, 4, 0.0),
        # Rings and all-gathers send and receive at once.
        (mwar("xring"), ONE_TENSOR, 4, 0.0),
        (("tf.MultiWorkerMirroredStrategy", {}), ONE_TENSOR, 4, 0.0),
        (("HierarchicalCollectiveAllReduce", {}), ONE_TENSOR, 2, 0.0),
        (
            ("CollectiveAllReduce", {"compression": "bf16"}),
            ONE_TENSOR,
            2,
            0.0,
        ),
        # fp16 halves float32's wire bytes, bf16 quarters float64's.
        (mwar("pscpu", compression="fp16"), ONE_TENSOR, 2, S / 2),
        (
            mwar("pscpu", compression="bf16"),
            [((S // 8,), "float64")],
            2,
            S / 4,
        ),
    ],
)
def test_one_way_bytes_are_one_packs_idle_direction(
    config, grads, workers, expected
):
    t = traffic(config, workers, grads=grads)
    assert t.one_way_bytes == pytest.approx(expected)


@pytest.mark.parametrize(
    "config, expected",
    [
        # The root's 2 remote replicas each send S, all in before it
        # sends anything back.
        (("tf.ReductionToOneDevice", {}), 2 * S),
        # The flat shuffle, one shard: worker 1's two replicas send S
        # each to worker 0's first device.
        (mwar("pscpu"), 2 * S),
        # The two-level one sums inside each worker first: one S crosses.
        (mwar(("pscpu/pscpu", 1, -1)), S),
        # Two shards, one per worker: each receives 2 x S/2 of its own
        # while its two devices send 2 x S/2 of the other's.
        (mwar(("pscpu", 2, -1)), 0.0),
        (mwar(("pscpu/pscpu", 2, -1)), 0.0),
    ],
)
def test_one_way_bytes_with_two_devices_per_worker(config, expected):
    t = traffic(config, 2, devices=2)
    assert t.one_way_bytes == pytest.approx(expected)


def test_a_link_used_one_way_at_a_time_is_priced_as_both_ways():
    # One shard at 2 hosts: the gather, then the broadcast, S each, on a
    # link that could carry both at once: 2 S on the wire, against S for
    # two shards.
    wire_only = dataclasses.replace(
        cost_model.Constants(*(0.0,) * 8),
        beta_net=8e-9,  # 1 Gbit/s
    )

    def seconds(config):
        return cost_model.predict(
            config,
            ONE_TENSOR,
            devices_per_worker=1,
            num_workers=2,
            constants=wire_only,
        )

    assert seconds(mwar("pscpu")) == pytest.approx(2 * S * 8e-9)
    assert seconds(mwar(("pscpu/pscpu", 2, -1))) == pytest.approx(S * 8e-9)


RATE = 1e9  # bits/s
SECONDS_PER_WIRE_BYTE = 8 / RATE
INCAST, SERIAL, STEP = 4e-9, 3e-9, 2e-3
MACHINE_CORES = 2


def hand_worked_rows(rate=None):
    """Step times on p hosts of a 2-core machine (2/p cores each), made
    from hand-worked counts: wire bytes at 1 Gbit/s (or `rate`, which
    each measurement then names), incast bytes (their time scaled with
    the wire's), the largest pack over the host's cores, a fixed step."""
    slower = RATE / (rate or RATE)  # the wire's time per byte over 1 Gbit/s'
    rows = []
    for p in (2, 3, 4):
        cores = MACHINE_CORES / p
        cases = [
            # (config, grads, wire bytes: each way plus one way at a time,
            # incast bytes, largest pack)
            (mwar("xring", num_packs=1), ONE_TENSOR, 2 * (p - 1) / p * S, 0, S),
            (mwar("xring"), TWO_HALVES, 2 * (p - 1) / p * S, 0, S / 2),
            (
                mwar(("pscpu/pscpu", 2, -1)),
                ONE_TENSOR,
                {2: S, 3: 1.5 * S + S / 2, 4: 2 * S + S}[p],
                {2: 0, 3: S / 2, 4: S}[p],
                S,
            ),
            (
                ("tf.ReductionToOneDevice", {}),
                ONE_TENSOR,
                (p - 1) * S + (p - 1) * S,
                (p - 2) * S,
                S,
            ),
        ]
        for config, grads, wire, incast, largest in cases:
            seconds = (
                SECONDS_PER_WIRE_BYTE * slower * wire
                + INCAST * slower * incast
                + SERIAL * largest / cores
                + STEP
            )
            rows.append(
                cost_model.Measurement(
                    config, grads, 1, p, seconds, cores, rate
                )
            )
    return rows


LINK_FIELDS = ("beta_net", "beta_incast", "beta_serial", "step")


def test_fit_recovers_the_link_rate_of_hand_worked_steps():
    fitted = cost_model.fit(hand_worked_rows(), fields=LINK_FIELDS)
    assert 8 / fitted.beta_net == pytest.approx(RATE, rel=1e-6)
    assert fitted.beta_incast == pytest.approx(INCAST, rel=1e-6)
    assert fitted.beta_serial == pytest.approx(SERIAL, rel=1e-6)
    assert fitted.step == pytest.approx(STEP, rel=1e-6)
    for name in set(cost_model.FIELDS) - set(LINK_FIELDS):
        assert getattr(fitted, name) == 0.0


def test_rows_at_another_rate_count_their_wire_bytes_at_the_fits_rate():
    # At 10 Gbit/s a byte takes 0.8 ns on the wire: constants for 1 Gbit/s
    # links fitted on them say 8 ns; the per-core and per-step terms are
    # the same at any rate.
    fast = hand_worked_rows(rate=10 * RATE)
    fitted = cost_model.fit(fast, fields=LINK_FIELDS, link_rate=RATE)
    assert fitted.beta_net == pytest.approx(8e-9, rel=1e-6)
    assert fitted.beta_incast == pytest.approx(INCAST, rel=1e-6)
    assert fitted.beta_serial == pytest.approx(SERIAL, rel=1e-6)
    assert fitted.step == pytest.approx(STEP, rel=1e-6)
    # Both rates together, for 10 Gbit/s links: 0.8 ns per byte.
    both = cost_model.fit(
        hand_worked_rows(rate=RATE) + fast,
        fields=LINK_FIELDS,
        link_rate=10 * RATE,
    )
    assert both.beta_net == pytest.approx(0.8e-9, rel=1e-6)
    assert both.beta_incast == pytest.approx(INCAST / 10, rel=1e-6)
    assert both.beta_serial == pytest.approx(SERIAL, rel=1e-6)
    # Without the rates, the 10 Gbit/s rows' wire time would read as
    # 1 Gbit/s': no set of constants fits both.
    unnamed = [m._replace(link_rate=None) for m in hand_worked_rows()] + [
        m._replace(link_rate=None) for m in fast
    ]
    blind = cost_model.fit(unnamed, fields=LINK_FIELDS)
    assert 8 / blind.beta_net > 1.5 * RATE


def test_fit_needs_the_rate_its_constants_are_for():
    fast = hand_worked_rows(rate=10 * RATE)
    with pytest.raises(
        ValueError, match=r"link_rate: measurements\[0\] was made on links"
    ):
        cost_model.fit(fast, fields=LINK_FIELDS)
    for rows in (fast, hand_worked_rows()):
        with pytest.raises(ValueError, match="link_rate: expected"):
            cost_model.fit(rows, fields=LINK_FIELDS, link_rate=0)
    with pytest.raises(ValueError, match=r"measurements\[0\].link_rate"):
        cost_model.fit([fast[0]._replace(link_rate=-1.0)], link_rate=RATE)


def test_fit_recovers_the_link_rate_within_a_few_percent_with_noise():
    # Each configuration timed 8 times, each time within a few percent.
    rng = np.random.default_rng(5)
    rows = [
        m._replace(seconds=m.seconds * (1 + 0.02 * rng.standard_normal()))
        for m in hand_worked_rows() * 8
    ]
    fitted = cost_model.fit(rows, fields=LINK_FIELDS)
    assert 8 / fitted.beta_net == pytest.approx(RATE, rel=0.05)


def test_cores_per_worker_divides_only_the_per_core_terms():
    c = cost_model.Constants(
        alpha_net=1.0,
        beta_net=0.0,
        alpha_mem=0.0,
        beta_mem=0.0,
        gamma=0.0,
        delta=2.0,
        alpha_collective=0.0,
        step=0.0,
        beta_serial=4.0,
    )
    t = Traffic(net_messages=3, ops=5, serial_bytes=7)
    assert c.seconds(t) == 3 + 10 + 28
    assert c.seconds(t, cores_per_worker=0.5) == 3 + 20 + 56


def test_constants_for_link_scale_the_wire_terms_with_the_rate():
    slow = cost_model.constants_for_link(1e9)
    fast = cost_model.constants_for_link(25e9)
    assert slow.beta_net == pytest.approx(25 * fast.beta_net)
    assert slow.beta_incast == pytest.approx(25 * fast.beta_incast)
    assert slow.beta_serial == fast.beta_serial
    assert slow.step == fast.step
    # On 1 Gbit/s links the wire costs within 10% of 8 ns per byte.
    assert slow.beta_net == pytest.approx(8e-9, rel=0.10)
    with pytest.raises(ValueError, match="rate_bits_per_s"):
        cost_model.constants_for_link(0)


def test_loopback_fit_leaves_the_link_only_terms_at_zero():
    rows = [m._replace(cores_per_worker=None) for m in hand_worked_rows()]
    fitted = cost_model.fit(rows)
    assert fitted.beta_incast == 0.0 and fitted.beta_serial == 0.0


def test_fit_names_an_unknown_field():
    with pytest.raises(ValueError, match="fields: unknown constant 'beta'"):
        cost_model.fit(hand_worked_rows(), fields=("beta",))


def test_recommend_for_large_clusters_on_known_links():
    grads = [((1000, 1000), "float32")] * 20 + [((64,), "float32")] * 100
    for workers in (64, 1024):
        config, seconds = cost_model.recommend(
            grads,
            num_workers=workers,
            constants=cost_model.constants_for_link(10e9),
            cores_per_worker=1,
        )
        # At least a bandwidth-optimal all-reduce's bytes at 10 Gbit/s.
        wire = 2 * (workers - 1) / workers * 80e6 * 8 / 10e9
        assert seconds >= 0.9 * wire, config
