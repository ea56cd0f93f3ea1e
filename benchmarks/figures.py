"""Measured figures in the guides: placeholders the site build fills.

A guide never types a measured figure; it writes a placeholder

    {{ figure("NAME", ARG, ...) }}

and the site build (`benchmarks.mkdocs_hooks`) replaces it with the value
from the suite's record that `canonical.pick` chose, linked to that
record's section of the benchmark's "All records" page. NAME is one of
FIGURES; ARGs are Python literals (strings, integers). Between hosts,
the host count picks the group (one local device unless `local=` says).

- `target(label, hosts[, local])`: a target's measured value, e.g.
  `target("PowerSGD vs the fastest uncompressed", 2)` -> "6.05";
  `target_threshold` and `target_met` ("met" or "not met") alike. The
  label is what follows ": " in the target's name (`targets.line`).
- `time(entry, hosts[, local])`: an entry's time, "870.7 ms".
- `sent(entry, hosts)`: MiB the busiest host sent per call, "1.6 MiB".
- `gradient_size()`: the gradients all-reduced between hosts, "97.6 MiB".
- `job_vs_tf(job, hosts)`: a training job's examples/s over TensorFlow's
  fastest job's at that host count, "1.79x".
- `single_host_vs_tf(devices[, workload])`: TensorFlow's best time over
  our fastest on one host, "1.20x".
- From the record of `python -m benchmarks.communicate`, at a link rate
  ("100mbit"), against the level "the synchronous run's final held-out
  accuracy minus 1 point": `first_to_level(rate)`, the method that
  reached it first, "DiLoCo H=32 (41.2 s)"; `time_to_level(method, rate)`,
  "41.2 s" or "not reached"; `final_accuracy(method, rate)`, "0.812".

A placeholder that names no figure, or a figure its record lacks, raises
`FigureError` naming the placeholder: the site build fails.
"""

from __future__ import annotations

import ast
import dataclasses
import posixpath
import re
from collections.abc import Callable
from typing import Any

from benchmarks import canonical, communicate, records, summary

PLACEHOLDER = re.compile(r"\{\{\s*figure\((?P<args>[^{}]*)\)\s*\}\}")
# What opens a placeholder (a call in double braces), caught where
# PLACEHOLDER does not match; TensorFlow's "[[{{node X}}]]" in an error
# message a guide quotes is no call.
OPENING = re.compile(r"\{\{\s*\w+\s*\(")
RECORDS_PAGE = "benchmark/records.md"


class FigureError(ValueError):
    """A placeholder that cannot be filled."""


@dataclasses.dataclass(frozen=True)
class Figure:
    """A filled placeholder: its text and the record it came from."""

    text: str
    record: str


Picked = dict[str, canonical.Canonical]


def _hosts_group(
    picked: Picked, hosts: int, local: int = 1
) -> tuple[canonical.Canonical, records.Group]:
    suite = canonical.require(picked, canonical.HOSTS)
    for g in summary.host_groups(suite.run, local):
        if g.num_replicas == hosts:
            return suite, g
    raise FigureError(
        f"{suite.name} has no group at {hosts} hosts x {local} devices"
    )


def _target(picked: Picked, label: str, hosts: int, local: int = 1):
    suite = canonical.require(picked, canonical.HOSTS)
    wheres = [f"example job, {hosts} emulated hosts at "]
    wheres += [
        f"{g.workload}, {g.scope}: "
        for g in summary.host_groups(suite.run, local)
        if g.num_replicas == hosts
    ]
    found = [
        t
        for t in suite.run.targets
        if t.name.endswith(": " + label)
        and any(t.name.startswith(w) for w in wheres)
    ]
    if len(found) != 1:
        raise FigureError(
            f"{suite.name} has {len(found)} targets {label!r} at {hosts} "
            f"hosts x {local} devices, not one"
        )
    return suite, found[0]


def target(picked: Picked, label: str, hosts: int, local: int = 1) -> Figure:
    suite, t = _target(picked, label, hosts, local)
    if t.measured is None:
        raise FigureError(f"{suite.name}: target {label!r} has no figure")
    return Figure(f"{t.measured:.2f}", suite.name)


def target_threshold(
    picked: Picked, label: str, hosts: int, local: int = 1
) -> Figure:
    suite, t = _target(picked, label, hosts, local)
    return Figure(f"{t.threshold:g}", suite.name)


def target_met(
    picked: Picked, label: str, hosts: int, local: int = 1
) -> Figure:
    suite, t = _target(picked, label, hosts, local)
    return Figure("met" if t.met else "not met", suite.name)


def time(picked: Picked, entry: str, hosts: int, local: int = 1) -> Figure:
    suite, g = _hosts_group(picked, hosts, local)
    seconds = g.time(entry)
    if seconds is None:
        raise FigureError(f"{suite.name}: no time for {entry!r} at {hosts}")
    return Figure(f"{seconds * 1e3:.1f} ms", suite.name)


def sent(picked: Picked, entry: str, hosts: int) -> Figure:
    suite, g = _hosts_group(picked, hosts)
    r = next((r for r in g.results if r.name == entry), None)
    if r is None or not r.sent_bytes_per_host:
        raise FigureError(f"{suite.name}: no bytes for {entry!r} at {hosts}")
    return Figure(f"{max(r.sent_bytes_per_host) / 2**20:.1f} MiB", suite.name)


def gradient_size(picked: Picked) -> Figure:
    suite = canonical.require(picked, canonical.HOSTS)
    groups = summary.host_groups(suite.run)
    if not groups:
        raise FigureError(f"{suite.name} has no group on emulated hosts")
    return Figure(f"{groups[0].size_bytes / 2**20:.1f} MiB", suite.name)


def job_vs_tf(picked: Picked, job: str, hosts: int) -> Figure:
    suite = canonical.require(picked, canonical.HOSTS)
    here = [
        j
        for j in suite.run.training
        if j.hosts == hosts and not j.error and j.examples_per_second
    ]
    mine = next((j for j in here if j.name == job), None)
    tf = [
        j.examples_per_second or 0.0 for j in here if j.name.startswith("TF ")
    ]
    if mine is None or not tf:
        raise FigureError(f"{suite.name}: no job {job!r} or TF's at {hosts}")
    return Figure(
        f"{(mine.examples_per_second or 0.0) / max(tf):.2f}x", suite.name
    )


def single_host_vs_tf(
    picked: Picked, devices: int, workload: str = summary.WORKLOAD
) -> Figure:
    suite = canonical.require(picked, canonical.SINGLE_HOST)
    for g in summary.single_host_groups(suite.run, workload):
        if g.num_replicas == devices:
            ratio = records.ratio(
                g.time(g.tf_best), g.time(summary.fastest_exact(g))
            )
            if ratio is not None:
                return Figure(f"{ratio:.2f}x", suite.name)
    raise FigureError(f"{suite.name}: no {workload} at {devices} devices")


def _communicate(link_rate: str) -> tuple[str, list[Any], float]:
    """The communicate record's name, its runs at `link_rate`, and the
    level (the synchronous run's final accuracy minus 1 point)."""
    path = communicate.RECORD
    if not path.exists():
        raise FigureError(
            f"no record {path.name} (python -m benchmarks.communicate)"
        )
    curves = communicate.curves_of(records.Run.read(path))
    here = [c for c in curves if c.link_rate == link_rate]
    sync = next((c for c in here if c.method == communicate.SYNC), None)
    if sync is None or sync.final_accuracy is None:
        raise FigureError(f"{path.stem}: no synchronous run at {link_rate}")
    return path.stem, here, sync.final_accuracy - communicate.LEVEL_BELOW


def first_to_level(picked: Picked, link_rate: str) -> Figure:
    name, here, level = _communicate(link_rate)
    reached = [
        (seconds, c.method)
        for c in here
        if (seconds := c.time_to(level)) is not None
    ]
    seconds, method = min(reached)  # The synchronous run reaches it.
    return Figure(f"{method} ({seconds:.1f} s)", name)


def time_to_level(picked: Picked, method: str, link_rate: str) -> Figure:
    name, here, level = _communicate(link_rate)
    curve = next((c for c in here if c.method == method), None)
    if curve is None:
        raise FigureError(f"{name}: no run of {method!r} at {link_rate}")
    seconds = curve.time_to(level)
    text = "not reached" if seconds is None else f"{seconds:.1f} s"
    return Figure(text, name)


def final_accuracy(picked: Picked, method: str, link_rate: str) -> Figure:
    name, here, _ = _communicate(link_rate)
    curve = next((c for c in here if c.method == method), None)
    if curve is None or curve.final_accuracy is None:
        raise FigureError(f"{name}: no final accuracy of {method!r}")
    return Figure(f"{curve.final_accuracy:.3f}", name)


FIGURES: dict[str, Callable[..., Figure]] = {
    f.__name__: f
    for f in (
        target,
        target_threshold,
        target_met,
        time,
        sent,
        gradient_size,
        job_vs_tf,
        single_host_vs_tf,
        first_to_level,
        time_to_level,
        final_accuracy,
    )
}


def _args(text: str) -> tuple[list[Any], dict[str, Any]]:
    """The literals of `figure(...)`'s arguments."""
    call = ast.parse(f"f({text})", mode="eval").body
    if not isinstance(call, ast.Call) or any(
        k.arg is None for k in call.keywords
    ):
        raise FigureError("expected figure(NAME, literal, ..., name=literal)")
    args = [ast.literal_eval(a) for a in call.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    return args, kwargs


def value(picked: Picked, placeholder: str) -> Figure:
    """The figure one placeholder stands for.

    Raises:
        FigureError: naming the placeholder, when it cannot be filled.
    """
    found = PLACEHOLDER.fullmatch(placeholder.strip())
    try:
        if not found:
            raise FigureError("not a placeholder")
        args, kwargs = _args(found["args"])
        if not args or args[0] not in FIGURES:
            raise FigureError(f"no such figure; known: {', '.join(FIGURES)}")
        return FIGURES[args[0]](picked, *args[1:], **kwargs)
    except (FigureError, canonical.CanonicalError) as e:
        raise FigureError(f"{placeholder}: {e}") from None
    except (SyntaxError, ValueError, TypeError) as e:
        raise FigureError(f"{placeholder}: bad arguments ({e})") from None


def fill(markdown: str, picked: Picked, page: str) -> str:
    """`markdown` with every placeholder replaced by its figure, linked to
    the record's section on the All records page.

    Args:
        markdown: the page's text.
        picked: `canonical.pick`'s records.
        page: the page's path under docs/, for the links and messages.

    Raises:
        FigureError: naming the page and placeholder that cannot be filled.
    """
    to_records = posixpath.relpath(RECORDS_PAGE, posixpath.dirname(page) or ".")

    def one(found: re.Match[str]) -> str:
        try:
            figure = value(picked, found[0])
        except FigureError as e:
            raise FigureError(f"{page}: {e}") from None
        return f"[{figure.text}]({to_records}#{figure.record})"

    out = PLACEHOLDER.sub(one, markdown)
    stray = OPENING.search(out)
    if stray:
        line = out.count("\n", 0, stray.start()) + 1
        raise FigureError(
            f"{page}, line {line}: {stray[0]!r} opens no placeholder "
            '({{ figure("NAME", ...) }})'
        )
    return out
