"""benchmarks.cost_fit: fitting at narrower scopes tells drift between
benchmark runs from what the model's form cannot express."""

import dataclasses
import itertools
import pathlib

import pytest

from benchmarks import cost_fit
from tf_crossdevice.tuning import cost_model

REPO = pathlib.Path(__file__).resolve().parents[2]
GRADS = [((64,), "float32")] * 200 + [((1000, 100), "float32")] * 4
BASE = cost_model.DEFAULT_CONSTANTS
# A second benchmark run on a machine 4x slower per op and per step.
SLOWER = dataclasses.replace(BASE, delta=4 * BASE.delta, step=4 * BASE.step)


def _rows() -> list[cost_fit.Row]:
    rows = []
    for record, constants in (("a", BASE), ("b", SLOWER)):
        for devices in (2, 4, 8):
            for spec in ("xring", "pscpu", "rechd"):
                for packs in (0, 1, 4):
                    config = (
                        "SpecAllReduce",
                        {"all_reduce_spec": spec, "num_packs": packs},
                    )
                    seconds = cost_model.predict(
                        config,
                        GRADS,
                        devices_per_worker=devices,
                        constants=constants,
                    )
                    rows.append(
                        cost_fit.Row(
                            f"{record}: small, {devices} devices",
                            f"{spec} num_packs={packs}",
                            cost_model.Measurement(
                                config, GRADS, devices, 1, seconds
                            ),
                            record=record,
                        )
                    )
    return rows


def test_one_fit_for_two_runs_misses_where_a_fit_per_run_does_not():
    rows = _rows()
    every, median, within, groups = cost_fit.scope_summary(
        cost_fit.fitted_by(rows, lambda r: "")
    )
    assert groups == 6
    # The same configurations took up to 4x longer in run b: one set of
    # constants cannot be within 25% of both runs everywhere.
    assert within < len(rows) and every < groups
    for key in (lambda r: r.record, lambda r: r.group):
        fitted = cost_fit.fitted_by(rows, key)
        assert cost_fit.scope_summary(fitted) == (6, 6, len(rows), 6)
        for row in fitted:
            assert abs(row.ratio - 1) < 1e-6, (row.group, row.candidate)


def test_fitted_by_leaves_the_rows_given_alone():
    rows = _rows()
    cost_fit.fitted_by(rows, lambda r: r.record)
    assert all(row.predicted == 0.0 for row in rows)


def test_rows_read_from_a_record_carry_its_name():
    path = REPO / "benchmarks" / "records" / "small8.json"
    rows = cost_fit.read_rows([path])
    assert rows and {row.record for row in rows} == {"small8"}
    assert all(row.group.startswith("small8: ") for row in rows)


def test_report_tables_the_scopes():
    rows = _rows()
    cost_fit.predict_rows(rows, BASE)
    scopes = [
        (
            "each record alone",
            cost_fit.scope_summary(
                cost_fit.fitted_by(rows, lambda r: r.record)
            ),
        )
    ]
    text = cost_fit.report(rows, BASE, {}, [], "cmd", scopes)
    assert "(8 constants for 9 to 9 candidates)" in " ".join(text.split())
    assert "| each record alone | 6 of 6 | 6 of 6 | 54 of 54 |" in text


def _link_rows(constants, rates) -> list[cost_fit.Row]:
    """Measurements the model itself would make at each link rate: pscpu,
    xring and rechd, apart and in one pack, across 2, 3 and 4 hosts of
    one core each: 18 per rate."""
    rows = []
    for rate, link in rates:
        # The wire's per-byte terms by hand: a tenth at ten times the rate.
        at_rate = dataclasses.replace(
            constants,
            beta_net=constants.beta_net * 1e9 / rate,
            beta_incast=constants.beta_incast * 1e9 / rate,
        )
        for workers, spec, packs in itertools.product(
            (2, 3, 4), ("xring", "pscpu", "rechd"), (0, 1)
        ):
            kwargs = {"all_reduce_spec": spec, "num_packs": packs}
            config = ("MultiWorkerAllReduce", kwargs)
            seconds = cost_model.predict(
                config,
                GRADS,
                devices_per_worker=1,
                num_workers=workers,
                constants=at_rate,
                cores_per_worker=1.0,
            )
            rows.append(
                cost_fit.Row(
                    f"r: small, {workers} hosts at {link} x 1",
                    f"{spec} num_packs=1" if packs else spec,
                    cost_model.Measurement(
                        config, GRADS, 1, workers, seconds, 1.0, rate
                    ),
                )
            )
    return rows


def test_held_out_rate_moves_only_the_wire_terms():
    # 1 Gbit/s: 8 ns per byte on the wire; 10 Gbit/s: 0.8 ns. At 2 hosts
    # a ring sends 2(p-1)/p = 1x the gradients each way: 200 x 256 +
    # 4 x 400,000 = 1,651,200 bytes, 13.2096 ms on the wire at 1 Gbit/s
    # and a tenth of it at 10 Gbit/s; the per-op and per-step terms are
    # the same at both rates.
    constants = dataclasses.replace(
        BASE, beta_net=8e-9, beta_incast=0.0, beta_serial=0.0
    )
    rows = _link_rows(constants, [(1e9, "1gbit"), (10e9, "10gbit")])
    ((rate, test),) = cost_fit.held_out_by_rate(rows, 1e9, constants)
    assert rate == 10e9
    assert len(test) == 18
    for row in test:
        assert row.ratio == pytest.approx(1.0)
    fast, slow = (
        next(
            r
            for r in rs
            if r.group == f"r: small, 2 hosts at {link} x 1"
            and r.candidate == "xring"
        )
        for rs, link in ((test, "10gbit"), (rows, "1gbit"))
    )
    wire = 1_651_200 * 8e-9
    assert slow.measurement.seconds - fast.predicted == pytest.approx(
        wire - wire / 10
    )
    # Unmoved constants would predict the fast links as slow ones.
    cost_fit.predict_rows(test, constants)
    assert all(r.ratio > 1.0 for r in test)


def test_one_fit_for_every_rate_scales_each_rows_wire_bytes():
    # Steps the model makes at 1 and 10 Gbit/s, wire terms moved by hand:
    # fitted together for 1 Gbit/s links they are the same constants, so
    # every row is within 20%; read as if all were at 1 Gbit/s, no set of
    # constants fits both rates, and the fit leaves slow rows outside.
    constants = dataclasses.replace(
        BASE, beta_net=8e-9, beta_incast=0.0, beta_serial=0.0
    )
    rows = _link_rows(constants, [(1e9, "1gbit"), (10e9, "10gbit")])
    together = cost_fit.one_fit_for_every_rate(rows, 1e9)
    # (rate, candidates, within 20% summed, ...).
    assert [(r, n, summed) for r, n, summed, _, _ in together] == [
        (1e9, 18, 18),
        (10e9, 18, 18),
    ]
    assert rows[0].predicted == 0.0  # the rows given are left alone
    blind = [
        dataclasses.replace(
            r, measurement=r.measurement._replace(link_rate=None)
        )
        for r in rows
    ]
    cost_fit.predict_rows(blind, cost_fit.fit_link(blind, 1e9))
    slow = [
        b
        for b, r in zip(blind, rows, strict=True)
        if r.measurement.link_rate == 1e9
    ]
    assert sum(abs(r.ratio - 1) <= 0.20 for r in slow) < len(slow) - 4


def test_fit_larger_of_fits_steps_bound_by_the_wire_or_by_the_cores():
    # Steps made as the larger of the wire's time (8 ns per byte each way
    # at 1 Gbit/s, 0.8 at 10) and the cores' (1 ns per byte summed or
    # copied on one core), plus 2 ms: at 1 Gbit/s the wire bounds every
    # step, at 10 Gbit/s the cores bound some. The piecewise fit finds
    # them; the model's sum cannot be right at both rates.
    rows = _link_rows(BASE, [(1e9, "1gbit"), (10e9, "10gbit")])
    wire_bound = set()
    for row in rows:
        m = row.measurement
        t = cost_model.traffic_of(
            m.config,
            m.gradients,
            devices_per_worker=1,
            num_workers=m.num_workers,
        )
        wire = (t.net_bytes + t.one_way_bytes) * 8e-9 * 1e9 / m.link_rate
        cores = (t.reduce_bytes + t.copy_bytes) * 1e-9
        row.measurement = m._replace(seconds=max(wire, cores) + 2e-3)
        wire_bound.add((m.link_rate, wire > cores))
    # Both sides bound some step.
    assert {(1e9, True), (10e9, False)} <= wire_bound
    summed = [dataclasses.replace(r) for r in rows]
    constants = cost_fit.fit_link(summed, 1e9)
    predicted = cost_fit.fit_larger_of(rows, 1e9, constants)
    assert predicted == pytest.approx(
        [r.measurement.seconds for r in rows], rel=1e-6
    )
    cost_fit.predict_rows(summed, constants, 1e9)
    assert max(abs(r.ratio - 1) for r in summed) > 0.05
    # The page's column: every row within 20% at each rate, the larger of.
    together = cost_fit.one_fit_for_every_rate(rows, 1e9)
    assert [(r, n, larger) for r, n, _, larger, _ in together] == [
        (1e9, 18, 18),
        (10e9, 18, 18),
    ]


def test_rounds_within_counts_candidates_whose_rounds_stay_near_their_median():
    def row(rounds):
        config = ("MultiWorkerAllReduce", {"all_reduce_spec": "xring"})
        m = cost_model.Measurement(config, GRADS, 1, 2, 1.0)
        return cost_fit.Row("g", "xring", m, rounds=rounds)

    rows = [
        row((1.0, 1.1, 0.9)),  # median 1.0: every round within 10%
        row((1.0, 1.3, 1.0)),  # 1.3 is 30% above the median
        row((0.5, 1.0, 1.0)),  # 0.5 is half the median
        row(()),  # never timed
    ]
    assert cost_fit.rounds_within(rows) == 1


# --- emulated hosts: the shipped records ----------------------------------

HOST_RECORDS = [
    REPO / "benchmarks/records/hosts_1gbit.json",
    REPO / "benchmarks/records/hosts_collectives_1gbit.json",
]
SHAPED_RATE = 1e9  # the records' links: tc tbf ... rate 1gbit


def _host_rows() -> list[cost_fit.Row]:
    return cost_fit.read_rows(HOST_RECORDS, emulated=True)


def test_emulated_rows_are_read_apart_from_loopback_ones():
    rows = _host_rows()
    assert {r.measurement.num_workers for r in rows} == {2, 3, 4}
    # 2 cores shared by p hosts.
    for r in rows:
        m = r.measurement
        assert m.cores_per_worker == pytest.approx(2 / m.num_workers)
        assert m.link_rate == SHAPED_RATE  # the records' '1gbit'
        assert "hosts at 1gbit" in r.group
    assert cost_fit.read_rows(HOST_RECORDS) == []


def test_model_bytes_match_what_each_hosts_link_carried():
    # The interfaces count headers and gRPC framing too: under 1% more.
    rows = [r for r in _host_rows() if r.wire_bytes]
    assert len(rows) >= 50
    for r in rows:
        ratio = r.wire_bytes / cost_fit.model_bytes(r)
        assert 1.0 <= ratio <= 1.01, (r.group, r.candidate, ratio)


def test_fit_on_emulated_hosts_recovers_the_shaped_link_rate():
    rows = _host_rows()
    overhead = cost_fit.wire_overhead(rows) * cost_fit.FRAME_OVERHEAD
    rate = cost_fit.recovered_rate(
        cost_fit.fit_link(rows, SHAPED_RATE), overhead
    )
    assert abs(rate / SHAPED_RATE - 1) <= 0.10, rate


@pytest.mark.parametrize(
    "hosts, candidates",
    # At 2 hosts TF's reduction to one device sends each tensor to the
    # root and back: the root's link works one way at a time, which the
    # largest tensor's one-way bytes price (without them it misses).
    [(2, 32), (3, 12), (4, 12)],
)
def test_fitted_on_the_other_host_counts_predicts_every_candidate(
    hosts, candidates
):
    held_out = {
        held.hosts: held.rows
        for held in cost_fit.held_out_by_hosts(_host_rows(), SHAPED_RATE)
    }
    assert len(held_out[hosts]) == candidates
    misses = [
        (r.candidate, round(r.ratio, 2))
        for r in held_out[hosts]
        if abs(r.ratio - 1) > 0.20
    ]
    assert misses == []


def test_shipped_link_constants_are_the_fit_of_the_shipped_records():
    fitted = cost_fit.fit_link(_host_rows(), SHAPED_RATE)
    shipped = cost_model.constants_for_link(SHAPED_RATE)
    for name in cost_model.FIELDS:
        assert getattr(shipped, name) == pytest.approx(
            getattr(fitted, name), rel=1e-3, abs=1e-15
        ), name


def test_spearman_on_hand_worked_ranks():
    # Ranks (1, 2, 3, 4) against (2, 1, 4, 3): d^2 sums to 4,
    # rho = 1 - 6 * 4 / (4 * 15) = 0.6.
    assert cost_fit.spearman([1, 2, 3, 4], [20, 10, 40, 30]) == pytest.approx(
        0.6
    )
