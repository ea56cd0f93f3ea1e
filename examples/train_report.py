"""Progress lines, TensorBoard scalars and the closing summary of the job."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import train_timing
from tensorflow.core.framework import summary_pb2

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
) -> str:
    """The closing block, like tf_cnn_benchmarks' (total images/sec), with
    the step's parts when they were timed."""
    rate, steps, seconds = reporter.total_rate()
    equal = "yes" if replicas_equal else "NO"
    return "\n".join(
        [
            RULE,
            f"trained {reporter.steps_trained} steps in this run, from step "
            f"{reporter.start_step}",
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
