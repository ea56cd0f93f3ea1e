"""Training-loop helpers: traffic between replicas, preemption, a step's
timeline.

`GradientAccumulator`: `k` micro-batches per all-reduce (gradient
accumulation), so that the wire between hosts carries 1/k of the gradient
traffic of one all-reduce per micro-batch.

`LocalSGD` and `DiLoCo`: each worker takes `period` steps alone (its
replicas reduce only among themselves), then the workers' weights are
averaged (local SGD) or their mean change is a step of an outer optimizer
(DiLoCo): one exchange of the weights per `period` steps instead of one of
the gradients per step.

`PreemptionWatcher`: a SIGTERM on any worker becomes one stop step that
every worker agrees on (through a tiny all-reduce), so that they all save
a checkpoint at that step and leave cleanly.

`compute_average_loss` and the Keras loss `AverageOverExamples`: a
step's loss averaged over the examples it had on every replica, right also
when workers hold different amounts of data (a worker whose data ran out
gets empty batches).

`profile_step`: one step recorded by TensorFlow's profiler (a
`StepProfile`), every op of every host thread (the forward and backward
passes beside each pack's all-reduce), as Chrome trace events that
Perfetto UI, chrome://tracing and TensorBoard's profile plugin open
offline; `write_trace` and `merge_traces` write one worker's file and
join several workers' into one, and `summarize_trace` reads back the
all-reduce's share of the step (a `StepSummary` per process: the union
of the collective ops' intervals over its wall time).

These work with any strategy and CrossDeviceOps of the package, through
TensorFlow's public API (and, for the timeline, the profiler's file
format).
"""

from tf_crossdevice.training._accumulate import GradientAccumulator
from tf_crossdevice.training._average_loss import (
    AverageOverExamples,
    compute_average_loss,
)
from tf_crossdevice.training._periodic_sync import DiLoCo, LocalSGD
from tf_crossdevice.training._preemption import PreemptionWatcher
from tf_crossdevice.training._timeline import (
    COLLECTIVE_OPS,
    STEP_EVENT,
    StepProfile,
    StepSummary,
    merge_traces,
    profile_step,
    summarize_trace,
    write_trace,
)

__all__ = [
    "AverageOverExamples",
    "COLLECTIVE_OPS",
    "DiLoCo",
    "GradientAccumulator",
    "LocalSGD",
    "PreemptionWatcher",
    "STEP_EVENT",
    "StepProfile",
    "StepSummary",
    "compute_average_loss",
    "merge_traces",
    "profile_step",
    "summarize_trace",
    "write_trace",
]
