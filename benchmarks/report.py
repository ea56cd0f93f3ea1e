"""The benchmark's outputs: an nccl-tests-style table, JSON, a PNG, targets.

Columns: size (bytes of one replica's tensors), count (elements), tensors,
type, time (median minus the baseline, ms), iqr (of the step times, ms),
algbw (size / time, GB/s), busbw (algbw * 2(n-1)/n, GB/s), roofline
(roofline time / time), vs TF (TensorFlow's best time / time: above 1 is
faster than every TensorFlow built-in measured in the same rounds).

>>> format_size(4), format_size(3 << 20)
('4 B', '3 MiB')

A group and its table, targets and plot:

>>> import tempfile
>>> from benchmarks import records, workloads
>>> def entry(name, family, baseline, seconds):
...     return {"name": name, "family": family, "baseline": baseline,
...             "samples": [seconds] * 3, "verified": family != "baseline"
...             or None, "error": None}
>>> group = records.make_group_record(
...     setting="single_process",
...     workload=workloads.Workload("resnet50", ((1024,),)),
...     num_replicas=4, rounds=3, entries=[
...         entry("baseline: inputs only", "baseline", None, 0.001),
...         entry("roofline: numpy", "roofline", None, 0.002),
...         entry("TF ReductionToOneDevice", "tf", "baseline: inputs only",
...               0.005),
...         entry("ours SpecAllReduce pscpu", "ours", "baseline: inputs only",
...               0.003)])
>>> print(group_table(group).splitlines()[-1])
        4096        1024       1 float32      2.000     0.000    0.00    0.00     1.00   2.00  [ours] SpecAllReduce pscpu
>>> [(t["name"], t["met"]) for t in targets([group])]  # doctest: +NORMALIZE_WHITESPACE
[('resnet50, single process, 4 logical CPU devices: ours best vs TF best', True),
 ('resnet50, single process, 4 logical CPU devices: ours best as a fraction of the roofline', True)]
>>> with tempfile.TemporaryDirectory() as tmp:
...     path = pathlib.Path(tmp) / "plot.png"
...     write_plot(path, [group])
...     path.read_bytes()[:4]
b'\x89PNG'
"""  # noqa: E501

from __future__ import annotations

import json
import math
import pathlib
import re
from collections.abc import Sequence
from typing import Any

from benchmarks import records

_FAMILY_ORDER = {"roofline": 0, "bound": 1, "tf": 2, "ours": 3}
_SWEEP_RE = re.compile(r"^sweep_(\d+)B$")
_HEADER = (
    f"{'size':>12} {'count':>11} {'tensors':>7} {'type':>7} "
    f"{'time(ms)':>10} {'iqr(ms)':>9} {'algbw':>7} {'busbw':>7} "
    f"{'roofline':>8} {'vs TF':>6}  candidate"
)
_UNITS = (
    f"{'(B)':>12} {'(elements)':>11} {'':>7} {'':>7} {'':>10} {'':>9} "
    f"{'(GB/s)':>7} {'(GB/s)':>7} {'':>8} {'':>6}"
)


def format_size(num_bytes: int) -> str:
    """Bytes with a binary unit: exact for whole units (as nccl-tests' sweep
    steps read), else three significant digits.

    >>> format_size(8), format_size(3 << 20), format_size(102334368)
    ('8 B', '3 MiB', '97.6 MiB')
    >>> format_size(1023), format_size(1048575), format_size(1024001)
    ('1023 B', '1 MiB', '0.977 MiB')
    """
    for unit, shift in (("B", 0), ("KiB", 10), ("MiB", 20), ("GiB", 30)):
        value = num_bytes / (1 << shift)
        if value < 1024 and num_bytes % (1 << shift) == 0:
            return f"{num_bytes >> shift} {unit}"
        if value < 999.5:  # 999.5 and up would print as 1e+03.
            return f"{value:.3g} {unit}"
    return f"{value:.0f} {unit}"


def _is_sweep(group: dict[str, Any]) -> bool:
    return bool(_SWEEP_RE.match(group["workload"]))


def _scope(group: dict[str, Any]) -> str:
    n = group["num_replicas"]
    if group["setting"] == "single_process":
        return f"single process, {n} logical CPU devices"
    return f"{n} worker processes (one CPU replica each)"


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.3f}" if seconds is not None else "-"


def _num(value: float | None, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if value is not None else "-"


def _row(group: dict[str, Any], result: dict[str, Any]) -> str:
    step = result.get("step_seconds")
    iqr = step["q75"] - step["q25"] if step else None
    failed = result["error"] is not None or not result["verified"]
    time = "FAILED" if failed else _ms(result["time_seconds"])
    if not failed and result["time_seconds"] is None:
        time = "<noise"
    name = result["name"]
    if result["family"] == "ours":
        name = name[len("ours ") :] if name.startswith("ours ") else name
        name = f"[ours] {name}"
    line = (
        f"{group['size_bytes']:>12} {group['count']:>11} "
        f"{group['num_tensors']:>7} {group['dtype']:>7} {time:>10} "
        f"{_ms(iqr):>9} {_num(result['algbw_GBps']):>7} "
        f"{_num(result['busbw_GBps']):>7} "
        f"{_num(result['roofline_fraction']):>8} "
        f"{_num(result['ratio_to_tf_best']):>6}  {name}"
    )
    if failed:
        line += f"\n{'':>12} error: {result['error']}"
    return line


def _sorted(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r: dict[str, Any]) -> tuple[int, float]:
        t = r["time_seconds"]
        return (
            _FAMILY_ORDER.get(r["family"], 3),
            t if t is not None else math.inf,
        )

    return sorted(results, key=key)


def group_table(group: dict[str, Any]) -> str:
    """One group: a header naming it, then one row per result."""
    lines = [
        f"# {_scope(group)}: {group['workload']} ({group['num_tensors']} "
        f"tensors, {format_size(group['size_bytes'])}) - "
        f"{group['description']}",
        f"# roofline {_ms(group['roofline_seconds'])} ms "
        f"({group['roofline']}); TF best {_ms(group['tf_best_seconds'])} ms "
        f"({group['tf_best']}); ours best {_ms(group['ours_best_seconds'])} "
        f"ms ({group['ours_best']})",
    ]
    confirmed = group.get("confirmed")
    if confirmed:
        times = confirmed["times"]
        lines.append(
            f"# confirmed over {confirmed['rounds']} more rounds of the "
            f"finalists: ours best {_ms(times.get(group['ours_best']))} ms, "
            f"TF best {_ms(times.get(group['tf_best']))} ms (ours is "
            f"{_num(confirmed['ratio_to_tf_best'])}x TF best's speed), "
            f"roofline {_ms(times.get(group['roofline']))} ms (ours at "
            f"{_num(confirmed['roofline_fraction'])} of it)"
        )
    if group.get("error"):
        lines.append(f"# FAILED: {group['error']}")
    if group.get("skipped"):
        lines.append(f"# SKIPPED: {group['skipped']}")
    for name, base in group["baselines"].items():
        step = base.get("step_seconds")
        state = (
            f"{_ms(step['median'])} ms" if step else f"FAILED {base['error']}"
        )
        lines.append(f"# {name}: {state}")
    lines += ["#", "#" + _HEADER[1:], "#" + _UNITS[1:]]
    lines += [_row(group, r) for r in _sorted(group["results"])]
    return "\n".join(lines)


def sweep_table(groups: Sequence[dict[str, Any]], show_all: bool) -> str:
    """The size sweep of one setting: per size, the best of each family.

    With `show_all`, every result of every size.
    """
    first = groups[0]
    lines = [
        f"# {_scope(first)}: size sweep, one float32 tensor per replica",
        "#" + _HEADER[1:],
        "#" + _UNITS[1:],
    ]
    for group in sorted(groups, key=lambda g: g["size_bytes"]):
        reason = group.get("error") or group.get("skipped")
        if reason:
            state = "FAILED" if group.get("error") else "SKIPPED"
            lines.append(f"{group['size_bytes']:>12} {state}: {reason}")
        results = _sorted(group["results"])
        if not show_all:
            picked = [
                _best(results, group["roofline"]),
                _best(results, group["tf_best"]),
                _best(results, group["ours_best"]),
            ]
            failed = [r for r in results if r["error"] or not r["verified"]]
            results = [r for r in picked if r is not None] + failed
        lines += [_row(group, r) for r in results]
    return "\n".join(lines)


def _best(results: Sequence[dict[str, Any]], name: str | None):
    return next((r for r in results if r["name"] == name), None)


def full_table(
    groups: Sequence[dict[str, Any]],
    targets: Sequence[dict[str, Any]],
    meta: dict[str, Any],
    sweep_all: bool = False,
) -> str:
    """Everything printed at the end of a run."""
    lines = [
        "# tf_crossdevice benchmark: all-reduce (SUM) of float32 tensors",
        f"# command: {meta.get('command', '')}",
        f"# machine: {meta.get('machine', '')}",
        "# time: median step time minus the baseline step measured in the "
        "same interleaved rounds; iqr: spread of the step times",
        "# algbw = size/time; busbw = algbw*2(n-1)/n; roofline = roofline "
        "time/time; vs TF = TF's best time/time (>1: faster than every TF "
        "built-in)",
        "# every result was checked against numpy's sum before timing",
        "",
    ]
    sweeps: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for group in groups:
        if _is_sweep(group):
            sweeps.setdefault(
                (group["setting"], group["num_replicas"]), []
            ).append(group)
            continue
        lines += [group_table(group), ""]
    for sweep in sweeps.values():
        lines += [sweep_table(sweep, sweep_all), ""]
    lines += ["# Targets"]
    for t in targets:
        lines.append(f"# {_target_line(t)}")
    return "\n".join(lines)


def _target_line(target: dict[str, Any]) -> str:
    measured = target["measured"]
    shown = f"{measured:.2f}" if measured is not None else "n/a"
    verdict = "MET" if target["met"] else "NOT MET"
    line = (
        f"{target['name']}: {shown} (target >= {target['threshold']}) {verdict}"
    )
    if target.get("note"):
        line += f" - {target['note']}"
    return line


def _base_name(workload: str) -> str:
    """'resnet50[:24]' -> 'resnet50': the set a stand-in was cut from."""
    return re.sub(r"\[.*\]$", "", workload)


def _time(group: dict[str, Any], name: str | None) -> float | None:
    return records.confirmed_time(group, name)


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def targets(groups: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on the groups that were measured.

    Figures come from the confirmation rounds (the finalists re-timed side
    by side) where the group has them. A target measured on a smaller
    stand-in (e.g. `--quick`'s truncated ResNet-50) says so in its note.
    Each unmet target's note says what bounds it, from the same run.
    """
    out = []
    for g in groups:
        base = _base_name(g["workload"])
        stand_in = g["workload"] not in ("resnet50", "many_small")
        where = f"{g['workload']}, {_scope(g)}"
        ours = _time(g, g["ours_best"])
        if g["setting"] == "single_process" and base == "resnet50":
            if g["num_replicas"] != 4 and not stand_in:
                continue
            tf_best = _time(g, g["tf_best"])
            roof = _time(g, g["roofline"])
            bound = _ratio(tf_best, roof)
            out.append(
                _target(
                    f"{where}: ours best vs TF best",
                    _ratio(tf_best, ours),
                    1.25,
                    stand_in,
                    f"TF's best ({g['tf_best']}) already runs at "
                    f"{_num(_ratio(roof, tf_best))} of the roofline, so no "
                    f"algorithm can beat it by more than {_num(bound)}x here"
                    if bound is not None
                    else "",
                )
            )
            out.append(
                _target(
                    f"{where}: ours best as a fraction of the roofline",
                    _ratio(roof, ours),
                    0.8,
                    stand_in,
                    f"roofline: {g['roofline']}",
                )
            )
        elif g["setting"] == "single_process" and base == "many_small":
            bound = next(
                (r for r in g["results"] if r["family"] == "bound"), None
            )
            pack_unpack = _time(g, bound["name"]) if bound else None
            for name, threshold in (
                ("TF ReductionToOneDevice", 10),
                ("TF HierarchicalCopy num_packs=1", 3),
            ):
                other = _time(g, name)
                limit = _ratio(other, pack_unpack)
                out.append(
                    _target(
                        f"{where}: ours best vs {name}",
                        _ratio(other, ours),
                        threshold,
                        stand_in,
                        f"ours best {_ms(ours)} ms ({g['ours_best']}), "
                        f"{name} {_ms(other)} ms; packing and unpacking "
                        f"alone take {_ms(pack_unpack)} ms (every device, "
                        "no transfer, no sum), so a packing algorithm is at "
                        f"most {_num(limit)}x faster than {name} here"
                        if limit is not None
                        else "",
                    )
                )
        elif g["setting"] == "multi_worker" and base == "resnet50":
            mwms = _time(g, "TF MWMS default")
            out.append(
                _target(
                    f"{where}: ours best vs MWMS default",
                    _ratio(mwms, ours),
                    1.5,
                    stand_in,
                    f"ours best {_ms(ours)} ms ({g['ours_best']}), MWMS "
                    f"default {_ms(mwms)} ms, roofline "
                    f"{_ms(_time(g, g['roofline']))} ms ({g['roofline']})",
                )
            )
    return out


def _target(
    name: str,
    measured: float | None,
    threshold: float,
    stand_in: bool,
    bound: str,
) -> dict[str, Any]:
    met = measured is not None and measured >= threshold
    note = bound if not met or stand_in else ""
    if stand_in:
        note = "measured on a stand-in (smaller) workload; " + note
    return {
        "name": name,
        "measured": measured,
        "threshold": threshold,
        "met": met,
        "stand_in": stand_in,
        "note": note.strip("; "),
    }


def markdown_summary(
    groups: Sequence[dict[str, Any]], targets: Sequence[dict[str, Any]]
) -> str:
    """A Markdown table of each group's best (README-sized), then the targets.

    Times are the confirmation rounds' where the group has them, so the
    ratios match the targets'. Sweep groups are left out (see the PNG).

    >>> group = {"workload": "w", "setting": "single_process",
    ...          "num_replicas": 4, "num_tensors": 2, "size_bytes": 8,
    ...          "error": None, "skipped": None, "tf_best": "TF a",
    ...          "ours_best": "ours b", "roofline": "r", "results": [
    ...     {"name": n, "time_seconds": t, "verified": True, "error": None}
    ...     for n, t in (("TF a", 2e-3), ("ours b", 1e-3), ("r", 5e-4))]}
    >>> print(markdown_summary([group], []).splitlines()[2])
    | w | 4 logical CPUs | 2 / 8 B | a 2.000 ms | b 1.000 ms | 2.00 | 0.50 |
    """
    lines = [
        "| workload | setting | tensors / bytes | TF best | ours best "
        "| vs TF | ours / roofline |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in groups:
        if _is_sweep(g):
            continue
        n = g["num_replicas"]
        setting = (
            f"{n} logical CPUs"
            if g["setting"] == "single_process"
            else f"{n} worker processes"
        )
        size = f"{g['num_tensors']} / {format_size(g['size_bytes'])}"
        if g.get("error") or g.get("skipped"):
            why = g.get("error") or f"left out: {g['skipped']}"
            lines.append(
                f"| {g['workload']} | {setting} | {size} | {why} | | | |"
            )
            continue
        ours, tf_best = _time(g, g["ours_best"]), _time(g, g["tf_best"])
        roof = _time(g, g["roofline"])
        ours_name = (g["ours_best"] or "-").removeprefix("ours ")
        tf_name = (g["tf_best"] or "-").removeprefix("TF ")
        lines.append(
            f"| {g['workload']} | {setting} | {size} "
            f"| {tf_name} {_ms(tf_best)} ms | {ours_name} {_ms(ours)} ms "
            f"| {_num(_ratio(tf_best, ours))} | {_num(_ratio(roof, ours))} |"
        )
    if targets:
        lines += ["", "Targets:", ""]
        lines += [f"- {_target_line(t)}" for t in targets]
    return "\n".join(lines)


def write_json(path: pathlib.Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")


def write_plot(path: pathlib.Path, groups: Sequence[dict[str, Any]]) -> None:
    """Time against size, one line per candidate, one panel per setting.

    Sweep points are joined by lines; the tensor sets (ResNet-50, BERT,
    many-small) are single markers at their total size, labelled at their
    roofline (black). The roofline is the group's best roofline entry.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for g in groups:
        panels.setdefault((g["setting"], g["num_replicas"]), []).append(g)
    keys = sorted(panels, key=lambda k: (k[0] != "single_process", k[1]))
    fig, axes = plt.subplots(
        len(keys), 1, figsize=(13, 5.5 * max(len(keys), 1)), squeeze=False
    )
    palette = plt.get_cmap("tab20")
    color_of: dict[str, Any] = {}
    for ax, key in zip(axes[:, 0], keys, strict=True):
        lines: dict[str, list[tuple[int, float]]] = {}
        markers: dict[str, list[tuple[int, float]]] = {}
        for g in panels[key]:
            points = [
                (r["name"], r["time_seconds"])
                for r in g["results"]
                if r["family"] != "roofline"
                and r["verified"]
                and r["time_seconds"] is not None
            ]
            if g["roofline_seconds"] is not None:
                points.append(("roofline", g["roofline_seconds"]))
            for name, seconds in points:
                target = lines if _is_sweep(g) else markers
                target.setdefault(name, []).append((g["size_bytes"], seconds))
            if not _is_sweep(g) and g["roofline_seconds"] is not None:
                ax.annotate(
                    g["workload"],
                    (g["size_bytes"], g["roofline_seconds"]),
                    fontsize=8,
                    xytext=(4, -10),
                    textcoords="offset points",
                )
        for name in sorted(set(lines) | set(markers), key=_legend_order):
            color = (
                "black"
                if name == "roofline"
                else color_of.setdefault(name, palette(len(color_of) % 20))
            )
            style = {"color": color, **_line_style(name)}
            label: str | None = name
            if name in lines:
                xs, ys = zip(*sorted(lines[name]), strict=True)
                ax.plot(xs, ys, label=label, **style)
                label = None
            if name in markers:
                xs, ys = zip(*sorted(markers[name]), strict=True)
                ax.plot(
                    xs,
                    ys,
                    marker="x" if name == "roofline" else "o",
                    linestyle="none",
                    color=color,
                    label=label,
                )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per replica")
        ax.set_ylabel("time (s), net of the baseline")
        ax.set_title(_scope(panels[key][0]))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _legend_order(name: str) -> tuple[int, str]:
    if name == "roofline":
        return (0, name)
    return (1 if name.startswith("TF") else 2, name)


def _line_style(name: str) -> dict[str, Any]:
    if name == "roofline":
        return {"linestyle": ":", "linewidth": 2.5}
    if name.startswith("TF"):
        return {"linestyle": "--", "linewidth": 1.5}
    return {"linestyle": "-", "linewidth": 1.2}
