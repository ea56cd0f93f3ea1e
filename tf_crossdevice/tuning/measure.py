"""Measuring all-reduce steps: inputs, a numpy check, interleaved timing.

What the library needs to compare candidates (for selection and autotuning)
and what the benchmark study (`benchmarks/`, not installed) builds on. A
step is a `tf.function` whose body returns `results[k][d]`, value k reduced
on replica d. Each step is traced, run once and checked against numpy's sum
(values and placement), warmed up, then timed: every step once per round,
in a fresh random order each round, so that a noisy neighbour slows all of
them alike. A step that gives a wrong number is never timed.

>>> devices = tf_crossdevice.testing.cpu_devices(2)
>>> timings = measure_cross_device_ops(
...     {"xring": tf_crossdevice.SpecAllReduce("xring"),
...      "TF ReductionToOneDevice": tf.distribute.ReductionToOneDevice()},
...     devices, [((100,), "float32"), ((3, 4), "float64")],
...     rounds=3, target_seconds=0.001)
>>> [(t.name, t.verified, len(t.samples)) for t in timings]
[('xring', True, 3), ('TF ReductionToOneDevice', True, 3)]

The parts live in private modules: `_measure_inputs` (the values and
numpy's sum, the check of a result), `_steps` (a body traced into a
`Step`, `measure`) and `_timing` (build, check and warm-up of an entry,
interleaved rounds, the record).
"""

from tf_crossdevice.tuning._measure_inputs import (
    Check,
    Gradients,
    Inputs,
    Results,
    canonical,
    mismatch,
    mismatch_beyond,
    read_on,
    replica_seed,
)
from tf_crossdevice.tuning._steps import (
    Step,
    all_reduce_body,
    measure,
    measure_cross_device_ops,
    sink,
)
from tf_crossdevice.tuning._timing import (
    Prepared,
    TimeFn,
    Timing,
    first_line,
    interleaved_rounds,
    prepare,
    reps_for,
    time_calls,
    timer,
)

__all__ = [
    "Check",
    "Gradients",
    "Inputs",
    "Prepared",
    "Results",
    "Step",
    "TimeFn",
    "Timing",
    "all_reduce_body",
    "canonical",
    "first_line",
    "interleaved_rounds",
    "measure",
    "measure_cross_device_ops",
    "mismatch",
    "mismatch_beyond",
    "prepare",
    "read_on",
    "replica_seed",
    "reps_for",
    "sink",
    "time_calls",
    "timer",
]
