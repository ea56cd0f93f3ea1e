"""How much of a step the all-reduce costs (--timing_steps).

A training step computes (forward pass, backward pass, update) and
all-reduces the gradients between the workers; the all-reduce's packs can
run while backpropagation still computes earlier layers. After its last
step, each worker times, all at once (so that every host computes on its
own core share while the others do, as in training):

- the step on this host alone: the same custom-loop step, on a copy of the
  model and optimizer under a `tf.distribute.MirroredStrategy` of this
  worker's own devices (several are reduced with ReductionToOneDevice), on
  this worker's part of the global batch. Nothing crosses a link: it is
  the step of a one-host job with this core share.
- the forward pass alone: the step's forward pass and loss, on the same
  copy and examples as the step alone, no gradient taken. No gradient
  exists before it ends, so no step of a model whose all-reduce is
  bounded by its link is shorter than it plus the all-reduce alone (the
  dependency bound), whatever the overlap.
- the all-reduce alone: the all-reduce the step runs, through the same path
  (Keras's optimizer sums the gradients with the replica context's
  `all_reduce`), on values of the gradients' shapes and dtypes: the
  trainable weights. A compressor's state moves on with it; the job has
  saved its last checkpoint already.

In-graph, the controller times the step of the first host's replicas
alone (their gradients averaged on its first device) while the other
hosts idle, which lends it nothing, each host's core share being a quota;
and the in-graph step's `batch_reduce` alone, on the weights' values.
Where the controller started the workers itself, the cores busy are the
first worker's (its process's CPU time over the wall time); with workers
elsewhere it cannot see them and prints none.

Each is the median of `--timing_steps` calls after one untimed call that
traces it; the training's step is the median of its own steps. Besides
its all-reduce, the training's step under a strategy also runs small
collectives that neither reference does (the preemption watcher's
agreement, the loss's and the correct count's reduction). The chief
prints. From them: the all-reduce's share of the step, the overlap (the
step against the longer of the two, as if the shorter were hidden behind
it) and the scaling efficiency (the step alone over the step: these
hosts' examples/s over as many lone hosts').
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tf_crossdevice.tuning import measure


@dataclasses.dataclass(frozen=True)
class Parts:
    """Seconds of the training's median step and of its two references."""

    step: float
    alone: float  # The same step on this host alone.
    all_reduce: float  # The all-reduce alone.
    # CPU seconds per second during each of (step, alone, all-reduce) of
    # what trains on this host: the cores it kept busy.
    cores: tuple[float, float, float] | None = None
    forward: float | None = None  # The forward pass alone on this host.

    @property
    def all_reduce_share(self) -> float:
        """The all-reduce alone, as a fraction of the step."""
        return self.all_reduce / self.step

    @property
    def overlap(self) -> float:
        """step / max(alone, all-reduce): 1.0 when the shorter is wholly
        hidden behind the longer; 1 + min/max when they run one after the
        other."""
        return self.step / max(self.alone, self.all_reduce)

    @property
    def scaling_efficiency(self) -> float:
        """alone / step: these hosts' examples/s over as many lone hosts'
        with the same core share and the same batch each."""
        return self.alone / self.step

    def lines(self) -> list[str]:
        ms = 1e3
        lines = [
            f"step {self.step * ms:.1f} ms; this host alone "
            f"{self.alone * ms:.1f} ms; all-reduce alone "
            f"{self.all_reduce * ms:.1f} ms",
            f"all-reduce share of the step: {self.all_reduce_share:.2f} "
            "(all-reduce alone / step)",
            f"overlap: {self.overlap:.2f} (step / max(alone, all-reduce); "
            "1.00: the shorter one hidden)",
            f"scaling efficiency: {self.scaling_efficiency:.2f} (this host "
            "alone / step)",
        ]
        if self.forward is not None:
            lines.append(
                f"forward pass alone {self.forward * ms:.1f} ms: no step "
                "under it + the all-reduce alone, "
                f"{(self.forward + self.all_reduce) * ms:.1f} ms (no "
                "gradient exists before the forward pass ends)"
            )
        if self.cores:
            step, alone, all_reduce = self.cores
            lines.append(
                f"cores busy (CPU time / wall time): step {step:.2f}, "
                f"alone {alone:.2f}, all-reduce alone {all_reduce:.2f}"
            )
        return lines


def median_seconds(
    call: Callable[[], Any],
    calls: int,
    cpu_seconds: Callable[[], float] = time.process_time,
) -> tuple[float, float]:
    """The median time of `calls` calls of `call`, each waited for, after
    one untimed call; and the cores kept busy meanwhile: CPU time
    (`cpu_seconds`, by default this process's, every thread's) over the
    wall time."""
    _wait(call())
    times = []
    cpu, wall = cpu_seconds(), time.perf_counter()
    for _ in range(calls):
        start = time.perf_counter()
        _wait(call())
        times.append(time.perf_counter() - start)
    cores = (cpu_seconds() - cpu) / (time.perf_counter() - wall)
    return float(np.median(times)), cores


def _wait(result: Any) -> None:
    for t in tf.nest.flatten(result):
        np.asarray(t)


def steps_seconds(steps: Iterator[Any], calls: int) -> tuple[float, float]:
    """`median_seconds` of the next `calls` steps of `steps`."""
    return median_seconds(lambda: next(steps), calls)


def all_reduce_seconds(
    strategy: tf.distribute.Strategy, variables: list[Any], calls: int
) -> tuple[float, float]:
    """`median_seconds` of the replica context's all-reduce of `variables`'
    values under `strategy` (what Keras's optimizer runs on gradients)."""

    def replica_all_reduce():
        values = [tf.identity(v) for v in variables]
        context = tf.distribute.get_replica_context()
        return measure.sink(context.all_reduce("sum", values))

    @tf.function
    def all_reduce():
        return strategy.experimental_local_results(
            strategy.run(replica_all_reduce)
        )

    return median_seconds(all_reduce, calls)


def average_seconds(
    replicas: Any,
    average: Callable[[list[list[Any]]], list[Any]],
    variables: list[list[Any]],
    calls: int,
    cpu_seconds: Callable[[], float] = time.process_time,
) -> tuple[float, float]:
    """`median_seconds` of the in-graph step's all-reduce, `average`, on
    values of the gradients' shapes: replica r's values of `variables[r]`,
    run by `replicas` (a `tf_crossdevice.cluster.WorkerReplicas`)."""

    @tf.function
    def all_reduce():
        values = []
        for device, replica_variables in zip(
            replicas.devices, variables, strict=True
        ):
            with tf.device(device):
                values.append([tf.identity(v) for v in replica_variables])
        means = average(values)
        results = [getattr(m, "values", (m,)) for m in means]
        return measure.sink([t for r in results for t in r])

    return median_seconds(lambda: replicas.run(all_reduce), calls, cpu_seconds)
