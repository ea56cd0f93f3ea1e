"""Fits `tf_crossdevice.cost_model` to the benchmark records and reports.

    python -m benchmarks.cost_fit benchmarks/records/*.json \\
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
import math
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from benchmarks import candidates as candidates_lib
from benchmarks import records
from benchmarks import workloads as workloads_lib
from benchmarks.candidates import Candidate
from tf_crossdevice.cluster import hosts as hosts_lib
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
    # On emulated hosts: the most any host's link carried in either
    # direction per call (headers included); the links' rate is the
    # measurement's.
    wire_bytes: float | None = None
    # Gross seconds per call of each of the first timed rounds (not the
    # confirmation rounds): their spread, not the candidate's time.
    rounds: tuple[float, ...] = ()

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
        elif g.link_rate is not None:
            scope = (
                f"{g.num_replicas} hosts at {g.link_rate} x {g.local_devices}"
            )
        else:
            scope = f"{g.num_replicas} workers x {g.local_devices}"
        out.append((f"{path.stem}: {g.workload}, {scope}", g, results))
    return out


def machine_cores(path: pathlib.Path) -> int:
    """The cores of the machine a record ran on, as its meta states them
    ('2 CPU cores (x86_64), ...')."""
    machine = str(records.Run.read(path).meta.get("machine", ""))
    match = re.match(r"(\d+) CPU cores", machine)
    if match is None:
        raise ValueError(
            f"{path}: meta.machine {machine!r} does not start with the "
            "machine's cores ('2 CPU cores ...')"
        )
    return int(match[1])


def _wire_bytes(result: records.Result) -> float | None:
    sent = result.sent_bytes_per_host or []
    received = result.received_bytes_per_host or []
    return max([*sent, *received], default=None)


_PRICED_CODECS = (None, *cost_model.COMPRESSIONS)


def read_rows(
    paths: Sequence[pathlib.Path], *, emulated: bool = False
) -> list[Row]:
    """Every verified, timed candidate of every group of `paths` (bounds,
    rooflines and baselines are not all-reduces, so they are left out).

    Args:
        paths: benchmark records.
        emulated: read the groups on emulated hosts (with a `link_rate`)
            and only those; else the others. The two are fitted apart: on
            loopback the cores bound every transfer, on shaped links the
            wire does. On emulated hosts each host had an equal share of
            the machine's cores (`EmulatedHosts`' CPU quota), which each
            measurement carries as `cores_per_worker`.
    """
    rows = []
    for path in paths:
        for label, g, results in read_groups(path):
            if (g.link_rate is not None) != emulated:
                continue
            workload = workload_named(g.workload)
            single = g.setting == "single_process"
            workers = 1 if single else g.num_replicas
            local = g.num_replicas if single else g.local_devices
            known = {
                c.name: c
                for c in candidates_lib.single_process_candidates(workload)
                + candidates_lib.multi_worker_candidates(
                    workload, num_workers=max(2, workers)
                )
                + candidates_lib.strategy_candidates()
            }
            cores = machine_cores(path) / workers if emulated else None
            rate = (
                hosts_lib.parse_rate(g.link_rate)
                if g.link_rate is not None
                else None
            )
            entries = {r.name: r for r in g.results}
            for name, seconds in results:
                candidate = known.get(name)
                if candidate is None:
                    continue
                config, k = config_of(candidate, local)
                if config[1].get("compression") not in _PRICED_CODECS:
                    continue  # low-rank (PowerSGD): not in the model
                m = cost_model.Measurement(
                    config,
                    gradients_of(workload),
                    k,
                    workers,
                    seconds,
                    cores,
                    rate,
                )
                rows.append(
                    Row(
                        label,
                        name,
                        m,
                        record=path.stem,
                        wire_bytes=_wire_bytes(entries[name]),
                        rounds=entries[name].timing.samples,
                    )
                )
    return rows


def predict_rows(
    rows: Sequence[Row],
    constants: cost_model.Constants,
    link_rate: float | None = None,
) -> None:
    """Sets each row's prediction by `constants`; with `link_rate` (the
    rate they were fitted for), moved to each row's own link rate
    (`cost_model.at_link_rate`; a row without one is at `link_rate`, as
    `cost_model.fit` reads it)."""
    for row in rows:
        m = row.measurement
        at_rate = constants
        if link_rate is not None and m.link_rate is not None:
            at_rate = cost_model.at_link_rate(constants, link_rate, m.link_rate)
        row.predicted = cost_model.predict(
            m.config,
            m.gradients,
            devices_per_worker=m.devices_per_worker,
            num_workers=m.num_workers,
            constants=at_rate,
            cores_per_worker=m.cores_per_worker,
        )


def _repeats_table(pairs: Sequence[tuple[str, str, str, float]]) -> list[str]:
    """The Markdown table of `repeats`: each candidate's two groups and the
    ratio of their times."""
    return [
        "| candidate | group a | group b | a / b |",
        "| --- | --- | --- | --- |",
        *(
            f"| {name} | {a} | {b} | {ratio:.2f} |"
            for name, a, b, ratio in pairs
        ),
    ]


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
    for name in cost_model.LOOPBACK_FIELDS:
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
            f"alone ({len(cost_model.LOOPBACK_FIELDS)} constants for "
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
            *_repeats_table(pairs),
        ]
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


# --- hosts on links of known rate ----------------------------------------

# The targets on emulated hosts: the fitted link rate within 10% of the
# rate the links were shaped to; every candidate of a held-out host count
# predicted within 20%.
RATE_TOLERANCE = 0.10
HELD_OUT_TOLERANCE = 0.20
# What `tc tbf` charges per payload byte beyond what the interfaces
# counted: it shapes each segment's L2 frame (a GSO packet is charged per
# segment), while a veth's counters see a GSO packet's headers once. At
# MTU 9000 a TCP segment with timestamps carries 9000 - 52 payload bytes
# in a 9014-byte frame.
MTU = 9000
FRAME_OVERHEAD = (MTU + 14) / (MTU - 52)


def fit_link(rows: Sequence[Row], link_rate: float) -> cost_model.Constants:
    """Every constant (`cost_model.FIELDS`) fitted to emulated rows, for
    links of `link_rate` bits/s: rows at other rates count their wire
    bytes at that rate's scale (`cost_model.fit`), so rates where the
    wire hides the cores' work and rates where it does not are fitted
    together."""
    return cost_model.fit(
        [r.measurement for r in rows],
        fields=cost_model.FIELDS,
        link_rate=link_rate,
    )


def model_bytes(row: Row) -> float:
    """The model's bytes on the busiest host's link each way
    (`Traffic.net_bytes`)."""
    m = row.measurement
    return cost_model.traffic_of(
        m.config,
        m.gradients,
        devices_per_worker=m.devices_per_worker,
        num_workers=m.num_workers,
    ).net_bytes


def wire_overhead(rows: Sequence[Row]) -> float:
    """Median bytes the busiest host's link carried per byte the model
    counts (headers, gRPC framing, requests), over rows with both."""
    ratios = [
        r.wire_bytes / model_bytes(r)
        for r in rows
        if r.wire_bytes and model_bytes(r) > 0
    ]
    if not ratios:
        raise ValueError("rows: no row has measured and modelled bytes")
    return statistics.median(ratios)


def recovered_rate(constants: cost_model.Constants, overhead: float) -> float:
    """The link rate in bits/s that `constants.beta_net` (seconds per
    payload byte) implies, counting `overhead` wire bytes per payload byte.

    >>> c = dataclasses.replace(cost_model.DEFAULT_CONSTANTS, beta_net=8e-9)
    >>> [round(recovered_rate(c, x) / 1e9, 9) for x in (1.0, 1.01)]
    [1.0, 1.01]
    """
    if constants.beta_net <= 0:
        return math.inf
    return 8 * overhead / constants.beta_net


class HeldOutHosts(NamedTuple):
    """One host count predicted by a fit on the others."""

    fitted_on: tuple[int, ...]  # the host counts fitted
    hosts: int  # the host count predicted
    rows: list[Row]  # copies of its rows, predicted
    constants: cost_model.Constants  # the fit


def held_out_by_hosts(
    rows: Sequence[Row], link_rate: float
) -> list[HeldOutHosts]:
    """For each host count h: copies of h's rows predicted by constants
    fitted on the other host counts only (`fit_link` for `link_rate`)."""
    hosts = sorted({r.measurement.num_workers for r in rows})
    out = []
    for h in hosts:
        train = [r for r in rows if r.measurement.num_workers != h]
        test = [
            dataclasses.replace(r)
            for r in rows
            if r.measurement.num_workers == h
        ]
        if not train or not test:
            continue
        constants = fit_link(train, link_rate)
        predict_rows(test, constants, link_rate)
        others = tuple(x for x in hosts if x != h)
        out.append(HeldOutHosts(others, h, test, constants))
    return out


def rate_of(row: Row) -> float:
    """The row's link rate in bits/s (rows on emulated hosts have one)."""
    rate = row.measurement.link_rate
    if rate is None:
        raise ValueError(f"{row.group}: {row.candidate} has no link rate")
    return rate


def held_out_by_rate(
    rows: Sequence[Row], fit_rate: float, constants: cost_model.Constants
) -> list[tuple[float, list[Row]]]:
    """For each link rate of `rows` other than `fit_rate`: the rate and
    copies of its rows predicted by `constants` (fitted at `fit_rate`)
    moved to that rate (`cost_model.at_link_rate`, as
    `constants_for_link` moves the shipped ones)."""
    out = []
    for rate in sorted({rate_of(r) for r in rows} - {fit_rate}):
        test = [dataclasses.replace(r) for r in rows if rate_of(r) == rate]
        predict_rows(test, constants, fit_rate)
        out.append((rate, test))
    return out


def _held_out_within(rows: Sequence[Row]) -> int:
    """How many of `rows` are predicted within HELD_OUT_TOLERANCE."""
    return sum(abs(r.ratio - 1) <= HELD_OUT_TOLERANCE for r in rows)


def _worst(rows: Sequence[Row]) -> Row:
    return max(rows, key=lambda r: abs(r.ratio - 1))


def one_fit_for_every_rate(
    rows: Sequence[Row], link_rate: float
) -> list[tuple[float, int, int, int, int]]:
    """Every rate's rows fitted together, in sample, in two forms: the
    model's sum (`fit_link` for `link_rate`) and the larger of the wire
    and the cores (`fit_larger_of`). Per rate: (rate, candidates, within
    HELD_OUT_TOLERANCE summed, within it the larger of, candidates whose
    own rounds all lie within it: `rounds_within`). What any constants of
    the model's counts allow, and what the measurements themselves do."""
    summed = [dataclasses.replace(r) for r in rows]
    constants = fit_link(summed, link_rate)
    predict_rows(summed, constants, link_rate)
    larger = [
        dataclasses.replace(r, predicted=p)
        for r, p in zip(
            rows, fit_larger_of(rows, link_rate, constants), strict=True
        )
    ]
    out = []
    for rate in sorted({rate_of(r) for r in rows}):
        out.append(
            (
                rate,
                sum(rate_of(r) == rate for r in rows),
                _held_out_within([r for r in summed if rate_of(r) == rate]),
                _held_out_within([r for r in larger if rate_of(r) == rate]),
                rounds_within([r for r in rows if rate_of(r) == rate]),
            )
        )
    return out


# The terms of `cost_model.FIELDS` that are the wire's time and those that
# are the cores' (divided by a host's cores); the others, beta_serial
# among them (a pack's processing that its own transfer cannot hide), add
# to the larger of the two.
WIRE_TERMS = ("beta_net", "beta_incast")
CORE_TERMS = ("alpha_mem", "beta_mem", "gamma", "delta")


def fit_larger_of(
    rows: Sequence[Row], link_rate: float, summed: cost_model.Constants
) -> list[float]:
    """The model's counts in another form, fitted to `rows` (wire bytes
    at `link_rate`, as `fit_link`): a step takes the larger of the wire's
    time (WIRE_TERMS) and the cores' (CORE_TERMS), plus the other terms,
    which neither hides. Fitted piecewise: each row is given the side
    that bounds it, both sides are fitted together by non-negative least
    squares, the sides are read again from the fit, until no row moves;
    started from the sides of `summed` (the model's own fit of `rows`,
    `fit_link`), from every row on the wire's and from every row on the
    cores', the best kept. Returns each row's predicted seconds, in
    order.
    """
    x = np.array(
        [cost_model.measured_counts(r.measurement, link_rate) for r in rows]
    )
    seconds = np.array([r.measurement.seconds for r in rows])
    index = {name: i for i, name in enumerate(cost_model.FIELDS)}
    wire = np.array([index[f] for f in WIRE_TERMS])
    cores = np.array([index[f] for f in CORE_TERMS])
    rest = np.array(
        [i for f, i in index.items() if f not in WIRE_TERMS + CORE_TERMS]
    )

    def bound_by_wire(c: Any) -> Any:
        return x[:, wire] @ c[wire] >= x[:, cores] @ c[cores]

    def predicted(c: Any) -> Any:
        larger = np.maximum(x[:, wire] @ c[wire], x[:, cores] @ c[cores])
        return larger + x[:, rest] @ c[rest]

    best, best_error = None, math.inf
    everywhere = np.ones(len(rows), dtype=bool)
    for side in (
        bound_by_wire(np.array(dataclasses.astuple(summed))),
        everywhere,
        ~everywhere,
    ):
        for _ in range(len(rows) + 1):
            a = x.copy()
            a[np.ix_(side, cores)] = 0.0
            a[np.ix_(~side, wire)] = 0.0
            c = np.array(
                dataclasses.astuple(cost_model.Constants.fitted(a, seconds))
            )
            moved = bound_by_wire(c)
            if (moved == side).all():
                break
            side = moved
        error = float(((predicted(c) / seconds - 1) ** 2).sum())
        if error < best_error:
            best, best_error = predicted(c), error
    assert best is not None
    return [float(p) for p in best]


def rounds_within(rows: Sequence[Row]) -> int:
    """How many of `rows` have every timed round within
    HELD_OUT_TOLERANCE of the rounds' median: a candidate whose own
    rounds spread wider cannot be predicted to that tolerance."""

    def steady(rounds: tuple[float, ...]) -> bool:
        median = statistics.median(rounds)
        return all(abs(t / median - 1) <= HELD_OUT_TOLERANCE for t in rounds)

    return sum(bool(r.rounds) and steady(r.rounds) for r in rows)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (ties get their mean rank).

    >>> spearman([1, 2, 3, 4], [10, 20, 30, 40]), spearman([1, 2, 3], [3, 2, 1])
    (1.0, -1.0)
    """

    def ranks(values: Sequence[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while (
                j + 1 < len(order) and values[order[j + 1]] == values[order[i]]
            ):
                j += 1
            for m in range(i, j + 1):
                out[order[m]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    var = math.sqrt(
        sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb)
    )
    return cov / var if var else 0.0


def ordering(rows: Sequence[Row]) -> list[tuple[str, int, float, str, float]]:
    """Per group: (group, candidates, Spearman's rho of predicted against
    measured times, the model's top pick, the measured best time / the top
    pick's measured time: 1.0 when the model picks the fastest)."""
    out = []
    for name, rs in _groups(rows).items():
        rho = spearman(
            [r.predicted for r in rs], [r.measurement.seconds for r in rs]
        )
        pick = min(rs, key=lambda r: r.predicted)
        best = min(r.measurement.seconds for r in rs)
        out.append(
            (
                name,
                len(rs),
                rho,
                pick.candidate,
                best / pick.measurement.seconds,
            )
        )
    return out


# The per-message terms a fit on a few hosts cannot resolve next to a wire
# time of a second (they fit 0), but which grow with the host count.
LATENCY_TERMS = ("alpha_net", "alpha_collective")

HostRecommendation = tuple[
    str, int, int, cost_model.Config, float, cost_model.Config, float
]


def host_recommendations(
    constants: cost_model.Constants,
) -> list[HostRecommendation]:
    """`recommend` at 64 to 1024 hosts with `constants` (one core per
    replica: the per-core terms spread over a host's cores), then again
    with each of `LATENCY_TERMS` at least the loopback fit's
    (`DEFAULT_CONSTANTS`: the same machine's per-message costs).

    Returns:
        (workload, hosts, devices per host, config, seconds, config and
        seconds with the loopback per-message terms).
    """
    floor = dataclasses.replace(
        constants,
        **{
            name: max(
                getattr(constants, name),
                getattr(cost_model.DEFAULT_CONSTANTS, name),
            )
            for name in LATENCY_TERMS
        },
    )
    out = []
    for workload in (workloads_lib.resnet50(), workloads_lib.bert_base()):
        grads = gradients_of(workload)
        for workers in RECOMMEND_WORKERS:
            for k in RECOMMEND_DEVICES:
                picks = [
                    cost_model.recommend(
                        grads,
                        num_workers=workers,
                        devices_per_worker=k,
                        constants=c,
                        cores_per_worker=k,
                    )
                    for c in (constants, floor)
                ]
                out.append((workload.name, workers, k, *picks[0], *picks[1]))
    return out


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:.1f}"


def _host_label(row: Row) -> str:
    m = row.measurement
    return f"{m.num_workers} x {m.devices_per_worker}"


def hosts_report(
    rows: Sequence[Row],
    constants: cost_model.Constants,
    rate: float,
    overhead: float,
    held_out: Sequence[HeldOutHosts],
    held_out_rates: Sequence[tuple[float, list[Row]]],
    together: Sequence[tuple[float, int, int, int, int]],
    orderings: Sequence[
        tuple[str, Sequence[tuple[str, int, float, str, float]]]
    ],
    recommended: Sequence[HostRecommendation],
    command: str,
) -> str:
    """The page on emulated hosts: bytes, link rate, held-out host counts
    and rates, ordering. `rows` are the fitted rate's; `held_out_rates`
    hold the others'; `together`, `one_fit_for_every_rate`."""
    link = f"{rate / 1e9:g} Gbit/s"
    payload_rate = recovered_rate(constants, 1.0)
    counted_rate = recovered_rate(constants, overhead)
    framed_rate = recovered_rate(constants, overhead * FRAME_OVERHEAD)
    lines = [
        "# Cost model on emulated hosts: link rate and held-out predictions",
        "",
        f"Written by `{command}`",
        "(`tf_crossdevice.cost_model`, counts in",
        "`tf_crossdevice/tuning/_traffic.py`). Measured: each candidate's",
        "net median step time in the benchmark's records on emulated hosts",
        "(one network namespace per host, its link shaped with `tc tbf` both",
        "ways, one worker per host, each host an equal share of the",
        "machine's cores), confirmation rounds where it was re-timed. The",
        "loopback records are fitted apart (`cost_model.md`): there the",
        "cores bound every transfer.",
        "",
        "## The model on links of known rate",
        "",
        "The wire is each host's bottleneck, so a step takes the bytes the",
        "busiest host's link carries each way over the link's rate",
        "(`beta_net` per byte), counting again the bytes of one pack that",
        "it carries one way while the other way idles",
        "(`Traffic.one_way_bytes`: a reduction's root, a shuffle's owner",
        "that receives more of its shards than it sends of the others',",
        "and halving-doubling's fold-in partner receive before they send;",
        "other packs' transfers fill the idle direction, so the pack with",
        "the most counts), plus what the wire cannot hide:",
        "",
        "- `beta_incast` per byte a host receives from several senders at",
        "  once beyond one sender's share (a reduction to one device's root,",
        "  a shuffle's shard owners from 3 hosts on): flows converging on one",
        "  shaped link lose throughput to each other.",
        "- `beta_serial` per byte of the step's largest pack: a pack's own",
        "  transfer cannot hide its reduction, casts and copies (other packs'",
        "  transfers can), so one large pack (TF's MWMS default, an in-graph",
        "  ring of one pack) pays its processing on top of the wire. A",
        "  compressed collective's pack counts the group's messages every",
        "  member decodes and sums once the all-gather is done (n x the",
        "  pack). It is a per-core term: half a core takes twice as long.",
        "- per message, per collective launched, per byte summed or copied,",
        "  per graph op and per step, as on loopback; the per-core ones",
        "  (gamma, delta, alpha_mem, beta_mem, beta_serial) divided by the",
        "  host's cores (machine cores / hosts: the CPU quota).",
        "",
        "## Bytes on the busiest host's link",
        "",
        "`Traffic.net_bytes` is what the busiest worker sends, which in",
        "every schedule equals what it receives: the bytes its link carries",
        "each way. Against what the interfaces counted (the most any host",
        "sent or received per call):",
        "",
        "| group | candidate | model MiB | measured MiB | measured / model |",
        "| --- | --- | --- | --- | --- |",
    ]
    ratios = []
    for row in [*rows, *(r for _, test in held_out_rates for r in test)]:
        modelled = model_bytes(row)
        if not row.wire_bytes or modelled <= 0:
            continue
        ratios.append(row.wire_bytes / modelled)
        lines.append(
            f"| {row.group} | {row.candidate} | {_mib(modelled)} | "
            f"{_mib(row.wire_bytes)} | {ratios[-1]:.3f} |"
        )
    lines += [
        "",
        f"Measured / model: {min(ratios):.3f} to {max(ratios):.3f}, median "
        f"{overhead:.4f} (headers and gRPC framing: the counters see a",
        "GSO packet's headers once).",
        "",
        "## Recovered link rate",
        "",
        f"Every constant fitted to every candidate of every group at {link}",
        "(non-negative least squares on relative errors):",
        "",
        "| constant | value |",
        "| --- | --- |",
    ]
    for name in cost_model.FIELDS:
        lines.append(f"| {name} | {getattr(constants, name):.4g} |")
    ok = abs(framed_rate / rate - 1) <= RATE_TOLERANCE
    lines += [
        "",
        f"The links were shaped to {link}.",
        "",
        "| rate from beta_net, counting | Gbit/s | / shaped rate |",
        "| --- | --- | --- |",
        f"| payload bytes (the model's) | {payload_rate / 1e9:.3f} | "
        f"{payload_rate / rate:.3f} |",
        f"| bytes the interfaces counted (x {overhead:.4f}) | "
        f"{counted_rate / 1e9:.3f} | {counted_rate / rate:.3f} |",
        f"| L2 frames as tbf charges them, MTU {MTU} (x "
        f"{FRAME_OVERHEAD:.4f} more) | {framed_rate / 1e9:.3f} | "
        f"{framed_rate / rate:.3f} |",
        "",
        f"Target: within {RATE_TOLERANCE:.0%} of the shaped rate (tbf's "
        f"count, the last row): **{'met' if ok else 'not met'}**.",
        "",
        "## Held out: another host count",
        "",
        "Constants fitted on the other host counts' groups only, then every",
        f"candidate of the held-out count predicted (groups at {link}).",
        "",
        f"| fitted on hosts | predicted hosts | candidates | within "
        f"{HELD_OUT_TOLERANCE:.0%} | worst ratio | worst candidate | "
        "rate from that fit / shaped |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for held in held_out:
        worst, within = _worst(held.rows), _held_out_within(held.rows)
        fitted_rate = recovered_rate(held.constants, overhead * FRAME_OVERHEAD)
        lines.append(
            f"| {', '.join(map(str, held.fitted_on))} | {held.hosts} | "
            f"{len(held.rows)} | "
            f"{within} | {worst.ratio:.2f} | {worst.candidate} "
            f"({_host_label(worst)}) | {fitted_rate / rate:.3f} |"
        )
    spread: dict[tuple[str, str], float] = {}
    for name, a, b, ratio in repeats(rows):
        spread[(name, a)] = spread[(name, b)] = max(ratio, 1 / ratio)
    misses = [
        r
        for held in held_out
        for r in held.rows
        if abs(r.ratio - 1) > HELD_OUT_TOLERANCE
    ]
    if misses:
        lines += [
            "",
            f"Outside {HELD_OUT_TOLERANCE:.0%}, and whether the records",
            "measured the same configuration elsewhere (slower / faster):",
            "",
            "| group | candidate | ratio | measured twice: spread |",
            "| --- | --- | --- | --- |",
        ]
        for r in misses:
            twice = spread.get((r.candidate, r.group))
            lines.append(
                f"| {r.group} | {r.candidate} | {r.ratio:.2f} | "
                f"{'-' if twice is None else f'{twice:.2f}'} |"
            )
    lines += [
        "",
        "Every candidate (predicted / measured; ratio above 1: the model is",
        "slower than the measurement):",
        "",
        "| predicted hosts | group | candidate | measured ms | predicted ms "
        "| ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for held in held_out:
        for row in held.rows:
            lines.append(
                f"| {held.hosts} | {row.group} | {row.candidate} | "
                f"{_ms(row.measurement.seconds)} | {_ms(row.predicted)} | "
                f"{row.ratio:.2f} |"
            )
    lines += [
        "",
        "## Held out: another rate",
        "",
        f"The constants fitted at {link} (above), moved to each other rate",
        "by `cost_model.at_link_rate` (the wire's per-byte terms scale with",
        "the link's time per byte, the rest stays; `constants_for_link`",
        "moves the shipped ones the same way), then every candidate at that",
        "rate predicted.",
        "",
    ]
    if not held_out_rates:
        lines.append("No record has another link rate.")
    else:
        lines += [
            f"| rate | candidates | within {HELD_OUT_TOLERANCE:.0%} | "
            "worst ratio | worst candidate |",
            "| --- | --- | --- | --- | --- |",
        ]
        for held_rate, test in held_out_rates:
            worst, within = _worst(test), _held_out_within(test)
            lines.append(
                f"| {held_rate / 1e9:g} Gbit/s | {len(test)} | {within} | "
                f"{worst.ratio:.2f} | {worst.candidate} "
                f"({_host_label(worst)}) |"
            )
        lines += [
            "",
            "Fitted on every rate together instead (each row's wire bytes",
            f"scaled to {link}), in sample: what any constants of the",
            "model's counts can do. Two forms: the model's sum of its terms",
            "(`cost_model.fit` with `link_rate`), and a step that takes the",
            f"larger of the wire's time ({', '.join(WIRE_TERMS)}) and the",
            f"cores' ({', '.join(CORE_TERMS)}), plus the other terms, which",
            "neither hides, fitted piecewise (`fit_larger_of`). The last",
            "column is how many candidates' own timed rounds all lie within",
            f"{HELD_OUT_TOLERANCE:.0%} of their median: where few do, the",
            "measurement, not the model, is the limit.",
            "",
            f"| rate | candidates | within {HELD_OUT_TOLERANCE:.0%}, one "
            f"fit, summed | within {HELD_OUT_TOLERANCE:.0%}, one fit, the "
            f"larger of | rounds within {HELD_OUT_TOLERANCE:.0%} of their "
            "median |",
            "| --- | --- | --- | --- | --- |",
            *(
                f"| {r / 1e9:g} Gbit/s | {n} | {summed} | {larger} | {steady} |"
                for r, n, summed, larger, steady in together
            ),
        ]
        lines += [
            "",
            "| group | candidate | measured ms | predicted ms | ratio |",
            "| --- | --- | --- | --- | --- |",
        ]
        for _, test in held_out_rates:
            for row in test:
                lines.append(
                    f"| {row.group} | {row.candidate} | "
                    f"{_ms(row.measurement.seconds)} | "
                    f"{_ms(row.predicted)} | {row.ratio:.2f} |"
                )
    pairs = repeats(rows)
    if pairs:
        lines += [
            "",
            "## The records' own noise",
            "",
            "Candidates measured in two groups on the same configuration",
            "(two records, or TF's MWMS at 1 and 2 local devices, which",
            "keeps one replica per worker): no prediction can be nearer to",
            "both than their spread allows.",
            "",
            *_repeats_table(pairs),
        ]
    lines += [
        "",
        "## Ordering: the model's ranking against the measured one",
        "",
        "What autotune uses the model for: ordering the candidates it times",
        "and pruning the slow ones. Per group, Spearman's rank correlation",
        "of predicted against measured times, the model's top pick, and the",
        "measured best time over the top pick's measured time (1.00: it",
        "picks the fastest).",
        "",
        "| constants | group | candidates | Spearman | top pick | best / "
        "pick's time |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for title, table in orderings:
        for group, count, rho, pick, fraction in table:
            lines.append(
                f"| {title} | {group} | {count} | {rho:.2f} | {pick} | "
                f"{fraction:.2f} |"
            )
    lines += [
        "",
        "## Every candidate, fitted on every host count",
        "",
        "| group | candidate | measured ms | predicted ms | ratio |",
        "| --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row.group} | {row.candidate} | "
            f"{_ms(row.measurement.seconds)} | {_ms(row.predicted)} | "
            f"{row.ratio:.2f} |"
        )
    lines += [
        "",
        "## Recommended configurations for 64 to 1024 hosts",
        "",
        "`cost_model.recommend` with these constants at the shaped rate",
        "(`cost_model.constants_for_link` ships them). What it assumes:",
        "",
        f"- every host's link runs at {link} each way into a switch that",
        "  never blocks, and the wire stays the bottleneck;",
        "- one worker per host with 1 or 8 devices, one core per device (the",
        "  per-core terms divided by the host's cores);",
        "- the per-message, per-collective, incast and per-pack terms are",
        "  what at most 4 hosts with 1 or 2 devices each measured. At 64 to",
        "  1024 hosts the latency terms grow with the host count, so these",
        "  rows extrapolate them: "
        + ", ".join(
            f"{name} fitted {getattr(constants, name):.3g} s"
            for name in LATENCY_TERMS
        )
        + ". A term fitted 0 makes a latency-bound schedule (a ring of",
        "  2(p-1) steps per tensor) look as cheap as a bandwidth-bound one,",
        "  so the last two columns repeat the search with each of them at",
        "  least the loopback fit's (the same machine's gRPC per-message",
        "  costs, `DEFAULT_CONSTANTS`);",
        "- no compression (a user opts in).",
        "",
        "Read them as what the fitted terms imply, not as measurements.",
        "",
        "| workload | hosts | devices per host | config, as fitted | "
        "predicted ms | config, loopback per-message terms | predicted ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for workload, workers, k, config, seconds, floor, floor_s in recommended:
        lines.append(
            f"| {workload} | {workers} | {k} | {_config_text(config)} | "
            f"{_ms(seconds)} | {_config_text(floor)} | {_ms(floor_s)} |"
        )
    return "\n".join(lines) + "\n"


def emulated_main(paths: Sequence[pathlib.Path], command: str) -> str:
    """The emulated hosts' fit and its page (`hosts_report`): fitted on the
    slowest link rate's groups (where the wire bounds every candidate
    most clearly), each other rate held out."""
    every = read_rows(paths, emulated=True)
    if not every:
        raise ValueError(
            "records: no group on emulated hosts (with a link_rate) among "
            + ", ".join(map(str, paths))
        )
    rate = min(rate_of(r) for r in every)
    rows = [r for r in every if rate_of(r) == rate]
    constants = fit_link(rows, rate)
    predict_rows(rows, constants, rate)
    overhead = wire_overhead(every)
    held_out = held_out_by_hosts(rows, rate)
    held_out_rates = held_out_by_rate(every, rate, constants)
    together = one_fit_for_every_rate(every, rate)
    loopback = [dataclasses.replace(r) for r in rows]
    predict_rows(loopback, cost_model.DEFAULT_CONSTANTS)
    # Every emulated row is across workers: autotune's order for any count,
    # which knows no cores per worker (one each).
    autotune = [
        dataclasses.replace(
            r, measurement=r.measurement._replace(cores_per_worker=None)
        )
        for r in rows
    ]
    predict_rows(autotune, cost_model.ordering_constants(2))
    orderings = [
        ("fitted on every host count", ordering(rows)),
        (
            "fitted without the group's host count",
            ordering([r for held in held_out for r in held.rows]),
        ),
        (
            "fitted at another rate",
            ordering([r for _, test in held_out_rates for r in test]),
        ),
        ("loopback defaults", ordering(loopback)),
        ("autotune's order (loopback, serial pack cost)", ordering(autotune)),
    ]
    recommended = host_recommendations(constants)
    print(constants)
    return hosts_report(
        rows,
        constants,
        rate,
        overhead,
        held_out,
        held_out_rates,
        together,
        orderings,
        recommended,
        command,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=pathlib.Path)
    parser.add_argument("--output", type=pathlib.Path, default=None)
    parser.add_argument(
        "--emulated",
        action="store_true",
        help="fit the groups on emulated hosts (links of known rate) and "
        "write their page; else the loopback groups",
    )
    args = parser.parse_args(argv)
    names = " ".join(str(p) for p in args.records)
    if args.emulated:
        command = f"python -m benchmarks.cost_fit --emulated {names}"
        text = emulated_main(args.records, command)
        if args.output:
            args.output.write_text(text)
        else:
            sys.stdout.write(text)
        return 0
    rows = read_rows(args.records)
    constants = cost_model.fit([r.measurement for r in rows])
    predict_rows(rows, constants)
    held_out = leave_one_group_out(rows)
    recommended = recommendations(constants)
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
