"""The benchmark page's plots, drawn from the suites' records.

The site build draws them (`benchmarks.mkdocs_hooks` adds each as
`benchmark/plots/NAME`); they read the same records as the summary
(`canonical.pick`): time against the tensors' size on one host, time and
bytes sent per host against the host count, and the training job's
examples/s and scaling efficiency against the host count. A record that
holds accuracy curves (`benchmarks.communicate`) has a figure of its own,
`record_plots`: held-out accuracy against training time, one panel per
link rate, drawn under the record's name.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence

import matplotlib

# No display where the site is built: draw with Agg, write SVG.
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from benchmarks import canonical, communicate, records, summary  # noqa: E402

# SVG that is the same bytes for the same records.
matplotlib.rcParams["svg.hashsalt"] = "tf_crossdevice"


def _svg(fig: Figure) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue()


def _series(
    groups: Sequence[records.Group], pick: Callable[[records.Group], str | None]
) -> tuple[list[float], list[float]]:
    """(x, seconds) of `pick`'s entry in each group that timed it; x is the
    group's size for one host, its host count between hosts."""
    xs, ys = [], []
    for g in groups:
        t = g.time(pick(g))
        if t:
            x = g.size_bytes if g.link_rate is None else g.num_replicas
            xs.append(float(x))
            ys.append(t)
    return xs, ys


def single_host(picked: dict[str, canonical.Canonical]) -> str:
    """Time against the tensors' total size, one panel per device count."""
    run = canonical.require(picked, canonical.SINGLE_HOST).run
    groups = [
        g
        for g in run.groups
        if g.setting == "single_process" and not (g.error or g.skipped)
    ]
    counts = sorted({g.num_replicas for g in groups})
    fig = Figure(figsize=(4 * max(len(counts), 1), 3.6), layout="constrained")
    axes = fig.subplots(1, max(len(counts), 1), squeeze=False)[0]
    lines = (
        ("TensorFlow's best", lambda g: g.tf_best, "--"),
        ("ours, fastest", summary.fastest_exact, "-"),
        ("ours, default", lambda g: summary.SINGLE_HOST_DEFAULT, "-."),
        ("roofline (plain sum)", lambda g: g.roofline, ":"),
    )
    for ax, n in zip(axes, counts, strict=False):
        here = sorted(
            (g for g in groups if g.num_replicas == n),
            key=lambda g: g.size_bytes,
        )
        for label, pick, style in lines:
            x, y = _series(here, pick)
            ax.plot(
                [v / 2**20 for v in x],
                [v * 1e3 for v in y],
                style,
                marker="o",
                label=label,
            )
        ax.set(
            xscale="log",
            yscale="log",
            title=f"{n} logical CPU devices",
            xlabel="gradients all-reduced (MiB)",
            ylabel="time (ms)",
        )
    axes[0].legend(fontsize="small")
    return _svg(fig)


def hosts(picked: dict[str, canonical.Canonical]) -> str:
    """Time, and bytes each host sent, against the host count."""
    groups = summary.host_groups(canonical.require(picked, canonical.HOSTS).run)
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    time_ax, bytes_ax = fig.subplots(1, 2)
    lines = (
        ("TensorFlow's best", lambda g: g.tf_best, "--"),
        ("CollectiveAllReduce()", lambda g: summary.HOSTS_DEFAULT, "-."),
        ("ours, fastest (exact or 16-bit)", summary.fastest_exact, "-"),
        ("ours, PowerSGD rank 4", summary.fastest_powersgd, "-"),
        ("wire roofline", lambda g: g.roofline, ":"),
    )
    for label, pick, style in lines:
        x, y = _series(groups, pick)
        time_ax.plot(x, [v * 1e3 for v in y], style, marker="o", label=label)
        x, sent = _sent(groups, pick)
        if sent:
            bytes_ax.plot(x, sent, style, marker="o", label=label)
    x = [float(g.num_replicas) for g in groups]
    model = [
        2 * (g.num_replicas - 1) / g.num_replicas * g.size_bytes / 2**20
        for g in groups
    ]
    bytes_ax.plot(x, model, ":", color="black", label="2(p-1)/p x gradients")
    time_ax.set(xlabel="emulated hosts", ylabel="time (ms)", yscale="log")
    time_ax.set_title("ResNet-50's gradients, all-reduced")
    bytes_ax.set(xlabel="emulated hosts", ylabel="MiB sent, busiest host")
    bytes_ax.set(yscale="log", title="bytes on each host's link")
    for ax in (time_ax, bytes_ax):
        ax.set_xticks(x)
    time_ax.legend(fontsize="small")
    return _svg(fig)


def _sent(
    groups: Sequence[records.Group], pick: Callable[[records.Group], str | None]
) -> tuple[list[float], list[float]]:
    """(host count, MiB the busiest host sent per call) where counted."""
    xs, ys = [], []
    for g in groups:
        name = pick(g)
        r = next((r for r in g.results if r.name == name), None)
        if r is not None and r.sent_bytes_per_host:
            xs.append(float(g.num_replicas))
            ys.append(max(r.sent_bytes_per_host) / 2**20)
    return xs, ys


def training(picked: dict[str, canonical.Canonical]) -> str:
    """The example job's examples/s and scaling efficiency per host count."""
    jobs = [
        j
        for j in canonical.require(picked, canonical.HOSTS).run.training
        if not j.error
    ]
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    rate_ax, scale_ax = fig.subplots(1, 2)
    for name in dict.fromkeys(j.name for j in jobs):
        mine = sorted(
            (j for j in jobs if j.name == name), key=lambda j: j.hosts
        )
        style = "--" if name.startswith("TF ") else "-"
        x = [j.hosts for j in mine]
        rate_ax.plot(
            x,
            [j.examples_per_second for j in mine],
            style,
            marker="o",
            label=name,
        )
        scale_ax.plot(
            x,
            [j.scaling_efficiency for j in mine],
            style,
            marker="o",
            label=name,
        )
    hosts_seen = sorted({j.hosts for j in jobs})
    rate_ax.set(xlabel="emulated hosts", ylabel="examples/s")
    rate_ax.set_title("the example job's throughput")
    scale_ax.set(xlabel="emulated hosts", ylabel="this host alone / step")
    scale_ax.set(title="scaling efficiency (1: perfect)", ylim=(0, 1.05))
    for ax in (rate_ax, scale_ax):
        ax.set_xticks(hosts_seen)
    fig.legend(
        *rate_ax.get_legend_handles_labels(),
        loc="outside lower center",
        ncols=2,
        fontsize="small",
    )
    return _svg(fig)


def accuracy_against_time(run: records.Run) -> str:
    """Held-out accuracy against training time, one panel per link rate,
    with the level the targets ask (the synchronous run's final - 1 point);
    each method's label says what its busiest host sent."""
    curves = communicate.curves_of(run)
    rates = list(dict.fromkeys(c.link_rate for c in curves))
    fig = Figure(figsize=(4.2 * max(len(rates), 1), 4.2), layout="constrained")
    axes = fig.subplots(1, max(len(rates), 1), squeeze=False, sharey=True)[0]
    styles = dict(zip(communicate.METHODS, ("-", "--", "-.", ":"), strict=True))
    for ax, rate in zip(axes, rates, strict=False):
        for c in (c for c in curves if c.link_rate == rate):
            counted = c.bytes_per_host()
            sent = (
                f", {max(counted[0]) / 2**20:.3g} MiB/host" if counted else ""
            )
            ax.plot(
                [p.seconds for p in c.checkpoints],
                [100 * p.accuracy for p in c.checkpoints],
                styles.get(c.method, "-"),
                marker="o",
                markersize=3,
                label=c.method + sent + (" (failed)" if c.error else ""),
            )
        finals = [
            c.final_accuracy
            for c in curves
            if c.link_rate == rate and c.method == communicate.SYNC
        ]
        if finals and finals[0] is not None:
            level = 100 * (finals[0] - communicate.LEVEL_BELOW)
            ax.axhline(
                level,
                color="gray",
                linewidth=0.8,
                linestyle=":",
                label="synchronous final - 1 point",
            )
        scored = "" if rate in communicate.SCORED_RATES else ", not scored"
        ax.set(
            title=f"{communicate.HOSTS} emulated hosts at {rate}{scored}",
            xlabel="training time (s, start-up included)",
            ylabel="held-out accuracy (%)",
            xlim=(0, None),
        )
        ax.legend(fontsize="x-small", loc="best")
    return _svg(fig)


def record_plot(name: str, run: records.Run) -> str | None:
    """The file name of record `name`'s own figure, if it has one."""
    return f"{name}.svg" if communicate.curves_of(run) else None


def record_plots(runs: Sequence[tuple[str, records.Run]]) -> dict[str, str]:
    """The figures of records that have one of their own (`record_plot`),
    by file name under benchmark/plots/."""
    drawn = {}
    for name, run in runs:
        file = record_plot(name, run)
        if file is not None:
            drawn[file] = accuracy_against_time(run)
    return drawn


# File name under benchmark/plots/ -> the function that draws it.
PLOTS: dict[str, Callable[[dict[str, canonical.Canonical]], str]] = {
    "single_host.svg": single_host,
    "hosts.svg": hosts,
    "training.svg": training,
}


def draw(picked: dict[str, canonical.Canonical]) -> dict[str, str]:
    """Every plot's SVG, by file name."""
    return {name: plot(picked) for name, plot in PLOTS.items()}
