"""Local SGD and DiLoCo: workers train alone, and sync every `period` steps.

Between hosts on slow links the cheapest byte is the one never sent.
Local SGD (Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR
2020; PyTorch's post-local SGD) lets every worker take `period` optimizer
steps on its own data, its replicas reducing only among themselves, then
averages the workers' weights. DiLoCo (Douillard et al., "DiLoCo:
Distributed Low-Communication Training of Language Models", 2023) treats
the average change as a gradient of an outer optimizer (Nesterov SGD,
learning rate 0.7, momentum 0.9 in the paper) applied to the weights of the
last sync. Both start with `warmup_steps` synchronous steps, as the
post-local SGD recipe does.

Every sync, each variable's change since the last sync, anchor - weights
(the same on every replica of a worker), is all-reduced as a MEAN over
every replica through `cross_device_ops` (the strategy's by default, or
any class of the package, so bf16 or PowerSGD can compress it), then:

    local SGD:  anchor <- anchor - mean change     (the mean of the weights)
    DiLoCo:     anchor <- outer_optimizer step on anchor, gradient = mean change
    weights <- anchor, on every replica

The inner optimizer's state (momentum, Adam's moments) stays each
worker's own. The helper's variables (the anchors, the outer optimizer's
state and the steps done) are the same on every worker: checkpoint it
beside the model (`tf.train.Checkpoint(..., sync=helper)`) at a sync, and
a job restored there replays the period from the same weights.

How a step reduces only within its worker: the step is traced twice, once
as it is (the warm-up's synchronous steps) and once inside the strategy's
`reducing_with` block with a reduction among the worker's devices
(`_within_worker`). Which one runs, and whether a sync follows, is decided
in Python before each call, from the steps done: no all-reduce sits in a
conditional branch, which tf.distribute refuses in replica functions.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras  # type: ignore[import-untyped]
import tensorflow as tf

from tf_crossdevice._core import checks, reprs
from tf_crossdevice.training._within_worker import WithinWorker

__all__ = ["DiLoCo", "LocalSGD"]


class LocalSGD(tf.Module):
    """Workers take `period` steps alone, then average their weights.

    Create it under `strategy.scope()`, after the model, with the
    variables to sync (`model.trainable_variables`; add the non-trainable
    ones, BatchNorm's moving statistics, to average those too). For
    `model.fit`, pass `callbacks=[local_sgd.callback()]`. In a custom
    loop, wrap the step (a function that calls `strategy.run`):

    >>> import keras
    >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    >>> with strategy.scope():
    ...     w = tf.Variable([1.0])
    ...     optimizer = keras.optimizers.SGD(learning_rate=0.25)
    ...     local_sgd = tf_crossdevice.training.LocalSGD(
    ...         [w], period=2, warmup_steps=1)
    >>> def step():
    ...     def replica_step():
    ...         with tf.GradientTape() as tape:
    ...             loss = tf.nn.compute_average_loss(w * w)
    ...         optimizer.apply_gradients(
    ...             zip(tape.gradient(loss, [w]), [w]))
    ...     strategy.run(replica_step)
    >>> train_step = local_sgd.wrap(step)
    >>> for _ in range(3):
    ...     train_step()
    >>> w.numpy()  # Each step w <- w - 0.25 * 2 w; one worker: exact.
    array([0.125], dtype=float32)
    >>> int(local_sgd.steps_done.numpy()), local_sgd.is_sync_step(3)
    (3, True)

    With one worker (TensorFlow's MirroredStrategy) every step is
    synchronous anyway and a sync changes nothing; between workers it
    needs `tf_crossdevice.MultiWorkerMirroredStrategy`. Checkpoint it
    beside the model at a sync (`is_synced`): its anchors, steps done and
    (DiLoCo) outer optimizer are the same on every worker; each worker's
    inner optimizer state is its own.

    Args:
        variables: the variables whose weights are synced.
        period: steps between syncs (H); 1 is synchronous training with
            an extra average.
        warmup_steps: synchronous steps first; the periods start after.
        cross_device_ops: what all-reduces the changes at a sync: one of
            the package's classes (with `compression=` to compress them;
            use an object of its own, not the strategy's, so that PowerSGD
            keeps the changes' state apart from the gradients'). None: the
            strategy's.
        name: the module's name.

    Raises:
        TypeError: `period` or `warmup_steps` not an int; several workers
            under a strategy other than ours.
        ValueError: `period` < 1, `warmup_steps` < 0, no variables, or not
            created under a strategy's scope.
    """

    def __init__(
        self,
        variables: Sequence[Any],
        period: int,
        warmup_steps: int = 0,
        cross_device_ops: Any = None,
        name: str = "local_sgd",
    ) -> None:
        super().__init__(name=name)
        if not tf.distribute.has_strategy():
            raise ValueError(
                f"{name}: create it under strategy.scope(), where its "
                "variables are mirrored as the model's"
            )
        self._strategy = tf.distribute.get_strategy()
        self.period = checks.positive_int(period, "period")
        self.warmup_steps = checks.non_negative_int(
            warmup_steps, "warmup_steps"
        )
        if not list(variables):
            raise ValueError(
                "variables: expected at least one variable, got none"
            )
        # Untracked: a checkpoint of the helper holds its own state, not
        # the model's weights again, nor PowerSGD's per-worker state.
        self._parts = _Parts(tuple(variables), cross_device_ops)
        devices = list(self._strategy.extended.worker_devices)
        self.workers = self._strategy.num_replicas_in_sync // len(devices)
        self._within = WithinWorker(devices, self.workers)
        if self.workers > 1 and not hasattr(self._strategy, "reducing_with"):
            raise TypeError(
                f"{name}: reducing within a worker between syncs needs "
                "tf_crossdevice.MultiWorkerMirroredStrategy, got "
                f"{type(self._strategy).__name__}"
            )
        with self.name_scope:
            self.anchors = [
                tf.Variable(
                    tf.identity(_tensor(v)), trainable=False, name="anchor"
                )
                for v in self._parts.variables
            ]
            self.steps_done = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="steps_done",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        self._sync_function = tf.function(self._sync_body)
        self._fit_callback: _FitCallback | None = None

    def is_sync_step(self, step: int) -> bool:
        """Whether the step that makes `step` steps done ends with a
        sync (the warm-up's steps are synchronous; none needs one)."""
        after = step - self.warmup_steps
        return after > 0 and after % self.period == 0

    def is_synced(self, step: int) -> bool:
        """Whether every worker holds the same weights after `step` steps:
        in the warm-up, or at a sync."""
        return step <= self.warmup_steps or self.is_sync_step(step)

    @contextlib.contextmanager
    def within_worker(self) -> Iterator[None]:
        """Steps traced inside reduce among this worker's devices alone."""
        if self.workers == 1:
            yield
            return
        with self._strategy.reducing_with(self._within):
            yield

    def wrap(self, step_function: Callable[..., Any]) -> Callable[..., Any]:
        """`step_function` (a step that calls `strategy.run`, or a
        `tf.function` of one) as a callable that runs it synchronously in
        the warm-up, within the worker after it, and syncs when due."""
        python_function = getattr(
            step_function, "python_function", step_function
        )
        synchronous = tf.function(python_function)
        local = tf.function(python_function)

        def step(*args: Any, **kwargs: Any) -> Any:
            if int(self.steps_done.numpy()) < self.warmup_steps:
                out = synchronous(*args, **kwargs)
            else:
                with self.within_worker():
                    out = local(*args, **kwargs)
            self.step_done()
            return out

        return step

    def step_done(self) -> bool:
        """Counts a step; at the warm-up's end the anchors take the
        weights, and when a sync is due it runs. Returns whether it
        synced. Call it eagerly, after every step (`wrap` and the Keras
        callback do)."""
        done = int(self.steps_done.assign_add(1).numpy())
        if done == self.warmup_steps:
            # Synchronous steps left every worker the same weights.
            for anchor, variable in zip(
                self.anchors, self._parts.variables, strict=True
            ):
                anchor.assign(_tensor(variable))
        if not self.is_sync_step(done):
            return False
        self.sync()
        return True

    def sync(self) -> None:
        """All-reduces the change since the last sync and applies it (see
        the module docstring); every replica then holds the anchors."""
        self._sync_function()

    def _sync_body(self) -> None:
        def changes() -> list[tf.Tensor]:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(
                tf.distribute.ReduceOp.MEAN,
                [
                    anchor - _tensor(variable)
                    for anchor, variable in zip(
                        self.anchors, self._parts.variables, strict=True
                    )
                ],
            )

        reducing = (
            self._strategy.reducing_with(self._parts.cross_device_ops)
            if self._parts.cross_device_ops is not None
            else contextlib.nullcontext()
        )
        with reducing:
            mean = self._strategy.run(changes)
        self._apply_changes(list(mean))
        for variable, anchor in zip(
            self._parts.variables, self.anchors, strict=True
        ):
            variable.assign(anchor)

    def _apply_changes(self, mean: list[Any]) -> None:
        """The anchors take the workers' mean weights."""
        for anchor, change in zip(self.anchors, mean, strict=True):
            anchor.assign_sub(change)

    def __repr__(self) -> str:
        return reprs.call_repr(
            type(self),
            period=self.period,
            warmup_steps=self.warmup_steps,
            cross_device_ops=self._parts.cross_device_ops,
            name=self.name,
        )

    def callback(self) -> keras.callbacks.Callback:
        """A Keras callback that makes `model.fit` train this way (the
        same one each call: it keeps the functions it traced between
        `fit` calls)."""
        if self._fit_callback is None:
            self._fit_callback = _FitCallback(self)
        return self._fit_callback


class DiLoCo(LocalSGD):
    """Local SGD whose syncs step an outer optimizer (Douillard et al.).

    As `LocalSGD`, but a sync treats the workers' mean change since the
    last sync as the gradient of `outer_optimizer` on the weights of the
    last sync. The default outer optimizer is the paper's: Nesterov SGD,
    learning rate 0.7, momentum 0.9. Its state is the same on every worker
    and is saved with the helper.

    >>> import keras
    >>> strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    >>> with strategy.scope():
    ...     w = tf.Variable([1.0])
    ...     optimizer = keras.optimizers.SGD(learning_rate=0.25)
    ...     diloco = tf_crossdevice.training.DiLoCo([w], period=2)
    >>> def step():
    ...     def replica_step():
    ...         with tf.GradientTape() as tape:
    ...             loss = w * w
    ...         optimizer.apply_gradients(
    ...             zip(tape.gradient(loss, [w]), [w]))
    ...     strategy.run(replica_step)
    >>> train_step = diloco.wrap(step)
    >>> train_step(); train_step()
    >>> # Inner: 1 -> 0.5 -> 0.25, a change of 0.75. Outer (Nesterov):
    >>> # m = -0.7 * 0.75 = -0.525; w = 1 + 0.9 m - 0.7 * 0.75 = 0.0025.
    >>> np.round(w.numpy(), 6)
    array([0.0025], dtype=float32)

    Args:
        variables, period, warmup_steps, cross_device_ops, name: as
            `LocalSGD`'s.
        outer_optimizer: a Keras optimizer for the outer steps, created
            under the strategy's scope; None: SGD(0.7, momentum=0.9,
            nesterov=True).
    """

    def __init__(
        self,
        variables: Sequence[Any],
        period: int,
        warmup_steps: int = 0,
        outer_optimizer: Any = None,
        cross_device_ops: Any = None,
        name: str = "diloco",
    ) -> None:
        super().__init__(
            variables, period, warmup_steps, cross_device_ops, name
        )
        if outer_optimizer is None:
            outer_optimizer = keras.optimizers.SGD(
                learning_rate=0.7, momentum=0.9, nesterov=True
            )
        self.outer_optimizer = outer_optimizer
        self.outer_optimizer.build(self.anchors)

    def _apply_changes(self, mean: list[Any]) -> None:
        # Keras applies gradients in the replicas, summing them first: each
        # replica passes its share of the mean, and the sum stays within
        # the worker (the changes already are every worker's mean), so
        # nothing crosses to the other workers twice.
        share = 1.0 / self._strategy.num_replicas_in_sync

        def apply(changes: list[tf.Tensor]) -> None:
            self.outer_optimizer.apply_gradients(
                [
                    (change * share, anchor)
                    for change, anchor in zip(
                        changes, self.anchors, strict=True
                    )
                ]
            )

        with self.within_worker():
            self._strategy.run(apply, args=(mean,))

    def __repr__(self) -> str:
        return reprs.call_repr(
            type(self),
            period=self.period,
            warmup_steps=self.warmup_steps,
            outer_optimizer=self.outer_optimizer,
            cross_device_ops=self._parts.cross_device_ops,
            name=self.name,
        )


class _FitCallback(keras.callbacks.Callback):
    """Makes `model.fit` run local steps after the warm-up, and sync.

    Keras calls `model.train_function` afresh for every batch: before each
    one this puts the synchronous function or the one traced within the
    worker there; after each, the helper counts the step and syncs."""

    def __init__(self, helper: LocalSGD) -> None:
        super().__init__()
        self._helper = helper
        self._synchronous: Any = None
        self._local: Any = None

    def on_train_begin(self, logs: Any = None) -> None:
        model = self.model
        every = getattr(model, "steps_per_execution", 1)
        if int(every) != 1:
            raise ValueError(
                f"steps_per_execution: {every} steps per call of the train "
                "function would run between two checks for a sync; "
                "compile with steps_per_execution=1"
            )
        model.make_train_function()
        if self._local is not None and (
            model.train_function is self._synchronous
        ):
            return  # A later fit of the same model: both are traced.
        self._synchronous = model.train_function
        model.make_train_function(force=True)
        inner = model.train_function
        model.train_function = self._synchronous

        def local(iterator: Any) -> Any:
            with self._helper.within_worker():
                return inner(iterator)

        self._local = local

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        done = int(self._helper.steps_done.numpy())
        self.model.train_function = (
            self._synchronous
            if done < self._helper.warmup_steps
            else self._local
        )

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self._helper.step_done()

    def on_train_end(self, logs: Any = None) -> None:
        self.model.train_function = self._synchronous


@dataclasses.dataclass(frozen=True)
class _Parts:
    """What the helper syncs and with what; not part of its checkpoint."""

    variables: tuple[Any, ...]
    cross_device_ops: Any


def _tensor(variable: Any) -> tf.Tensor:
    """A variable's value (a Keras variable's too), in the current replica
    or the first."""
    return tf.convert_to_tensor(variable)
