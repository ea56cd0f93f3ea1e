"""The benchmark's CPU time per MiB on emulated hosts: the figures from
hand-worked numbers, the counter around each round's timed calls, the
table's column, old records still loading, and one small group measured
for real (slow: it builds namespaces, needs root).

Hand-worked: S = 100 MiB all-reduced per call. A host that used 0.5 CPU
seconds over 2 calls used 0.25 s per 100 MiB: 2.5 ms per MiB.
"""

from __future__ import annotations

import os

import pytest

from benchmarks import candidates, groups, records, report, site, workloads
from tf_crossdevice.cluster import hosts as hosts_lib

MIB = 2**20
S = 100 * MIB


def _wire_group(entries):
    """A group on 2 hosts at 1gbit of S bytes from (name, family, baseline,
    ms); every entry verified, 3 equal samples."""
    group = records.Group(
        "multi_worker",
        "resnet50",
        "",
        2,
        214,
        S,
        S // 4,
        "float32",
        link_rate="1gbit",
    )
    records.add_results(
        group,
        [
            records.entry_of(name, family, base, [ms / 1e3] * 3)
            for name, family, base, ms in entries
        ],
    )
    return group


@pytest.mark.parametrize(
    ("cpu_seconds", "calls", "size", "expected"),
    [
        ([0.5, 0.25], 2, S, [2.5, 1.25]),
        ([0.0, 1.0], 1, S, [0.0, 10.0]),
        # 4 MiB a call, 10 calls: 40 MiB; 0.1 s is 2.5 ms per MiB.
        ([0.1, 0.2, 0.05], 10, 4 * MIB, [2.5, 5.0, 1.25]),
    ],
    ids=["two_calls", "one_idle_host", "three_hosts"],
)
def test_cpu_ms_per_mib(cpu_seconds, calls, size, expected):
    got = records.cpu_ms_per_mib(cpu_seconds, calls, size)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize(
    ("rounds", "per_host", "busiest"),
    [
        ([[4.0, 6.0]], [4.0, 6.0], 6.0),
        # The busiest host changes: round maxima 3, 2, 5 -> median 3.
        ([[1.0, 3.0], [2.0, 1.0], [5.0, 4.0]], [2.0, 3.0], 3.0),
        # Even count: medians are the means of the middle two.
        ([[1.0, 2.0], [3.0, 2.0], [2.0, 8.0], [4.0, 1.0]], [2.5, 2.0], 3.5),
    ],
    ids=["one_round", "busiest_changes", "even_rounds"],
)
def test_cpu_figures_take_medians_over_rounds(rounds, per_host, busiest):
    got_per_host, got_busiest = records.cpu_figures(rounds)
    assert got_per_host == pytest.approx(per_host)
    assert got_busiest == pytest.approx(busiest)


class FakeHosts:
    """CPU counters: host i uses (1 + i) * 0.1 s per call timed, and 5 s
    between rounds (another entry, a build) that must not be counted."""

    def __init__(self):
        self.seconds = [0.0, 0.0]

    def cpu_seconds(self):
        return list(self.seconds)

    def calls(self, n):
        self.seconds = [
            s + (1 + i) * 0.1 * n for i, s in enumerate(self.seconds)
        ]


def test_cpu_counter_counts_each_round_around_its_timed_calls_only():
    fake = FakeHosts()

    def timer(reps):
        fake.calls(reps)
        return 0.5

    counter = groups.CpuCounter(fake, S)
    timed = counter.wrap("ours x", timer)
    assert timed(2) == 0.5
    fake.seconds = [s + 5 for s in fake.seconds]  # Not timed: not counted.
    assert timed(4) == 0.5
    group = _wire_group(
        [("base", "baseline", None, 100), ("ours x", "ours", "base", 1000)]
    )
    counter.record(group)
    (r,) = group.results
    # 0.1 s and 0.2 s per call of 100 MiB: 1 and 2 ms per MiB, each round.
    assert r.cpu_ms_per_mib_per_host == pytest.approx([1.0, 2.0])
    assert r.cpu_ms_per_mib == pytest.approx(2.0)
    (base,) = group.baselines
    assert base.cpu_ms_per_mib is None  # Never timed through the counter.


def test_the_table_shows_the_busiest_hosts_cpu_per_mib():
    group = _wire_group(
        [
            ("base", "baseline", None, 100),
            ("TF MWMS RING", "tf", "base", 1000),
            ("ours CollectiveAllReduce", "ours", "base", 1100),
        ]
    )
    by_name = {r.name: r for r in group.results}
    by_name["TF MWMS RING"].cpu_ms_per_mib_per_host = [3.0, 3.456]
    by_name["TF MWMS RING"].cpu_ms_per_mib = 3.456
    group.baselines[0].cpu_ms_per_mib = 0.25
    text = report.group_table(group)
    assert "CPU     sent     recv    model  candidate" in text
    assert "(ms/MiB)" in text
    lines = text.splitlines()
    tf_row = next(line for line in lines if line.endswith("TF MWMS RING"))
    ours_row = next(line for line in lines if line.endswith("AllReduce"))
    # CPU, then sent, recv and model (none recorded here), then the name.
    assert tf_row.split()[-7:-3] == ["3.46", "-", "-", "-"]
    assert ours_row.split()[-6:-2] == ["-", "-", "-", "-"]
    assert "# base: 100.000 ms, CPU 0.25 ms/MiB" in lines


def test_records_without_cpu_fields_still_load(tmp_path):
    group = _wire_group([("ours x", "ours", None, 1000)])
    group.results[0].cpu_ms_per_mib_per_host = [1.5, 2.5]
    group.results[0].cpu_ms_per_mib = 2.5
    records.Run({}, {}, [group], []).write(tmp_path / "r.json")
    again = records.Run.read(tmp_path / "r.json").groups[0].results[0]
    assert again.cpu_ms_per_mib_per_host == [1.5, 2.5]
    assert again.cpu_ms_per_mib == 2.5
    old = records.dataclasses.asdict(group)
    for r in old["results"]:
        del r["cpu_ms_per_mib_per_host"], r["cpu_ms_per_mib"]
    loaded = records.Group.from_dict(old).results[0]
    assert loaded.cpu_ms_per_mib_per_host is None
    assert loaded.cpu_ms_per_mib is None
    # And the committed records (most written before these fields) load,
    # and their tables have the column.
    for path in sorted(site.RECORDS_DIR.glob("hosts_*.json")):
        for g in records.Run.read(path).groups:
            if g.link_rate is not None:
                assert "(ms/MiB)" in report.group_table(g), path


@pytest.mark.slow
def test_every_between_host_result_has_each_hosts_cpu_per_mib():
    """One 4 MiB tensor on 2 hosts at 1gbit: TF's collective, ours
    between-graph and ours in-graph each used CPU on both hosts while
    timed, and no more per call than the host's share of the cores allows
    over the call's time (plus the round's messages)."""
    workload = workloads.Workload(
        "one_tensor", ((1 << 20,),), "one 4 MiB tensor"
    )

    def candidates_of(w):
        every = candidates.multi_worker_candidates(w, quick=True)
        every += candidates.strategy_candidates(quick=True)
        return candidates.select(every, "CollectiveAllReduce$,xring$")

    config = groups.Config(rounds=2, target_seconds=0.1, max_reps=5)
    (group,) = groups.multi_worker(
        [workload], 2, config, candidates_of, link_rate="1gbit"
    )
    assert group.error is None, group.error
    between_hosts = [r for r in group.results if r.family in ("tf", "ours")]
    kinds = {r.name.split()[1] for r in between_hosts}
    assert {"MWMS", "CollectiveAllReduce", "MultiWorkerAllReduce"} <= kinds
    share = (os.cpu_count() or 1) / 2  # Cores per host.
    mib = (4 << 20) / MIB
    for r in between_hosts:
        assert r.ok, (r.name, r.timing.error)
        per_host = r.cpu_ms_per_mib_per_host
        assert per_host is not None and len(per_host) == 2, r.name
        assert all(x > 0 for x in per_host), (r.name, per_host)
        assert r.cpu_ms_per_mib is not None
        assert r.cpu_ms_per_mib >= min(per_host), r.name
        # CPU ms per call, against the slowest round's wall time.
        most = 1.5 * 1e3 * max(r.timing.samples) * share + 50
        assert r.cpu_ms_per_mib * mib <= most, (r.name, per_host, most)
    text = report.group_table(group)
    assert "(ms/MiB)" in text
    assert hosts_lib.leftovers(os.getpid()) == []
