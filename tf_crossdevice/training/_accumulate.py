"""Gradient accumulation: `steps` micro-batches per all-reduce.

Each replica sums its micro-batch gradients into its own accumulator
variables (no communication); every `steps`-th micro-batch the sums are
averaged over the micro-batches, all-reduced once by
`optimizer.apply_gradients`, applied and reset. The wire between replicas
(and between hosts) carries one all-reduce per `steps` micro-batches, as
Horovod's `backward_passes_per_step` and PyTorch's `no_sync` do.

Why not Keras's own `Optimizer(gradient_accumulation_steps=k)`: it decides
in the replica function, with a `cond`, whether this micro-step applies;
its update branch all-reduces. Under `tf.distribute.MirroredStrategy` and
(our or TensorFlow's) `MultiWorkerMirroredStrategy` an all-reduce is a
`merge_call` (except under XLA with every replica on a GPU), which
tf.distribute refuses inside control flow of the replica function: with
Keras 3.15 and TensorFlow 2.21 the first `apply_gradients` raises
"`merge_call` called while defining a new graph or a tf.function ...
control flow statements" (tests/training/accumulate_test.py checks that
it still does). Here the `cond` is in the cross-replica part of the step,
around a second `strategy.run`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, reprs

__all__ = ["GradientAccumulator"]


class GradientAccumulator(tf.Module):
    """Sums gradients per replica; all-reduces and applies every `steps`.

    Create it under `strategy.scope()`: each replica then gets its own
    accumulators (`tf.VariableSynchronization.ON_READ`). In the step,
    call `accumulate` inside `strategy.run` and `maybe_apply_gradients`
    after it, outside `strategy.run`:

    >>> import keras
    >>> strategy = tf.distribute.MirroredStrategy(
    ...     ["/cpu:0", "/cpu:1"],
    ...     cross_device_ops=tf_crossdevice.ReductionToOneDevice())
    >>> with strategy.scope():
    ...     w = tf.Variable([0.0])
    ...     optimizer = keras.optimizers.SGD(learning_rate=1.0)
    ...     accumulator = tf_crossdevice.GradientAccumulator([w], steps=2)
    >>> @tf.function
    ... def train_step(x):
    ...     def micro_step(x):
    ...         with tf.GradientTape() as tape:
    ...             # Scaled as for one step on the micro-batch.
    ...             loss = tf.nn.compute_average_loss(w * x)
    ...         accumulator.accumulate(tape.gradient(loss, [w]))
    ...     strategy.run(micro_step, args=(x,))
    ...     return accumulator.maybe_apply_gradients(optimizer)
    >>> x = strategy.experimental_distribute_values_from_function(
    ...     lambda ctx: tf.constant([ctx.replica_id_in_sync_group + 1.0]))
    >>> [bool(train_step(x)) for _ in range(4)]
    [False, True, False, True]
    >>> w.numpy()  # 2 updates, each by the mean gradient (1 + 2) / 2
    array([-3.], dtype=float32)

    The update equals one step on the `steps` micro-batches concatenated,
    with the loss their mean, when each micro-batch's loss is scaled as for
    a step of its own (`tf.nn.compute_average_loss` over the global
    micro-batch, the replicas' micro-batches together): the accumulated sum
    is divided by the micro-batches accumulated (`steps`), and the
    optimizer's all-reduce sums over the replicas. Keras divides the same
    way. Gradients of `None` add nothing (a variable that got none is
    applied a zero gradient); `tf.IndexedSlices` are added
    densely (so their all-reduce is dense too). The optimizer's
    `iterations` count updates, not micro-batches.

    Args:
        variables: the trainable variables, in the order of the gradients
            that `accumulate` gets (e.g. `model.trainable_variables`).
        steps: micro-batches per update and all-reduce, at least 1.
        name: the module's name.

    Raises:
        TypeError: `steps` is not an int.
        ValueError: `steps` is below 1, or `variables` is empty.
    """

    def __init__(
        self,
        variables: Sequence[Any],
        steps: int,
        name: str = "gradient_accumulator",
    ) -> None:
        super().__init__(name=name)
        # The strategy whose scope creates the accumulators; the step that
        # calls maybe_apply_gradients usually runs outside that scope.
        self._strategy = tf.distribute.get_strategy()
        self.steps = checks.positive_int(steps, "steps")
        self._variables = list(variables)
        if not self._variables:
            raise ValueError(
                "variables: expected at least one variable, got none"
            )
        with self.name_scope:
            self._sums = [
                tf.Variable(
                    tf.zeros(v.shape, v.dtype),
                    trainable=False,
                    name="sum",
                    synchronization=tf.VariableSynchronization.ON_READ,
                    # Read outside the replicas (a checkpoint): the sum
                    # over the replicas.
                    aggregation=tf.VariableAggregation.SUM,
                )
                for v in self._variables
            ]
            self._count = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="count",
                synchronization=tf.VariableSynchronization.ON_READ,
                # Every replica counts the same micro-batches.
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )

    def __repr__(self) -> str:
        return reprs.call_repr(
            type(self),
            # A list again: tf.Module wrapped it to track the variables.
            variables=list(self._variables),
            steps=self.steps,
            name=self.name,
        )

    def accumulate(self, gradients: Sequence[Any]) -> None:
        """Adds one micro-batch's gradients to this replica's sums.

        Call it in the replica function (inside `strategy.run`). No
        communication.

        Args:
            gradients: one gradient (or None) per variable, in order.

        Raises:
            ValueError: not one gradient per variable.
        """
        gradients = list(gradients)
        if len(gradients) != len(self._variables):
            raise ValueError(
                f"gradients: expected {len(self._variables)} (one per "
                f"variable), got {len(gradients)}"
            )
        for total, gradient in zip(self._sums, gradients, strict=True):
            if gradient is not None:
                total.assign_add(
                    tf.cast(tf.convert_to_tensor(gradient), total.dtype)
                )
        self._count.assign_add(1)

    def apply_gradients(self, optimizer: Any) -> None:
        """Applies the mean of the accumulated gradients, then resets.

        Call it in the replica function (inside `strategy.run`), on every
        replica at once: `optimizer.apply_gradients` all-reduces (sums) the
        gradients over the replicas, once for all the micro-batches.
        `maybe_apply_gradients` calls it every `steps` micro-batches.

        Args:
            optimizer: a Keras optimizer (or anything with
                `apply_gradients(grads_and_vars)`).
        """
        count = tf.maximum(self._count.read_value(), 1)
        means = [
            total.read_value() / tf.cast(count, total.dtype)
            for total in self._sums
        ]
        optimizer.apply_gradients(zip(means, self._variables, strict=True))
        for total in self._sums:
            total.assign(tf.zeros_like(total))
        self._count.assign(0)

    def maybe_apply_gradients(self, optimizer: Any) -> tf.Tensor:
        """Every `steps`-th micro-batch: `apply_gradients` on every replica.

        Call it in the step's `tf.function` after `strategy.run` (in the
        cross-replica context): the all-reduce is a second `strategy.run`
        under a `tf.cond`, which tf.distribute allows there.

        Args:
            optimizer: the optimizer that `apply_gradients` gets.

        Returns:
            A bool scalar: whether this call applied (and all-reduced).

        Raises:
            RuntimeError: called inside a replica function.
        """
        if tf.distribute.has_strategy() and (
            not tf.distribute.in_cross_replica_context()
        ):
            raise RuntimeError(
                "maybe_apply_gradients: call it outside strategy.run (an "
                "all-reduce inside the replica function's control flow is "
                "refused by tf.distribute); inside, call apply_gradients "
                "on the steps where every replica applies"
            )

        def apply() -> tf.Tensor:
            self._strategy.run(self.apply_gradients, args=(optimizer,))
            return tf.constant(True)

        return tf.cond(
            self._count.read_value() >= self.steps,
            apply,
            lambda: tf.constant(False),
        )
