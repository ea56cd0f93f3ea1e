"""The benchmark page's summary: who wins where, and by how much.

Every figure comes from the suites' records that `canonical.pick` chose:
one host from its single-host record (ResNet-50's gradients at each device
count), between hosts and the training job from `--suite=hosts`. A row
holds TensorFlow's best, our fastest and our default, and the physical
bound the record carries (one host: the fastest plain sum of the same
bytes, timed in the same run; between hosts: the wire roofline
2(p-1)/p*S at the link rate).

>>> g = records.Group("single_process", "resnet50", "", 2, 1, 8, 2, "float32")
>>> records.add_results(g, [
...     records.entry_of("base", "baseline", None, [0.001] * 3),
...     records.entry_of("roof", "roofline", "base", [0.002] * 3),
...     records.entry_of("TF x", "tf", "base", [0.009] * 3),
...     records.entry_of(SINGLE_HOST_DEFAULT, "ours", "base", [0.005] * 3),
...     records.entry_of("ours y", "ours", "base", [0.004] * 3)])
>>> row = group_row("2 devices", g, SINGLE_HOST_DEFAULT)
>>> print(table([row]).splitlines()[-1])
| 2 devices | 8.00 ms | 3.00 ms (2.67x) | 4.00 ms (2.00x) | 1.00 ms |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from benchmarks import canonical, records, targets, training

# What one host runs without arguments: select_cross_device_ops on CPUs,
# pscpu with small tensors packed.
SINGLE_HOST_DEFAULT = "ours SpecAllReduce pscpu agg_small=64KiBx1024"
# Between hosts: CollectiveAllReduce() (one device per host).
HOSTS_DEFAULT = targets.FLAT
TRAINING_DEFAULT = training.DEFAULT_MODES[0]
WORKLOAD = "resnet50"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One cell: an entry's name and its figure (None: not measured)."""

    name: str | None
    value: float | None


@dataclasses.dataclass(frozen=True)
class Row:
    """One setting of the summary.

    Attributes:
        setting: e.g. "2 emulated hosts".
        unit: "ms" (seconds stored, lower is better) or "examples/s".
        tf_best, ours_fastest, ours_default: the three contenders.
        bound: the physical bound in the same unit, if the record has one.
    """

    setting: str
    unit: str
    tf_best: Entry
    ours_fastest: Entry
    ours_default: Entry
    bound: float | None = None

    def vs_tf(self, entry: Entry) -> float | None:
        """How many times faster than TensorFlow's best (above 1: ours)."""
        tf, ours = self.tf_best.value, entry.value
        if self.unit == "examples/s":
            return records.ratio(ours, tf)
        return records.ratio(tf, ours)


def fastest_exact(g: records.Group) -> str | None:
    """Our fastest entry by `Group.time`, PowerSGD left out: it changes
    the training, so the comparisons with TensorFlow leave it out (the
    targets do too)."""
    timed = [
        (t, r.name)
        for r in g.results
        if r.family == "ours"
        and targets.POWERSGD not in r.name
        and (t := g.time(r.name))
    ]
    return min(timed)[1] if timed else None


def group_row(setting: str, g: records.Group, default: str) -> Row:
    """A group's row: times in seconds, the group's roofline as bound."""
    ours = fastest_exact(g)

    def entry(name: str | None) -> Entry:
        return Entry(name, g.time(name))

    return Row(
        setting,
        "ms",
        entry(g.tf_best),
        entry(ours),
        entry(default),
        g.time(g.roofline),
    )


def job_row(setting: str, jobs: Sequence[records.Job]) -> Row:
    """The training job's row at one host count, in examples/s (the
    record has no bound for a whole step)."""
    ok = [j for j in jobs if not j.error and j.examples_per_second]

    def best(prefix: str) -> Entry:
        mine = [j for j in ok if j.name.startswith(prefix)]
        j = max(mine, key=lambda j: j.examples_per_second or 0.0, default=None)
        return Entry(j.name, j.examples_per_second) if j else Entry(None, None)

    default = next((j for j in ok if j.name == TRAINING_DEFAULT), None)
    rate = default.examples_per_second if default else None
    return Row(
        setting,
        "examples/s",
        best("TF "),
        best("ours "),
        Entry(TRAINING_DEFAULT, rate),
    )


def single_host_groups(run: records.Run, workload: str) -> list[records.Group]:
    """The run's timed single-process groups of `workload`, by devices."""
    found = [
        g
        for g in run.groups
        if g.setting == "single_process"
        and g.workload == workload
        and not (g.error or g.skipped)
    ]
    return sorted(found, key=lambda g: g.num_replicas)


def host_groups(
    run: records.Run, local_devices: int = 1
) -> list[records.Group]:
    """The run's groups on emulated hosts with `local_devices` each."""
    found = [
        g
        for g in run.groups
        if g.link_rate is not None and g.local_devices == local_devices
    ]
    return sorted(found, key=lambda g: g.num_replicas)


def rows(picked: dict[str, canonical.Canonical]) -> list[Row]:
    """The summary's rows: one host, between hosts, the training job."""
    one = canonical.require(picked, canonical.SINGLE_HOST).run
    hosts = canonical.require(picked, canonical.HOSTS).run
    out = [
        group_row(f"1 host, {g.num_replicas} devices", g, SINGLE_HOST_DEFAULT)
        for g in single_host_groups(one, WORKLOAD)
    ]
    out += [
        group_row(f"{g.num_replicas} emulated hosts", g, HOSTS_DEFAULT)
        for g in host_groups(hosts)
    ]
    for p in sorted({j.hosts for j in hosts.training}):
        here = [j for j in hosts.training if j.hosts == p]
        out.append(job_row(f"training job, {p} hosts", here))
    return out


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value * 1e3:.2f} ms"
    return f"{value:.0f} {unit}"


def _cell(row: Row, entry: Entry) -> str:
    text = _value(entry.value, row.unit)
    ratio = row.vs_tf(entry)
    return f"{text} ({ratio:.2f}x)" if ratio is not None else text


def table(summary: Sequence[Row]) -> str:
    """The summary as one narrow Markdown table (ratios: vs TF's best)."""
    lines = [
        "| setting | TensorFlow's best | ours, fastest | ours, default "
        "| bound |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in summary:
        cells = [
            r.setting,
            _value(r.tf_best.value, r.unit),
            _cell(r, r.ours_fastest),
            _cell(r, r.ours_default),
            _value(r.bound, r.unit),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def names(summary: Sequence[Row]) -> list[str]:
    """Which entry each cell is, as Markdown list items."""

    def short(entry: Entry) -> str:
        return f"`{entry.name}`" if entry.name else "-"

    return [
        f"- {r.setting}: TensorFlow's best {short(r.tf_best)}; ours fastest "
        f"{short(r.ours_fastest)}; default {short(r.ours_default)}"
        for r in summary
    ]


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.2f}" if seconds else "-"


def _short(name: str | None) -> str:
    return (name or "-").removeprefix("TF ").removeprefix("ours ")


def _markdown_table(
    header: Sequence[str], body: Sequence[Sequence[str]]
) -> str:
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("| " + " | ".join("---" for _ in header) + " |")
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def one_host_section(one: canonical.Canonical, plot: str) -> list[str]:
    """Which all-reduce is fastest on one host, per workload and count."""
    body = []
    for workload in dict.fromkeys(g.workload for g in one.run.groups):
        for g in single_host_groups(one.run, workload):
            ours = fastest_exact(g)
            tf, mine = g.time(g.tf_best), g.time(ours)
            ratio = records.ratio(tf, mine)
            body.append(
                [
                    f"{workload}, {g.num_replicas}",
                    f"{_short(g.tf_best)}: {_ms(tf)}",
                    f"{_short(ours)}: {_ms(mine)}",
                    f"{ratio:.2f}" if ratio else "-",
                    _ms(g.time(g.roofline)),
                ]
            )
    header = (
        "workload, devices",
        "TensorFlow's best (ms)",
        "ours, fastest (ms)",
        "vs TF",
        "roofline (ms)",
    )
    return [
        "## Which all-reduce is fastest on one host?",
        "",
        f"![Time against the gradients' size, per device count]({plot})",
        "",
        f"From `{one.name}`. The devices share the cores and the memory bus, "
        "so every algorithm sums the same bytes: packing small tensors "
        "decides, and on large gradient sets the fastest run near the "
        "roofline (a plain sum of the same bytes).",
        "",
        _markdown_table(header, body),
        "",
    ]


def hosts_section(hosts: canonical.Canonical, plot: str) -> list[str]:
    """Ours against TensorFlow between hosts: time per host count."""
    groups = host_groups(hosts.run)
    header = (
        "hosts",
        "MWMS default",
        "TensorFlow's best",
        "CollectiveAllReduce()",
        "ours, fastest",
        "PowerSGD rank 4",
        "wire roofline",
    )
    body = [
        [
            str(g.num_replicas),
            _ms(g.time("TF MWMS default")),
            _ms(g.time(g.tf_best)),
            _ms(g.time(HOSTS_DEFAULT)),
            _ms(g.time(fastest_exact(g))),
            _ms(g.time(fastest_powersgd(g))),
            _ms(g.time(g.roofline)),
        ]
        for g in groups
    ]
    local = [
        [
            str(g.num_replicas),
            _ms(g.time(g.tf_best)),
            _ms(g.time(targets.HIERARCHICAL)),
            _ms(g.time(HOSTS_DEFAULT)),
        ]
        for g in host_groups(hosts.run, 2)
    ]
    out = [
        "## How do we compare with TensorFlow between hosts?",
        "",
        f"![Time and bytes sent against the host count]({plot})",
        "",
        f"From `{hosts.name}`, times in ms. `CollectiveAllReduce()` runs "
        "TensorFlow's own ring on the same packs as its strategy, so it ties "
        "TensorFlow's best; what beats it sends fewer bytes (16-bit on the "
        "wire) or far fewer (PowerSGD, which changes the training).",
        "",
        _markdown_table(header, body),
        "",
    ]
    if local:
        out += [
            "With 2 devices per host (TensorFlow's strategy keeps one):",
            "",
            _markdown_table(
                (
                    "hosts",
                    "TensorFlow's best",
                    "HierarchicalCollectiveAllReduce()",
                    "CollectiveAllReduce()",
                ),
                local,
            ),
            "",
        ]
    return out


def fastest_powersgd(g: records.Group) -> str | None:
    """Our fastest PowerSGD entry by `Group.time`."""
    timed = [
        (t, r.name)
        for r in g.results
        if r.family == "ours"
        and targets.POWERSGD in r.name
        and (t := g.time(r.name))
    ]
    return min(timed)[1] if timed else None


def training_section(hosts: canonical.Canonical, plot: str) -> list[str]:
    """The example job's examples/s and scaling, per host count."""
    body = []
    for p in sorted({j.hosts for j in hosts.run.training}):
        here = [j for j in hosts.run.training if j.hosts == p and not j.error]
        tf = max(
            (
                j.examples_per_second or 0.0
                for j in here
                if j.name.startswith("TF ")
            ),
            default=None,
        )
        for j in here:
            ratio = records.ratio(j.examples_per_second, tf)
            scaling = j.scaling_efficiency
            body.append(
                [
                    str(p),
                    j.name,
                    f"{j.examples_per_second or 0:.0f}",
                    f"{ratio:.2f}" if ratio else "-",
                    f"{scaling:.2f}" if scaling else "-",
                ]
            )
    header = (
        "hosts",
        "job",
        "examples/s",
        "vs TF's best",
        "scaling efficiency",
    )
    return [
        "## Does the example job scale with hosts?",
        "",
        f"![Examples/s and scaling efficiency against the host count]({plot})",
        "",
        f"From `{hosts.name}`: the example job (`benchmarks.training`), "
        "TensorFlow's strategy and ours one after another in one run. Scaling "
        "efficiency: the step of this host alone over the job's step (1: "
        "perfect).",
        "",
        _markdown_table(header, body),
        "",
    ]


def targets_section(hosts: canonical.Canonical) -> list[str]:
    """How many of the suite's targets are met, and which are not."""
    met = [t for t in hosts.run.targets if t.met]
    missed = [t for t in hosts.run.targets if not t.met]
    return [
        "## Which targets does the suite meet?",
        "",
        f"{len(met)} of {len(hosts.run.targets)} targets of `{hosts.name}` "
        "are met (`benchmarks.targets`). Not met:",
        "",
        *[f"- {targets.line(t)}" for t in missed],
        "",
    ]


def questions(
    picked: dict[str, canonical.Canonical], plots_dir: str, plots: Sequence[str]
) -> str:
    """The page's sections after the summary, each answering a question;
    `plots`: the file names of `benchmarks.plots.PLOTS`, in its order."""
    one_plot, hosts_plot, training_plot = (f"{plots_dir}/{p}" for p in plots)
    one = canonical.require(picked, canonical.SINGLE_HOST)
    hosts = canonical.require(picked, canonical.HOSTS)
    lines = one_host_section(one, one_plot)
    lines += hosts_section(hosts, hosts_plot)
    lines += training_section(hosts, training_plot)
    lines += targets_section(hosts)
    return "\n".join(lines)
