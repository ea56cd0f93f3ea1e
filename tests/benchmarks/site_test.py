"""benchmarks.site: the documentation's benchmark page, written from the
records (every figure on it comes from a record's JSON)."""

import pathlib

from benchmarks import records, site

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


def test_page_from_a_record_has_its_meta_and_table_rows(tmp_path):
    _record(tmp_path / "small.json")
    output = site.write(tmp_path, tmp_path / "index.md")
    assert output == tmp_path / "index.md"
    lines = output.read_text().splitlines()
    assert "## small" in lines
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
    text = site.page([("small", run)])
    assert "- date:" not in text and "```sh" not in text
    assert "| ours SpecAllReduce pscpu | ours | 3.000 | 2.67 | 0.33 |" in text


def test_the_committed_page_is_what_the_records_give(tmp_path):
    """Adding or changing a record needs `python -m benchmarks.site`."""
    committed = site.PAGE
    assert site.RECORDS_DIR == REPO / "benchmarks" / "records"
    assert committed == REPO / "docs" / "benchmark" / "index.md"
    written = site.write(site.RECORDS_DIR, tmp_path / "index.md")
    assert committed.read_text() == written.read_text(), (
        "docs/benchmark/index.md is stale: run `python -m benchmarks.site`"
    )


def test_command_line_writes_the_page(tmp_path, capsys):
    _record(tmp_path / "small.json")
    out = tmp_path / "page.md"
    assert (
        site.main(["--records_dir", str(tmp_path), "--output", str(out)]) == 0
    )
    assert "## small" in out.read_text()
    assert str(out) in capsys.readouterr().out
