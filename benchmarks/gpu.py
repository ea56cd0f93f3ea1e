"""The GPU group: `python -m benchmarks.gpu [--quick] [--output_dir DIR]`.

Times the single-host classes on this machine's GPUs against TensorFlow's
own on the same tensors: ours NcclAllReduce, HierarchicalCopyAllReduce,
SpecAllReduce("psgpu") and ReductionToOneDevice; TensorFlow's
NcclAllReduce, HierarchicalCopyAllReduce and ReductionToOneDevice. Each
entry is checked against numpy first (`measure.Inputs`), then every entry
is timed once per round in interleaved rounds; a result's time is its
median minus the median of a step that only reads the inputs. Per result:
algbw and busbw (nccl-tests' conventions), the ratio to TensorFlow's best
and to TensorFlow's NcclAllReduce (its time / ours: above 1 is faster).

Devices: every GPU when there are 2 or more; one GPU is split into
--logical_gpus logical GPUs (copies then stay in one GPU's memory, and
NCCL, which refuses two ranks on one GPU, is left out with that reason).
A measurement ends with `tf.test.experimental.sync_devices()` after its
calls, so that queued GPU work is timed. A step keeps its results on their
GPUs: a control dependency, not `measure.sink`, whose Assert reads its data
on the host. Grappler's dependency optimizer would prune work that only
feeds a control dependency (seen on CPU devices: a 16 MiB 4-way sum took 2
ms instead of 13), so it is off for the whole run, for ours and TF's alike.

Writes gpu_results.json (`records.Run`) and gpu_results.txt to
--output_dir. Exit code: 0 when every entry was verified and timed (or
left out with a reason), 2 when one failed, 3 when TensorFlow sees no GPU
(nothing measured: on the machine this group is for, that must not look
like success), 1 on a usage error.

>>> [name for name, *_ in ENTRIES]  # doctest: +NORMALIZE_WHITESPACE
['ours NcclAllReduce', 'ours HierarchicalCopyAllReduce',
 'ours SpecAllReduce psgpu', 'ours ReductionToOneDevice',
 'TF NcclAllReduce', 'TF HierarchicalCopyAllReduce',
 'TF ReductionToOneDevice']
"""

from __future__ import annotations

import datetime
import functools
import os
import pathlib
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import tf_crossdevice  # noqa: E402
from benchmarks import records, report  # noqa: E402
from benchmarks import workloads as workloads_lib  # noqa: E402
from tf_crossdevice.tuning import measure  # noqa: E402

NO_GPU = 3
INPUTS = "baseline: read the inputs"
TF_NCCL = "TF NcclAllReduce"
# (name, family, needs distinct GPUs, the object's constructor): NCCL's
# entries need GPUs that are not logical GPUs of one.
ENTRIES: tuple[tuple[str, str, bool, Callable[[], Any]], ...] = (
    ("ours NcclAllReduce", "ours", True, tf_crossdevice.NcclAllReduce),
    (
        "ours HierarchicalCopyAllReduce",
        "ours",
        False,
        tf_crossdevice.HierarchicalCopyAllReduce,
    ),
    (
        "ours SpecAllReduce psgpu",
        "ours",
        False,
        functools.partial(tf_crossdevice.SpecAllReduce, "psgpu"),
    ),
    (
        "ours ReductionToOneDevice",
        "ours",
        False,
        tf_crossdevice.ReductionToOneDevice,
    ),
    (TF_NCCL, "tf", True, tf.distribute.NcclAllReduce),
    (
        "TF HierarchicalCopyAllReduce",
        "tf",
        False,
        tf.distribute.HierarchicalCopyAllReduce,
    ),
    (
        "TF ReductionToOneDevice",
        "tf",
        False,
        tf.distribute.ReductionToOneDevice,
    ),
)
SETTING = "single_process_gpu"


def define_flags() -> None:
    if "logical_gpus" in flags.FLAGS:
        return
    flags.DEFINE_bool("quick", False, "ResNet-50's first 24 tensors, 2 sizes.")
    flags.DEFINE_string("output_dir", "benchmark_results/gpu", "Output folder.")
    flags.DEFINE_integer(
        "logical_gpus",
        4,
        "With one GPU: split it into this many.",
        lower_bound=2,
    )
    flags.DEFINE_integer(
        "logical_gpu_memory_mb",
        4096,
        "With one GPU: each logical GPU's memory.",
        lower_bound=64,
    )
    flags.DEFINE_integer("rounds", 7, "Timing rounds.", lower_bound=1)
    flags.DEFINE_float("target_seconds", 0.05, "Seconds per measurement.")
    flags.DEFINE_integer("max_reps", 200, "Steps per measurement, at most.")
    flags.DEFINE_integer("seed", 0, "Seeds the values and the round order.")


def workloads(quick: bool) -> list[workloads_lib.Workload]:
    """ResNet-50's gradients and single tensors of 1, 16 and 64 MiB."""
    resnet = workloads_lib.resnet50()
    if quick:
        return [resnet.truncated(24)] + [
            workloads_lib.single_tensor(s) for s in (1 << 20, 16 << 20)
        ]
    sizes = (1 << 20, 16 << 20, 64 << 20)
    return [resnet] + [workloads_lib.single_tensor(s) for s in sizes]


def set_up_gpus(logical: int, memory_mb: int) -> tuple[int, bool]:
    """(GPUs to use, whether they are logical GPUs of one), before TF runs.

    Two or more GPUs: all of them. One: split into `logical`.
    """
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) != 1:
        return len(gpus), False
    config = tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)
    tf.config.set_logical_device_configuration(gpus[0], [config] * logical)
    return logical, True


def machine() -> str:
    """The GPUs' names, the CPU cores and the software."""
    details = [
        tf.config.experimental.get_device_details(g).get("device_name", "?")
        for g in tf.config.list_physical_devices("GPU")
    ]
    build = tf.sysconfig.get_build_info()
    cuda = (
        f"CUDA {build.get('cuda_version')}, cuDNN {build.get('cudnn_version')}"
        if build.get("is_cuda_build")
        else "not a CUDA build"
    )
    return (
        f"{len(details)} GPU(s) ({', '.join(details) or 'none'}), "
        f"{os.cpu_count()} CPU cores, TensorFlow {tf.__version__} ({cuda}), "
        f"Python {sys.version.split()[0]}"
    )


def _kept_on_gpus(body: Callable[[], Any]) -> Any:
    """A tf.function running `body` whose results stay on their devices."""

    def step() -> Any:
        results = [t for per in body() for t in per]
        with tf.control_dependencies(results), tf.device("/cpu:0"):
            return tf.constant(0)

    return tf.function(step, autograph=False)


def _synced_timer(call: Callable[[], Any]) -> Callable[[int], float]:
    """Seconds per call of n calls, waiting for the GPUs at both ends."""
    sync = tf.test.experimental.sync_devices

    def time_calls(reps: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            call()
        sync()
        return (time.perf_counter() - start) / reps

    return time_calls


def measure_group(
    workload: workloads_lib.Workload,
    devices: Sequence[str],
    logical: bool,
    options: dict[str, Any],
) -> records.Group:
    """Every entry on `devices`: checked, then timed in interleaved rounds."""
    note = f"{len(devices)} GPUs" + (
        " (logical GPUs of one GPU: copies stay in its memory)"
        if logical
        else ""
    )
    group = records.Group.of(SETTING, workload, len(devices), note=note)
    inputs = measure.Inputs(
        [(s, workload.dtype) for s in workload.shapes], devices, options["seed"]
    )
    bodies: dict[str, tuple[str, str | None, Any, Any]] = {
        INPUTS: (
            "baseline",
            None,
            lambda: [list(k) for k in zip(*_per_device(inputs), strict=True)],
            inputs.check_inputs,
        )
    }
    left_out: dict[str, str] = {}
    for name, family, distinct, make in ENTRIES:
        if distinct and logical:
            left_out[name] = (
                "left out: NCCL refuses two ranks on one GPU (logical GPUs)"
            )
            continue
        body = measure.all_reduce_body(make(), inputs)
        bodies[name] = (family, INPUTS, body, inputs.check)
    prepared: dict[str, measure.Prepared] = {}
    timers: dict[str, measure.TimeFn] = {}
    reps: dict[str, int] = {}
    for name, (family, _, body, check) in bodies.items():

        def build(body: Any = body, check: Any = check) -> Any:
            # Step's returning trace checks the numbers and placement; its
            # sinking trace is never called (see the module docstring).
            returning = measure.Step(body)
            return _kept_on_gpus(body), lambda: returning.verify(check)

        prepared[name], call = measure.prepare(
            build, options["warmup"], family != "baseline"
        )
        if call is not None:
            timers[name] = _synced_timer(call)
            reps[name] = measure.reps_for(
                prepared[name].seconds_per_call,
                options["target_seconds"],
                options["max_reps"],
            )
    samples, errors = measure.interleaved_rounds(
        timers, reps, options["rounds"], options["seed"]
    )
    entries = [
        records.Result(
            name,
            family,
            baseline,
            measure.Timing.of(
                name,
                prepared[name],
                reps.get(name, 0),
                samples.get(name, []),
                errors.get(name),
            ),
        )
        for name, (family, baseline, *_) in bodies.items()
    ]
    records.add_results(group, entries)
    if left_out:
        group.note += "; " + "; ".join(f"{k}: {v}" for k, v in left_out.items())
    return group


def _per_device(inputs: Any) -> list[list[Any]]:
    """inputs' tensors, per device (a body returning the inputs as is)."""
    return [inputs.tensors(i) for i in range(len(inputs.devices))]


def ratio_to(group: records.Group, name: str, reference: str) -> float | None:
    """`reference`'s time / `name`'s in `group` (above 1: `name` is faster).

    >>> g = records.Group(SETTING, "w", "", 2, 1, 8, 2, "float32")
    >>> records.add_results(g, [
    ...     records.entry_of("base", "baseline", None, [1.0] * 3),
    ...     records.entry_of("TF x", "tf", "base", [5.0] * 3),
    ...     records.entry_of("ours x", "ours", "base", [3.0] * 3)])
    >>> ratio_to(g, "ours x", "TF x")
    2.0
    """
    return records.ratio(group.time(reference), group.time(name))


def table(group: records.Group) -> str:
    """The group's rows: time, algbw, busbw and the two ratios."""
    lines = [
        f"# {group.workload} ({group.num_tensors} tensors, "
        f"{report.format_size(group.size_bytes)}) on {group.note}",
        f"# {'entry':<32} {'time(ms)':>10} {'algbw':>7} {'busbw':>7} "
        f"{'vs TF':>6} {'vs TF NCCL':>10}",
    ]
    for b in group.baselines:
        state = (
            b.timing.error or f"{report.format_ms(b.timing.median_seconds)} ms"
        )
        lines.append(f"# {b.name}: {state}")
    for r in group.results:
        time_text = report.format_ms(r.time_seconds) if r.ok else "FAILED"
        if r.ok and r.time_seconds is None:
            time_text = "<noise"  # not above the baseline's time
        lines.append(
            f"  {r.name:<32} {time_text:>10} "
            f"{report.format_ratio(r.algbw_gbps):>7} "
            f"{report.format_ratio(r.busbw_gbps):>7} "
            f"{report.format_ratio(r.ratio_to_tf_best):>6} "
            f"{report.format_ratio(ratio_to(group, r.name, TF_NCCL)):>10}"
            + (f"\n      error: {r.timing.error}" if not r.ok else "")
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    f = flags.FLAGS
    output = pathlib.Path(f.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    count, logical = set_up_gpus(f.logical_gpus, f.logical_gpu_memory_mb)
    meta: dict[str, Any] = {
        "command": shlex.join(
            ["python", "-m", "benchmarks.gpu", *sys.argv[1:]]
        ),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": machine(),
        "quick": f.quick,
    }
    if count == 0:
        why = f"no GPU: {meta['machine']}; nothing measured"
        records.Run(meta, {"gpu": why}, [], []).write(
            output / "gpu_results.json"
        )
        print(why, file=sys.stderr)
        return NO_GPU
    tf.get_logger().setLevel("ERROR")
    tf.config.optimizer.set_experimental_options(
        {"dependency_optimization": False}  # see the module docstring
    )
    devices = [
        measure.canonical(d.name) for d in tf.config.list_logical_devices("GPU")
    ]
    options = {
        "seed": f.seed,
        "warmup": 2,
        "rounds": f.rounds,
        "target_seconds": f.target_seconds,
        "max_reps": f.max_reps,
    }
    started = time.time()
    groups = []
    texts = [f"# {meta['machine']}", f"# {meta['command']}, {meta['date']}"]
    for workload in workloads(f.quick):
        group = measure_group(workload, devices[:count], logical, options)
        groups.append(group)
        texts.append(table(group))
        print(texts[-1], flush=True)
    meta["seconds"] = time.time() - started
    records.Run(meta, {}, groups, []).write(output / "gpu_results.json")
    (output / "gpu_results.txt").write_text("\n\n".join(texts) + "\n")
    print(f"# wrote {output}/gpu_results.json and gpu_results.txt")
    failed = [
        f"{g.workload}: {r.name}: {r.timing.error or 'not verified'}"
        for g in groups
        for r in [*g.baselines, *g.results]
        if r.timing.error or r.timing.verified is False
    ]
    if failed:
        print(
            f"{len(failed)} failure(s):", *failed, sep="\n  ", file=sys.stderr
        )
    return 2 if failed else 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
