"""A step's loss averaged over the examples it had, on every replica.

When workers hold different amounts of data, the replicas of a worker whose
data ran out get empty batches (TensorFlow's distributed iterators hand
them out until no replica has data left) while the others train on. The
step's gradient must then be the mean over the examples that are there:
each replica's summed loss over the step's examples on every replica, then
the gradients summed across replicas (what Keras's optimizers and
`tf.distribute`'s SUM all-reduce do). TensorFlow's
`tf.nn.compute_average_loss` and Keras's losses divide by the local batch
size times `num_replicas_in_sync` instead, counting an empty replica as a
full one: its steps' gradients come out too small.

Here the count is the step's own, all-reduced across replicas (one scalar
per step). With even batches it equals TensorFlow's: training does not
change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras  # type: ignore[import-untyped]
import tensorflow as tf

__all__ = ["AverageOverExamples", "compute_average_loss"]


def compute_average_loss(
    per_example_loss: Any, num_examples: Any = None
) -> tf.Tensor:
    """This replica's losses summed and divided by the step's examples.

    Summing the result's gradients across replicas gives the gradient of
    the mean loss over every example of the step, on every replica, also
    when some replicas got fewer examples or none (a worker whose data ran
    out). In a custom loop:

        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = keras.losses.mean_squared_error(y, model(x))
                loss = tf_crossdevice.training.compute_average_loss(
                    per_example)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

    Alone (one replica) it is the mean:

    >>> float(tf_crossdevice.training.compute_average_loss([1.0, 2.0, 6.0]))
    3.0

    Args:
        per_example_loss: one loss per example, shape [batch, ...] (a batch
            may be empty).
        num_examples: the step's examples on every replica. None: counted
            by an all-reduce, inside `strategy.run`. Pass it where no
            strategy runs the replicas: an in-graph client (which builds
            every replica's step, so it knows every batch) sums the batch
            sizes, e.g. `tf.add_n([tf.shape(x)[0] for x in batches])`.

    Returns:
        A scalar: the sum of `per_example_loss` over `num_examples` (0 when
        the step has no examples).

    Raises:
        RuntimeError: called in cross-replica context without
            `num_examples`.
    """
    per_example_loss = tf.convert_to_tensor(per_example_loss)
    if num_examples is None:
        num_examples = _examples_in_step(per_example_loss)
    return tf.math.divide_no_nan(
        tf.reduce_sum(per_example_loss),
        tf.cast(num_examples, per_example_loss.dtype),
    )


def _examples_in_step(
    per_example_loss: tf.Tensor, cross_replica_ok: bool = False
) -> tf.Tensor:
    """The step's examples on every replica of the current strategy.

    In cross-replica context a tensor holds the whole step, not one
    replica's part: its own batch size with `cross_replica_ok`, else an
    error.
    """
    local = tf.cast(tf.shape(per_example_loss)[0], tf.float32)
    context = tf.distribute.get_replica_context()
    if context is None:
        if cross_replica_ok:
            return local
        raise RuntimeError(
            "compute_average_loss: called in cross-replica context without "
            "num_examples; call it inside strategy.run, or pass the step's "
            "examples on every replica as num_examples"
        )
    # float32 (above): exact up to 2**24 examples in a step, and a dtype
    # every strategy's all-reduce takes.
    if context.num_replicas_in_sync == 1:
        return local
    return context.all_reduce("sum", local)


class AverageOverExamples(keras.losses.Loss):
    """A Keras loss: `fn`'s losses averaged over the step's examples on
    every replica (`compute_average_loss`), for `model.compile(loss=...)`.

    Keras's own losses divide each replica's mean by `num_replicas_in_sync`,
    which is right only when every replica has a full batch. Sample weights
    and masks weigh each example's loss as Keras's do; the divisor is the
    number of examples (Keras's "sum_over_batch_size").

    >>> loss = tf_crossdevice.training.AverageOverExamples(
    ...     keras.losses.mean_squared_error)
    >>> float(loss(np.array([[0.0], [0.0]]), np.array([[1.0], [3.0]])))
    5.0

    Args:
        fn: `fn(y_true, y_pred)`, one loss per example, such as
            `keras.losses.mean_squared_error`.
        name: the loss's name (default: `fn`'s).
    """

    def __init__(
        self, fn: Callable[[Any, Any], Any], name: str | None = None
    ) -> None:
        if not callable(fn):
            raise TypeError(
                "fn: expected a function of (y_true, y_pred) such as "
                f"keras.losses.mean_squared_error, got {fn!r}"
            )
        # "sum": Keras adds the weighted losses and scales nothing.
        super().__init__(
            name=name or getattr(fn, "__name__", None), reduction="sum"
        )
        self.fn = fn

    def call(self, y_true: Any, y_pred: Any) -> tf.Tensor:
        per_example = tf.convert_to_tensor(self.fn(y_true, y_pred))
        # Keras builds its losses once in cross-replica context, on
        # symbolic tensors (`_symbolic_build`).
        count = _examples_in_step(per_example, cross_replica_ok=True)
        return tf.math.divide_no_nan(
            per_example, tf.cast(count, per_example.dtype)
        )

    def __call__(
        self, y_true: Any, y_pred: Any, sample_weight: Any = None
    ) -> tf.Tensor:
        loss = super().__call__(y_true, y_pred, sample_weight)
        # Keras returns the losses unreduced when they have the static
        # shape [0] (an empty batch, run eagerly): their sum is 0.
        return tf.reduce_sum(loss)

    def get_config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "fn": keras.saving.serialize_keras_object(self.fn),
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AverageOverExamples:
        fn = keras.saving.deserialize_keras_object(config["fn"])
        return cls(fn, name=config["name"])
