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
import functools
import math
import pathlib
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
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
# The pages' prose: templates/<page>.md, in blocks that `_block` fills in.
TEMPLATES = pathlib.Path(__file__).parent / "templates"
LOOPBACK_PAGE = "cost_model"
HOSTS_PAGE = "cost_model_hosts"


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


# What the collective classes' own packing (bytes_per_pack=0) meant before
# a record's meta named the default pack size
# (records.COLLECTIVE_PACK_KEY): TF 1's 32 values per collective for the
# flat class, one pack per dtype for the hierarchical one (as if its packs
# could hold any gradient set).
_LEGACY_OWN_PACKING: dict[str, dict[str, Any]] = {
    "CollectiveAllReduce": {"all_reduce_merge_scope": 32},
    "HierarchicalCollectiveAllReduce": {"options": {"bytes_per_pack": 1 << 50}},
}


def config_of(
    candidate: Candidate, devices_per_worker: int, legacy: bool = False
) -> tuple[cost_model.Config, int]:
    """The cost model's config for a candidate, and the replicas per
    worker it really runs (TF's MWMS keeps one CPU per worker). `legacy`:
    measured before the collectives packed by size by default (a record
    whose meta has no records.COLLECTIVE_PACK_KEY)."""
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
        own: dict[str, Any] = {
            "options": {"bytes_per_pack": kwargs["bytes_per_pack"]}
        }
        if legacy and not kwargs["bytes_per_pack"]:
            own.update(_LEGACY_OWN_PACKING[kwargs["cross_device_ops"]])
        if kwargs.get("compression"):
            own["compression"] = kwargs["compression"]
        return (kwargs["cross_device_ops"], own), devices_per_worker
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
    path: pathlib.Path, run: records.Run
) -> list[tuple[str, records.Group, list[tuple[str, float]]]]:
    """The timed groups of the record `run` read from `path`: each with
    its label and (name, net seconds) of its verified, timed results (the
    confirmation rounds' time where it was re-timed)."""
    out = []
    for g in run.groups:
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


def machine_cores(path: pathlib.Path, run: records.Run) -> int:
    """The cores of the machine the record `run` (read from `path`) ran
    on, as its meta states them ('2 CPU cores (x86_64), ...')."""
    machine = str(run.meta.get("machine", ""))
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


@functools.cache
def _known_candidates(workload: str, workers: int) -> dict[str, Candidate]:
    """The benchmark's candidates for a workload across `workers`, by name
    (with the default pack sizes)."""
    w = workload_named(workload)
    return {
        c.name: c
        for c in candidates_lib.single_process_candidates(w)
        + candidates_lib.multi_worker_candidates(w, num_workers=workers)
        + candidates_lib.strategy_candidates()
    }


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
        run = records.Run.read(path)
        legacy = records.COLLECTIVE_PACK_KEY not in run.meta
        for label, g, results in read_groups(path, run):
            if (g.link_rate is not None) != emulated:
                continue
            workload = workload_named(g.workload)
            single = g.setting == "single_process"
            workers = 1 if single else g.num_replicas
            local = g.num_replicas if single else g.local_devices
            known = _known_candidates(g.workload, max(2, workers))
            cores = machine_cores(path, run) / workers if emulated else None
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
                config, k = config_of(candidate, local, legacy)
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


@functools.cache
def _template_blocks(page: str) -> dict[str, str]:
    """The blocks of `templates/{page}.md`: each runs from a line
    `<!-- name -->` to the next such line (the text before the first is
    the template's own comment)."""
    text = (TEMPLATES / f"{page}.md").read_text(encoding="utf-8")
    parts = re.split(r"^<!-- (\w+) -->\n", text, flags=re.MULTILINE)
    return {
        name: body.strip("\n")
        for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


def _block(
    page: str, name: str, rows: Iterable[str] = (), **values: Any
) -> str:
    """Block `name` of `page`'s template filled in with `values`, then
    `rows`, one per line: the rows of the table the block ends with."""
    return "\n".join([_template_blocks(page)[name].format(**values), *rows])


def _page(blocks: Iterable[str]) -> str:
    """A page of `blocks`, with a blank line between each two."""
    return "\n\n".join(blocks) + "\n"


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
    """The loopback page (prose in `templates/cost_model.md`): the fitted
    constants, each group's errors fitted with and without it, the errors
    of narrower fits (`scopes`), the records' own noise, every candidate
    and the `recommended` configurations."""
    blocks = [
        _block(
            LOOPBACK_PAGE,
            "head",
            command=command,
            **dataclasses.asdict(constants),
        ),
        _per_group(rows, held_out),
    ]
    if scopes:
        blocks.append(_scopes(rows, scopes))
    blocks += _noise(LOOPBACK_PAGE, rows)
    every = (
        f"| {row.group} | {row.candidate} | {row.measurement.config[0]} | "
        f"{_ms(row.measurement.seconds)} | {_ms(row.predicted)} | "
        f"{row.ratio:.2f} | {'yes' if _within(row) else 'no'} |"
        for row in rows
    )
    blocks.append(_block(LOOPBACK_PAGE, "every", every))
    recommended_rows = (
        f"| {workload} | {workers} | {k} | {_config_text(config)} | "
        f"{_ms(seconds)} |"
        for workload, workers, k, config, seconds in recommended
    )
    blocks.append(_block(LOOPBACK_PAGE, "recommended", recommended_rows))
    return _page(blocks)


def _per_group(rows: Sequence[Row], held_out: dict[str, list[float]]) -> str:
    """Per group: how many candidates are within TOLERANCE, the median
    and worst errors, and the same held out (`leave_one_group_out`)."""
    groups = _groups(rows)
    met = [name for name, rs in groups.items() if all(_within(r) for r in rs)]
    table = []
    for name, rs in groups.items():
        errors = [abs(r.ratio - 1) for r in rs]
        out = held_out.get(name, [])
        out_within = sum(abs(x - 1) <= TOLERANCE for x in out)
        out_error = statistics.median(abs(x - 1) for x in out) if out else 0
        table.append(
            f"| {name} | {len(rs)} | {sum(map(_within, rs))} | "
            f"{statistics.median(errors):.0%} | {_worst(rs).ratio:.2f} | "
            f"{out_within} | {out_error:.0%} |"
        )
    return _block(
        LOOPBACK_PAGE,
        "per_group",
        table,
        tolerance=TOLERANCE,
        met=len(met),
        groups=len(groups),
        within=sum(map(_within, rows)),
        candidates=len(rows),
    )


def _scopes(
    rows: Sequence[Row], scopes: Sequence[tuple[str, tuple[int, int, int, int]]]
) -> str:
    """The errors of the constants fitted to fewer rows at a time."""
    sizes = [len(rs) for rs in _groups(rows).values()]
    table = (
        f"| {title} | {every} of {total} | {median} of {total} | "
        f"{within} of {len(rows)} |"
        for title, (every, median, within, total) in scopes
    )
    return _block(
        LOOPBACK_PAGE,
        "scopes",
        table,
        fields=len(cost_model.LOOPBACK_FIELDS),
        fewest=min(sizes),
        most=max(sizes),
        tolerance=TOLERANCE,
    )


def _noise(page: str, rows: Sequence[Row]) -> list[str]:
    """`page`'s prose on the records' own noise and the table of the
    candidates `rows` measured twice (`repeats`); none if there are none."""
    pairs = repeats(rows)
    if not pairs:
        return []
    spreads = [max(r, 1 / r) - 1 for *_, r in pairs]
    prose = _block(
        page,
        "noise",
        pairs=len(pairs),
        median=statistics.median(spreads),
        most=max(spreads),
        tolerance=TOLERANCE,
    )
    return [prose, "\n".join(_repeats_table(pairs))]


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


def _timed_row(row: Row) -> str:
    """A table row: group, candidate, measured and predicted ms, ratio."""
    return (
        f"| {row.group} | {row.candidate} | {_ms(row.measurement.seconds)} | "
        f"{_ms(row.predicted)} | {row.ratio:.2f} |"
    )


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
    """The page on emulated hosts (prose in
    `templates/cost_model_hosts.md`): bytes, link rate, held-out host
    counts and rates, ordering. `rows` are the fitted rate's;
    `held_out_rates` hold the others'; `together`,
    `one_fit_for_every_rate`."""
    link = f"{rate / 1e9:g} Gbit/s"
    ordering_rows = (
        f"| {title} | {group} | {count} | {rho:.2f} | {pick} | {fraction:.2f} |"
        for title, table in orderings
        for group, count, rho, pick, fraction in table
    )
    return _page(
        [
            *_link_rate_blocks(
                rows, held_out_rates, constants, rate, overhead, command
            ),
            *_held_out_hosts_blocks(rows, held_out, rate, overhead, link),
            *_held_out_rate_blocks(held_out_rates, together, link),
            *_noise(HOSTS_PAGE, rows),
            _block(HOSTS_PAGE, "ordering", ordering_rows),
            _block(HOSTS_PAGE, "every", map(_timed_row, rows)),
            _host_recommendations_block(constants, recommended, link),
        ]
    )


def _link_rate_blocks(
    rows: Sequence[Row],
    held_out_rates: Sequence[tuple[float, list[Row]]],
    constants: cost_model.Constants,
    rate: float,
    overhead: float,
    command: str,
) -> list[str]:
    """The page's head, the model's bytes on the busiest host's link
    against the interfaces' counts, and the link rate the fit recovers."""
    table, ratios = [], []
    for row in [*rows, *(r for _, test in held_out_rates for r in test)]:
        modelled = model_bytes(row)
        if not row.wire_bytes or modelled <= 0:
            continue
        ratios.append(row.wire_bytes / modelled)
        table.append(
            f"| {row.group} | {row.candidate} | {_mib(modelled)} | "
            f"{_mib(row.wire_bytes)} | {ratios[-1]:.3f} |"
        )
    payload_rate = recovered_rate(constants, 1.0)
    counted_rate = recovered_rate(constants, overhead)
    framed_rate = recovered_rate(constants, overhead * FRAME_OVERHEAD)
    ok = abs(framed_rate / rate - 1) <= RATE_TOLERANCE
    recovered = _block(
        HOSTS_PAGE,
        "recovered",
        (
            f"| {name} | {getattr(constants, name):.4g} |"
            for name in cost_model.FIELDS
        ),
        lowest=min(ratios),
        highest=max(ratios),
        link=f"{rate / 1e9:g} Gbit/s",
        overhead=overhead,
    )
    rate_check = _block(
        HOSTS_PAGE,
        "recovered_rate",
        overhead=overhead,
        link=f"{rate / 1e9:g} Gbit/s",
        payload_rate=payload_rate / 1e9,
        payload_share=payload_rate / rate,
        counted_rate=counted_rate / 1e9,
        counted_share=counted_rate / rate,
        framed_rate=framed_rate / 1e9,
        framed_share=framed_rate / rate,
        mtu=MTU,
        frame_overhead=FRAME_OVERHEAD,
        rate_tolerance=RATE_TOLERANCE,
        verdict="met" if ok else "not met",
    )
    return [
        _block(HOSTS_PAGE, "head", table, command=command),
        recovered,
        rate_check,
    ]


def _held_out_hosts_blocks(
    rows: Sequence[Row],
    held_out: Sequence[HeldOutHosts],
    rate: float,
    overhead: float,
    link: str,
) -> list[str]:
    """Each host count predicted by a fit on the others: one row per fit,
    the candidates outside HELD_OUT_TOLERANCE (with their spread where the
    records measured them twice), then every candidate."""
    fits = []
    for held in held_out:
        worst, within = _worst(held.rows), _held_out_within(held.rows)
        fitted_rate = recovered_rate(held.constants, overhead * FRAME_OVERHEAD)
        fits.append(
            f"| {', '.join(map(str, held.fitted_on))} | {held.hosts} | "
            f"{len(held.rows)} | "
            f"{within} | {worst.ratio:.2f} | {worst.candidate} "
            f"({_host_label(worst)}) | {fitted_rate / rate:.3f} |"
        )
    tolerance = HELD_OUT_TOLERANCE
    blocks = [
        _block(
            HOSTS_PAGE, "held_out_hosts", fits, link=link, tolerance=tolerance
        )
    ]
    spread: dict[tuple[str, str], float] = {}
    for name, a, b, ratio in repeats(rows):
        spread[(name, a)] = spread[(name, b)] = max(ratio, 1 / ratio)
    misses = [
        r
        for held in held_out
        for r in held.rows
        if abs(r.ratio - 1) > tolerance
    ]
    if misses:
        twice = [spread.get((r.candidate, r.group)) for r in misses]
        table = (
            f"| {r.group} | {r.candidate} | {r.ratio:.2f} | "
            f"{'-' if t is None else f'{t:.2f}'} |"
            for r, t in zip(misses, twice, strict=True)
        )
        blocks.append(_block(HOSTS_PAGE, "misses", table, tolerance=tolerance))
    every = (
        f"| {held.hosts} {_timed_row(row)}"
        for held in held_out
        for row in held.rows
    )
    blocks.append(_block(HOSTS_PAGE, "held_out_candidates", every))
    return blocks


def _held_out_rate_blocks(
    held_out_rates: Sequence[tuple[float, list[Row]]],
    together: Sequence[tuple[float, int, int, int, int]],
    link: str,
) -> list[str]:
    """Each other rate predicted by the constants moved to it, then every
    rate fitted together in two forms (`one_fit_for_every_rate`)."""
    head = _block(HOSTS_PAGE, "held_out_rate", link=link)
    if not held_out_rates:
        return [head, _block(HOSTS_PAGE, "no_other_rate")]
    rates = []
    for held_rate, test in held_out_rates:
        worst, within = _worst(test), _held_out_within(test)
        rates.append(
            f"| {held_rate / 1e9:g} Gbit/s | {len(test)} | {within} | "
            f"{worst.ratio:.2f} | {worst.candidate} ({_host_label(worst)}) |"
        )
    one_fit = (
        f"| {r / 1e9:g} Gbit/s | {n} | {summed} | {larger} | {steady} |"
        for r, n, summed, larger, steady in together
    )
    candidates = (_timed_row(row) for _, test in held_out_rates for row in test)
    return [
        head,
        _block(HOSTS_PAGE, "other_rates", rates, tolerance=HELD_OUT_TOLERANCE),
        _block(
            HOSTS_PAGE,
            "one_fit",
            one_fit,
            link=link,
            tolerance=HELD_OUT_TOLERANCE,
            wire_terms=", ".join(WIRE_TERMS),
            core_terms=", ".join(CORE_TERMS),
        ),
        _block(HOSTS_PAGE, "other_rate_candidates", candidates),
    ]


def _host_recommendations_block(
    constants: cost_model.Constants,
    recommended: Sequence[HostRecommendation],
    link: str,
) -> str:
    """`host_recommendations` and what they assume."""
    latency = ", ".join(
        f"{name} fitted {getattr(constants, name):.3g} s"
        for name in LATENCY_TERMS
    )
    table = (
        f"| {workload} | {workers} | {k} | {_config_text(config)} | "
        f"{_ms(seconds)} | {_config_text(floor)} | {_ms(floor_s)} |"
        for workload, workers, k, config, seconds, floor, floor_s in recommended
    )
    return _block(HOSTS_PAGE, "recommended", table, link=link, latency=latency)


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


def loopback_main(paths: Sequence[pathlib.Path], command: str) -> str:
    """The loopback fit and its page (`report`), with the errors of fits
    to each record and each group alone (`SCOPES`)."""
    rows = read_rows(paths)
    constants = cost_model.fit([r.measurement for r in rows])
    predict_rows(rows, constants)
    held_out = leave_one_group_out(rows)
    recommended = recommendations(constants)
    scopes = [
        ("every record together (the constants above)", scope_summary(rows))
    ]
    scopes += [
        (title, scope_summary(fitted_by(rows, key))) for title, key in SCOPES
    ]
    text = report(rows, constants, held_out, recommended, command, scopes)
    print(constants)
    return text


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
    else:
        command = f"python -m benchmarks.cost_fit {names}"
        text = loopback_main(args.records, command)
    if args.output:
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
