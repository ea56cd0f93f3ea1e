"""Tests for the benchmark study (benchmarks/, not installed).

The slow test runs `python -m benchmarks --quick` from the checkout in its
own process (it needs its own logical devices and worker processes), on
smaller stand-ins than --quick's own (QUICKER: every group, family and
kind of candidate still runs, on fewer and smaller tensors and fewer
rounds, to keep the suite's time), and checks the table, the JSON read
back into records (every figure, every result verified against numpy
before it was timed) and the PNG. The fast tests check that the figures
follow from the samples, the records survive JSON, and the candidate lists
are the issue's.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import tf_crossdevice
from benchmarks import candidates, records, targets, workloads
from tf_crossdevice.compression import _codec as compression
from tf_crossdevice.tuning import _candidates, _topology, cost_model, measure

REPO = pathlib.Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# MultiWorkerAllReduce's own default spec, which the benchmark times
# besides the one-shard specs.
MULTI_WORKER_DEFAULT_SPEC = (
    inspect.signature(tf_crossdevice.MultiWorkerAllReduce)
    .parameters["all_reduce_spec"]
    .default
)
# Flags that win over --quick's: 4 ResNet-50 tensors, 4 small tensors, two
# sweep sizes (4 and 64 bytes), 3 rounds of shorter measurements, 1 s for
# each autotune search (it still times a candidate it verified).
QUICKER = [
    "--resnet50_tensors=4",
    "--many_small_count=4",
    "--sweep_max_bytes=64",
    "--sweep_step=16",
    "--rounds=3",
    "--target_seconds=0.005",
    "--autotune_budget_seconds=1",
]
ROUNDS = 3


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("benchmark")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), env.get("PYTHONPATH")) if p
    )
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            *QUICKER,
            f"--output_dir={output}",
        ],
        cwd=output,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return process, output


@pytest.mark.slow
def test_quick_run_exits_zero_and_prints_the_table(quick_run):
    process, _ = quick_run
    assert process.returncode == 0, process.stderr[-5000:]
    table = process.stdout
    assert re.search(
        r"^#\s+size\s+count\s+tensors\s+type\s+time\(ms\)\s+iqr\(ms\)\s+"
        r"algbw\s+busbw\s+roofline\s+vs TF\s+build\s+candidate$",
        table,
        flags=re.MULTILINE,
    )
    assert "# Targets" in table
    rows = [
        line
        for line in table.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert any("[ours]" in row for row in rows)
    assert any(" TF " in f" {row} " for row in rows)
    assert not any("FAILED" in row for row in rows)
    # The progress bar (one unit per group) went to stderr, not the table.
    bar = re.compile(r"\d+/\d+ \[\d\d:\d\d<")  # e.g. 4/5 [03:42<00:32
    assert bar.search(process.stderr) and not bar.search(table)


@pytest.mark.slow
def test_quick_run_json_has_every_figure_and_every_result_verified(quick_run):
    process, output = quick_run
    assert process.returncode == 0, process.stderr[-5000:]
    run = records.Run.read(output / "results.json")
    settings = {(g.setting, g.num_replicas) for g in run.groups}
    assert settings == {("single_process", 4), ("multi_worker", 2)}
    families = set()
    for group in run.groups:
        assert group.error is None and group.rounds == ROUNDS
        assert group.roofline_seconds is not None
        for family in ("tf", "ours"):
            if getattr(group, f"{family}_best") is None:
                # Only when every step of the family was within noise of
                # its baseline (it happens on a loaded machine).
                assert all(
                    r.time_seconds is None
                    for r in group.results
                    if r.family == family
                ), (group.workload, family)
        for base in group.baselines:
            assert base.timing.error is None
            assert len(base.timing.samples) == group.rounds
        medians = {r.name: r.timing.median_seconds for r in group.baselines}
        for result in group.results:
            where = (group.workload, group.num_replicas, result.name)
            # Checked against numpy before it was timed.
            assert result.timing.verified is True, where
            assert result.timing.error is None, where
            samples = result.timing.samples
            assert len(samples) == group.rounds and min(samples) > 0, where
            time = result.time_seconds
            if time is None:
                # No figure rather than a made-up one: the step was not
                # slower than its baseline.
                assert result.timing.median_seconds <= medians[result.baseline]
                assert result.algbw_gbps is None, where
            else:
                assert math.isclose(
                    result.algbw_gbps, group.size_bytes / time / 1e9
                )
                assert result.roofline_fraction > 0, where
            families.add(result.family)
            if not group.workload.startswith("sweep_"):
                # Every result has its row (the sweep shows the best ones).
                assert result.name.removeprefix("ours ") in process.stdout
    assert families == {"ours", "tf", "roofline", "bound", "autotune"}
    assert run.targets
    assert run.skipped == candidates.SKIPPED


@pytest.mark.slow
def test_quick_run_multi_worker_group_times_the_16_bit_bounds_and_autotune(
    quick_run,
):
    # The copy of the same bytes in 16 bits bounds compression,
    # and autotune searches our in-graph candidates across the workers.
    _, output = quick_run
    run = records.Run.read(output / "results.json")
    (group,) = [g for g in run.groups if g.setting == "multi_worker"]
    by_name = {r.name: r for r in group.results}
    copy16 = by_name["bound: TF gRPC copy worker 0 -> 1 in bfloat16"]
    assert copy16.family == "bound" and copy16.timing.verified is True
    # pscpu's messages in float32 and on values already bfloat16: checked
    # against numpy (exactly; within bf16's rounding), then timed.
    for name in (
        "bound: sum on worker 0 and copy back, per tensor",
        "bound: sum on worker 0 and copy back, per tensor, in bfloat16",
    ):
        bound = by_name[name]
        assert bound.family == "bound" and bound.timing.verified is True
        assert bound.timing.samples
    (chosen,) = [r for r in group.results if r.family == "autotune"]
    assert chosen.timing.verified is True
    # Named as the benchmark names the same candidate, or by autotune's
    # label where the benchmark has none with its arguments.
    assert chosen.timing.chosen.startswith(
        ("ours MultiWorkerAllReduce ", "MultiWorkerAllReduce ")
    )
    assert chosen.timing.search_seconds > 0
    # Its steps: a line per candidate it had, then its own clock.
    *steps, clock = chosen.timing.search
    assert steps and all(": " in line for line in steps)
    assert any(" s, median " in line for line in steps)
    assert clock.startswith("its own clock: ")


@pytest.mark.slow
def test_quick_run_writes_a_png_and_the_summary(quick_run):
    process, output = quick_run
    assert process.returncode == 0, process.stderr[-5000:]
    png = (output / "time_vs_size.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    # IHDR: width and height, big-endian, after the signature and the
    # chunk's length and type.
    assert int.from_bytes(png[16:20], "big") > 100
    assert int.from_bytes(png[20:24], "big") > 100
    text = (output / "results.txt").read_text()
    assert text.startswith("# tf_crossdevice benchmark")
    summary = (output / "results.md").read_text().splitlines()
    assert summary[0].startswith("| workload | setting |")
    # One row per non-sweep group: resnet50[:4], many_small[4], 2 workers.
    rows = [line for line in summary[2:] if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| resnet50[:4]",
        "| many_small[4]",
        "| resnet50[:4]",
    ]
    assert "Targets:" in summary


# ---- Fast tests ----------------------------------------------------------


def _group():
    group = records.Group.of(
        "single_process", workloads.single_tensor(4 << 20), 4
    )
    entry = records.entry_of
    records.add_results(
        group,
        [
            entry("floor", "baseline", None, [0.001, 0.002, 0.001]),
            entry("roof", "roofline", None, [0.002, 0.002, 0.003]),
            entry("tf a", "tf", "floor", [0.011, 0.009, 0.010]),
            entry("tf b", "tf", "floor", [0.021, 0.020, 0.022]),
            entry("ours", "ours", "floor", [0.005, 0.006, 0.004]),
            entry("noise", "ours", "floor", [0.001, 0.001, 0.001]),
        ],
    )
    return group


def test_group_figures_follow_from_the_samples():
    group = _group()
    by_name = {r.name: r for r in group.results}
    ours = by_name["ours"]
    assert ours.time_seconds == pytest.approx(0.004)
    assert ours.algbw_gbps == pytest.approx((4 << 20) / 0.004 / 1e9)
    assert ours.busbw_gbps == pytest.approx(ours.algbw_gbps * 1.5)
    assert ours.ratio_to_tf_best == pytest.approx(0.009 / 0.004)
    assert ours.roofline_fraction == pytest.approx(0.002 / 0.004)
    assert (group.tf_best, group.ours_best) == ("tf a", "ours")
    # Not above the baseline: no time rather than a made-up one.
    assert by_name["noise"].time_seconds is None
    assert by_name["noise"].algbw_gbps is None


def test_confirmation_rounds_decide_the_targets_figures():
    group = _group()
    names = records.finalists(group, ["tf b", "missing"])
    assert names == ["ours", "tf a", "roof", "tf b", "floor"]
    samples = {
        "ours": [0.003],
        "tf a": [0.013],
        "roof": [0.002],
        "tf b": [0.021],
        "floor": [0.001],
    }
    records.add_confirmation(group, samples)
    assert group.time("ours") == pytest.approx(0.002)
    assert group.time("tf a") == pytest.approx(0.012)
    group.workload = "resnet50"
    (vs_tf, vs_roofline) = targets.evaluate([group])
    assert vs_tf.measured == pytest.approx(6.0) and vs_tf.met
    assert vs_roofline.measured == pytest.approx(1.0) and vs_roofline.met


def test_autotune_targets_compare_its_choice_and_its_search_time():
    """Within 10% of the fastest of the same run, and within the budget."""
    group = records.Group("single_process", "w", "", 4, 1, 8, 2, "float32")
    entry = records.entry_of
    results = [
        entry("base", "baseline", None, [0.001] * 3),
        entry("roof", "roofline", None, [0.002] * 3),
        entry("tf", "tf", "base", [0.006] * 3),
        entry("ours", "ours", "base", [0.005] * 3),
        entry("autotune (2 s budget)", "autotune", "base", [0.0054] * 3),
    ]
    prepared = measure.Prepared(True, None, 0.0, 1.0, 2.5, "pscpu")
    timing = results[-1].timing
    results[-1].timing = measure.Timing.of(
        timing.name, prepared, 1, timing.samples
    )
    records.add_results(group, results)
    assert group.ours_best == "ours"  # autotune is a family of its own
    assert "autotune (2 s budget)" in targets.references(group)
    vs_ours, vs_fastest, budget = targets.evaluate([group])
    assert vs_ours.measured == pytest.approx(0.004 / 0.0044) and vs_ours.met
    assert vs_fastest.measured == vs_ours.measured
    assert "autotune chose pscpu" in vs_ours.note
    assert budget.measured == pytest.approx(2 / 2.5) and not budget.met
    assert "searched 2.5 s of a 2 s budget" in budget.note


AUTOTUNE_ENTRY = "autotune (2 s budget)"


@pytest.mark.parametrize("setting", ["single_process", "multi_worker"])
@pytest.mark.parametrize("chosen", ["pscpu bf16", "xring", "x"])
def test_autotune_is_judged_by_its_own_time_against_the_fastest(
    setting, chosen
):
    """autotune's own time / the fastest candidate's, both timed in the
    same run, whatever it chose and in every setting: choosing the fastest
    candidate (pscpu bf16, 4 ms net) while its own entry takes 5.2 ms is
    5.2 / 4 = 1.3 > 1.1, the target NOT met."""
    group = _autotune_group(setting, chosen=chosen)
    vs_ours, vs_fastest, _ = targets.evaluate([group])
    assert group.ours_best == "ours pscpu bf16"
    assert group.time(AUTOTUNE_ENTRY) == pytest.approx(0.0052)
    for target in (vs_ours, vs_fastest):
        assert target.measured == pytest.approx(0.004 / 0.0052)
        assert 1 / target.measured == pytest.approx(1.3)
        assert not target.met
        assert target.name.endswith("/ autotune's own time")
        assert f"autotune chose {chosen} (5.200 ms, its own entry)" in (
            target.note
        )


def test_autotune_slower_than_the_candidate_it_chose_misses_the_target():
    """Across workers autotune chose the fastest candidate: the old rule
    scored that candidate's time, 1.00 by construction; its own entry is
    30% slower, and that is what counts."""
    group = _autotune_group("multi_worker", chosen="pscpu bf16")
    assert "ours pscpu bf16" in targets.references(group)  # for the note
    vs_ours, vs_fastest, _ = targets.evaluate([group])
    assert group.time("ours pscpu bf16") < group.time(AUTOTUNE_ENTRY)
    assert vs_ours.measured != pytest.approx(1.0)
    assert vs_fastest.measured == pytest.approx(0.004 / 0.0052)
    assert not vs_ours.met and not vs_fastest.met
    assert "that candidate, ours pscpu bf16, 4.000 ms" in vs_ours.note


@pytest.mark.parametrize("setting", ["single_process", "multi_worker"])
def test_autotune_within_10_percent_by_its_own_confirmed_time(setting):
    """The figures are the confirmation rounds': autotune's own entry
    re-timed at 4.3 ms against the fastest's 4 ms (4.3 / 4 <= 1.1) meets
    the target; re-timed at 3.9 ms it beats the fastest (above 1.00)."""
    group = _autotune_group(setting, own=0.0053)
    vs_ours, vs_fastest, _ = targets.evaluate([group])
    assert vs_fastest.measured == pytest.approx(0.004 / 0.0043)
    assert vs_ours.met and vs_fastest.met
    records.add_confirmation(
        group,
        {
            AUTOTUNE_ENTRY: [0.0049],
            "ours pscpu bf16": [0.005],
            "tf": [0.010],
            "base": [0.001],
        },
    )
    vs_ours, vs_fastest, _ = targets.evaluate([group])
    assert vs_fastest.measured == pytest.approx(0.004 / 0.0039)
    assert vs_fastest.measured > 1 and vs_fastest.met


def _autotune_group(setting, ok=True, chosen="pscpu bf16", own=0.0062):
    group = records.Group(setting, "w", "", 2, 1, 8, 2, "float32")
    entry = records.entry_of
    results = [
        entry("base", "baseline", None, [0.001] * 3),
        entry("roof", "roofline", None, [0.002] * 3),
        entry("tf", "tf", "base", [0.010] * 3),
        entry("ours pscpu bf16", "ours", "base", [0.005] * 3),
        entry("ours xring", "ours", "base", [0.0055] * 3),
        entry(AUTOTUNE_ENTRY, "autotune", "base", [own] * 3),
    ]
    error = None if ok else "3 of 8 elements differ from numpy"
    prepared = measure.Prepared(ok, error, 0.0, 1.0, 1.5, chosen)
    results[-1].timing = measure.Timing.of(
        results[-1].name, prepared, 1, results[-1].timing.samples if ok else ()
    )
    records.add_results(group, results)
    return group


def test_a_failed_autotune_entry_never_meets_its_target():
    group = _autotune_group("multi_worker", ok=False)
    assert "ours pscpu bf16" not in targets.references(group)
    vs_ours, vs_fastest = targets.evaluate([group])[:2]
    assert vs_ours.measured is None and not vs_ours.met
    assert vs_fastest.measured is None and not vs_fastest.met


def test_in_one_process_autotune_confirms_no_chosen_candidate():
    group = _autotune_group("single_process")
    assert "ours pscpu bf16" not in targets.references(group)
    vs_ours = targets.evaluate([group])[0]
    assert vs_ours.measured == pytest.approx(0.004 / 0.0052)
    assert "that candidate" not in vs_ours.note


def _compression_group(workers):
    """A resnet50 group across `workers` workers with every entry the
    targets compare (times in ms: the samples, all above a 1 ms baseline)."""
    group = records.Group(
        "multi_worker", "resnet50", "", workers, 214, 8, 2, "float32"
    )
    ms = [
        ("base", "baseline", None, 1),
        ("idle", "baseline", None, 1),
        ("roofline: TCP loopback", "roofline", None, 21),
        ("roofline: TF gRPC copy worker 0 -> 1", "roofline", "idle", 41),
        ("bound: TF gRPC copy worker 0 -> 1 in bfloat16", "bound", "idle", 21),
        (
            "bound: sum on worker 0 and copy back, per tensor",
            "bound",
            "base",
            73,
        ),
        (
            "bound: sum on worker 0 and copy back, per tensor, in bfloat16",
            "bound",
            "base",
            49,
        ),
        ("TF MWMS default", "tf", None, 291),
        ("TF MWMS RING bytes_per_pack=4MiB", "tf", None, 157),
        ("TF ReductionToOneDevice (in-graph)", "tf", "base", 81),
        ("ours HierarchicalCollectiveAllReduce", "ours", None, 279),
        ("ours CollectiveAllReduce", "ours", None, 155),
        ("ours MultiWorkerAllReduce pscpu", "ours", "base", 71),
        (
            "ours MultiWorkerAllReduce pscpu compression=bf16",
            "ours",
            "base",
            49,
        ),
        ("ours MultiWorkerAllReduce xring", "ours", "base", 99),
        ("autotune (60 s budget)", "autotune", "base", 51),
    ]
    results = [
        records.entry_of(name, family, base, [t / 1e3] * 3)
        for name, family, base, t in ms
    ]
    prepared = measure.Prepared(
        True, None, 0.0, 1.0, 50.0, "MultiWorkerAllReduce xring"
    )
    results[-1].timing = measure.Timing.of(
        results[-1].name, prepared, 1, results[-1].timing.samples
    )
    factor = 2 * (workers - 1) / workers
    records.add_results(group, results, lambda t: t * factor)
    return group


@pytest.mark.parametrize("workers", [2, 3])
def test_every_entry_the_multi_worker_targets_compare_is_confirmed(workers):
    group = _compression_group(workers)
    wanted = targets.references(group)
    names = records.finalists(group, wanted)
    for name in wanted:
        if name in {r.name for r in group.results}:
            assert name in names, name
    assert "ours MultiWorkerAllReduce xring" in names  # autotune's choice


@pytest.mark.parametrize("workers", [2, 3])
def test_compression_target_quotes_both_bounds_like_for_like(workers):
    (target,) = [
        t
        for t in targets.evaluate([_compression_group(workers)])
        if "bf16 vs the same uncompressed" in t.name
    ]
    assert target.measured == pytest.approx(70 / 48) and not target.met
    # The float32 copy is a roofline scaled to a ring's bytes per worker
    # (x 4/3 at 3 workers); the note compares one copy with one copy.
    assert "40.000 ms in float32, 20.000 ms in bfloat16 (2.00x)" in target.note
    assert "72.000 ms in float32, 48.000 ms in bfloat16 (1.50x)" in target.note


@pytest.mark.parametrize("workers", [2, 3])
def test_multi_worker_resnet50_target_counts_at_every_worker_count(workers):
    """ours best vs MWMS default is scored at 2 and 3 workers, not only
    where a group happens to have 4 replicas (the single-process rule)."""
    group = _compression_group(workers)
    by_name = {t.name: t for t in targets.evaluate([group])}
    name = (
        f"resnet50, {workers} worker processes (one CPU replica each): "
        "ours best vs MWMS default"
    )
    assert name in by_name, sorted(by_name)
    target = by_name[name]
    # TF MWMS default 291 ms (no baseline); ours best, the bf16 candidate,
    # 49 ms minus its 1 ms baseline.
    assert group.ours_best == "ours MultiWorkerAllReduce pscpu compression=bf16"
    assert target.measured == pytest.approx(0.291 / 0.048)
    assert target.threshold == 1.5 and target.met and not target.stand_in


@pytest.mark.parametrize("devices", [2, 8])
def test_single_process_resnet50_targets_count_at_4_devices_only(devices):
    def resnet_targets(n):
        group = _group()
        group.workload, group.num_replicas = "resnet50", n
        return [t for t in targets.evaluate([group]) if "ours best" in t.name]

    assert len(resnet_targets(4)) == 2
    assert resnet_targets(devices) == []


def _arguments(kwargs):
    """kwargs as the constructor sees them: num_packs=0 is the default,
    and a spec read back from JSON is a list."""
    return tuple(
        sorted(
            (k, tuple(v) if isinstance(v, list) else v)
            for k, v in kwargs.items()
            if (k, v) != ("num_packs", 0)
        )
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_autotune_choices_get_the_benchmark_candidates_names(workers):
    """The session names autotune's choice with `candidates.name_of`: it
    must give the name of the candidate built with the same arguments."""
    workload = workloads.resnet50()
    gradients = [(shape, "float32") for shape in workload.shapes]
    if workers == 1:
        devices = [
            f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)
        ]
        listed = candidates.single_process_candidates(workload)
    else:
        devices = [
            f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in range(2)
        ]
        listed = candidates.multi_worker_candidates(workload)
    classes = {
        "ours_spec": "SpecAllReduce",
        "ours_multi_worker": "MultiWorkerAllReduce",
    }
    by_arguments = {
        (classes[c.kind], _arguments(c.kwargs)): c.name
        for c in listed
        if c.kind in classes
    }
    topology = _topology.Topology.of(devices)
    matched = []
    for config in _candidates.timed_candidates(topology, gradients):
        spec = config[1].get("all_reduce_spec")
        key = (config[0], _arguments(config[1]))
        # The benchmark times every one-shard spec and the class's default.
        if _benchmark_times(spec):
            assert key in by_arguments, config
        if key in by_arguments:
            assert candidates.name_of(config) == by_arguments[key], config
            matched.append(by_arguments[key])
    assert len(matched) >= 4
    # Two-level tuple specs among them (autotune labels them pscpu/pscpu#2).
    two_level = [n for n in matched if "('pscpu/pscpu', 2, -1)" in n]
    assert bool(two_level) == (workers == 2)


def test_records_survive_json(tmp_path):
    run = records.Run({"command": "x"}, candidates.SKIPPED, [_group()], [])
    run.targets = targets.evaluate(run.groups)
    run.write(tmp_path / "results.json")
    assert records.Run.read(tmp_path / "results.json") == run


def test_records_read_the_first_format():
    # benchmarks/records/small8.json predates records.Run: flat results,
    # baselines by name, confirmation times under "times".
    path = REPO / "benchmarks" / "records" / "small8.json"
    raw = json.loads(path.read_text())["groups"][0]
    (group,) = records.Run.read(path).groups
    assert [r.name for r in group.results] == [
        r["name"] for r in raw["results"]
    ]
    assert [b.name for b in group.baselines] == list(raw["baselines"])
    for r, old in zip(group.results, raw["results"], strict=True):
        assert r.timing.samples == tuple(old["step_seconds"]["samples"])
        assert r.ok == (old["error"] is None and old["verified"] is not False)
        want = raw["confirmed"]["times"].get(old["name"], old["time_seconds"])
        assert group.time(r.name) == (want if r.ok else None)


def test_workload_sizes():
    resnet = workloads.resnet50()
    assert resnet.num_tensors == 214
    assert resnet.num_elements == 25_583_592
    bert = workloads.bert_base()
    assert (bert.num_tensors, round(bert.num_elements / 1e6, 1)) == (199, 109.5)
    small = workloads.many_small()
    assert small.num_tensors == 1000
    assert max(math.prod(s) * 4 for s in small.shapes) == 4096
    sizes = workloads.sweep_sizes()
    assert sizes[0] == 4 and sizes[-1] == 256 << 20 and len(sizes) == 27


def test_candidate_filter_keeps_tf_references_and_names_a_bad_pattern():
    group = candidates.single_process_candidates(workloads.many_small(8))
    tf_names = [c.name for c in group if c.family == "tf"]
    kept = [c.name for c in candidates.select(group, "xring$,^ours Red")]
    assert kept == tf_names + [
        "ours ReductionToOneDevice",
        "ours SpecAllReduce xring",
    ]
    assert candidates.select(group, "") == group
    with pytest.raises(ValueError, match=r"--candidates: '\(pscpu' is not"):
        candidates.select(group, "(pscpu")


def test_missing_extras_say_what_to_install(monkeypatch):
    from benchmarks import __main__ as cli

    real = cli.importlib.util.find_spec

    def without_tqdm(name, *args):
        return None if name == "tqdm" else real(name, *args)

    monkeypatch.setattr(cli.importlib.util, "find_spec", without_tqdm)
    message = cli.missing_extras()
    assert message is not None
    assert "needs tqdm:" in message
    assert "pip install -e '.[benchmark]'" in message


def test_the_library_does_not_import_the_study():
    package = REPO / "tf_crossdevice"
    for path in package.rglob("*.py"):
        assert "benchmarks" not in re.findall(
            r"^\s*(?:from|import)\s+(\w+)", path.read_text(), re.MULTILINE
        ), path


def test_full_run_candidates_cover_the_issue_list():
    # The issue's list: every algorithm and packing setting of ours that
    # applies, TF's ReductionToOneDevice, HierarchicalCopy(1 and 4) and
    # MirroredStrategy's default; across workers MWMS's collective
    # all-reduce (default options, RING, bytes_per_pack settings).
    packings = ["", " num_packs=1", " num_packs=4", " agg_small=64KiBx1024"]
    tf_single = [
        "TF ReductionToOneDevice",
        "TF HierarchicalCopy num_packs=1",
        "TF HierarchicalCopy num_packs=4",
        "TF MirroredStrategy default",
    ]
    names = [
        c.name
        for c in candidates.single_process_candidates(workloads.many_small())
    ]
    assert names == tf_single + [
        "ours ReductionToOneDevice",
        "ours HierarchicalCopy num_packs=0",
        *(f"ours HierarchicalCopy{p}" for p in packings[1:]),
        *(
            f"ours SpecAllReduce {spec}{p}"
            for spec in ("pscpu", "psgpu", "xring", "rechd")
            for p in packings
        ),
    ]
    # One tensor: concatenating or aggregating it would change nothing.
    one = [
        c.name
        for c in candidates.single_process_candidates(
            workloads.single_tensor(1024)
        )
    ]
    assert not [n for n in one if "num_packs=1" in n and n.startswith("ours")]
    assert not [n for n in one if "agg_small" in n]
    mw = [
        c.name
        for c in candidates.multi_worker_candidates(workloads.many_small())
    ]
    assert mw[:4] == [
        "TF MWMS default",
        "TF MWMS RING",
        "TF MWMS RING bytes_per_pack=4MiB",
        "TF MWMS RING bytes_per_pack=32MiB",
    ]
    # Each setting uncompressed, then with bf16, then with fp16; then
    # PowerSGD at rank 4 with the default spec in one pack.
    assert mw[5:] == [
        f"ours MultiWorkerAllReduce {spec}{p}{codec}"
        for codec in ("", " compression=bf16", " compression=fp16")
        for spec in ("('pscpu/pscpu', 2, -1)", "pscpu", "xring", "rechd")
        for p in packings
    ] + [
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) num_packs=1 "
        "compression=powersgd rank=4"
    ]
    # Our collectives in our strategy: default packing, 4 MiB packs, and
    # the default packing with each codec; the flat one with PowerSGD too.
    powersgd = " compression=powersgd rank=4"
    assert [c.name for c in candidates.strategy_candidates()] == [
        f"ours {ops}{setting}"
        for ops in ("CollectiveAllReduce", "HierarchicalCollectiveAllReduce")
        for setting in (
            "",
            " bytes_per_pack=4MiB",
            " compression=bf16",
            " compression=fp16",
            *([powersgd] if ops == "CollectiveAllReduce" else []),
        )
    ]


def _benchmark_times(spec):
    """Whether the benchmark times configurations with this spec: one
    algorithm at one shard, or MultiWorkerAllReduce's default."""
    one_shard = isinstance(spec, str) and "#" not in spec
    return one_shard or spec == MULTI_WORKER_DEFAULT_SPEC


def test_our_candidates_come_from_the_package_list():
    # Ours are cost_model.candidates' one-shard and default-spec entries
    # (with compression across workers), nothing else.
    def grid_names(num_workers):
        return {
            candidates.name_of(config)
            for config in cost_model.candidates(num_workers, 1)
            if _benchmark_times(config[1].get("all_reduce_spec"))
        }

    single = [
        c.name
        for c in candidates.single_process_candidates(workloads.many_small())
        if c.kind == "ours_spec"
    ]
    assert set(single) == grid_names(1)
    mw = [
        c.name
        for c in candidates.multi_worker_candidates(workloads.many_small())
        if c.family == "ours"
    ]
    plain = {n for n in mw if "compression=" not in n}
    assert plain == grid_names(2)
    # Uncompressed, bf16, fp16, and one PowerSGD (not in the package's
    # list: it changes the training, so autotune never chooses it).
    assert len(mw) == 3 * len(plain) + 1
    # Above 2 workers, also the list's pscpu with one shard per worker.
    at_3 = {
        c.name
        for c in candidates.multi_worker_candidates(
            workloads.many_small(), num_workers=3
        )
        if c.family == "ours" and "compression=" not in c.name
    }
    assert at_3 - plain == {"ours MultiWorkerAllReduce ('pscpu', 3, -1)"}
    per_worker = ("pscpu", 3, -1)
    assert ("MultiWorkerAllReduce", {"all_reduce_spec": per_worker}) in (
        cost_model.candidates(3, 1)
    )
    hierarchical = [
        c
        for c in candidates.single_process_candidates(workloads.many_small())
        if c.kind == "ours_all_reduce"
    ]
    assert [c.name for c in hierarchical] == [
        "ours HierarchicalCopy num_packs=0",
        "ours HierarchicalCopy num_packs=1",
        "ours HierarchicalCopy num_packs=4",
        "ours HierarchicalCopy agg_small=64KiBx1024",
    ]
    # Built as AllReduceCrossDeviceOps with the list's arguments (that class
    # covers HierarchicalCopyAllReduce's and aggregation).
    assert [c.kwargs for c in hierarchical] == [
        {"all_reduce_alg": "hierarchical_copy", **kwargs}
        for name, kwargs in cost_model.candidates(1, 1)
        if name in ("HierarchicalCopyAllReduce", "AllReduceCrossDeviceOps")
    ]


def test_compressed_candidates_are_checked_within_the_codecs_rounding():
    from benchmarks import sessions

    # README "Wire compression": a value rounded at most k times errs by
    # ((1+u)**k - 1) * sum|x_i|; u = 2**-8 for bf16; at p = 3 workers k is
    # 2 (pscpu, psgpu, pscpu/pscpu), 3 (hierarchical_copy), p + 1 (xring),
    # ceil(log2 p) + 2 (rechd), 1 (collectives).
    p, u = 3, 2.0**-8
    k = max(1, 2, 3, p + 1, math.ceil(math.log2(p)) + 2)
    bound = (1 + u) ** k - 1
    bf16 = candidates.Candidate(
        "ours MultiWorkerAllReduce xring compression=bf16",
        "ours",
        "ours_multi_worker",
        {"all_reduce_spec": "xring", "compression": "bf16"},
    )
    plain = candidates.Candidate(
        "ours MultiWorkerAllReduce xring",
        "ours",
        "ours_multi_worker",
        {"all_reduce_spec": "xring"},
    )
    assert compression.sum_tolerance("bf16", p) >= bound
    # Replica 0 of 3 here; the check compares with numpy's sum of all 3.
    inputs = measure.Inputs([((64,), "float32")], ["/cpu:0"], 0, 0, p)
    (expected,), (magnitude,) = inputs.expected, inputs.magnitudes
    devices = [[inputs.devices[0]]]
    rounded = (expected + bound * magnitude).astype(np.float32)
    assert np.count_nonzero(rounded != expected) > 32
    assert sessions.check_of(bf16, inputs, p)([[rounded]], devices) is None
    assert "differ from numpy" in sessions.check_of(plain, inputs, p)(
        [[rounded]], devices
    )
    assert sessions.check_of(plain, inputs, p)([[expected]], devices) is None
    beyond = (expected + 0.1 * magnitude).astype(np.float32)
    assert "more than the tolerance" in sessions.check_of(bf16, inputs, p)(
        [[beyond]], devices
    )
