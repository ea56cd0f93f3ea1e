"""Fits `tf_crossdevice.cost_model` to the benchmark records and reports.

    python -m benchmarks.cost_fit docs/benchmark/*.json \\
        --output docs/benchmark/cost_model.md

Every verified candidate of every group becomes a measurement: its config
(from `benchmarks.candidates`, matched by name), the group's workload's
gradients, its devices and workers, and its net median time (the
confirmation rounds' where it was re-timed). The report has the fitted
constants, predicted against measured times per candidate and group, a
leave-one-group-out check, and the recommended configurations for large
clusters.

>>> config_of(Candidate("x", "tf", "mwms", {"bytes_per_pack": 4}), 2)
(('tf.MultiWorkerMirroredStrategy', {'implementation': 'RING', 'options': {'bytes_per_pack': 4}}), 1)
"""  # noqa: E501

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import candidates as candidates_lib
from benchmarks import records
from benchmarks import workloads as workloads_lib
from benchmarks.candidates import Candidate
from tf_crossdevice.tuning import cost_model

# Within 25% of the measured time: close enough to rank the candidates.
TOLERANCE = 0.25


def workload_named(name: str) -> workloads_lib.Workload:
    """The workload a group names (`many_small[10][:3]` style included)."""
    truncated = re.fullmatch(r"(.*)\[:(\d+)\]", name)
    if truncated:
        return workload_named(truncated.group(1)).truncated(
            int(truncated.group(2))
        )
    if name == "bert_base":
        return workloads_lib.bert_base()
    if name == "resnet50":
        return workloads_lib.resnet50()
    small = re.fullmatch(r"many_small(?:\[(\d+)\])?", name)
    if small:
        return workloads_lib.many_small(int(small.group(1) or 1000))
    sweep = re.fullmatch(r"sweep_(\d+)B", name)
    if sweep:
        return workloads_lib.single_tensor(int(sweep.group(1)))
    raise ValueError(f"workload: unknown workload {name!r}")


def gradients_of(workload: workloads_lib.Workload) -> list[tuple[Any, str]]:
    return [(shape, workload.dtype) for shape in workload.shapes]


def config_of(
    candidate: Candidate, devices_per_worker: int
) -> tuple[cost_model.Config, int]:
    """The cost model's config for a candidate, and the replicas per
    worker it really runs (TF's MWMS keeps one CPU per worker)."""
    kind, kwargs = candidate.kind, dict(candidate.kwargs)
    if isinstance(kwargs.get("all_reduce_spec"), list):
        kwargs["all_reduce_spec"] = tuple(kwargs["all_reduce_spec"])
    simple = {
        "tf_r1d": "tf.ReductionToOneDevice",
        "tf_hc": "tf.HierarchicalCopyAllReduce",
        "ours_r1d": "ReductionToOneDevice",
        "ours_all_reduce": "AllReduceCrossDeviceOps",
        "ours_spec": "SpecAllReduce",
        "ours_multi_worker": "MultiWorkerAllReduce",
    }
    if kind in simple:
        return (simple[kind], kwargs), devices_per_worker
    if kind == "tf_mirrored_default":  # a RING collective, one pack
        return ("tf.MultiWorkerMirroredStrategy", {}), devices_per_worker
    if kind == "mwms":
        options = {"bytes_per_pack": kwargs.get("bytes_per_pack", 0)}
        implementation = kwargs.get("implementation", "RING")
        config = {"implementation": implementation, "options": options}
        return ("tf.MultiWorkerMirroredStrategy", config), 1
    if kind == "ours_mwms":
        options = {"bytes_per_pack": kwargs["bytes_per_pack"]}
        config = {"options": options}
        if kwargs.get("compression"):
            config["compression"] = kwargs["compression"]
        return (kwargs["cross_device_ops"], config), devices_per_worker
    raise ValueError(f"candidate.kind: unknown kind {kind!r}")


@dataclasses.dataclass
class Row:
    """One candidate of one group, measured and (later) predicted."""

    group: str
    candidate: str
    measurement: cost_model.Measurement
    predicted: float = 0.0
    record: str = ""  # the benchmark record (one run) it comes from

    @property
    def ratio(self) -> float:
        return self.predicted / self.measurement.seconds


def read_groups(
    path: pathlib.Path,
) -> list[tuple[str, records.Group, list[tuple[str, float]]]]:
    """The timed groups of a results JSON (`records.Run.read`): each with
    its label and (name, net seconds) of its verified, timed results (the
    confirmation rounds' time where it was re-timed)."""
    out = []
    for g in records.Run.read(path).groups:
        if g.error or g.skipped:
            continue
        results = []
        for r in g.results:
            seconds = g.time(r.name) if r.ok else None
            if seconds:
                results.append((r.name, seconds))
        if g.setting == "single_process":
            scope = f"{g.num_replicas} devices"
        else:
            scope = f"{g.num_replicas} workers x {g.local_devices}"
        out.append((f"{path.stem}: {g.workload}, {scope}", g, results))
    return out


def read_rows(paths: Sequence[pathlib.Path]) -> list[Row]:
    """Every verified, timed candidate of every group of `paths` (bounds,
    rooflines and baselines are not all-reduces, so they are left out)."""
    rows = []
    for path in paths:
        for label, g, results in read_groups(path):
            workload = workload_named(g.workload)
            known = {
                c.name: c
                for c in candidates_lib.single_process_candidates(workload)
                + candidates_lib.multi_worker_candidates(workload)
                + candidates_lib.strategy_candidates()
            }
            single = g.setting == "single_process"
            workers = 1 if single else g.num_replicas
            local = g.num_replicas if single else g.local_devices
            for name, seconds in results:
                candidate = known.get(name)
                if candidate is None:
                    continue
                config, k = config_of(candidate, local)
                m = cost_model.Measurement(
                    config, gradients_of(workload), k, workers, seconds
                )
                rows.append(Row(label, name, m, record=path.stem))
    return rows


def predict_rows(rows: Sequence[Row], constants: cost_model.Constants) -> None:
    for row in rows:
        m = row.measurement
        row.predicted = cost_model.predict(
            m.config,
            m.gradients,
            devices_per_worker=m.devices_per_worker,
            num_workers=m.num_workers,
            constants=constants,
        )


def _within(row: Row) -> bool:
    return abs(row.ratio - 1) <= TOLERANCE


def _groups(rows: Sequence[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(row.group, []).append(row)
    return out


def leave_one_group_out(rows: Sequence[Row]) -> dict[str, list[float]]:
    """Per group, the ratios predicted/measured when fitted without it."""
    out = {}
    for name, held_out in _groups(rows).items():
        rest = [r.measurement for r in rows if r.group != name]
        constants = cost_model.fit(rest)
        copies = [dataclasses.replace(r) for r in held_out]
        predict_rows(copies, constants)
        out[name] = [r.ratio for r in copies]
    return out


# Which rows share one set of constants, from the shipped model (one set
# for every record) down to one set per group: the gaps between the rows
# of the report's table tell the machine's drift between benchmark runs
# from what the model's form cannot express.
SCOPES: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("each record (one benchmark run) alone", lambda r: r.record),
    ("each group alone", lambda r: r.group),
)


def fitted_by(rows: Sequence[Row], key: Callable[[Row], str]) -> list[Row]:
    """Copies of `rows`, each predicted by constants fitted only to the
    rows with the same `key(row)`."""
    parts: dict[str, list[Row]] = {}
    for row in rows:
        parts.setdefault(key(row), []).append(dataclasses.replace(row))
    out = []
    for part in parts.values():
        predict_rows(part, cost_model.fit([r.measurement for r in part]))
        out += part
    return out


def scope_summary(rows: Sequence[Row]) -> tuple[int, int, int, int]:
    """(groups with every candidate within TOLERANCE, groups whose median
    error is within it, candidates within it, groups)."""
    groups = _groups(rows).values()
    every = sum(all(map(_within, g)) for g in groups)
    median = sum(
        statistics.median(abs(r.ratio - 1) for r in g) <= TOLERANCE
        for g in groups
    )
    return every, median, sum(map(_within, rows)), len(groups)


RECOMMEND_WORKERS = (64, 256, 1024)
RECOMMEND_DEVICES = (1, 8)


def recommendations(
    constants: cost_model.Constants,
) -> list[tuple[str, int, int, cost_model.Config, float]]:
    out = []
    for workload in (
        workloads_lib.resnet50(),
        workloads_lib.bert_base(),
        workloads_lib.many_small(),
    ):
        grads = gradients_of(workload)
        for workers in RECOMMEND_WORKERS:
            for k in RECOMMEND_DEVICES:
                config, seconds = cost_model.recommend(
                    grads,
                    num_workers=workers,
                    devices_per_worker=k,
                    constants=constants,
                )
                out.append((workload.name, workers, k, config, seconds))
    return out


def repeats(rows: Sequence[Row]) -> list[tuple[str, str, str, float]]:
    """Pairs of rows that measured the same thing in different groups
    (same config, workload, devices and workers): the records' own noise,
    a floor under any model's error. (candidate, group a, group b, a / b)
    """
    seen: dict[str, Row] = {}
    out = []
    for row in rows:
        m = row.measurement
        key = repr((m.config, m.gradients, m.devices_per_worker, m.num_workers))
        if key in seen and seen[key].group != row.group:
            first = seen[key]
            ratio = first.measurement.seconds / m.seconds
            out.append((row.candidate, first.group, row.group, ratio))
        seen.setdefault(key, row)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def _config_text(config: cost_model.Config) -> str:
    kwargs = ", ".join(f"{k}={v!r}" for k, v in config[1].items())
    return f"`{config[0]}({kwargs})`"


def report(
    rows: Sequence[Row],
    constants: cost_model.Constants,
    held_out: dict[str, list[float]],
    recommended: Sequence[tuple[str, int, int, cost_model.Config, float]],
    command: str,
    scopes: Sequence[tuple[str, tuple[int, int, int, int]]] = (),
) -> str:
    lines = [
        "# Cost model: fitted constants and predicted vs measured times",
        "",
        f"Written by `{command}`",
        "(`tf_crossdevice.cost_model`, counts in",
        "`tf_crossdevice/tuning/_traffic.py`). Measured: each",
        "candidate's net median step time in the benchmark records",
        "(confirmation rounds where it was re-timed).",
        "",
        "## The model, and what it leaves out",
        "",
        "Per worker process: alpha per message and beta per byte on each",
        "link (memory: logical devices of one process; network: between",
        "workers), gamma per byte summed or copied (packing's and",
        "flattening's concatenations and pads), delta per graph op, a launch",
        "cost per collective across workers and a fixed cost per step.",
        "Counts follow the builders (Thakur-Rabenseifner-Gropp: ring",
        "`2(p-1)` messages, halving-doubling `2 log2 p` plus one fold",
        "message each way when p is not a power of two, shuffle a gather",
        "and a broadcast on the shard owners, two-level = inner + outer +",
        "copies back; packing sets how many all-reduces run and how big).",
        "A worker's devices share its CPU thread pool, so their costs add;",
        "workers run in parallel, so a step costs the busiest worker's",
        "time. Not modelled: link contention (the model makes recursive",
        "halving-doubling never slower than a ring at a power of two),",
        "overlap of independent packs, and core counts. Compression",
        "(bf16/fp16) halves the wire bytes and prices each cast like a",
        "sum; a compressed collective is one all-gather of the 16-bit",
        "messages (groups of 2-3 only).",
        "",
        "## Constants (non-negative least squares on relative errors)",
        "",
        "| constant | value | meaning |",
        "| --- | --- | --- |",
    ]
    meanings = {
        "alpha_net": "s per message between worker processes",
        "beta_net": "s per byte between worker processes",
        "alpha_mem": "s per message between devices of one process",
        "beta_mem": "s per byte between devices of one process",
        "gamma": "s per byte summed, cast or copied (concat, pad)",
        "delta": "s per graph op",
        "alpha_collective": "s per collective all-reduce launched",
        "step": "s per all-reduce step, whatever it does",
    }
    for name in cost_model.FIELDS:
        value = getattr(constants, name)
        lines.append(f"| {name} | {value:.4g} | {meanings[name]} |")
    groups = _groups(rows)
    met = [name for name, rs in groups.items() if all(_within(r) for r in rs)]
    lines += [
        "",
        "## Per group",
        "",
        f"A group meets the target when every candidate's prediction is "
        f"within {TOLERANCE:.0%} of its measured time. "
        f"**{len(met)} of {len(groups)} groups meet it**; "
        f"{sum(map(_within, rows))} of {len(rows)} candidates are within "
        f"{TOLERANCE:.0%}. Leave-one-group-out: fitted on the other groups.",
        "",
        "| group | candidates | within 25% | median abs error | worst ratio "
        "| held out: within 25% | held out: median abs error |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, rs in groups.items():
        errors = [abs(r.ratio - 1) for r in rs]
        worst = max(rs, key=lambda r: abs(r.ratio - 1)).ratio
        out = held_out.get(name, [])
        out_within = sum(abs(x - 1) <= TOLERANCE for x in out)
        out_error = statistics.median(abs(x - 1) for x in out) if out else 0
        lines.append(
            f"| {name} | {len(rs)} | {sum(map(_within, rs))} | "
            f"{statistics.median(errors):.0%} | {worst:.2f} | "
            f"{out_within} | {out_error:.0%} |"
        )
    if scopes:
        sizes = [len(rs) for rs in groups.values()]
        lines += [
            "",
            "## Where the error comes from",
            "",
            "The same model with its constants fitted to fewer rows at a",
            "time. Fitted to each record alone, the constants absorb the",
            "machine's state during that benchmark run; fitted to each group",
            f"alone ({len(cost_model.FIELDS)} constants for "
            f"{min(sizes)} to {max(sizes)} candidates), what still misses",
            "is what the model's form cannot express: overlap of packs and",
            "transfers, core contention, TF's built-ins' own internals, and",
            "candidates whose samples spread wider than the tolerance.",
            "",
            f"| constants fitted to | groups: every candidate within "
            f"{TOLERANCE:.0%} | groups: median error within {TOLERANCE:.0%} "
            f"| candidates within {TOLERANCE:.0%} |",
            "| --- | --- | --- | --- |",
        ]
        for title, (every, median, within, total) in scopes:
            lines.append(
                f"| {title} | {every} of {total} | {median} of {total} | "
                f"{within} of {len(rows)} |"
            )
    pairs = repeats(rows)
    if pairs:
        spreads = [max(r, 1 / r) - 1 for *_, r in pairs]
        lines += [
            "",
            "## The records' own noise",
            "",
            f"{len(pairs)} candidates were measured twice on the same "
            "configuration, in different groups: the same workload, devices "
            "and workers in two records (a repeated run), or TF's MWMS "
            "timed at x1 and x2 local devices (it keeps one replica per "
            "worker, so both time the same thing). Two measurements of one "
            "thing differ by "
            f"{statistics.median(spreads):.0%} (median) and up to "
            f"{max(spreads):.0%}: a floor under any model's error, and a "
            f"large part of the {TOLERANCE:.0%} budget.",
            "",
            "| candidate | group a | group b | a / b |",
            "| --- | --- | --- | --- |",
        ]
        for name, a, b, ratio in pairs:
            lines.append(f"| {name} | {a} | {b} | {ratio:.2f} |")
    lines += [
        "",
        "## Every candidate",
        "",
        "| group | candidate | config | measured ms | predicted ms | "
        "ratio | within 25% |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        m = row.measurement
        lines.append(
            f"| {row.group} | {row.candidate} | {m.config[0]} | "
            f"{_ms(m.seconds)} | {_ms(row.predicted)} | {row.ratio:.2f} | "
            f"{'yes' if _within(row) else 'no'} |"
        )
    lines += [
        "",
        "## Recommended configurations for large clusters",
        "",
        "`cost_model.recommend` with these constants (no compression: it",
        "changes the numbers, so a user opts in). Extrapolated far beyond",
        "the measured 2-3 loopback workers: read them as what the fitted",
        "alpha, beta, gamma and delta imply, not as measurements.",
        "",
        "| workload | workers | devices per worker | config | predicted ms |",
        "| --- | --- | --- | --- | --- |",
    ]
    for workload, workers, k, config, seconds in recommended:
        lines.append(
            f"| {workload} | {workers} | {k} | {_config_text(config)} | "
            f"{_ms(seconds)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=pathlib.Path)
    parser.add_argument("--output", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    rows = read_rows(args.records)
    constants = cost_model.fit([r.measurement for r in rows])
    predict_rows(rows, constants)
    held_out = leave_one_group_out(rows)
    recommended = recommendations(constants)
    names = " ".join(str(p) for p in args.records)
    command = f"python -m benchmarks.cost_fit {names}"
    scopes = [
        ("every record together (the constants above)", scope_summary(rows))
    ]
    scopes += [
        (title, scope_summary(fitted_by(rows, key))) for title, key in SCOPES
    ]
    text = report(rows, constants, held_out, recommended, command, scopes)
    print(constants)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
