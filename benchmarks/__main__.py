"""Command line: `python -m benchmarks [--quick] [flags]`.

Runs the single-process groups (every workload on 2, 4 and 8 logical CPU
devices), then the multi-worker groups (2 and 3 worker processes), prints
the table and writes `results.txt`, `results.json` and `time_vs_size.png`
to `--output_dir`. Exit code 0 when every result was verified and timed, 2
when some candidate failed (its row says why), 1 on a usage error.

`--quick` (under two minutes on two cores) uses stand-ins: the first 24
ResNet-50 tensors, 32 small tensors, two sweep sizes, 4 devices, 2 workers
and a few candidates per family. Flags given explicitly win over it.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

FLAGS = flags.FLAGS
WORKLOADS = ("resnet50", "bert_base", "many_small", "sweep")

# Flag values `--quick` uses unless the flag is given.
QUICK_DEFAULTS: dict[str, Any] = {
    "workloads": ["resnet50", "many_small", "sweep"],
    "devices": [4],
    "workers": [2],
    "multi_worker_workloads": ["resnet50"],
    "rounds": 5,
    "target_seconds": 0.02,
    "resnet50_tensors": 24,
    "many_small_count": 32,
    "sweep_max_bytes": 4 << 20,
    "sweep_step": 1 << 20,
}


def define_flags() -> None:
    """Defines the command's flags (once per process)."""
    if "quick" in FLAGS:
        return
    flags.DEFINE_bool(
        "quick", False, "A small run (under two minutes): see the docstring."
    )
    flags.DEFINE_string(
        "output_dir", "benchmark_results", "Where the files are written."
    )
    flags.DEFINE_list(
        "workloads",
        list(WORKLOADS),
        f"Single-process workloads, from {', '.join(WORKLOADS)}.",
    )
    flags.DEFINE_list(
        "devices", ["2", "4", "8"], "Logical CPU device counts (one process)."
    )
    flags.DEFINE_list(
        "workers", ["2", "3"], "Worker process counts (empty: none)."
    )
    flags.DEFINE_list(
        "multi_worker_workloads",
        ["resnet50", "many_small"],
        "Workloads across worker processes (resnet50, bert_base, many_small).",
    )
    flags.DEFINE_integer("rounds", 7, "Timing rounds.", lower_bound=1)
    flags.DEFINE_float(
        "target_seconds",
        0.05,
        "Each measurement repeats the step for about this long.",
        lower_bound=0,
    )
    flags.DEFINE_integer(
        "max_reps",
        200,
        "At most this many steps per measurement.",
        lower_bound=1,
    )
    flags.DEFINE_integer(
        "resnet50_tensors",
        214,
        "Use the first N ResNet-50 tensors (214: all).",
        lower_bound=1,
    )
    flags.DEFINE_integer(
        "many_small_count",
        1000,
        "Tensors in the many-small set.",
        lower_bound=1,
    )
    flags.DEFINE_integer("sweep_min_bytes", 4, "Smallest sweep size.")
    flags.DEFINE_integer("sweep_max_bytes", 256 << 20, "Largest sweep size.")
    flags.DEFINE_integer(
        "sweep_step",
        2,
        "Each sweep size is this times the last.",
        lower_bound=2,
    )
    flags.DEFINE_string(
        "candidates",
        "",
        "Only our candidates whose name matches one of these comma-separated "
        "regular expressions (re.search), e.g. 'SpecAllReduce (pscpu|xring)$'"
        "; escape ( ) [ ] . * + ? with \\ to match them literally. Each must "
        "match one of ours. TensorFlow's built-ins, rooflines and baselines "
        "always run.",
    )
    flags.DEFINE_enum(
        "sweep_table",
        "best",
        ["best", "all"],
        "Sweep rows: roofline, TF's best and ours best per size, or all.",
    )
    flags.DEFINE_integer("seed", 0, "Seeds the values and the round order.")
    flags.DEFINE_float(
        "timeout_seconds",
        900.0,
        "The longest one multi-worker command may take.",
        lower_bound=1,
    )
    flags.DEFINE_float(
        "max_memory_gib",
        12.0,
        "Leave out single-process groups whose estimated peak memory "
        "(single_process.estimated_peak_bytes) is above this.",
        lower_bound=0,
    )
    flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")


def _apply_quick() -> None:
    if not FLAGS.quick:
        return
    for name, value in QUICK_DEFAULTS.items():
        if not FLAGS[name].present:
            setattr(FLAGS, name, value)


def _ints(values: Sequence[str], flag: str, minimum: int) -> list[int]:
    out = []
    for v in values:
        try:
            number = int(v)
        except ValueError:
            raise app.UsageError(f"--{flag}: {v!r} is not an integer") from None
        if number < minimum:
            raise app.UsageError(f"--{flag}: {number} is below {minimum}")
        out.append(number)
    return out


def _workload(name: str, flag: str):
    from benchmarks import workloads

    if name == "resnet50":
        return workloads.resnet50().truncated(FLAGS.resnet50_tensors)
    if name == "bert_base":
        return workloads.bert_base()
    if name == "many_small":
        return workloads.many_small(FLAGS.many_small_count)
    raise app.UsageError(
        f"--{flag}: unknown workload {name!r}; expected one of "
        f"{', '.join(WORKLOADS)}"
    )


def _filtered(candidates: list[Any]) -> list[Any]:
    """The candidates --candidates keeps (checked by `_check_candidates`)."""
    from benchmarks import candidates as candidates_lib

    return candidates_lib.select(candidates, FLAGS.candidates)


def _check_candidates(candidates_lib: Any, groups: list[list[Any]]) -> None:
    """Every --candidates pattern must compile and match one of ours."""
    try:
        candidates_lib.check_patterns(
            [c for group in groups for c in group], FLAGS.candidates
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from None


EXTRAS = ("tqdm", "matplotlib")


def missing_extras() -> str | None:
    """What to install when the benchmark's own dependencies are missing.

    Returns:
        None when they are all importable (tests/benchmark_test.py checks
        the message; pytest does not collect doctests from `__main__.py`).
    """
    missing = [m for m in EXTRAS if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"the benchmark needs {' and '.join(missing)}, which a plain install "
        "leaves out: pip install 'tf_crossdevice[benchmark]' (from a "
        "checkout: pip install -e '.[benchmark]')"
    )


def _machine() -> str:
    import numpy as np
    import tensorflow as tf

    load = os.getloadavg()
    return (
        f"{os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), "
        f"load average {load[0]:.1f}, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, numpy {np.__version__}"
    )


def _failed_group(
    setting: str,
    workload: Any,
    n: int,
    error: str | None = None,
    skipped: str | None = None,
) -> dict[str, Any]:
    """The record of a group that did not run (error) or was left out."""
    return {
        "setting": setting,
        "workload": workload.name,
        "description": workload.description,
        "num_replicas": n,
        "num_tensors": workload.num_tensors,
        "size_bytes": workload.num_bytes,
        "count": workload.num_elements,
        "dtype": workload.dtype,
        "error": error,
        "skipped": skipped,
        "roofline": None,
        "roofline_seconds": None,
        "tf_best": None,
        "tf_best_seconds": None,
        "ours_best": None,
        "ours_best_seconds": None,
        "baselines": {},
        "results": [],
    }


def _plan(candidates_lib: Any, workloads: Any, devices: list[int]):
    """(workload, devices, every candidate) of each single-process group."""
    single = []
    for name in FLAGS.workloads:
        if name == "sweep":
            single += workloads.sweep(
                FLAGS.sweep_min_bytes, FLAGS.sweep_max_bytes, FLAGS.sweep_step
            )
        else:
            single.append(_workload(name, "workloads"))
    return [
        (w, n, candidates_lib.single_process_candidates(w, FLAGS.quick))
        for w in single
        for n in devices
    ]


def _run_single_process(
    plan: list[Any],
    config: Any,
    bar: Any,
    describe: Callable[[str], None],
    groups: list[dict[str, Any]],
    save: Callable[[], None],
) -> None:
    """Runs each planned group in its own process; failures become records."""
    from benchmarks import single_process

    for workload, n, candidates in plan:
        units = single_process.units(
            len(candidates), config.rounds, workload.num_tensors
        )
        need = single_process.estimated_peak_bytes(workload, n)
        if need > FLAGS.max_memory_gib * 2**30:
            groups.append(
                _failed_group(
                    "single_process",
                    workload,
                    n,
                    skipped=f"needs about {need / 2**30:.1f} GiB "
                    f"(over --max_memory_gib={FLAGS.max_memory_gib:g})",
                )
            )
            bar.update(units)
            continue
        done = [0]

        def advance(count: int, done: list[int] = done) -> None:
            done[0] += count
            bar.update(count)

        try:
            groups.append(
                single_process.run_in_child(
                    workload,
                    n,
                    candidates,
                    config,
                    advance,
                    describe,
                    timeout_seconds=FLAGS.timeout_seconds,
                )
            )
        except Exception as e:  # noqa: BLE001 - reported in the table.
            groups.append(
                _failed_group(
                    "single_process",
                    workload,
                    n,
                    error=f"{type(e).__name__}: {e}",
                )
            )
            bar.update(max(units - done[0], 0))
        save()


def _run_multi_worker(
    mw_workloads: list[Any],
    workers: list[int],
    config: Any,
    bar: Any,
    describe: Callable[[str], None],
    groups: list[dict[str, Any]],
    save: Callable[[], None],
) -> None:
    """Runs the multi-worker groups; a setup failure fails that p's groups."""
    from benchmarks import multi_worker

    for p in workers:
        try:
            groups += multi_worker.run(
                mw_workloads,
                p,
                config,
                FLAGS.quick,
                timeout_seconds=FLAGS.timeout_seconds,
                advance=bar.update,
                describe=describe,
                candidate_filter=_filtered,
            )
        except Exception as e:  # noqa: BLE001 - reported in the table.
            error = f"{type(e).__name__}: {e}"
            groups += [
                _failed_group("multi_worker", w, p, error=error)
                for w in mw_workloads
            ]
        save()


def _failures(groups: list[dict[str, Any]]) -> list[str]:
    return [
        f"{g['workload']} x{g['num_replicas']}: {g['error']}"
        for g in groups
        if g.get("error")
    ] + [
        f"{g['workload']} x{g['num_replicas']}: {r['name']}: {r['error']}"
        for g in groups
        for r in g["results"]
        if not r["verified"] or r["error"]
    ]


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _apply_quick()
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
        # Every candidate is a new tf.function by design; TensorFlow's
        # retracing warning would fire for each one.
        import tensorflow as tf

        tf.get_logger().setLevel("ERROR")
    devices = _ints(FLAGS.devices, "devices", 2)
    workers = _ints(FLAGS.workers, "workers", 2)
    for name in FLAGS.workloads:
        if name not in WORKLOADS:
            raise app.UsageError(
                f"--workloads: unknown workload {name!r}; expected one of "
                f"{', '.join(WORKLOADS)}"
            )

    missing = missing_extras()
    if missing:
        print(missing, file=sys.stderr)
        return 1
    import tqdm  # type: ignore[import-untyped]

    from benchmarks import candidates as candidates_lib
    from benchmarks import (
        multi_worker,
        report,
        single_process,
        workloads,
    )

    started = time.time()
    command = "python -m benchmarks " + shlex.join(sys.argv[1:])
    meta: dict[str, Any] = {
        "command": command.strip(),
        "machine": _machine(),
        "quick": FLAGS.quick,
    }
    config = single_process.Config(
        rounds=FLAGS.rounds,
        target_seconds=FLAGS.target_seconds,
        max_reps=FLAGS.max_reps,
        seed=FLAGS.seed,
        cores=os.cpu_count() or 1,
    )
    plan = _plan(candidates_lib, workloads, devices)
    mw_workloads = [
        _workload(name, "multi_worker_workloads")
        for name in FLAGS.multi_worker_workloads
    ]
    mw_groups = [
        candidates_lib.multi_worker_candidates(w, FLAGS.quick)
        for w in (mw_workloads if workers else [])
    ]
    _check_candidates(candidates_lib, [c for _, _, c in plan] + mw_groups)
    plan = [(w, n, _filtered(c)) for w, n, c in plan]
    total = sum(
        single_process.units(len(c), config.rounds, w.num_tensors)
        for w, _, c in plan
    ) + sum(
        len(workers) * multi_worker.units(len(_filtered(c)), config.rounds)
        for c in mw_groups
    )

    output = pathlib.Path(FLAGS.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    groups: list[dict[str, Any]] = []

    def save_partial() -> None:
        # A long run that dies keeps what it measured.
        report.write_json(
            output / "results.json",
            {"meta": {**meta, "partial": True}, "groups": groups},
        )

    with tqdm.tqdm(
        total=total,
        file=sys.stderr,
        disable=not FLAGS.progress,
        unit="step",
        dynamic_ncols=True,
    ) as bar:

        def describe(text: str) -> None:
            bar.set_postfix_str(text[:70], refresh=True)

        _run_single_process(plan, config, bar, describe, groups, save_partial)
        _run_multi_worker(
            mw_workloads, workers, config, bar, describe, groups, save_partial
        )

    met = report.targets(groups)
    meta["seconds"] = time.time() - started
    meta["load_average_end"] = os.getloadavg()[0]
    document = {
        "meta": meta,
        "skipped": [
            {"name": s.name, "reason": s.reason}
            for s in candidates_lib.single_process_skipped()
        ],
        "groups": groups,
        "targets": met,
    }
    table = report.full_table(
        groups, met, meta, sweep_all=FLAGS.sweep_table == "all"
    )
    table += f"\n# finished in {meta['seconds']:.0f} s"
    print(table, flush=True)
    (output / "results.txt").write_text(table + "\n")
    (output / "results.md").write_text(
        report.markdown_summary(groups, met) + "\n"
    )
    report.write_json(output / "results.json", document)
    report.write_plot(output / "time_vs_size.png", groups)
    print(
        f"# wrote {output}/results.txt, results.md, results.json, "
        "time_vs_size.png"
    )
    failed = _failures(groups)
    if failed:
        print(
            f"{len(failed)} failure(s):\n  " + "\n  ".join(failed),
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
