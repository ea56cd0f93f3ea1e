"""Steps: an all-reduce body traced into a `Step`, and measuring steps.

A body returns `results[k][d]`, value k reduced on replica d. `Step`
traces it twice (one trace returns the results for the check, one sinks
them, as a training step would); `measure` checks, warms up and times
steps in interleaved rounds (`_timing`) against `_measure_inputs`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import values as values_lib
from tf_crossdevice.tuning._measure_inputs import (
    Check,
    Gradients,
    Inputs,
    Results,
)
from tf_crossdevice.tuning._timing import (
    Prepared,
    TimeFn,
    Timing,
    interleaved_rounds,
    prepare,
    reps_for,
    timer,
)


def sink(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Keeps `tensors` alive in a tf.function without copying them.

    One stateful `Assert` per device takes that device's tensors as data
    (with a true condition it does nothing else). Returns a constant 0.
    Assert reads its data in host memory, so on a GPU it takes one
    element of each tensor (which still needs the whole tensor computed)
    rather than copying every result to the host.
    """
    by_device: dict[str, list[tf.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for device, group in by_device.items():
        with tf.device(device):
            if "GPU" in device.upper():
                group = [tf.reshape(t, [-1])[:1] for t in group]
            tf.raw_ops.Assert(
                condition=tf.constant(True), data=group, summarize=0
            )
    return tf.constant(0)


class OwnFunction:
    """`fn` as a callable object, whose tf.function TensorFlow counts alone.

    TensorFlow counts the traces of a tf.function by the code of the Python
    function it wraps, and logs a warning ("5 out of the last 5 calls to
    <function Step.__init__.<locals>.results> triggered tf.function
    retracing") when one code is traced on most of its recent calls. Every
    `Step` wraps functions of the same code, one `Step` per candidate, so
    autotune's candidates, each traced once, looked like one function
    retraced. TensorFlow counts a callable object without `__code__` by the
    object itself: each candidate's function is then one function traced
    once, which is what it is.
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        self._fn = fn

    def __call__(self) -> Any:
        return self._fn()


class Step:
    """Two traces of one body: one returns the results, one sinks them.

    `verify` runs the first once, checks its results and where the step
    placed them, and lets go of it; `timed` is an ordinary tf.function, as a
    training step would be, that sinks the results on their devices.

    One trace cannot serve both: a call that returns 8 x 1000 results spends
    most of its time handing them back (about 5x the sinking step), and a
    sinking function that calls the returning trace runs no faster.
    """

    def __init__(self, body: Callable[[], Results]):
        self.devices: list[list[str]] = []

        def results() -> Results:
            out = body()
            self.devices = [[t.device for t in per] for per in out]
            return out

        self._results: Callable[[], Results] | None = tf.function(
            OwnFunction(results), autograph=False
        )
        self.timed = tf.function(
            OwnFunction(lambda: sink([t for per in body() for t in per])),
            autograph=False,
        )

    def verify(self, check: Check) -> str | None:
        """`check(results, devices)` of one run (once per step)."""
        if self._results is None:
            raise RuntimeError("verify: this step was verified already")
        try:
            return check(self._results(), self.devices)
        finally:
            self._results = None


def measure(
    bodies: Mapping[str, Callable[[], Results]],
    inputs: Inputs,
    *,
    checks: Mapping[str, Check | None] | None = None,
    rounds: int = 5,
    warmup: int = 2,
    target_seconds: float = 0.05,
    max_reps: int = 100,
    seed: int = 0,
) -> list[Timing]:
    """Verifies, warms up and times step bodies in interleaved rounds.

    Args:
        bodies: name -> a body returning `results[k][d]` (traced into a
            `Step`).
        inputs: what the bodies reduce; `inputs.check` verifies each body
            unless `checks` names another check, or None (not verified).
        rounds: timing rounds.
        warmup: untimed calls after the check.
        target_seconds: each measurement repeats the step about this long.
        max_reps: at most this many calls per measurement.
        seed: seeds the round order.

    Returns:
        One record per body, in the order of `bodies`.
    """
    checks = checks or {}
    prepared: dict[str, Prepared] = {}
    timers: dict[str, TimeFn] = {}
    reps: dict[str, int] = {}
    for name, body in bodies.items():
        check = checks.get(name, inputs.check)

        def build(body: Any = body, check: Any = check) -> Any:
            step = Step(body)
            return step.timed, lambda: step.verify(check) if check else None

        prepared[name], call = prepare(build, warmup, check is not None)
        if call is not None:
            timers[name] = timer(call)
            reps[name] = reps_for(
                prepared[name].seconds_per_call, target_seconds, max_reps
            )
    samples, errors = interleaved_rounds(timers, reps, rounds, seed)
    return [
        Timing.of(
            name, p, reps.get(name, 0), samples.get(name, []), errors.get(name)
        )
        for name, p in prepared.items()
    ]


def all_reduce_body(
    cross_device_ops: tf.distribute.CrossDeviceOps, inputs: Inputs
) -> Callable[[], Results]:
    """A body that sums every gradient of `inputs` with one batch_reduce."""

    def body() -> Results:
        values = [(v, v) for v in inputs.values()]
        reduced = cross_device_ops.batch_reduce(
            tf.distribute.ReduceOp.SUM, values
        )
        return [list(values_lib.per_destination(r)) for r in reduced]

    return body


def measure_cross_device_ops(
    candidates: Mapping[str, tf.distribute.CrossDeviceOps],
    devices: Sequence[str],
    gradients: Gradients,
    *,
    seed: int = 0,
    **options: Any,
) -> list[Timing]:
    """`measure` of each CrossDeviceOps summing `gradients` on `devices`.

    Args:
        candidates: name -> a CrossDeviceOps.
        devices: one replica per device.
        gradients: (shape, dtype) of each gradient of one replica.
        seed: seeds the values and the round order.
        **options: rounds, warmup, target_seconds, max_reps (`measure`).
    """
    inputs = Inputs(gradients, devices, seed)
    bodies = {n: all_reduce_body(c, inputs) for n, c in candidates.items()}
    return measure(bodies, inputs, seed=seed, **options)
