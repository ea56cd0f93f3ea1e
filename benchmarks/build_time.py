"""Graph build time: `python -m benchmarks.build_time [--devices 8]`.

For every single-process algorithm x packing setting, traces one
all-reduce of a workload's gradients in a `tf.function` (trace), runs it
once (first step: placement, Grappler, the run) and checks the sums against
numpy (not timed). Prints one row per configuration and whether the
build-time limits are met (`LIMITS`: trace + first step under 10 s for
ResNet-50's 214 gradients and under 30 s for 1000 small ones, at 8
devices).

Each configuration runs in a fresh graph of the same process; timings on a
shared machine are noisy, so compare rows of one run.

>>> [c.name for c in configurations()][:2]
['xring', 'xring num_packs=1']
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import tf_crossdevice  # noqa: E402
from benchmarks import workloads as workloads_lib  # noqa: E402
from benchmarks.targets import BUILD_SECONDS as LIMITS  # noqa: E402
from tf_crossdevice import testing  # noqa: E402
from tf_crossdevice.tuning import measure as _measure  # noqa: E402

ALGORITHMS = ("xring", "rechd", "pscpu", "psgpu", "hierarchical_copy", "nccl")
PACKINGS: dict[str, dict[str, int]] = {
    "": {},
    "num_packs=1": {"num_packs": 1},
    "num_packs=4": {"num_packs": 4},
    "agg_small=64KiBx1024": {
        "agg_small_grads_max_bytes": 64 << 10,
        "agg_small_grads_max_group": 1024,
    },
}


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One row: a class name and its constructor's arguments."""

    name: str
    class_name: str
    kwargs: dict


def configurations(
    algorithms: Sequence[str] = ALGORITHMS,
) -> list[Configuration]:
    """Every algorithm x packing, then ReductionToOneDevice."""
    out = [
        Configuration(
            f"{alg} {label}".strip(),
            "SpecAllReduce",
            {"all_reduce_spec": alg, **kwargs},
        )
        for alg in algorithms
        for label, kwargs in PACKINGS.items()
    ]
    out.append(
        Configuration("ReductionToOneDevice", "ReductionToOneDevice", {})
    )
    return out


@dataclasses.dataclass(frozen=True)
class BuildTime:
    """What one configuration took, in seconds, and its graph's size."""

    workload: str
    configuration: str
    trace_seconds: float
    first_step_seconds: float
    graph_nodes: int
    error: str | None

    @property
    def build_seconds(self) -> float:
        return self.trace_seconds + self.first_step_seconds


def measure(
    workload, config: Configuration | None, devices: Sequence[str], check=True
) -> BuildTime:
    """Traces, runs once and checks one configuration (fresh graph).

    The timed step sinks the sums on their devices (as
    `_measure.Step.timed` does, like a training step); the check runs a
    second, untimed trace that returns them. `config=None` times the
    inputs alone (no all-reduce): the floor every row pays.
    """
    tf.keras.backend.clear_session()
    inputs = _measure.Inputs(
        [(s, workload.dtype) for s in workload.shapes], devices
    )
    if config is None:
        per_device = lambda: [  # noqa: E731
            t for i in range(len(devices)) for t in inputs.tensors(i)
        ]
    else:
        ops = getattr(tf_crossdevice, config.class_name)(**config.kwargs)
        reduce = _measure.all_reduce_body(ops, inputs)
        per_device = lambda: [t for per in reduce() for t in per]  # noqa: E731
    step = tf.function(lambda: _measure.sink(per_device()), autograph=False)
    start = time.perf_counter()
    concrete = step.get_concrete_function()
    traced = time.perf_counter()
    concrete().numpy()
    first = time.perf_counter()
    nodes = len(concrete.graph.as_graph_def().node)
    error = None
    if check and config is not None:
        step = _measure.Step(reduce)
        error = step.verify(inputs.check)
    return BuildTime(
        workload.name,
        "inputs only (floor)" if config is None else config.name,
        traced - start,
        first - traced,
        nodes,
        None if error is None else f"wrong result: {error}",
    )


def verdicts(rows: Sequence[BuildTime]) -> list[str]:
    """One line per workload with a limit: MET or NOT MET, and the worst.

    >>> verdicts([BuildTime("resnet50", "xring", 3.0, 2.0, 10, None)])
    ['resnet50: worst build 5.0 s (xring), limit 10 s: MET']
    """
    out = []
    for workload, limit in LIMITS.items():
        mine = [
            r
            for r in rows
            if r.workload == workload
            and not r.configuration.startswith("inputs")
        ]
        if not mine:
            continue
        worst = max(mine, key=lambda r: r.build_seconds)
        met = all(r.error is None for r in mine) and (
            worst.build_seconds < limit
        )
        out.append(
            f"{workload}: worst build {worst.build_seconds:.1f} s "
            f"({worst.configuration}), limit {limit:g} s: "
            f"{'MET' if met else 'NOT MET'}"
        )
    return out


def main(argv: Sequence[str]) -> int:
    del argv
    n = int(flags.FLAGS.devices)
    testing.request_cpu_devices(n)
    devices = testing.cpu_devices(n)
    chosen = [w for w in flags.FLAGS.workloads if w]
    configs = [
        c
        for c in configurations(flags.FLAGS.algorithms)
        if not flags.FLAGS.only or c.name in flags.FLAGS.only
    ]
    rows = []
    print(
        f"{'workload':<11} {'configuration':<40} {'trace s':>8} "
        f"{'first s':>8} {'build s':>8} {'nodes':>7}"
    )
    for name in chosen:
        workload = getattr(workloads_lib, name)()
        for config in [None, *configs]:
            row = measure(workload, config, devices, flags.FLAGS.check)
            rows.append(row)
            print(
                f"{name:<11} {row.configuration:<40} {row.trace_seconds:8.2f} "
                f"{row.first_step_seconds:8.2f} {row.build_seconds:8.2f} "
                f"{row.graph_nodes:7d}"
                + (f"  {row.error}" if row.error else ""),
                flush=True,
            )
    for line in verdicts(rows):
        print(line)
    return 0 if all(r.error is None for r in rows) else 2


def define_flags() -> None:
    flags.DEFINE_integer("devices", 8, "Logical CPU devices.")
    flags.DEFINE_list("workloads", ["resnet50", "many_small"], "Workloads.")
    flags.DEFINE_list("algorithms", list(ALGORITHMS), "Spec algorithms.")
    flags.DEFINE_list("only", [], "Only these configuration names.")
    flags.DEFINE_bool("check", True, "Check the sums against numpy.")


if __name__ == "__main__":
    define_flags()
    sys.exit(app.run(lambda argv: main(argv)))
