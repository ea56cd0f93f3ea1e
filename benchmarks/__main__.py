"""Command line: `python -m benchmarks [--quick] [flags]` (from a checkout).

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
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

FLAGS = flags.FLAGS
WORKLOADS = ("resnet50", "bert_base", "many_small", "sweep")

# Flag values `--quick` uses unless the flag is given.
EXTRAS = ("tqdm", "matplotlib")
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


def _workload(name: str, flag: str) -> Any:
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


def missing_extras() -> str | None:
    """What to install when tqdm or matplotlib is missing (else None)."""
    missing = [m for m in EXTRAS if importlib.util.find_spec(m) is None]
    if not missing:
        return None
    return (
        f"the benchmark needs {' and '.join(missing)}: from the checkout, "
        "pip install -e '.[benchmark]'"
    )


def _machine() -> str:
    import numpy as np
    import tensorflow as tf

    return (
        f"{os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), "
        f"load average {os.getloadavg()[0]:.1f}, Python "
        f"{platform.python_version()}, TensorFlow {tf.__version__}, numpy "
        f"{np.__version__}"
    )


def _plan(candidates_lib: Any, workloads: Any, devices: list[int]) -> list:
    """(workload, devices, candidates) of each single-process group."""
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


def _failures(groups: list[Any]) -> list[str]:
    out = []
    for g in groups:
        where = f"{g.workload} x{g.num_replicas}"
        if g.error:
            out.append(f"{where}: {g.error}")
        out += [
            f"{where}: {r.name}: {r.timing.error}"
            for r in g.results
            if not r.ok
        ]
    return out


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if FLAGS.quick:
        for name, value in QUICK_DEFAULTS.items():
            if not FLAGS[name].present:
                setattr(FLAGS, name, value)
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
        import tensorflow as tf

        # Every candidate is a new tf.function by design: no retrace warnings.
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
        records,
        report,
        single_process,
        targets,
        workloads,
    )

    started = time.time()
    meta: dict[str, Any] = {
        "command": ("python -m benchmarks " + shlex.join(sys.argv[1:])).strip(),
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
    mw_lists = [
        candidates_lib.multi_worker_candidates(w, FLAGS.quick)
        for w in (mw_workloads if workers else [])
    ]
    try:
        candidates_lib.check_patterns(
            [c for _, _, group in plan for c in group]
            + [c for group in mw_lists for c in group],
            FLAGS.candidates,
        )
    except ValueError as e:
        raise app.UsageError(str(e)) from None

    def keep(group: list[Any]) -> list[Any]:
        return candidates_lib.select(group, FLAGS.candidates)

    plan = [(w, n, keep(c)) for w, n, c in plan]
    total = sum(
        single_process.units(len(c), config.rounds, w.num_tensors)
        for w, _, c in plan
    ) + len(workers) * sum(
        multi_worker.units(len(keep(c)), config.rounds) for c in mw_lists
    )
    output = pathlib.Path(FLAGS.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    groups: list[records.Group] = []

    def save_partial() -> None:  # A long run that dies keeps what it measured.
        records.Run({**meta, "partial": True}, {}, groups, []).write(
            output / "results.json"
        )

    with tqdm.tqdm(
        total=total, file=sys.stderr, disable=not FLAGS.progress, unit="step"
    ) as bar:

        def describe(text: str) -> None:
            bar.set_postfix_str(text[:70], refresh=True)

        for workload, n, candidates in plan:
            units = single_process.units(
                len(candidates), config.rounds, workload.num_tensors
            )
            need = single_process.estimated_peak_bytes(workload, n)
            done = bar.n
            if need > FLAGS.max_memory_gib * 2**30:
                groups.append(
                    records.Group.of(
                        "single_process",
                        workload,
                        n,
                        skipped=f"needs about {need / 2**30:.1f} GiB (over "
                        f"--max_memory_gib={FLAGS.max_memory_gib:g})",
                    )
                )
            else:
                try:
                    groups.append(
                        single_process.run_in_child(
                            workload,
                            n,
                            candidates,
                            config,
                            bar.update,
                            describe,
                            FLAGS.timeout_seconds,
                        )
                    )
                except Exception as e:  # noqa: BLE001 - in the table.
                    error = f"{type(e).__name__}: {e}"
                    groups.append(
                        records.Group.of(
                            "single_process", workload, n, error=error
                        )
                    )
            bar.update(max(units - (bar.n - done), 0))
            save_partial()
        for p in workers:
            try:
                groups += multi_worker.run(
                    mw_workloads,
                    p,
                    config,
                    FLAGS.quick,
                    FLAGS.timeout_seconds,
                    bar.update,
                    describe,
                    keep,
                )
            except Exception as e:  # noqa: BLE001 - in the table.
                error = f"{type(e).__name__}: {e}"
                groups += [
                    records.Group.of("multi_worker", w, p, error=error)
                    for w in mw_workloads
                ]
            save_partial()

    meta["seconds"] = time.time() - started
    meta["load_average_end"] = os.getloadavg()[0]
    run = records.Run(
        meta, candidates_lib.SKIPPED, groups, targets.evaluate(groups)
    )
    table = report.write_all(output, run, FLAGS.sweep_table == "all")
    print(f"{table}\n# finished in {meta['seconds']:.0f} s", flush=True)
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
