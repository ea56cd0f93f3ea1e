"""Tests for benchmarks.

The slow test runs `python -m benchmarks --quick` in its own
process (it needs its own logical devices and worker processes) and checks
the table, the JSON (every figure, every result verified against numpy
before it was timed) and the PNG. The fast tests check the parts that
decide whether a number is right: the numpy check catches wrong sums and
wrong placement, and the figures follow from the samples.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from benchmarks import (
    candidates,
    records,
    steps,
    timing,
    workloads,
)

REPO = pathlib.Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESULT_FIGURES = (
    "time_seconds",
    "algbw_GBps",
    "busbw_GBps",
    "roofline_fraction",
    "ratio_to_tf_best",
)
GROUP_FIGURES = (
    "size_bytes",
    "count",
    "num_tensors",
    "roofline_seconds",
    "tf_best_seconds",
    "ours_best_seconds",
)


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
            f"--output_dir={output}",
        ],
        cwd=output,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return process, output


@pytest.mark.slow
def test_quick_run_exits_zero_and_prints_the_table(quick_run):
    process, _ = quick_run
    assert process.returncode == 0, process.stderr[-5000:]
    table = process.stdout
    assert re.search(
        r"^#\s+size\s+count\s+tensors\s+type\s+time\(ms\)\s+iqr\(ms\)\s+"
        r"algbw\s+busbw\s+roofline\s+vs TF\s+candidate$",
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
    # The progress bar went to stderr, not into the table.
    assert "step" in process.stderr


@pytest.mark.slow
def test_quick_run_json_has_every_figure_and_every_result_verified(quick_run):
    process, output = quick_run
    assert process.returncode == 0, process.stderr[-5000:]
    document = json.loads((output / "results.json").read_text())
    groups = document["groups"]
    settings = {(g["setting"], g["num_replicas"]) for g in groups}
    assert ("single_process", 4) in settings
    assert ("multi_worker", 2) in settings
    families = set()
    for group in groups:
        assert group["error"] is None
        for key in GROUP_FIGURES:
            value = group[key]
            family = {"tf_best_seconds": "tf", "ours_best_seconds": "ours"}
            if key in family and value is None:
                # Only when every step of that family was within noise of
                # its baseline (it happens on a loaded machine).
                assert all(
                    r["time_seconds"] is None
                    for r in group["results"]
                    if r["family"] == family[key]
                ), (group["workload"], key)
                continue
            assert isinstance(value, (int, float)), (group["workload"], key)
        for base in group["baselines"].values():
            assert base["error"] is None
            assert len(base["step_seconds"]["samples"]) == group["rounds"]
        for result in group["results"]:
            where = (group["workload"], group["num_replicas"], result["name"])
            # Checked against numpy before it was timed: a result that did
            # not match has no samples (prepare stops before timing).
            assert result["verified"] is True, where
            assert result["error"] is None, where
            samples = result["step_seconds"]["samples"]
            assert len(samples) == group["rounds"], where
            assert all(s > 0 for s in samples), where
            time = result["time_seconds"]
            if time is None:
                # No figure rather than a made-up one: the step was not
                # slower than its baseline.
                baseline = group["baselines"].get(result["baseline"])
                if baseline is not None:
                    assert (
                        result["step_seconds"]["median"]
                        <= baseline["step_seconds"]["median"]
                    ), where
                assert result["algbw_GBps"] is None, where
            else:
                assert math.isclose(
                    result["algbw_GBps"], group["size_bytes"] / time / 1e9
                )
                for key in RESULT_FIGURES:
                    if key == "ratio_to_tf_best" and group["tf_best"] is None:
                        continue
                    assert result[key] > 0, (where, key)
            families.add(result["family"])
            if not group["workload"].startswith("sweep_"):
                # Every result has its row (the sweep shows the best ones).
                assert result["name"].removeprefix("ours ") in process.stdout
    assert families == {"ours", "tf", "roofline", "bound"}
    assert document["targets"]
    for target in document["targets"]:
        assert {"name", "measured", "threshold", "met", "note"} <= set(target)


@pytest.mark.slow
def test_quick_run_writes_a_png(quick_run):
    process, output = quick_run
    assert process.returncode == 0, process.stderr[-5000:]
    png = (output / "time_vs_size.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    # IHDR: width and height, big-endian, after the 8-byte signature and the
    # chunk's length and type.
    width = int.from_bytes(png[16:20], "big")
    height = int.from_bytes(png[20:24], "big")
    assert width > 100 and height > 100
    assert (
        (output / "results.txt")
        .read_text()
        .startswith("# tf_crossdevice benchmark")
    )
    summary = (output / "results.md").read_text().splitlines()
    assert summary[0].startswith("| workload | setting |")
    # One row per non-sweep group: resnet50[:24], many_small[32], 2 workers.
    rows = [line for line in summary[2:] if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| resnet50[:24]",
        "| many_small[32]",
        "| resnet50[:24]",
    ]
    assert "Targets:" in summary


# ---- Fast tests: what makes a number right ---------------------------------


def _replicas(num_devices: int, shapes=((3,), (2, 5), (17,))):
    workload = workloads.Workload("test", tuple(shapes))
    devices = tf_crossdevice.testing.cpu_devices(num_devices)
    return steps.Replicas(workload, devices, seed=7), devices


@pytest.mark.parametrize("num_devices", [2, 3, 4], ids=lambda n: f"{n}dev")
def test_check_accepts_a_correct_all_reduce(num_devices):
    replicas, _ = _replicas(num_devices)
    ops = tf_crossdevice.SpecAllReduce("xring")
    pair = steps.StepPair(
        lambda: [
            list(v.values)
            for v in ops.batch_reduce(
                "sum", [(v, v) for v in replicas.values()]
            )
        ]
    )
    assert pair.verify(replicas.check) is None
    # The expected sum is numpy's, from the same seeds.
    want = sum(
        workloads.replica_data(replicas.layout, 7, "test", r)
        for r in range(num_devices)
    )
    np.testing.assert_array_equal(replicas.expected, want)


def _sum_without_last(replicas):
    def body():
        out = []
        for value in replicas.values():
            partial = tf.add_n(list(value.values[:-1]))
            per_device = []
            for device in replicas.devices:
                with tf.device(device):
                    per_device.append(tf.identity(partial))
            out.append(per_device)
        return out

    return body


def _sum_on_first_device(replicas):
    def body():
        out = []
        for value in replicas.values():
            with tf.device(replicas.devices[0]):
                total = tf.add_n(list(value.values))
            out.append([total] * len(replicas.devices))
        return out

    return body


@pytest.mark.parametrize(
    ("make_body", "message"),
    [
        pytest.param(
            _sum_without_last,
            "elements differ from numpy's sum",
            id="wrong_sum",
        ),
        pytest.param(
            _sum_on_first_device,
            "value 0 replica 1: result on",
            id="wrong_device",
        ),
    ],
)
def test_wrong_results_are_not_timed(make_body, message):
    replicas, _ = _replicas(3)
    pair = steps.StepPair(make_body(replicas))
    prepared, call = steps.prepare(
        lambda: (
            pair.timed,
            lambda: pair.verify(replicas.check),
        ),
        warmup=1,
    )
    assert prepared.verified is False
    assert message in prepared.error
    assert call is None


def test_timed_step_runs_the_reduction():
    # The sink keeps the results alive: a step that sums 4 x 32 MiB must take
    # clearly longer than the step that only cuts its inputs.
    workload = workloads.single_tensor(32 << 20)
    devices = tf_crossdevice.testing.cpu_devices(4)
    replicas = steps.Replicas(workload, devices, seed=0)
    inputs = steps.StepPair(lambda: [list(v.values) for v in replicas.values()])

    def add_n():
        with tf.device(devices[0]):
            total = tf.add_n(replicas.flats())
        return [[total]]

    summed = steps.StepPair(add_n)
    inputs.timed()
    summed.timed()
    fast = min(timing.time_calls(inputs.timed, 3) for _ in range(3))
    slow = min(timing.time_calls(summed.timed, 3) for _ in range(3))
    # Reading 128 MiB and writing 32 MiB takes milliseconds on any machine.
    assert slow > fast + 2e-3, (fast, slow)


@pytest.mark.parametrize(
    "samples",
    [[1.0], [3.0, 1.0], [5.0, 1.0, 4.0, 2.0, 3.0], [0.1] * 7 + [9.0]],
    ids=["one", "two", "five", "outlier"],
)
def test_summary_matches_numpy(samples):
    summary = timing.summarize(samples)
    assert summary.median == pytest.approx(np.median(samples))
    assert summary.q25 == pytest.approx(np.percentile(samples, 25))
    assert summary.q75 == pytest.approx(np.percentile(samples, 75))
    assert (summary.minimum, summary.maximum) == (min(samples), max(samples))


def test_group_figures_follow_from_the_samples():
    workload = workloads.single_tensor(4 << 20)

    def entry(name, family, baseline, samples, verified=True):
        return {
            "name": name,
            "family": family,
            "baseline": baseline,
            "samples": samples,
            "verified": verified,
            "error": None,
        }

    group = records.make_group_record(
        setting="single_process",
        workload=workload,
        num_replicas=4,
        entries=[
            entry("floor", "baseline", None, [0.001, 0.002, 0.001], None),
            entry("roof", "roofline", None, [0.002, 0.002, 0.003]),
            entry("tf a", "tf", "floor", [0.011, 0.009, 0.010]),
            entry("tf b", "tf", "floor", [0.021, 0.020, 0.022]),
            entry("ours", "ours", "floor", [0.005, 0.006, 0.004]),
            entry("noise", "ours", "floor", [0.001, 0.001, 0.001]),
        ],
        rounds=3,
    )
    by_name = {r["name"]: r for r in group["results"]}
    ours = by_name["ours"]
    assert ours["time_seconds"] == pytest.approx(0.004)
    assert ours["algbw_GBps"] == pytest.approx((4 << 20) / 0.004 / 1e9)
    assert ours["busbw_GBps"] == pytest.approx(ours["algbw_GBps"] * 1.5)
    assert ours["ratio_to_tf_best"] == pytest.approx(0.009 / 0.004)
    assert ours["roofline_fraction"] == pytest.approx(0.002 / 0.004)
    assert group["tf_best"] == "tf a"
    assert group["ours_best"] == "ours"
    # Not above the baseline: no time rather than a made-up one.
    assert by_name["noise"]["time_seconds"] is None
    assert by_name["noise"]["algbw_GBps"] is None


def test_workload_sizes():
    resnet = workloads.resnet50()
    assert resnet.num_tensors == 214
    assert resnet.num_elements == 25_583_592
    bert = workloads.bert_base()
    assert 190 <= bert.num_tensors <= 210
    assert 105e6 <= bert.num_elements <= 115e6
    small = workloads.many_small()
    assert small.num_tensors >= 1000
    assert max(math.prod(s) * 4 for s in small.shapes) <= 4096
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
    assert "needs tqdm," in message
    assert "pip install 'tf_crossdevice[benchmark]'" in message


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
    assert mw[5:] == [
        f"ours MultiWorkerAllReduce {spec}{p}"
        for spec in ("('pscpu/pscpu', 2, -1)", "pscpu", "xring", "rechd")
        for p in packings
    ]
