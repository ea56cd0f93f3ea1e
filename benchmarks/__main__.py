"""Command line: `python -m benchmarks [--quick] [flags]` (from a checkout).

Runs the single-process groups (every workload on 2, 4 and 8 logical CPU
devices, each group in a process of its own), then the multi-worker groups
(2 and 3 worker processes, with 1 and 2 local devices each: ours in
tf_crossdevice's MultiWorkerMirroredStrategy against TensorFlow's, whose
worker holds the sum of its local devices' values), prints the table and
writes `results.txt`, `results.md`, `results.json` and `time_vs_size.png`
to `--output_dir`. With `--emulated_hosts=2,3,4`, the multi-worker groups
run again with one worker per emulated host (a network namespace on a link
shaped to `--link_rate`, an equal share of the cores each; needs root on
Linux), where the wire, not the cores, bounds them. Exit code 0 when every
result was verified and timed, 2 when something failed (its row says why),
1 on a usage error.

`--quick` (a few minutes on two shared cores) uses stand-ins: the first 24
ResNet-50 tensors, 32 small tensors, two sweep sizes, 4 devices, 2 workers
with 1 local device and a few candidates per family. Flags given explicitly
win over it.

`--suite=hosts` is the one run that scores every between-hosts target
(`benchmarks.targets`): ResNet-50's gradients on 2, 3 and 4 emulated hosts
at 1 Gbit/s with 1 and 2 local devices (our defaults, our fastest, and
TensorFlow's strategy at 2 and 4 MiB packs, its fastest sizes; CPU per MiB
on every host; autotune with its default budget, and its pick timed on its
own), then the example job on 2 and 4 hosts (`benchmarks.training`).
Flags given explicitly win over it too.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import platform
import shlex
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

from benchmarks import candidates as candidates_lib  # noqa: E402
from benchmarks import groups as groups_lib  # noqa: E402
from benchmarks import records, report, targets, training  # noqa: E402
from benchmarks import workloads as workloads_lib  # noqa: E402
from tf_crossdevice import packing  # noqa: E402
from tf_crossdevice.cluster import hosts as hosts_lib  # noqa: E402

FLAGS = flags.FLAGS
WORKLOADS = ("resnet50", "bert_base", "many_small", "sweep")
EXTRAS = ("tqdm", "matplotlib")
# Flag values `--quick` uses unless the flag is given.
QUICK_DEFAULTS: dict[str, Any] = {
    "workloads": ["resnet50", "many_small", "sweep"],
    "devices": ["4"],
    "workers": ["2"],
    "local_devices": ["1"],
    "multi_worker_workloads": ["resnet50"],
    "rounds": 5,
    "target_seconds": 0.02,
    "resnet50_tensors": 24,
    "many_small_count": 32,
    "sweep_max_bytes": 4 << 20,
    "sweep_step": 1 << 20,
    "autotune_budget_seconds": 3.0,
}

# The candidates of --suite=hosts (re.search each; commas split the list,
# so a comma inside a candidate's name is matched with "."): our defaults
# and their references, our fastest kinds, PowerSGD.
_SUITE_CANDIDATES = ",".join(
    [
        r"^ours CollectiveAllReduce( bytes_per_pack=4MiB| compression=bf16)?$",
        r"^ours CollectiveAllReduce compression=powersgd rank=4$",
        r"^ours HierarchicalCollectiveAllReduce$",
        r"^ours MultiWorkerAllReduce \('pscpu/pscpu'. 2. -1\)"
        r"( agg_small=64KiBx1024)?( compression=bf16)?$",
        r"^ours MultiWorkerAllReduce \('pscpu'. [34]. -1\)"
        r"( compression=bf16)?$",
        r"^ours MultiWorkerAllReduce \('pscpu/pscpu'. 2. -1\) num_packs=1 "
        r"compression=powersgd rank=4$",
    ]
)
SUITES: dict[str, dict[str, Any]] = {
    "hosts": {
        "workloads": [],
        "workers": [],
        "emulated_hosts": ["2", "3", "4"],
        "link_rate": "1gbit",
        "local_devices": ["1", "2"],
        "multi_worker_workloads": ["resnet50"],
        "pack_sizes_kib": [str(2 << 10), str(4 << 10)],
        "training_hosts": ["2", "4"],
        "rounds": 5,
        "candidates": _SUITE_CANDIDATES,
    },
}


def define_flags() -> None:
    """Defines the command's flags (once per process)."""
    if "quick" in FLAGS:
        return
    flags.DEFINE_bool("quick", False, "A small run: see the docstring.")
    flags.DEFINE_enum(
        "suite",
        "",
        ["", *SUITES],
        "A named run that scores a set of targets: see the docstring.",
    )
    flags.DEFINE_string("output_dir", "benchmark_results", "Output folder.")
    flags.DEFINE_list("workloads", list(WORKLOADS), "Single-process sets.")
    flags.DEFINE_list("devices", ["2", "4", "8"], "Logical CPU device counts.")
    flags.DEFINE_list("workers", ["2", "3"], "Worker process counts.")
    flags.DEFINE_list(
        "emulated_hosts",
        [],
        "Host counts: the multi-worker groups again, one worker per "
        "emulated host (tf_crossdevice.cluster.hosts; needs root).",
    )
    flags.DEFINE_string(
        "link_rate", "1gbit", "Emulated hosts' link rate, each way ('tc')."
    )
    flags.DEFINE_list(
        "training_hosts",
        [],
        "Host counts: run the example job on that many emulated hosts, "
        "TensorFlow's strategy against ours (benchmarks.training; needs "
        "root).",
    )
    flags.DEFINE_list(
        "local_devices",
        ["1", "2"],
        "Logical CPU devices per worker process (multi-worker groups).",
    )
    flags.DEFINE_list(
        "multi_worker_workloads",
        ["resnet50", "many_small"],
        "Sets across worker processes (resnet50, bert_base, many_small).",
    )
    flags.DEFINE_list(
        "pack_sizes_kib",
        [],
        "Pack sizes (KiB) the between-graph collectives run with, "
        "TensorFlow's strategy and ours, besides each class's own packing "
        "(default: 4 MiB and 32 MiB for TensorFlow's, 4 MiB for ours).",
    )
    flags.DEFINE_integer("rounds", 7, "Timing rounds.", lower_bound=1)
    flags.DEFINE_float(
        "target_seconds", 0.05, "Seconds per measurement.", lower_bound=0
    )
    flags.DEFINE_integer("max_reps", 200, "Steps per measurement, at most.")
    flags.DEFINE_integer("resnet50_tensors", 214, "First N ResNet-50 tensors.")
    flags.DEFINE_integer("many_small_count", 1000, "Tensors in many_small.")
    flags.DEFINE_integer("sweep_min_bytes", 4, "Smallest sweep size.")
    flags.DEFINE_integer("sweep_max_bytes", 256 << 20, "Largest sweep size.")
    flags.DEFINE_integer("sweep_step", 2, "Sweep size ratio.", lower_bound=2)
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
        "sweep_table", "best", ["best", "all"], "Sweep rows: best of each."
    )
    flags.DEFINE_integer("seed", 0, "Seeds the values and the round order.")
    flags.DEFINE_float(
        "timeout_seconds", 900.0, "Longest silence of a child process."
    )
    flags.DEFINE_float(
        "max_memory_gib",
        12.0,
        "Leave out single-process groups estimated to need more memory.",
    )
    flags.DEFINE_bool("progress", True, "Show a progress bar on stderr.")
    flags.DEFINE_float(
        "autotune_budget_seconds",
        60.0,
        "Budget of tf_crossdevice.autotune in each single-process group.",
        lower_bound=0.001,
    )
    least = {
        "devices": 2,
        "workers": 2,
        "emulated_hosts": 2,
        "local_devices": 1,
        "training_hosts": 1,
    }
    for name, minimum in least.items():
        flags.register_validator(
            name,
            lambda values, m=minimum: all(
                v.isdigit() and int(v) >= m for v in values
            ),
            f"--{name}: expected whole numbers of at least {minimum}",
        )


def _workloads(flag: str) -> list[Any]:
    out = []
    for name in FLAGS[flag].value or ():
        if name == "resnet50":
            resnet = workloads_lib.resnet50()
            out.append(resnet.truncated(FLAGS.resnet50_tensors))
        elif name == "bert_base":
            out.append(workloads_lib.bert_base())
        elif name == "many_small":
            out.append(workloads_lib.many_small(FLAGS.many_small_count))
        elif name == "sweep" and flag == "workloads":
            out += workloads_lib.sweep(
                FLAGS.sweep_min_bytes, FLAGS.sweep_max_bytes, FLAGS.sweep_step
            )
        else:
            raise app.UsageError(
                f"--{flag}: unknown workload {name!r}; expected one of "
                f"{', '.join(WORKLOADS)}"
            )
    return out


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
    return (
        f"{os.cpu_count()} CPU cores "
        f"({platform.processor() or platform.machine()}), load average "
        f"{os.getloadavg()[0]:.1f}, Python {platform.python_version()}, "
        f"TensorFlow {tf.__version__}, numpy {np.__version__}"
    )


def _failures(groups: list[Any]) -> list[str]:
    out = []
    for g in groups:
        where = f"{g.workload} x{g.num_replicas}"
        failed = [f"{r.name}: {r.timing.error}" for r in g.results if not r.ok]
        out += [f"{where}: {e}" for e in [g.error, *failed] if e]
    return out


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    presets = SUITES.get(FLAGS.suite, {}) | (
        QUICK_DEFAULTS if FLAGS.quick else {}
    )
    for name, value in presets.items():
        if not FLAGS[name].present:
            FLAGS[name].value = value
    if not FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
        # Every candidate is a new tf.function by design: no retrace warnings.
        tf.get_logger().setLevel("ERROR")
    devices = [int(v) for v in FLAGS.devices]
    workers = [int(v) for v in FLAGS.workers]
    local_devices = [int(v) for v in FLAGS.local_devices]
    emulated = [int(v) for v in FLAGS.emulated_hosts]
    training_hosts = [int(v) for v in FLAGS.training_hosts]
    pack_sizes = [int(v) << 10 for v in FLAGS.pack_sizes_kib]
    if any(size <= 0 for size in pack_sizes):
        raise app.UsageError(
            f"--pack_sizes_kib: expected positive integers, got "
            f"{','.join(FLAGS.pack_sizes_kib)}"
        )
    if emulated or training_hosts:
        try:
            hosts_lib.parse_rate(FLAGS.link_rate)
        except ValueError as e:
            raise app.UsageError(f"--{e}") from None
    single = _workloads("workloads")
    across = _workloads("multi_worker_workloads")
    missing = missing_extras()
    if missing:
        print(missing, file=sys.stderr)
        return 1
    # An optional extra: imported once missing_extras() has checked for it.
    import tqdm  # type: ignore[import-untyped]

    started = time.time()
    meta: dict[str, Any] = {
        "command": ("python -m benchmarks " + shlex.join(sys.argv[1:])).strip(),
        "machine": _machine(),
        "quick": FLAGS.quick,
        # What the collectives' own packing (bytes_per_pack=0) meant.
        records.COLLECTIVE_PACK_KEY: packing.DEFAULT_BYTES_PER_PACK,
    }
    config = groups_lib.Config(
        rounds=FLAGS.rounds,
        target_seconds=FLAGS.target_seconds,
        max_reps=FLAGS.max_reps,
        seed=FLAGS.seed,
        cores=os.cpu_count() or 1,
        timeout_seconds=FLAGS.timeout_seconds,
        max_memory_bytes=int(FLAGS.max_memory_gib * 2**30),
        autotune_budget_seconds=FLAGS.autotune_budget_seconds,
    )
    plan = [
        (w, n, candidates_lib.single_process_candidates(w, FLAGS.quick))
        for w in single
        for n in devices
    ]
    across_candidates = {
        (w.name, p): candidates_lib.multi_worker_candidates(
            w, FLAGS.quick, num_workers=p, pack_sizes=pack_sizes
        )
        + candidates_lib.strategy_candidates(FLAGS.quick, pack_sizes)
        for w in across
        for p in {*workers, *emulated}
    }
    every = [c for _, _, group in plan for c in group]
    every += [c for group in across_candidates.values() for c in group]
    try:
        # A suite's own patterns may name candidates of host counts a
        # narrower run leaves out; the user's must each match.
        if FLAGS["candidates"].present:
            candidates_lib.check_patterns(every, FLAGS.candidates)
    except ValueError as e:
        raise app.UsageError(str(e)) from None

    def keep(group: list[Any]) -> list[Any]:
        return candidates_lib.select(group, FLAGS.candidates)

    def candidates_for(p: int) -> Any:
        return lambda w: keep(across_candidates[w.name, p])

    output = pathlib.Path(FLAGS.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    groups: list[records.Group] = []

    def save_partial() -> None:  # A long run that dies keeps what it measured.
        run = records.Run({**meta, "partial": True}, {}, groups, [])
        run.write(output / "results.json")

    with tqdm.tqdm(
        total=len(plan)
        + (len(workers) + len(emulated)) * len(across) * len(local_devices)
        + sum(len(training.jobs_for(p)) for p in training_hosts),
        file=sys.stderr,
        disable=not FLAGS.progress,
        unit="group",
    ) as bar:

        def describe(text: str) -> None:
            bar.set_postfix_str(text[:70], refresh=True)

        for w, n, candidates in plan:
            chosen = keep(candidates)
            group = groups_lib.single_process(w, n, chosen, config, describe)
            groups.append(group)
            bar.update(1)
            save_partial()
        for p in workers:
            groups += groups_lib.multi_worker(
                across,
                p,
                config,
                candidates_for(p),
                describe,
                local_devices,
            )
            bar.update(len(across) * len(local_devices))
            save_partial()
        for p in emulated:
            groups += groups_lib.multi_worker(
                across,
                p,
                config,
                candidates_for(p),
                describe,
                local_devices,
                link_rate=FLAGS.link_rate,
            )
            bar.update(len(across) * len(local_devices))
            save_partial()
        jobs: list[records.Job] = []
        for p in training_hosts:
            for name in training.jobs_for(p):
                describe(f"example job: {name} on {p} emulated hosts")
                jobs.append(
                    training.run_job(
                        name, p, FLAGS.link_rate, FLAGS.timeout_seconds
                    )
                )
                bar.update(1)

    meta["seconds"] = time.time() - started
    meta["load_average_end"] = os.getloadavg()[0]
    run = records.Run(
        meta,
        candidates_lib.SKIPPED,
        groups,
        targets.evaluate(groups) + targets.training_targets(jobs),
        jobs,
    )
    table = report.write_all(output, run, FLAGS.sweep_table == "all")
    print(f"{table}\n# finished in {meta['seconds']:.0f} s", flush=True)
    print(
        f"# wrote {output}/results.txt, results.md, results.json and "
        "time_vs_size.png"
    )
    failed = _failures(groups) + [
        f"example job {j.name} on {j.hosts} hosts: {j.error}"
        for j in jobs
        if j.error
    ]
    if failed:
        print(
            f"{len(failed)} failure(s):", *failed, sep="\n  ", file=sys.stderr
        )
    return 2 if failed else 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
