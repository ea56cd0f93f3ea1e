"""The example job's step parts: what each timed call runs, and the ratios
the summary derives from the times."""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice

sys.path.insert(
    0,
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "examples"
    ),
)
import train_report  # noqa: E402
import train_timing  # noqa: E402

DEVICES = tf_crossdevice.testing.cpu_devices(2)


def test_ratios_of_hand_worked_times():
    parts = train_timing.Parts(step=0.150, alone=0.120, all_reduce=0.060)
    assert parts.all_reduce_share == pytest.approx(0.4)
    assert parts.overlap == pytest.approx(1.25)
    assert parts.scaling_efficiency == pytest.approx(0.8)
    assert parts.lines() == [
        "step 150.0 ms; this host alone 120.0 ms; all-reduce alone 60.0 ms",
        "all-reduce share of the step: 0.40 (all-reduce alone / step)",
        "overlap: 1.25 (step / max(alone, all-reduce); 1.00: the shorter "
        "one hidden)",
        "scaling efficiency: 0.80 (this host alone / step)",
    ]
    busy = dataclasses.replace(parts, cores=(0.9, 1.0, 0.25))
    assert busy.lines()[-1] == (
        "cores busy (CPU time / wall time): step 0.90, alone 1.00, "
        "all-reduce alone 0.25"
    )
    forward = dataclasses.replace(busy, forward=0.04)
    assert forward.lines()[-2:] == [
        "forward pass alone 40.0 ms: no step under it + the all-reduce "
        "alone, 100.0 ms (no gradient exists before the forward pass ends)",
        busy.lines()[-1],
    ]
    # The all-reduce the longer part: the overlap is against it.
    slow_wire = dataclasses.replace(parts, all_reduce=0.5)
    assert slow_wire.overlap == pytest.approx(0.3)


class CountingOps(tf_crossdevice.ReductionToOneDevice):
    """Counts the values it is asked to reduce, and sums them."""

    def __init__(self):
        super().__init__()
        self.reduced: list[int] = []

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        self.reduced.append(len(value_destination_pairs))
        return super().batch_reduce(reduce_op, value_destination_pairs, options)


def strategy_and_weights():
    ops = CountingOps()
    strategy = tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=ops)
    with strategy.scope():
        weights = [tf.Variable(np.ones((3, 2), np.float32)), tf.Variable(2.0)]
    return strategy, ops, weights


def test_all_reduce_reduces_every_weight_through_the_strategy():
    strategy, ops, weights = strategy_and_weights()
    seconds, cores = train_timing.all_reduce_seconds(strategy, weights, 2)
    assert seconds > 0 and cores > 0
    # Traced once: one reduction of both weights, as Keras's optimizer
    # asks for the gradients of every variable at once.
    assert ops.reduced == [2], ops.reduced


def test_steps_times_the_next_steps_after_an_untimed_one():
    taken = []

    def steps():
        for i in range(10):
            taken.append(i)
            yield tf.constant(float(i))

    seconds, _ = train_timing.steps_seconds(steps(), 3)
    assert seconds >= 0
    assert taken == [0, 1, 2, 3]


def test_cores_busy_come_from_the_clock_given(monkeypatch):
    # Wall clock: start 10.0, calls (10.0 to 10.5), (10.5 to 11.5),
    # end 12.0; another process's CPU clock: 3.0 at the start, 3.6 at the end.
    wall = iter([10.0, 10.0, 10.5, 10.5, 11.5, 12.0])
    cpu = iter([3.0, 3.6])
    monkeypatch.setattr(train_timing.time, "perf_counter", lambda: next(wall))
    seconds, cores = train_timing.median_seconds(
        lambda: None, 2, cpu_seconds=lambda: next(cpu)
    )
    assert seconds == pytest.approx(0.75)  # median of 0.5 and 1.0
    assert cores == pytest.approx(0.6 / 2.0)


def test_the_reporter_s_step_is_the_median_gap_from_the_second_step_on(
    monkeypatch,
):
    # 7 steps; the CPU clock is read at the second step's end and the
    # last's, and nowhere else (next() would run out).
    cpu = iter([4.0, 4.5])
    reporter = train_report.Reporter(
        64, 0, 7, None, verbose=False, cpu_seconds=lambda: next(cpu)
    )
    clock = iter([0.0, 5.0, 5.1, 5.3, 5.4, 6.4, 6.5])  # Step ends.
    monkeypatch.setattr(train_report.time, "perf_counter", lambda: next(clock))
    reporter.step_done()
    reporter.step_done()
    assert np.isnan(reporter.median_step_seconds())
    assert np.isnan(reporter.step_cores())
    for _ in range(5):
        reporter.step_done()
    # Gaps from the second step's end: 0.1, 0.2, 0.1, 1.0 (a checkpoint),
    # 0.1; the first step (5.0 s, tracing) is left out.
    assert reporter.median_step_seconds() == pytest.approx(0.1)
    # 0.5 CPU seconds over 1.5 s of steps.
    assert reporter.step_cores() == pytest.approx(0.5 / 1.5)
