"""Writes the documentation site's benchmark pages from the records.

    python -m benchmarks.site  # benchmarks/records/*.json -> the pages

Every figure on them comes from a record (`records.Run.read`), so the pages
are rewritten, never edited:

- docs/benchmark/index.md answers what a reader asks first: a summary of
  who wins where (`benchmarks.summary`) and one section per question, from
  each suite's record (`canonical.pick`), with the plots the site build
  draws from the same records (`benchmarks.plots`, as
  `plots/*.svg`);
- docs/benchmark/records.md has every record, titled by what it measured
  (`title`): its date, machine and command, a table of each group's best
  (TF's best and ours, net times from the confirmation rounds, ratios)
  and one table per group with every candidate.

tests/benchmarks/site_test.py checks that the committed pages are what
this command writes from the committed records.

>>> group = records.Group("single_process", "w", "", 2, 1, 8, 2, "float32")
>>> records.add_results(group, [
...     records.entry_of("base", "baseline", None, [0.001] * 3),
...     records.entry_of("TF x", "tf", "base", [0.005] * 3),
...     records.entry_of("ours y", "ours", "base", [0.003] * 3)])
>>> print(summary_table([group]).splitlines()[-1])
| w | 2 logical CPUs | 1 / 8 B | x | 4.000 | y | 2.000 | 2.00 | - |
"""

from __future__ import annotations

import argparse
import math
import pathlib
import re
import sys
from collections.abc import Sequence

from benchmarks import canonical, plots, records, summary, targets
from benchmarks.report import (
    format_ms,
    format_ratio,
    format_size,
    training_table,
)

REPO = pathlib.Path(__file__).resolve().parents[1]
# The run records are data beside the benchmark; the pages they give are
# the documentation site's.
RECORDS_DIR = REPO / "benchmarks/records"
PAGE = REPO / "docs/benchmark/index.md"
RECORDS_PAGE = REPO / "docs/benchmark/records.md"

_GENERATED = """\
<!-- Written by `python -m benchmarks.site` from benchmarks/records/*.json:
     do not edit; run the command again after adding a record. -->
"""

_RECORDS_INTRO = f"""\
# All records

{_GENERATED}
Each section below is one benchmark record in `benchmarks/records/` (its
JSON holds every sample), titled by what it measured. The benchmark reduces
(SUM) the same tensors with ours and TensorFlow's built-ins inside
`tf.function`, in interleaved rounds after a warm-up, checks every result
against numpy before timing it, and times the best of each family again
side by side (confirmation rounds).

- **time**: median step time minus the baseline step's (the step that only
  produces the inputs), in milliseconds; confirmation rounds where the
  entry was re-timed. `-`: within the noise, or no figure.
- **vs TF**: TensorFlow's best time / this time (above 1: faster than every
  TensorFlow built-in in that group).
- **roofline**: roofline time / this time (the roofline is measured in
  the same run: the fastest plain sum in one process, a TCP loopback copy
  between worker processes; on emulated hosts, the wire's 2(p-1)/p*S at
  the link rate).
"""


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = [_row(header), "| " + " | ".join("---" for _ in header) + " |"]
    return "\n".join(lines + [_row(r) for r in rows])


def setting(group: records.Group) -> str:
    """The group's replicas in a few words, e.g. "2 workers x 2 devices"."""
    n = group.num_replicas
    if group.setting == "single_process":
        return f"{n} logical CPUs"
    if group.local_devices > 1:
        return f"{n} workers x {group.local_devices} local devices"
    return f"{n} worker processes"


def _name(name: str | None, prefix: str) -> str:
    return (name or "-").removeprefix(prefix)


def summary_table(groups: Sequence[records.Group]) -> str:
    """One row per group: TF's best and ours, their times and ratios."""
    rows = []
    for g in groups:
        head = [
            g.workload,
            setting(g),
            f"{g.num_tensors} / {format_size(g.size_bytes)}",
        ]
        if g.error or g.skipped:
            state = (
                f"failed: {g.error}" if g.error else f"left out: {g.skipped}"
            )
            rows.append([*head, state, "-", "-", "-", "-", "-"])
            continue
        ours, tf_best, roof = map(g.time, (g.ours_best, g.tf_best, g.roofline))
        rows.append(
            [
                *head,
                _name(g.tf_best, "TF "),
                format_ms(tf_best),
                _name(g.ours_best, "ours "),
                format_ms(ours),
                format_ratio(records.ratio(tf_best, ours)),
                format_ratio(records.ratio(roof, ours)),
            ]
        )
    header = (
        "workload",
        "setting",
        "tensors / bytes",
        "TF best",
        "time (ms)",
        "ours best",
        "time (ms)",
        "vs TF",
        "roofline",
    )
    return _table(header, rows)


def entries_table(g: records.Group) -> str:
    """Every candidate of one group, fastest first within each family."""
    order = {"roofline": 0, "bound": 1, "tf": 2, "ours": 3}
    rows = []
    tf_best = g.time(g.tf_best)
    roof = g.time(g.roofline)
    results = sorted(
        g.results,
        key=lambda r: (order.get(r.family, 4), g.time(r.name) or math.inf),
    )
    for r in results:
        t = g.time(r.name)
        rows.append(
            [
                r.name,
                r.family,
                "failed" if not r.ok else format_ms(t),
                format_ratio(records.ratio(tf_best, t)),
                format_ratio(records.ratio(roof, t)),
            ]
        )
    return _table(("entry", "family", "time (ms)", "vs TF", "roofline"), rows)


# Pack-size variants of the between-graph collectives: the family's name,
# then " bytes_per_pack=<size>" (the class's own packing has no suffix).
PACK_FAMILIES = (
    ("ours", "ours CollectiveAllReduce"),
    ("TF's", "TF MWMS RING"),
)
_PACK_RE = re.compile(r" bytes_per_pack=(\d+)(KiB|MiB)$")


def _pack_bytes(name: str, family: str) -> int | None:
    """`name`'s pack size in bytes if it is `family` with a pack size."""
    if not name.startswith(family):
        return None
    found = _PACK_RE.fullmatch(name[len(family) :])
    if not found:
        return None
    return int(found[1]) << (10 if found[2] == "KiB" else 20)


def pack_size_table(groups: Sequence[records.Group]) -> str | None:
    """Time by pack size, ours and TensorFlow's strategy, one column per
    group, and for ours the worst ratio to the group's fastest size over
    the groups: the default pack size is the one whose worst is lowest.
    None unless ours was timed at three or more pack sizes (a sweep).

    >>> g = records.Group("multi_worker", "w", "", 2, 1, 8, 2, "float32")
    >>> records.add_results(g, [
    ...     records.entry_of("base", "baseline", None, [0.0] * 3),
    ...     records.entry_of("ours CollectiveAllReduce bytes_per_pack=1MiB",
    ...                      "ours", "base", [0.2] * 3),
    ...     records.entry_of("ours CollectiveAllReduce bytes_per_pack=4MiB",
    ...                      "ours", "base", [0.3] * 3),
    ...     records.entry_of("ours CollectiveAllReduce bytes_per_pack=2MiB",
    ...                      "ours", "base", [0.1] * 3)])
    >>> print(pack_size_table([g]).splitlines()[-2])
    | 2 MiB | 100.000 | - | 1.00 |
    """
    sizes: dict[int, dict[tuple[int, str], float | None]] = {}
    for k, g in enumerate(groups):
        for r in g.results:
            for label, family in PACK_FAMILIES:
                size = _pack_bytes(r.name, family)
                if size is not None:
                    sizes.setdefault(size, {})[k, label] = g.time(r.name)
    if sum(any(key[1] == "ours" for key in t) for t in sizes.values()) < 3:
        return None  # not a sweep: the grid's one or two sizes
    fastest: dict[int, float | None] = {}
    for k in range(len(groups)):
        times = [t.get((k, "ours")) for t in sizes.values()]
        fastest[k] = min((t for t in times if t), default=None)
    header = ["pack size"]
    for g in groups:
        header += [f"{label}, {setting(g)} (ms)" for label, _ in PACK_FAMILIES]
    header.append("ours: worst / fastest size")
    rows = []
    for size in sorted(sizes):
        row: list[object] = [format_size(size)]
        worst: float | None = 0.0
        for k in range(len(groups)):
            for label, _ in PACK_FAMILIES:
                row.append(format_ms(sizes[size].get((k, label))))
            ours, best = sizes[size].get((k, "ours")), fastest[k]
            worst = (
                max(worst, ours / best)
                if worst is not None and ours and best
                else None
            )
        row.append(format_ratio(worst))
        rows.append(row)
    return _table(header, rows)


_WORKLOADS = {
    "resnet50": "ResNet-50's gradients",
    "bert_base": "BERT-base's gradients",
    "many_small": "many small tensors",
}


def _where(groups: Sequence[records.Group]) -> list[str]:
    """Where the groups ran, a phrase per kind of setting."""
    kinds: dict[str, set[int]] = {}
    for g in groups:
        local = f" x {g.local_devices} devices" if g.local_devices > 1 else ""
        if g.setting == "single_process":
            kind = "logical CPUs in one process"
        elif g.link_rate is not None:
            kind = f"emulated hosts at {g.link_rate}{local}"
        else:
            kind = f"worker processes on loopback{local}"
        kinds.setdefault(kind, set()).add(g.num_replicas)
    return [
        f"{', '.join(map(str, sorted(counts)))} {kind}"
        for kind, counts in kinds.items()
    ]


def title(run: records.Run) -> str:
    """What a record measured, e.g. "ResNet-50's gradients on 2, 3 emulated
    hosts at 1gbit; autotune (60 s budget)".

    >>> g = records.Group("multi_worker", "resnet50", "", 2, 1, 8, 2,
    ...                   "float32", link_rate="1gbit")
    >>> title(records.Run({}, {}, [g], []))
    "ResNet-50's gradients on 2 emulated hosts at 1gbit"
    """
    if run.meta.get("title"):  # A record of its own kind says what it is.
        return str(run.meta["title"])
    workloads = dict.fromkeys(
        _WORKLOADS.get(g.workload, g.workload) for g in run.groups
    )
    what = " and ".join(workloads)
    text = f"{what} on {'; '.join(_where(run.groups))}" if what else ""
    if run.training:
        hosts = sorted({j.hosts for j in run.training})
        job = f"the example job on {', '.join(map(str, hosts))} emulated hosts"
        text = f"{text}, then {job}" if text else job[0].upper() + job[1:]
    names = {r.name for g in run.groups for r in g.results}
    extras = sorted(
        {n for n in names if n.startswith(targets.AUTOTUNE)}
        | ({"PowerSGD"} if any(targets.POWERSGD in n for n in names) else set())
    )
    if pack_size_table(run.groups):
        extras.append("pack sizes")
    return "; ".join([text, *extras])


def record_section(name: str, run: records.Run) -> str:
    """One record: what it measured, what it says about its run, then its
    tables; `<a id=NAME>` keeps links to the record by file name."""
    lines = [f'<a id="{name}"></a>', "", f"## {title(run)}", ""]
    meta = run.meta
    lines.append(f"- record: `benchmarks/records/{name}.json`")
    for key in ("date", "machine", "note"):
        if meta.get(key):
            lines.append(f"- {key}: {_cell(meta[key])}")
    if meta.get("command"):
        lines += ["", "```sh", str(meta["command"]), "```"]
    lines.append("")
    figure = plots.record_plot(name, run)
    if figure is not None:
        lines += [f"![{title(run)}]({PLOTS_DIR}/{figure})", ""]
    if run.groups:
        lines += [summary_table(run.groups), ""]
        packs = pack_size_table(run.groups)
        if packs:
            lines += ["Time by pack size:", "", packs, ""]
    if run.training:
        lines += ["The example job on emulated hosts:", ""]
        lines += [*training_table(run.training), ""]
    if run.targets:
        lines += [f"- {targets.line(t)}" for t in run.targets] + [""]
    if run.skipped:
        lines += ["Left out of this run:", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(run.skipped.items())]
        lines.append("")
    for g in run.groups:
        lines += [f"### {g.workload}, {setting(g)} ({name})", ""]
        if g.note:
            lines += [_cell(g.note), ""]
        lines += [entries_table(g), ""]
    return "\n".join(lines)


def records_page(runs: Sequence[tuple[str, records.Run]]) -> str:
    """The All records page for (name, record) pairs, in the order given."""
    parts = [_RECORDS_INTRO]
    parts += [record_section(name, run) for name, run in runs]
    return "\n".join(parts).rstrip("\n") + "\n"


def page(runs: Sequence[tuple[str, records.Run]]) -> str:
    """The benchmark page: the summary and the questions it answers, from
    each suite's record among `runs`.

    Raises:
        canonical.CanonicalError: a suite without a record, or with two.
    """
    picked = canonical.pick(runs)
    one = canonical.require(picked, canonical.SINGLE_HOST)
    hosts = canonical.require(picked, canonical.HOSTS)
    rows = summary.rows(picked)
    lines = [
        "# Benchmark",
        "",
        _GENERATED,
        "Who wins where, from each suite's latest record: one host from "
        f"[`{one.name}`](records.md#{one.name}) ({one.why}); between hosts "
        f"and the example job from [`{hosts.name}`](records.md#{hosts.name}) "
        f"({hosts.why}). [All records](records.md) has every record with its "
        "machine, command and every candidate's time.",
        "",
        "## Summary",
        "",
        "One host: ResNet-50's gradients on logical CPU devices. Between "
        "hosts: the same gradients, one worker per emulated host, links "
        f"shaped to {summary.host_groups(hosts.run)[0].link_rate} each way, "
        "an equal share of the machine's cores each. The training job: "
        "examples/s of the example job (`benchmarks.training`).",
        "",
        summary.table(rows),
        "",
        "In brackets: how many times TensorFlow's best ours is (above 1: "
        "ours is faster). Bound: one host, the fastest plain sum of the "
        "same bytes in the same run; between hosts, the wire roofline "
        "2(p-1)/p x size / link rate; the job's record has none. Fastest "
        "leaves PowerSGD out (it changes the training); the hosts' table "
        "below has it. Which configuration each cell is:",
        "",
        *summary.names(rows),
        "",
        summary.questions(picked, PLOTS_DIR, list(plots.PLOTS)),
    ]
    return "\n".join(lines).rstrip("\n") + "\n"


# Where the site build puts the plots (benchmarks.mkdocs_hooks), relative
# to the benchmark page.
PLOTS_DIR = "plots"


def read_records(directory: pathlib.Path) -> list[tuple[str, records.Run]]:
    """Every `*.json` record of `directory`, by file name."""
    return canonical.read(directory)


def write(
    directory: pathlib.Path = RECORDS_DIR,
    output: pathlib.Path = PAGE,
    records_output: pathlib.Path = RECORDS_PAGE,
) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes both pages for `directory`'s records."""
    runs = read_records(directory)
    output.write_text(page(runs))
    records_output.write_text(records_page(runs))
    return output, records_output


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--records_dir",
        type=pathlib.Path,
        default=RECORDS_DIR,
        help="folder of the benchmark's JSON records",
    )
    parser.add_argument(
        "--output",
        type=pathlib.Path,
        default=PAGE,
        help="the page to write (default: docs/benchmark/index.md)",
    )
    parser.add_argument(
        "--records_output",
        type=pathlib.Path,
        default=RECORDS_PAGE,
        help="the All records page (default: docs/benchmark/records.md)",
    )
    args = parser.parse_args(argv)
    for path in write(args.records_dir, args.output, args.records_output):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
