"""benchmarks.site: the documentation's benchmark page, written from the
records (every figure on it comes from a record's JSON)."""

import json
import pathlib

import pytest

from benchmarks import canonical, figures, plots, records, site, summary

REPO = pathlib.Path(__file__).resolve().parents[2]


def _record(path: pathlib.Path) -> None:
    group = records.Group(
        "single_process", "many_small", "", 4, 1000, 1 << 20, 1 << 18, "float32"
    )
    records.add_results(
        group,
        [
            records.entry_of("base", "baseline", None, [0.001] * 3),
            records.entry_of(
                "roofline: numpy", "roofline", "base", [0.002] * 3
            ),
            records.entry_of(
                "TF ReductionToOneDevice", "tf", "base", [0.009] * 3
            ),
            records.entry_of(
                "ours SpecAllReduce pscpu", "ours", "base", [0.004] * 3
            ),
        ],
    )
    meta = {
        "date": "2025-01-02",
        "machine": "2 CPU cores (x86_64)",
        "command": "python -m benchmarks --workloads=many_small --devices=4",
    }
    skipped = {"ours NcclAllReduce": "NCCL has no CPU kernel"}
    records.Run(meta, skipped, [group], []).write(path)


def test_records_page_from_a_record_has_its_meta_and_table_rows(tmp_path):
    _record(tmp_path / "small.json")
    run = records.Run.read(tmp_path / "small.json")
    lines = site.records_page([("small", run)]).splitlines()
    # Titled by what it measured; the anchor keeps links by file name.
    assert "## many small tensors on 4 logical CPUs in one process" in lines
    assert '<a id="small"></a>' in lines
    assert "- record: `benchmarks/records/small.json`" in lines
    assert "- date: 2025-01-02" in lines
    assert "- machine: 2 CPU cores (x86_64)" in lines
    assert "python -m benchmarks --workloads=many_small --devices=4" in lines
    assert "- ours NcclAllReduce: NCCL has no CPU kernel" in lines
    # Net times: TF 8 ms, ours 3 ms, roofline 1 ms (median minus base).
    assert (
        "| many_small | 4 logical CPUs | 1000 / 1 MiB | ReductionToOneDevice "
        "| 8.000 | SpecAllReduce pscpu | 3.000 | 2.67 | 0.33 |"
    ) in lines
    assert "| ours SpecAllReduce pscpu | ours | 3.000 | 2.67 | 0.33 |" in lines
    assert "| TF ReductionToOneDevice | tf | 8.000 | 1.00 | 0.12 |" in lines
    assert "| roofline: numpy | roofline | 1.000 | 8.00 | 1.00 |" in lines


def test_a_record_without_date_or_command_leaves_them_out(tmp_path):
    _record(tmp_path / "small.json")
    run = records.Run.read(tmp_path / "small.json")
    run.meta = {}
    text = site.records_page([("small", run)])
    assert "- date:" not in text and "```sh" not in text
    assert "| ours SpecAllReduce pscpu | ours | 3.000 | 2.67 | 0.33 |" in text


def test_the_committed_pages_are_what_the_records_give(tmp_path):
    """Adding or changing a record needs `python -m benchmarks.site`."""
    assert site.RECORDS_DIR == REPO / "benchmarks" / "records"
    assert site.PAGE == REPO / "docs" / "benchmark" / "index.md"
    assert site.RECORDS_PAGE == REPO / "docs" / "benchmark" / "records.md"
    written = site.write(
        site.RECORDS_DIR, tmp_path / "index.md", tmp_path / "records.md"
    )
    for committed, fresh in zip(
        (site.PAGE, site.RECORDS_PAGE), written, strict=True
    ):
        assert committed.read_text() == fresh.read_text(), (
            f"{committed.name} is stale: run `python -m benchmarks.site`"
        )


def test_command_line_writes_both_pages(tmp_path, capsys):
    out, records_out = tmp_path / "page.md", tmp_path / "records.md"
    argv = ["--output", str(out), "--records_output", str(records_out)]
    assert site.main(argv) == 0
    assert out.read_text().startswith("# Benchmark\n")
    assert "## Summary" in out.read_text()
    assert records_out.read_text().startswith("# All records\n")
    printed = capsys.readouterr().out
    assert str(out) in printed and str(records_out) in printed


def _raw(name):
    return json.loads((site.RECORDS_DIR / f"{name}.json").read_text())


def _raw_time(group, name):
    """A result's net time as the record stores it: the confirmation
    rounds' where it was re-timed, else its rounds'."""
    if name in group["confirmed"]:
        return group["confirmed"][name]
    return next(r for r in group["results"] if r["name"] == name)[
        "time_seconds"
    ]


def _summary_lines():
    picked = canonical.pick(canonical.read(site.RECORDS_DIR))
    return summary.table(summary.rows(picked)).splitlines()


def test_summary_between_hosts_is_the_suite_records_own_figures():
    hosts = _raw("hosts_suite_1gbit")
    assert "--suite=hosts" in hosts["meta"]["command"]
    (g,) = [
        g
        for g in hosts["groups"]
        if g["num_replicas"] == 2 and g["local_devices"] == 1
    ]
    tf = _raw_time(g, g["tf_best"])
    # Our fastest exact entry at 2 hosts, read off the record's table.
    ours = _raw_time(
        g,
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) "
        "agg_small=64KiBx1024 compression=bf16",
    )
    default = _raw_time(g, "ours CollectiveAllReduce")
    # The wire roofline: each host sends 2(p-1)/p of the bytes at 1 Gbit/s.
    wire = 2 * (2 - 1) / 2 * g["size_bytes"] * 8 / 1e9
    assert g["link_rate"] == "1gbit"
    expected = (
        f"| 2 emulated hosts | {tf * 1e3:.2f} ms | {ours * 1e3:.2f} ms "
        f"({tf / ours:.2f}x) | {default * 1e3:.2f} ms ({tf / default:.2f}x) "
        f"| {wire * 1e3:.2f} ms |"
    )
    assert expected == (
        "| 2 emulated hosts | 869.10 ms | 441.38 ms (1.97x) | 884.44 ms "
        "(0.98x) | 818.67 ms |"
    )
    assert expected in _summary_lines()


def test_summary_of_one_host_and_the_job_are_the_records_own_figures():
    (g,) = [
        g
        for g in _raw("autotune248")["groups"]
        if g["workload"] == "resnet50" and g["num_replicas"] == 4
    ]
    tf = _raw_time(g, g["tf_best"])
    ours = _raw_time(g, "ours SpecAllReduce psgpu agg_small=64KiBx1024")
    default = _raw_time(g, "ours SpecAllReduce pscpu agg_small=64KiBx1024")
    roof = _raw_time(g, g["roofline"])
    one_host = (
        f"| 1 host, 4 devices | {tf * 1e3:.2f} ms | {ours * 1e3:.2f} ms "
        f"({tf / ours:.2f}x) | {default * 1e3:.2f} ms ({tf / default:.2f}x) "
        f"| {roof * 1e3:.2f} ms |"
    )
    jobs = {
        j["name"]: j["examples_per_second"]
        for j in _raw("hosts_suite_1gbit")["training"]
        if j["hosts"] == 2
    }
    tf_job = max(
        jobs["TF MWMS bytes_per_pack=2MiB"], jobs["TF MWMS bytes_per_pack=4MiB"]
    )
    fastest = jobs[
        "ours in-graph MultiWorkerAllReduce pscpu, a shard per host "
        "compression=bf16"
    ]
    mine = jobs["ours CollectiveAllReduce"]
    job = (
        f"| training job, 2 hosts | {tf_job:.0f} examples/s | {fastest:.0f} "
        f"examples/s ({fastest / tf_job:.2f}x) | {mine:.0f} examples/s "
        f"({mine / tf_job:.2f}x) | - |"
    )
    assert job == (
        "| training job, 2 hosts | 2683 examples/s | 4683 examples/s (1.75x) "
        "| 2718 examples/s (1.01x) | - |"
    )
    lines = _summary_lines()
    assert one_host in lines and job in lines


def test_a_placeholder_is_the_targets_figure_linked_to_its_record():
    hosts = _raw("hosts_suite_1gbit")
    (t,) = [
        t
        for t in hosts["targets"]
        if t["name"].startswith("resnet50, 4 emulated hosts at 1gbit, each")
        and t["name"].endswith(": PowerSGD vs the fastest uncompressed")
    ]
    picked = canonical.pick(canonical.read(site.RECORDS_DIR))
    text = (
        'At 4: {{ figure("target", "PowerSGD vs the fastest uncompressed", 4) '
        '}}, {{ figure("target_met", "PowerSGD vs the fastest uncompressed", '
        "4) }}."
    )
    filled = figures.fill(text, picked, "guides/powersgd.md")
    link = "../benchmark/records.md#hosts_suite_1gbit"
    verdict = "met" if t["met"] else "not met"
    assert (
        filled == f"At 4: [{t['measured']:.2f}]({link}), [{verdict}]({link})."
    )
    assert filled == f"At 4: [4.46]({link}), [not met]({link})."


def test_placeholders_that_cannot_be_filled_name_themselves():
    picked = canonical.pick(canonical.read(site.RECORDS_DIR))
    bad = [
        ('{{ figure("no_such_figure") }}', "no such figure"),
        (
            '{{ figure("target", "PowerSGD vs the fastest uncompressed", 5) }}',
            "0 targets",
        ),
        ('{{ figure("time", "ours Nothing", 2) }}', "no time for"),
        ("{{ figure(target) }}", "bad arguments"),
    ]
    for placeholder, why in bad:
        with pytest.raises(figures.FigureError) as error:
            figures.fill(f"a\n{placeholder}\n", picked, "guides/x.md")
        message = str(error.value)
        assert message.startswith(f"guides/x.md: {placeholder}: "), message
        assert why in message
    with pytest.raises(figures.FigureError, match="line 2: .*figur"):
        figures.fill('a\n{{ figur("time") }}\n', picked, "guides/x.md")


def test_a_suite_without_its_record_fails_the_placeholder():
    runs = [
        (name, run)
        for name, run in canonical.read(site.RECORDS_DIR)
        if name != "hosts_suite_1gbit"
    ]
    picked = canonical.pick(runs)
    with pytest.raises(figures.FigureError, match="no record of --suite=hosts"):
        figures.fill('{{ figure("gradient_size") }}', picked, "guides/x.md")


def test_two_records_of_one_suite_are_an_error():
    run = records.Run(
        {"command": "python -m benchmarks --suite=hosts"}, {}, [], []
    )
    with pytest.raises(canonical.CanonicalError, match="a and b"):
        canonical.pick([("a", run), ("b", run)])


def test_the_plots_are_svg_drawn_from_the_records():
    picked = canonical.pick(canonical.read(site.RECORDS_DIR))
    drawn = plots.draw(picked)
    assert sorted(drawn) == ["hosts.svg", "single_host.svg", "training.svg"]
    for svg in drawn.values():
        assert svg.startswith("<?xml") and "<svg" in svg
    page = site.PAGE.read_text()
    assert all(f"](plots/{name})" in page for name in drawn)
