"""PreemptionWatcher: every worker stops at the same step after a SIGTERM.

Cluster managers announce a preemption with SIGTERM, to one process of a
job or to all of them at slightly different times, and kill what is left
after a grace period. A between-graph job must then save a checkpoint at
one step on every worker: a worker that stops alone leaves the others
blocked in their next collective until it times out.

TensorFlow's `tf.distribute.experimental.PreemptionCheckpointHandler` agrees
on that step through TensorFlow's coordination service (a key-value store
on the chief). `tf_crossdevice.MultiWorkerMirroredStrategy` does not start
that service (it enables collectives itself, so that start-up is bounded by
`timeout_seconds`), and there the handler fails: its watcher thread dies
with "FailedPreconditionError: Coordination service is not enabled." and
the SIGTERM itself raises "Coordination service agent is not enabled."
from the handler, which ends the signalled worker with status 1 and leaves
the others waiting. This watcher agrees through the job's own collectives
instead, as Horovod's elastic mode does with its own all-reduces.
"""

from __future__ import annotations

import signal
import threading
import types
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks
from tf_crossdevice.cluster import WorkerReplicas


class PreemptionWatcher:
    """Turns a termination signal on any worker into one agreed stop step.

    Creating it installs a handler for `signals` that only records that a
    signal came (the process keeps running); `close()` (or leaving the
    `with` block) puts the previous handlers back. Every worker calls
    `should_stop()` once per step at the same point of the step; every
    `check_every`-th call all-reduces the workers' flags (one float per
    replica, summed over every replica of every worker), so that the calls
    return True on every worker at the same call: each worker then saves
    its checkpoint at the same step and leaves. Without a strategy, or with
    one of a single worker, no collective runs: the flag is this process's.

    >>> with PreemptionWatcher() as watcher:
    ...     before = watcher.should_stop()
    ...     signal.raise_signal(signal.SIGTERM)  # What a preemption sends.
    ...     after = watcher.should_stop()
    >>> before, after, watcher.received
    (False, True, True)

    In a training loop (every worker runs it):

        with tf_crossdevice.training.PreemptionWatcher(strategy) as watcher:
            for step in range(start, steps):
                train_step(next(iterator))
                if watcher.should_stop():
                    manager.save(checkpoint_number=step + 1)
                    break

    An in-graph controller passes its `workers`: a SIGTERM to one of their
    servers (started by `tf_crossdevice.cluster` or the example job, which
    record it as a notice and serve on) then stops the controller at its
    next check, while the server still holds its variables.

    Args:
        strategy: the job's `tf.distribute.Strategy` (its workers agree
            through its `reduce`); None for a single process, such as an
            in-graph controller.
        workers: an in-graph controller's `WorkerReplicas`, whose servers'
            preemption notices count as signals here (one small op per
            worker at each check).
        check_every: agree on every this-many calls to `should_stop`; a
            signal waits for the next agreement. 1 costs one tiny
            all-reduce per step.
        signals: the signals that announce a preemption.

    Raises:
        TypeError: `check_every` is not an int.
        ValueError: `check_every` is below 1, `signals` is empty or names
            no signal, or the watcher is created outside the main thread
            (Python installs signal handlers only there).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy | None = None,
        *,
        check_every: int = 1,
        signals: Iterable[int] = (signal.SIGTERM,),
        workers: WorkerReplicas | None = None,
    ) -> None:
        self._check_every = checks.positive_int(check_every, "check_every")
        chosen = list(signals)
        if not chosen:
            raise ValueError("signals: empty; expected e.g. [signal.SIGTERM]")
        for i, sig in enumerate(chosen):
            if not isinstance(sig, int) or sig not in signal.valid_signals():
                raise ValueError(
                    f"signals[{i}]: {sig!r} is not a signal; expected e.g. "
                    "signal.SIGTERM or signal.SIGINT"
                )
        if threading.current_thread() is not threading.main_thread():
            raise ValueError(
                "PreemptionWatcher: create it in the main thread; Python "
                "installs signal handlers only there"
            )
        if workers is not None and not isinstance(workers, WorkerReplicas):
            raise TypeError(
                "workers: expected None or a "
                f"tf_crossdevice.cluster.WorkerReplicas, got {workers!r}"
            )
        self._strategy = strategy if _num_workers(strategy) > 1 else None
        self._workers = workers
        self._preempted_workers: list[str] = []
        self._received = threading.Event()
        self._calls = 0
        self._stopping = False
        self._sum_flags: Any = None
        self._previous = {
            sig: signal.signal(sig, self._on_signal) for sig in chosen
        }

    def _on_signal(self, signum: int, frame: Any) -> None:
        del signum, frame
        self._received.set()

    @property
    def received(self) -> bool:
        """Whether this process has received one of the signals."""
        return self._received.is_set()

    @property
    def preempted_workers(self) -> list[str]:
        """The `workers` whose servers recorded a notice, as of the check
        that stopped the job: '/job:worker/replica:0/task:1 (host:port)'."""
        return list(self._preempted_workers)

    def should_stop(self) -> bool:
        """Whether every worker stops now; the same answer on every worker.

        Call it on every worker, the same number of times (once per step),
        and while the other workers can take part in a collective. Once it
        has returned True it returns True without a collective.
        """
        if self._stopping:
            return True
        self._calls += 1
        if self._calls % self._check_every:
            return False
        flag = self._received.is_set()
        if self._workers is not None:
            self._preempted_workers = self._workers.preempted_workers()
            flag = flag or bool(self._preempted_workers)
        if self._strategy is not None:
            flag = self._agree(flag)
        self._stopping = flag
        return flag

    def _agree(self, flag: bool) -> bool:
        if self._sum_flags is None:
            strategy: Any = self._strategy

            # Traced once: a tf.function with the strategy's collective.
            @tf.function
            def sum_flags(value: tf.Tensor) -> tf.Tensor:
                per_replica = strategy.run(tf.identity, args=(value,))
                return strategy.reduce(
                    tf.distribute.ReduceOp.SUM, per_replica, axis=None
                )

            self._sum_flags = sum_flags
        return float(self._sum_flags(tf.constant(float(flag)))) > 0

    def close(self) -> None:
        """Puts back the handlers that were there before; safe to repeat."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def __enter__(self) -> PreemptionWatcher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: types.TracebackType | None,
    ) -> None:
        self.close()


def _num_workers(strategy: tf.distribute.Strategy | None) -> int:
    """Worker and chief tasks of the strategy's cluster (1 without one)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("chief", [])) + len(spec.get("worker", [])))
