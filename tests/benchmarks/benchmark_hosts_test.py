"""The benchmark on emulated hosts: the wire roofline, the bytes each host's
link carries per call, the targets stated against the wire, and one small
group measured for real (slow: it builds namespaces, needs root).

Figures are worked out by hand: S = 125,000,000 bytes at 1 Gbit/s
(125,000,000 bytes/s) takes 1 s one way, so the wire roofline 2(p-1)/p*S/B
is 1 s at 2 hosts, 4/3 s at 3 and 1.5 s at 4.
"""

from __future__ import annotations

import os

import pytest

from benchmarks import (
    candidates,
    groups,
    records,
    report,
    roofline,
    sessions,
    targets,
    workloads,
)
from tf_crossdevice.cluster import hosts as hosts_lib

S = 125_000_000
MIB = 2**20


def _wire_group(num_hosts, entries, local_devices=1, workload="resnet50"):
    """A group on `num_hosts` hosts at 1gbit from (name, family, baseline,
    ms, sent per host or None); every entry verified, 3 equal samples."""
    group = records.Group(
        "multi_worker",
        workload,
        "",
        num_hosts,
        214,
        S,
        S // 4,
        "float32",
        local_devices=local_devices,
        link_rate="1gbit",
    )
    results = []
    for name, family, base, ms, sent in entries:
        r = records.entry_of(name, family, base, [ms / 1e3] * 3)
        r.sent_bytes_per_host = r.received_bytes_per_host = sent
        results.append(r)
    records.add_results(group, results)
    return group


@pytest.mark.parametrize(
    ("num_hosts", "seconds"), [(2, 1.0), (3, 4 / 3), (4, 1.5)]
)
def test_the_wire_roofline_is_the_groups_roofline(num_hosts, seconds):
    group = _wire_group(
        num_hosts,
        [
            ("base", "baseline", None, 100, None),
            (
                "roofline: TF gRPC copy worker 0 -> 1",
                "roofline",
                "base",
                600,
                None,
            ),  # fmt: skip
            ("ours x", "ours", "base", 2100, None),
        ],
    )
    assert group.roofline == records.WIRE_ROOFLINE
    assert group.roofline_seconds == pytest.approx(seconds)
    assert group.time(group.roofline) == pytest.approx(seconds)
    ours = next(r for r in group.results if r.name == "ours x")
    assert ours.roofline_fraction == pytest.approx(seconds / 2.0)
    assert "emulated hosts at 1gbit" in group.scope
    assert "equal share of the cores" in group.scope


def test_records_without_the_new_fields_still_load(tmp_path):
    group = _wire_group(2, [("ours x", "ours", None, 1000, [S * 1.0] * 2)])
    run = records.Run({}, {}, [group], [])
    run.write(tmp_path / "r.json")
    again = records.Run.read(tmp_path / "r.json").groups[0]
    assert again.link_rate == "1gbit"
    assert again.results[0].sent_bytes_per_host == [S, S]
    old = records.dataclasses.asdict(group)
    del old["link_rate"]
    for r in old["results"]:
        del r["sent_bytes_per_host"], r["received_bytes_per_host"]
    loaded = records.Group.from_dict(old)
    assert loaded.link_rate is None and loaded.wire_roofline_seconds is None
    assert loaded.results[0].sent_bytes_per_host is None


class FakeHosts:
    """Counters that grow by 1000 sent and 2000 received bytes per host and
    per call, host i adding i more."""

    def __init__(self):
        self.calls = 0

    def link_bytes(self):
        return [
            hosts_lib.LinkBytes(
                (1000 + i) * self.calls, (2000 + i) * self.calls
            )
            for i in range(2)
        ]


def test_link_counter_divides_each_entrys_bytes_by_its_calls():
    fake = FakeHosts()

    def timer(reps):
        fake.calls += reps
        return 0.5

    counter = groups.LinkCounter(fake)
    timed = counter.wrap("ours x", timer)
    assert timed(4) == 0.5 and timed(6) == 0.5
    fake.calls += (
        1000  # untimed traffic (another entry, a check) is not counted
    )
    timed(10)
    group = _wire_group(2, [("ours x", "ours", None, 1000, None)])
    counter.record(group)
    (r,) = group.results
    assert r.sent_bytes_per_host == [1000.0, 1001.0]
    assert r.received_bytes_per_host == [2000.0, 2001.0]


@pytest.mark.parametrize(
    ("name", "hosts", "local", "sent"),
    [
        ("TF MWMS default", 2, 1, [S, S]),
        ("TF MWMS RING", 4, 1, [1.5 * S] * 4),
        # An all-gather of 16-bit halves: (p-1)*S/2 per host where that is
        # fewer bytes than the ring (p <= 3); at 4 the uncompressed ring.
        ("ours CollectiveAllReduce compression=bf16", 3, 1, [S] * 3),
        ("ours CollectiveAllReduce compression=bf16", 2, 1, [S / 2] * 2),
        ("ours CollectiveAllReduce compression=fp16", 4, 1, [1.5 * S] * 4),
        (
            "ours HierarchicalCollectiveAllReduce compression=bf16",
            2,
            2,
            [S / 2] * 2,
        ),
        ("ours CollectiveAllReduce compression=bf16", 2, 2, None),
        ("ours HierarchicalCollectiveAllReduce", 2, 2, [S, S]),
        # One ring over 4 replicas, 2 on each host: 2 * 3/4 * S per host.
        ("ours CollectiveAllReduce", 2, 2, [1.5 * S, 1.5 * S]),
        ("ours MultiWorkerAllReduce xring num_packs=1", 3, 1, [S * 4 / 3] * 3),
        # pscpu, 2 shards on 3 hosts: shards on hosts 0 and 1 (S/2 each);
        # host 0 sends S/2 to host 1 and its sum twice, S/2 * 2.
        (
            "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1)",
            3,
            1,
            [1.5 * S, 1.5 * S, S],
        ),  # fmt: skip
        ("TF ReductionToOneDevice (in-graph)", 3, 1, [2 * S, S, S]),
        ("roofline: TF gRPC copy worker 0 -> 1", 2, 1, [S, 0]),
        ("ours MultiWorkerAllReduce rechd", 3, 1, None),
    ],
)
def test_bytes_sent_model(name, hosts, local, sent):
    got = roofline.bytes_sent_model(name, S, hosts, local)
    assert got == (pytest.approx(sent) if sent is not None else None)


def _targets_group():
    """2 hosts, S in 1 s at the wire. Times (ms, net of a 100 ms baseline
    where one is named) and bytes per host as a run might give them."""
    plain, half = [S * 1.01] * 2, [S * 0.505] * 2
    return _wire_group(
        2,
        [
            ("base", "baseline", None, 100, None),
            ("TF MWMS default", "tf", None, 1150, plain),
            ("TF MWMS RING", "tf", None, 1100, plain),
            ("ours CollectiveAllReduce", "ours", None, 1080, plain),
            (
                "ours CollectiveAllReduce compression=bf16",
                "ours",
                None,
                580,
                half,
            ),  # fmt: skip
            ("ours MultiWorkerAllReduce xring", "ours", "base", 1210, plain),
            (
                "ours MultiWorkerAllReduce xring compression=bf16",
                "ours",
                "base",
                650,
                half,
            ),  # fmt: skip
            # 8% over its model: off.
            (
                "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1)",
                "ours",
                "base",
                1200,
                [S * 1.08] * 2,
            ),  # fmt: skip
            ("ours MultiWorkerAllReduce rechd", "ours", "base", 1500, plain),
        ],
    )


def test_wire_targets_on_a_hand_made_group():
    group = _targets_group()
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    # ours best uncompressed: CollectiveAllReduce 1.080 s; wire 1 s.
    wire = by_name["ours best uncompressed / wire bound"]
    assert wire.measured == pytest.approx(1 / 1.08) and wire.met
    # Fastest bf16: the in-graph xring's, 0.550 s net of its baseline,
    # against the same uncompressed, 1.110 s.
    bf16 = by_name["bf16 vs the same uncompressed"]
    assert bf16.measured == pytest.approx(1.11 / 0.55) and bf16.met
    # ours best (that one) 0.550 s, TF best (RING) 1.100 s: 2.00x.
    tf_best = by_name["ours best vs TF best"]
    assert tf_best.measured == pytest.approx(1.1 / 0.55) and tf_best.met
    # Our collective with no arguments 1.080 s, MWMS best 1.100 s.
    mwms = by_name["CollectiveAllReduce() vs MWMS best"]
    assert mwms.measured == pytest.approx(1.1 / 1.08) and mwms.met
    assert mwms.threshold == 1.0
    # The same against the wire: 1 / 1.08 = 0.926, under 0.93.
    default_wire = by_name["CollectiveAllReduce() / wire bound"]
    assert default_wire.measured == pytest.approx(1 / 1.08)
    assert default_wire.threshold == 0.93 and not default_wire.met
    # Worst modeled entry: pscpu at 1.08 S, 1/1.08 < 1/1.05.
    wire_bytes = by_name["bytes each host sent / model, worst entry"]
    assert wire_bytes.measured == pytest.approx(1 / 1.08)
    assert not wire_bytes.met
    assert "6 of 7 modeled entries within 5%" in wire_bytes.note
    assert "no model: ours MultiWorkerAllReduce rechd" in wire_bytes.note
    # The loopback targets do not apply on the wire.
    assert not any("TCP loopback" in n or "MWMS default" in n for n in by_name)


@pytest.mark.parametrize(
    "copy_ms, bound_ms",
    [(1100, 1100), (950, 1000)],
    ids=["copy_slower_than_the_wire", "copy_at_the_wire"],
)
def test_the_wire_targets_score_against_tfs_own_copy_where_it_is_slower(
    copy_ms, bound_ms
):
    """TF's gRPC copy of the bytes (ring-scaled, as the group times it)
    taking 1.1 s where the wire allows 1 s: the links could not be filled
    here, and the targets are scored against the copy; a copy as fast as
    the wire leaves the roofline as the bound."""
    group = _targets_group()
    copy = records.entry_of(
        sessions.ROOFLINE_GRPC, "roofline", None, [copy_ms / 1000] * 3
    )
    records.add_results(group, [*group.results, copy])
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    default_wire = by_name["CollectiveAllReduce() / wire bound"]
    # CollectiveAllReduce() took 1.080 s.
    assert default_wire.measured == pytest.approx(bound_ms / 1080)
    assert default_wire.met == (bound_ms / 1080 >= 0.93)
    wire = by_name["ours best uncompressed / wire bound"]
    assert wire.measured == pytest.approx(bound_ms / 1080)
    if copy_ms > 1000:
        assert "reached 0.909 of the link" in default_wire.note
    else:
        assert "wire roofline 1000.000 ms" in default_wire.note


def test_cpu_per_mib_of_our_default_against_tfs_same_packs():
    group = _targets_group()
    tf_2mib = records.entry_of(
        "TF MWMS RING bytes_per_pack=2MiB", "tf", None, [1.09] * 3
    )
    records.add_results(group, [*group.results, tf_2mib])
    cpu = {
        "ours CollectiveAllReduce": 3.0,
        "TF MWMS RING bytes_per_pack=2MiB": 2.9,
    }
    for r in group.results:
        r.cpu_ms_per_mib = cpu.get(r.name)
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    target = by_name["TF's CPU per MiB / CollectiveAllReduce()'s"]
    # 2.9 / 3.0: ours costs 3% more CPU per MiB than TensorFlow's.
    assert target.measured == pytest.approx(2.9 / 3.0) and not target.met
    assert "3.00 CPU ms/MiB" in target.note and "2.90" in target.note
    # Without TF's entry at the same packs, no such target.
    plain = _targets_group()
    names = [t.name for t in targets.evaluate([plain])]
    assert not any("CPU per MiB" in n for n in names)


def test_bert_bases_gradients_have_the_same_wire_targets():
    group = _targets_group()
    group.workload = "bert_base"
    found = targets.evaluate([group])
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in found}
    assert by_name["bf16 vs the same uncompressed"].measured == (
        pytest.approx(1.11 / 0.55)
    )
    assert by_name["ours best vs TF best"].threshold == 1.8
    # The whole set, not a subset standing in for it.
    assert not any(t.stand_in for t in found)
    # A subset's speed targets are marked (its bytes are counted alike).
    group.workload = "resnet50[:100]"
    speed = [
        t
        for t in targets.evaluate([group])
        if "bytes each host" not in t.name and "autotune" not in t.name
    ]
    assert len(speed) == 5 and all(t.stand_in for t in speed)


PSGD = "ours MultiWorkerAllReduce xring compression=powersgd rank=4"


def test_powersgd_is_left_out_of_ours_best_and_autotune_is_held_to_5():
    """PowerSGD (100 ms) changes the training: TF's best is compared with
    our fastest other (xring bf16, 550 ms net of the baseline), and
    autotune, which never picks it, with that too. autotune's own entry,
    600 ms net, is 600 / 550 = 1.09x the fastest: within 10% (the loopback
    rule) but not within 5% (on emulated hosts)."""
    group = _targets_group()
    results = [
        records.entry_of(PSGD, "ours", "base", [0.2] * 3),
        records.entry_of(
            "autotune (30 s budget)", "autotune", "base", [0.7] * 3
        ),
    ]
    records.add_results(group, [*group.baselines, *group.results, *results])
    assert group.ours_best == PSGD
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    tf_best = by_name["ours best vs TF best"]
    assert tf_best.measured == pytest.approx(1.1 / 0.55)
    assert "compression=bf16" in tf_best.note and "powersgd" not in tf_best.note
    for name in ("ours best", "fastest"):
        target = by_name[f"{name} / autotune's own time"]
        assert target.measured == pytest.approx(0.55 / 0.6)
        assert target.threshold == pytest.approx(1 / 1.05, abs=1e-3)
        assert not target.met
    powersgd = by_name["PowerSGD vs the fastest uncompressed"]
    assert powersgd.measured == pytest.approx(1.08 / 0.1)


def test_faster_links_keep_the_bytes_target_only():
    """The speed targets are set for 1 Gbit/s links; at 10 Gbit/s the same
    group checks the bytes each host sent, nothing else."""
    group = _targets_group()
    group.link_rate = "10gbit"
    names = [t.name.rsplit(": ", 1)[1] for t in targets.evaluate([group])]
    assert names == ["bytes each host sent / model, worst entry"]


def test_ours_best_is_chosen_by_confirmed_times():
    """xring bf16, 550 ms net in the first rounds, is re-timed at 500; an
    fp16 twin at 520 in the first rounds was not re-timed. Ours best is
    the confirmed 500 ms: TF's best (RING, 1.100 s) / 0.5 = 2.2."""
    group = _targets_group()
    fp16 = "ours MultiWorkerAllReduce xring compression=fp16"
    extra = records.entry_of(fp16, "ours", "base", [0.62] * 3)
    records.add_results(group, [*group.baselines, *group.results, extra])
    assert fp16 in targets.references(group)
    bf16 = "ours MultiWorkerAllReduce xring compression=bf16"
    records.add_confirmation(
        group, {bf16: [0.6], "base": [0.1], "TF MWMS RING": [1.1]}
    )
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    tf_best = by_name["ours best vs TF best"]
    assert tf_best.measured == pytest.approx(1.1 / 0.5)
    assert bf16 in tf_best.note


@pytest.mark.parametrize(
    ("rate", "within"),
    [("1gbit", 1 / 1.05), ("1000mbit", 1 / 1.05), ("10gbit", 1 / 1.1)],
)
def test_autotune_is_held_to_5_percent_where_the_wire_bounds(rate, within):
    group = _targets_group()
    group.link_rate = rate
    entry = records.entry_of(
        "autotune (30 s budget)", "autotune", "base", [0.7] * 3
    )
    records.add_results(group, [*group.baselines, *group.results, entry])
    scored = [
        t for t in targets.evaluate([group]) if "autotune's own" in t.name
    ]
    assert [t.threshold for t in scored] == [round(within, 3)] * 2
    speed = [t for t in targets.evaluate([group]) if "TF best" in t.name]
    assert len(speed) == (0 if rate == "10gbit" else 1)


def test_a_collective_left_out_of_the_run_has_no_target():
    group = _targets_group()
    kept = [r for r in group.results if "CollectiveAllReduce" not in r.name]
    records.add_results(group, [*group.baselines, *kept])
    names = [t.name.rsplit(": ", 1)[1] for t in targets.evaluate([group])]
    assert "CollectiveAllReduce vs MWMS best" not in names
    assert "ours best vs TF best" in names


def test_every_entry_the_wire_targets_compare_is_confirmed():
    group = _targets_group()
    names = records.finalists(group, targets.references(group))
    for name in (
        "ours CollectiveAllReduce",
        "ours CollectiveAllReduce compression=bf16",
        "TF MWMS RING",
    ):
        assert name in names


def test_hierarchical_beats_flat_by_1_4_with_2_local_devices():
    group = _wire_group(
        2,
        [
            ("TF MWMS RING", "tf", None, 1100, [S * 1.01] * 2),
            # The flat class's default is faster than its 4 MiB packs
            # here; the target names the 4 MiB packs all the same.
            ("ours CollectiveAllReduce", "ours", None, 1300, [S * 1.5] * 2),
            (
                "ours CollectiveAllReduce bytes_per_pack=4MiB",
                "ours",
                None,
                1400,
                [S * 1.5] * 2,
            ),  # fmt: skip
            (
                "ours HierarchicalCollectiveAllReduce",
                "ours",
                None,
                990,
                [S * 1.01] * 2,
            ),  # fmt: skip
        ],
        local_devices=2,
    )
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    hierarchical = by_name[
        "HierarchicalCollectiveAllReduce() vs "
        "CollectiveAllReduce bytes_per_pack=4MiB"
    ]
    assert hierarchical.measured == pytest.approx(1.4 / 0.99)
    assert hierarchical.met and hierarchical.threshold == 1.4
    assert by_name["bytes each host sent / model, worst entry"].met


def test_a_hierarchical_gain_the_bytes_cap_is_scored_against_the_cap():
    """At 4 hosts of 2 devices the flat ring over 8 replicas sends 1.75 S
    per host, the hierarchical ring over 4 hosts 1.5 S: on links that
    bound both, 1.75 / 1.5 = 1.167 is the most the hierarchical class can
    gain, under the 1.4 the target asks; it is held to 0.9 of the cap."""
    group = _wire_group(
        4,
        [
            ("TF MWMS RING", "tf", None, 1400, [S * 1.5] * 4),
            (
                "ours CollectiveAllReduce bytes_per_pack=4MiB",
                "ours",
                None,
                1680,
                [S * 1.75] * 4,
            ),  # fmt: skip
            (
                "ours HierarchicalCollectiveAllReduce",
                "ours",
                None,
                1500,
                [S * 1.5] * 4,
            ),  # fmt: skip
        ],
        local_devices=2,
    )
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    hierarchical = by_name[
        "HierarchicalCollectiveAllReduce() vs "
        "CollectiveAllReduce bytes_per_pack=4MiB"
    ]
    assert hierarchical.measured == pytest.approx(1.12)  # 1680 / 1500.
    # 0.9 x 1.75 / 1.5 = 1.05.
    assert hierarchical.threshold == 1.05 and hierarchical.met
    assert "sends 1.167 x the bytes each host sends" in hierarchical.note


def test_the_table_shows_each_hosts_bytes_and_the_model():
    text = report.group_table(_targets_group())
    assert "lower bound 2(p-1)/p*S = 119.21 MiB" in text
    assert "sent     recv    model  candidate" in text
    row = next(
        line
        for line in text.splitlines()
        if line.endswith("] CollectiveAllReduce")
    )
    # 1.01 S = 120.40 MiB sent and received, 1.01 of the model.
    assert row.split()[-5:-1] == ["120.40", "120.40", "1.01", "[ours]"]
    rechd = next(line for line in text.splitlines() if "rechd" in line)
    assert "no model" in rechd


@pytest.mark.slow
def test_a_small_group_on_two_emulated_hosts():
    """One 4 MiB tensor on 2 hosts at 1gbit (34 ms a call at the wire):
    the group's results, its wire roofline, each host's bytes near S, and
    nothing left behind."""
    workload = workloads.Workload(
        "one_tensor", ((1 << 20,),), "one 4 MiB tensor"
    )

    def candidates_of(w):
        every = candidates.multi_worker_candidates(w, quick=True)
        every += candidates.strategy_candidates(quick=True)
        return candidates.select(every, "CollectiveAllReduce$")

    config = groups.Config(rounds=2, target_seconds=0.1, max_reps=5)
    (group,) = groups.multi_worker(
        [workload], 2, config, candidates_of, link_rate="1gbit"
    )
    assert group.error is None, group.error
    assert group.roofline == records.WIRE_ROOFLINE
    assert group.roofline_seconds == pytest.approx((4 << 20) / 125e6)
    by_name = {r.name: r for r in group.results}
    assert "roofline: TCP loopback" not in by_name
    for name in ("TF MWMS default", "ours CollectiveAllReduce"):
        r = by_name[name]
        assert r.ok and r.time_seconds, (name, r.timing.error)
        assert r.roofline_fraction is not None
        # S each way per host, plus headers and TF's own messages.
        for n in r.sent_bytes_per_host + r.received_bytes_per_host:
            assert 0.99 * (4 << 20) <= n <= 1.1 * (4 << 20), (name, n)
    assert hosts_lib.leftovers(os.getpid()) == []
