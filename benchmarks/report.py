"""The benchmark's outputs: an nccl-tests-style table, Markdown, a PNG.

Columns: size (bytes of one replica's tensors), count (elements), tensors,
type, time (median minus the baseline, ms), iqr (of the step times, ms),
algbw (size / time, GB/s), busbw (algbw * 2(n-1)/n, GB/s), roofline
(roofline time / time), vs TF (TensorFlow's best time / time), build
(seconds to trace, run first, check and warm up; `Result.build_seconds`).
On emulated hosts also CPU (the CPU milliseconds per MiB all-reduced of
the busiest host, `Result.cpu_ms_per_mib`), sent and recv (MiB per call,
the most any host's link carried) and model (sent /
`roofline.bytes_sent_model`, the host furthest from it; 'no model' where
there is none).

>>> from benchmarks import records
>>> group = records.Group("single_process", "w", "", 4, 1, 4096, 1024,
...                       "float32")
>>> records.add_results(group, [
...     records.entry_of("base", "baseline", None, [0.001] * 3),
...     records.entry_of("ours x", "ours", "base", [0.003] * 3)])
>>> print(group_table(group).splitlines()[-1])
        4096        1024       1 float32      2.000     0.000    0.00    0.00        -      -     0.0  [ours] x
"""  # noqa: E501

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence
from typing import Any

from benchmarks import roofline as roofline_lib
from benchmarks import targets as targets_lib
from benchmarks.records import Group, Job, Result, Run, ratio

_ORDER = {"roofline": 0, "bound": 1, "tf": 2, "ours": 3}
_HEADER = (
    f"#{'size':>11} {'count':>11} {'tensors':>7} {'type':>7} "
    f"{'time(ms)':>10} {'iqr(ms)':>9} {'algbw':>7} {'busbw':>7} "
    f"{'roofline':>8} {'vs TF':>6} {'build':>7}  candidate\n"
    f"#{'(B)':>11} {'(elements)':>11} {'':>7} {'':>7} {'':>10} {'':>9} "
    f"{'(GB/s)':>7} {'(GB/s)':>7} {'':>8} {'':>6} {'(s)':>7}"
)


_WIRE_HEADER = (
    f" {'CPU':>8} {'sent':>8} {'recv':>8} {'model':>8}",
    f" {'(ms/MiB)':>8} {'(MiB)':>8} {'(MiB)':>8} {'':>8}",
)


def _header(g: Group) -> str:
    if g.link_rate is None:
        return _HEADER
    first, second = _HEADER.split("\n")
    head, tail = first.rsplit("  candidate", 1)
    return (
        f"{head}{_WIRE_HEADER[0]}  candidate{tail}\n{second}{_WIRE_HEADER[1]}"
    )


def _wire_columns(g: Group, r: Result) -> str:
    """CPU, sent, recv and model of a row on emulated hosts (else
    nothing)."""
    if g.link_rate is None:
        return ""
    sent, received = r.sent_bytes_per_host, r.received_bytes_per_host
    model = targets_lib.bytes_model(g, r)
    shown = "-" if sent is None else "no model"
    if sent is not None and model is not None and len(sent) == len(model):
        # The host furthest from its model (of those it expects to send).
        pairs = [(s, m) for s, m in zip(sent, model, strict=True) if m]
        worst = max(pairs, key=lambda x: abs(x[0] - x[1]), default=None)
        shown = format_ratio(ratio(*worst)) if worst else "-"

    def mib(values: list[float] | None) -> str:
        return f"{max(values) / 2**20:.2f}" if values else "-"

    cpu = format_ratio(r.cpu_ms_per_mib)
    return f" {cpu:>8} {mib(sent):>8} {mib(received):>8} {shown:>8}"


def format_size(num_bytes: int) -> str:
    """Bytes in a binary unit: exact for whole units, else 3 digits.

    >>> format_size(8), format_size(3 << 20), format_size(102334368)
    ('8 B', '3 MiB', '97.6 MiB')
    """
    for unit, shift in (("B", 0), ("KiB", 10), ("MiB", 20), ("GiB", 30)):
        value = num_bytes / (1 << shift)
        if value < 1024 and num_bytes % (1 << shift) == 0:
            return f"{num_bytes >> shift} {unit}"
        if value < 999.5:
            return f"{value:.3g} {unit}"
    return f"{value:.0f} {unit}"


def format_ms(seconds: float | None) -> str:
    """Seconds as milliseconds with 3 decimals; '-' for none or infinite."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.3f}"


def format_ratio(value: float | None) -> str:
    """A ratio with 2 decimals; '-' for none."""
    return f"{value:.2f}" if value is not None else "-"


def _is_sweep(group: Group) -> bool:
    return group.workload.startswith("sweep_")


def _row(g: Group, r: Result) -> str:
    t = r.timing
    q25, q75 = t.q25_seconds, t.q75_seconds
    iqr = q75 - q25 if q25 is not None and q75 is not None else None
    time = "FAILED" if not r.ok else format_ms(r.time_seconds)
    if r.ok and r.time_seconds is None:  # within noise, or no baseline time
        bases = {b.name: b.timing.median_seconds for b in g.baselines}
        time = (
            "no base" if r.baseline and not bases.get(r.baseline) else "<noise"
        )
    name = r.name
    if r.family == "ours":
        name = "[ours] " + name.removeprefix("ours ")
    line = (
        f"{g.size_bytes:>12} {g.count:>11} {g.num_tensors:>7} {g.dtype:>7} "
        f"{time:>10} {format_ms(iqr):>9} {format_ratio(r.algbw_gbps):>7} "
        f"{format_ratio(r.busbw_gbps):>7} "
        f"{format_ratio(r.roofline_fraction):>8} "
        f"{format_ratio(r.ratio_to_tf_best):>6} {r.build_seconds:>7.1f}"
        f"{_wire_columns(g, r)}  {name}"
    )
    return line + (f"\n{'':>12} error: {t.error}" if not r.ok else "")


def _sorted(results: Sequence[Result]) -> list[Result]:
    return sorted(
        results,
        key=lambda r: (_ORDER.get(r.family, 3), r.time_seconds or math.inf),
    )


def _state(g: Group) -> list[str]:
    lines = [f"# FAILED: {g.error}"] if g.error else []
    return lines + ([f"# SKIPPED: {g.skipped}"] if g.skipped else [])


def group_table(g: Group) -> str:
    """One group: a header naming it, then one row per result."""
    lines = [
        f"# {g.scope}: {g.workload} ({g.num_tensors} tensors, "
        f"{format_size(g.size_bytes)}) - {g.description}",
        f"# roofline {format_ms(g.roofline_seconds)} ms ({g.roofline}); "
        f"TF best {format_ms(g.tf_best_seconds)} ms ({g.tf_best}); ours best "
        f"{format_ms(g.ours_best_seconds)} ms ({g.ours_best})",
    ]
    if g.confirmed:
        ours, tf_best, roof = map(g.time, (g.ours_best, g.tf_best, g.roofline))
        lines.append(
            f"# confirmed over {g.confirmed_rounds} more rounds: ours best "
            f"{format_ms(ours)} ms, TF best {format_ms(tf_best)} ms, "
            f"roofline {format_ms(roof)} ms "
            f"(vs TF {format_ratio(ratio(tf_best, ours))}, "
            f"roofline {format_ratio(ratio(roof, ours))})"
        )
    if g.note:
        lines.append(f"# {g.note}")
    if g.link_rate is not None:
        bound = roofline_lib.ring_bytes_per_worker(g.size_bytes, g.num_replicas)
        lines.append(
            f"# wire: {g.link_rate} each way per host; lower bound "
            f"2(p-1)/p*S = {bound / 2**20:.2f} MiB sent and received per host"
        )
    lines += _state(g)
    for b in g.baselines:
        state = b.timing.error or f"{format_ms(b.timing.median_seconds)} ms"
        if b.cpu_ms_per_mib is not None and not b.timing.error:
            state += f", CPU {b.cpu_ms_per_mib:.2f} ms/MiB"
        lines.append(f"# {b.name}: {state}")
    lines += ["#", _header(g)]
    return "\n".join(lines + [_row(g, r) for r in _sorted(g.results)])


def sweep_table(groups: Sequence[Group], show_all: bool) -> str:
    """One setting's size sweep: the best of each family per size (or all)."""
    lines = [
        f"# {groups[0].scope}: size sweep, one float32 tensor per replica",
        _HEADER,
    ]
    for g in sorted(groups, key=lambda g: g.size_bytes):
        lines += [f"{g.size_bytes:>12} {s[2:]}" for s in _state(g)]
        results = _sorted(g.results)
        if not show_all:
            best = (g.roofline, g.tf_best, g.ours_best)
            results = [r for r in results if r.name in best or not r.ok]
        lines += [_row(g, r) for r in results]
    return "\n".join(lines)


def full_table(run: Run, sweep_all: bool = False) -> str:
    """Everything printed at the end of a run."""
    lines = [
        "# tf_crossdevice benchmark: all-reduce (SUM) of float32 tensors",
        f"# command: {run.meta.get('command', '')}",
        f"# machine: {run.meta.get('machine', '')}",
        "# time: median step time minus the baseline step measured in the "
        "same interleaved rounds; iqr: spread of the step times",
        "# algbw = size/time; busbw = algbw*2(n-1)/n; roofline = roofline "
        "time/time; vs TF = TF's best time/time (>1: faster than every TF "
        "built-in)",
        "# every result was checked against numpy's sum before timing",
        "",
    ]
    sweeps: dict[tuple[str, int], list[Group]] = {}
    for g in run.groups:
        if _is_sweep(g):
            sweeps.setdefault((g.setting, g.num_replicas), []).append(g)
        else:
            lines += [group_table(g), ""]
    lines += [sweep_table(s, sweep_all) + "\n" for s in sweeps.values()]
    if run.training:
        lines += [
            "# The example job on emulated hosts",
            *training_table(run.training),
            "",
        ]
    lines += ["# Targets"] + [f"# {targets_lib.line(t)}" for t in run.targets]
    return "\n".join(lines)


def training_table(jobs: Sequence[Job]) -> list[str]:
    """The example job's runs (benchmarks.training), as Markdown rows."""
    lines = [
        "| hosts | job | examples/s | held-out accuracy | step / alone / "
        "all-reduce alone (ms) | overlap | scaling efficiency | cores busy: "
        "step / alone / all-reduce |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for j in jobs:
        head = f"| {j.hosts} at {j.link_rate} | {j.name} |"
        if j.error:
            lines.append(f"{head} {j.error} | | | | | |")
            continue
        times = " / ".join(
            f"{t * 1e3:.1f}" if t is not None else "-"
            for t in (j.step_seconds, j.alone_seconds, j.all_reduce_seconds)
        )
        cores = " / ".join(f"{c:.2f}" for c in j.cores) if j.cores else "-"
        lines.append(
            f"{head} {j.examples_per_second or 0:.1f} | "
            f"{j.accuracy or 0:.3f} | {times} | "
            f"{format_ratio(j.overlap)} | "
            f"{format_ratio(j.scaling_efficiency)} | {cores} |"
        )
    return lines


def markdown_summary(run: Run) -> str:
    """Each non-sweep group's best (README-sized), then the targets."""
    lines = [
        "| workload | setting | tensors / bytes | TF best | ours best "
        "| vs TF | ours / roofline |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in run.groups:
        if _is_sweep(g):
            continue
        n = g.num_replicas
        setting = (
            f"{n} logical CPUs"
            if g.setting == "single_process"
            else f"{n} worker processes"
        )
        if g.link_rate is not None:
            setting = f"{n} emulated hosts at {g.link_rate}"
        if g.local_devices > 1:
            setting += f" x {g.local_devices} local devices"
        head = f"| {g.workload} | {setting} | {g.num_tensors} / "
        head += f"{format_size(g.size_bytes)} |"
        if g.error or g.skipped:
            lines.append(
                f"{head} {g.error or f'left out: {g.skipped}'} | | | |"
            )
            continue
        ours, tf_best, roof = map(g.time, (g.ours_best, g.tf_best, g.roofline))
        lines.append(
            f"{head} {(g.tf_best or '-').removeprefix('TF ')} "
            f"{format_ms(tf_best)} ms | "
            f"{(g.ours_best or '-').removeprefix('ours ')} "
            f"{format_ms(ours)} ms | {format_ratio(ratio(tf_best, ours))} | "
            f"{format_ratio(ratio(roof, ours))} |"
        )
    if run.training:
        lines += ["", "The example job on emulated hosts:", ""]
        lines += training_table(run.training)
    if run.targets:
        lines += ["", "Targets:", ""]
        lines += [f"- {targets_lib.line(t)}" for t in run.targets]
    return "\n".join(lines)


def write_plot(path: pathlib.Path, groups: Sequence[Group]) -> None:
    """Time against size: one panel per setting, one line per candidate.

    Sweep points are joined by lines (TF's dashed, the roofline dotted and
    black); the tensor sets are single markers at their total size.
    """
    # An optional extra ('.[benchmark]'): benchmarks.site runs without it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, int], list[Group]] = {}
    for g in groups:
        panels.setdefault((g.setting, g.num_replicas), []).append(g)
    keys = sorted(panels, key=lambda k: (k[0] != "single_process", k[1]))
    if not keys:
        return
    fig, axes = plt.subplots(
        len(keys), 1, figsize=(13, 5.5 * len(keys)), squeeze=False
    )
    colors: dict[str, Any] = {"roofline": "black"}
    palette = plt.get_cmap("tab20")
    for ax, key in zip(axes.flat, keys, strict=True):
        points: dict[tuple[int, str, bool], list[tuple[int, float]]] = {}
        for g in panels[key]:
            if g.roofline_seconds and not _is_sweep(g):  # name the sets
                ax.annotate(g.workload, (g.size_bytes, g.roofline_seconds))
            timed = [(r.name, r.time_seconds) for r in g.results if r.ok]
            for name, t in [("roofline", g.roofline_seconds)] + timed:
                if t and not name.startswith("roofline: "):
                    order = 0 if name == "roofline" else 1 + (name[:2] != "TF")
                    line = (order, name, _is_sweep(g))
                    points.setdefault(line, []).append((g.size_bytes, t))
        for (order, name, sweep), xy in sorted(points.items()):
            color = colors.setdefault(name, palette(len(colors) % 20))
            style = (":", "--", "-")[order] if sweep else "xoo"[order]
            x, y = zip(*sorted(xy), strict=True)
            ax.plot(x, y, style, color=color, label=name)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=True))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="center left",
                  bbox_to_anchor=(1.01, 0.5))  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", xlabel="bytes per replica",
               ylabel="time (s), net of the baseline",
               title=panels[key][0].scope)  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_all(output: pathlib.Path, run: Run, sweep_all: bool) -> str:
    """Writes results.txt, .md, .json and the PNG; returns the table."""
    table = full_table(run, sweep_all)
    (output / "results.txt").write_text(table + "\n")
    (output / "results.md").write_text(markdown_summary(run) + "\n")
    run.write(output / "results.json")
    write_plot(output / "time_vs_size.png", run.groups)
    return table
