"""benchmarks.cost_fit: fitting at narrower scopes tells drift between
benchmark runs from what the model's form cannot express."""

import dataclasses
import pathlib

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
    path = REPO / "docs" / "benchmark" / "small8.json"
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
