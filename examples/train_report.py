"""Progress lines, TensorBoard scalars and the closing summary of the job,
and its --timeline files."""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
import train_timing
from tensorflow.core.framework import summary_pb2

import tf_crossdevice

RULE = "-" * 64
# TensorBoard's scalar plugin reads summaries with this metadata. Written
# with tf.summary.write, which needs no tensorboard package (tf.summary.scalar
# does); `pip install tensorboard` only to view them.
_SCALAR = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
)


def _scalar(name: str, value: float) -> None:
    tf.summary.write(name, tf.constant(value, tf.float32), metadata=_SCALAR)


class Reporter:
    """Prints progress and writes TensorBoard scalars (chief only).

    Args:
        global_batch: examples per step, over every replica.
        start_step: the step training starts (or resumes) from.
        total_steps: the step it ends at.
        log_dir: where scalars go (None: nowhere).
        verbose: print progress lines (the chief does; other workers not).
        cpu_seconds: the CPU clock of what trains on the first host (this
            process, unless it drives workers elsewhere).
    """

    def __init__(
        self,
        global_batch: int,
        start_step: int,
        total_steps: int,
        log_dir: str | None,
        verbose: bool,
        cpu_seconds: Callable[[], float] = time.process_time,
    ) -> None:
        self.global_batch = global_batch
        self.cpu_seconds = cpu_seconds
        self.start_step = start_step
        self.total_steps = total_steps
        self.verbose = verbose
        self._writer = (
            tf.summary.create_file_writer(log_dir) if log_dir else None
        )
        self._last = (start_step, time.perf_counter())
        # When each step of this run ended (and the process's CPU time).
        self._step_ends: list[float] = []
        # The CPU clock at the second step's end and at the last's, read
        # then only (another process's clock costs a look at /proc).
        self._step_cpu: dict[int, float] = {}
        self.loss = float("nan")
        self.accuracy = float("nan")

    @property
    def steps_trained(self) -> int:
        """Steps this run trained (counted as they end, not worked out from
        the step numbers): a resumed job trains only the steps it lacks."""
        return len(self._step_ends)

    def step_done(self) -> None:
        """Counts a step; the first one's end (tracing) is left out of rates."""
        self._step_ends.append(time.perf_counter())
        done = len(self._step_ends)
        if done in (2, self.total_steps - self.start_step):
            self._step_cpu[done - 1] = self.cpu_seconds()

    def record(self, step: int, loss: float, accuracy: float) -> None:
        """Reports the steps since the last call; `step` steps are done."""
        now = time.perf_counter()
        last_step, last_time = self._last
        first = self.start_step + 1
        if self._step_ends and last_step < first:
            last_step, last_time = first, self._step_ends[0]
        steps = max(step - last_step, 1)
        step_time = (now - last_time) / steps
        rate = self.global_batch / step_time if step_time > 0 else 0.0
        eta = step_time * (self.total_steps - step)
        self._last = (step, now)
        self.loss, self.accuracy = loss, accuracy
        if self.verbose:
            print(
                f"step {step:5d}/{self.total_steps}  loss {loss:.4f}  "
                f"accuracy {accuracy:.3f}  {rate:8.1f} examples/s  "
                f"{step_time * 1e3:7.1f} ms/step  ETA {eta:5.0f} s",
                flush=True,
            )
        if self._writer is not None:
            with self._writer.as_default(step=step):
                _scalar("loss", loss)
                _scalar("accuracy", accuracy)
                _scalar("step_time_seconds", step_time)
                _scalar("examples_per_second", rate)
            self._writer.flush()

    def total_rate(self) -> tuple[float, int, float]:
        """(examples/s, steps, seconds) after the first step."""
        end_step, end_time = self._last
        first = self.start_step + 1
        if not self._step_ends or end_step <= first:
            return 0.0, 0, 0.0
        seconds = end_time - self._step_ends[0]
        steps = end_step - first
        return self.global_batch * steps / seconds, steps, seconds

    def median_step_seconds(self) -> float:
        """The median time from one step's end to the next's, from the
        second step's end on (nan with fewer than 3 steps): the first steps
        trace, and steps that also saved a checkpoint or printed a line
        are outliers the median leaves out."""
        gaps = np.diff(self._step_ends[1:])
        return float(np.median(gaps)) if len(gaps) else float("nan")

    def step_cores(self) -> float:
        """CPU time (`cpu_seconds`) over the wall time, from the second
        step's end to the last's: the cores the training kept busy (nan
        before the last step, or with fewer than 3)."""
        last = len(self._step_ends) - 1
        if last < 2 or last not in self._step_cpu:
            return float("nan")
        wall = self._step_ends[last] - self._step_ends[1]
        return (self._step_cpu[last] - self._step_cpu[1]) / wall

    def write_timeline(
        self,
        step: int,
        summary: tf_crossdevice.training.StepSummary,
        sent_bytes_per_second: float | None,
    ) -> None:
        """The scalars of the traced step `step` (--timeline): the
        collective ops' share of it, where any ran (an in-process
        reduction runs ordinary ops, which it cannot count), and the bytes
        this host sent per second, where they were counted."""
        if self._writer is None:
            return
        with self._writer.as_default(step=step):
            if summary.collective_ops:
                _scalar("timeline/all_reduce_share", summary.all_reduce_share)
            if sent_bytes_per_second is not None:
                _scalar("timeline/sent_bytes_per_second", sent_bytes_per_second)
        self._writer.flush()

    def write_eval(self, step: int, accuracy: float) -> None:
        if self._writer is not None:
            with self._writer.as_default(step=step):
                _scalar("eval_accuracy", accuracy)
            self._writer.flush()


def weights_digest(weights: Sequence[np.ndarray]) -> str:
    """A short hash of the weights' bytes: equal digests, equal weights."""
    h = hashlib.sha256()
    for w in weights:
        h.update(np.ascontiguousarray(w).tobytes())
    return h.hexdigest()[:16]


def summary(
    reporter: Reporter,
    eval_accuracy: float,
    eval_examples: int,
    replicas_equal: bool,
    num_replicas: int,
    digest: str,
    model_dir: str,
    parts: train_timing.Parts | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The closing block, like tf_cnn_benchmarks' (total images/sec), with
    the step's parts when they were timed and `notes` on the run's
    data."""
    rate, steps, seconds = reporter.total_rate()
    equal = "yes" if replicas_equal else "NO"
    return "\n".join(
        [
            RULE,
            f"trained {reporter.steps_trained} steps in this run, from step "
            f"{reporter.start_step}",
            *notes,
            f"total examples/s: {rate:.1f} ({steps} steps x "
            f"{reporter.global_batch} examples in {seconds:.1f} s, after "
            "the first step)",
            *(parts.lines() if parts else []),
            f"final loss: {reporter.loss:.4f}",
            f"final training accuracy: {reporter.accuracy:.3f}",
            f"held-out accuracy: {eval_accuracy:.3f} ({eval_examples} "
            "examples)",
            f"replica weights equal: {equal} ({num_replicas} replicas)",
            f"weights digest: {digest}",
            f"model_dir: {model_dir}",
            RULE,
        ]
    )


# ---- --timeline -------------------------------------------------------------

VIEWERS = (
    "open it offline in Perfetto UI (ui.perfetto.dev, Open trace file) or "
    "Chromium's chrome://tracing (Load); TensorBoard's profile plugin "
    "(pip install tensorboard-plugin-profile) shows the same step from "
    "{model_dir}/plugins/profile (tensorboard --logdir={model_dir}, "
    "Profile tab)"
)


def timeline_file(path: str, worker: int, num_workers: int) -> str:
    """Where worker `worker` of `num_workers` writes its --timeline trace:
    `path` itself for one worker, else with .worker<i> before .json.

    >>> timeline_file("/tmp/step.json", 0, 1)
    '/tmp/step.json'
    >>> timeline_file("/tmp/step.json", 1, 2)
    '/tmp/step.worker1.json'
    """
    if num_workers == 1:
        return path
    return f"{path[: -len('.json')]}.worker{worker}.json"


def save_timeline(
    profile: tf_crossdevice.training.StepProfile,
    path: str,
    step: int,
    worker: int,
    num_workers: int,
) -> tf_crossdevice.training.StepSummary:
    """Writes this worker's trace of step `step`; the step's summary.

    The file keeps what the chief's report needs besides the events: the
    step's start (to tell this run's file from an older one at the same
    path) and the bytes this host sent.
    """
    (summary,) = tf_crossdevice.training.summarize_trace(profile.events)
    tf_crossdevice.training.write_trace(
        timeline_file(path, worker, num_workers),
        profile.events,
        {
            "worker": worker,
            "step": step,
            "step_start_us": profile.start_us,
            "wall_seconds": profile.wall_seconds,
            "sent_bytes": profile.sent_bytes,
            "sent_bytes_per_second": profile.sent_bytes_per_second,
        },
    )
    return summary


def timeline_report(
    path: str, step: int, num_workers: int, since_us: float, model_dir: str
) -> list[str]:
    """The chief's lines on the traced step, after every worker traced it.

    Reads each worker's file written since `since_us` (wall clock, µs):
    those of the workers on this machine. With several workers, merges
    them into `path`; a worker whose file is elsewhere is named with where
    its own machine has it.
    """
    found: dict[int, str] = {}
    lines = []
    for worker in range(num_workers):
        file = timeline_file(path, worker, num_workers)
        trace = _read_trace(file)
        other = (trace or {}).get("otherData", {})
        if trace is None or other.get("step_start_us", 0) < since_us:
            lines.append(
                f"  worker {worker}: no trace of this run at {file} on this "
                "machine (it is on the worker's own machine; copy it here "
                "and join them with tf_crossdevice.training.merge_traces)"
            )
            continue
        found[worker] = file
        (summary,) = tf_crossdevice.training.summarize_trace(
            trace["traceEvents"]
        )
        lines.append(_timeline_line(worker, summary, other))
    if not found:
        return [f"--timeline: no trace of step {step} found", *lines]
    if num_workers > 1:
        tf_crossdevice.training.merge_traces(found, path)
    merged = ", ".join(str(w) for w in found)
    what = f"workers {merged} merged" if num_workers > 1 else "1 worker"
    viewers = VIEWERS.format(model_dir=model_dir)
    return [f"timeline of step {step}: {path} ({what}); {viewers}", *lines]


def _read_trace(file: str) -> dict[str, Any] | None:
    """A trace file's contents; None where there is no such file."""
    if not os.path.exists(file):
        return None
    with open(file) as f:
        return json.load(f)


def _timeline_line(
    worker: int,
    summary: tf_crossdevice.training.StepSummary,
    other: dict[str, Any],
) -> str:
    step = f"  worker {worker}: {summary.step_us / 1e3:.1f} ms step; "
    if summary.collective_ops:
        share = (
            f"collective ops {summary.all_reduce_share:.1%} of it "
            f"({summary.collective_ops} ops)"
        )
    else:
        share = (
            "no collective op ran (an in-process reduction runs ordinary "
            "ops, not counted)"
        )
    rate = other.get("sent_bytes_per_second")
    sent = (
        "; sent bytes not counted here (no /sys/class/net)"
        if rate is None
        else f"; sent {rate:.0f} B/s on interfaces other than loopback"
    )
    return step + share + sent
