"""compute_average_loss and AverageOverExamples, in one process.

Two logical CPU replicas under tf.distribute.MirroredStrategy (with one of
our single-worker classes), the second replica's batch empty, as a worker
whose data ran out gets it: the losses summed across replicas are numpy's
mean over the examples present. The workers' side is
tests/training/uneven_inputs_test.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice

DEVICES = tf_crossdevice.testing.cpu_devices(2)
# Replica 0's per-example losses; replica 1 has none.
LOSSES = np.array([1.0, 2.0, 6.0], np.float32)


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(
        DEVICES, cross_device_ops=tf_crossdevice.AllReduceCrossDeviceOps()
    )


def uneven(strategy, arrays):
    """A PerReplica of arrays[r] on replica r."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(arrays[ctx.replica_id_in_sync_group])
    )


def summed(strategy, per_replica):
    return float(strategy.reduce("sum", per_replica, axis=None))


def test_compute_average_loss_divides_by_the_examples_present(strategy):
    losses = uneven(strategy, [LOSSES, LOSSES[:0]])

    @tf.function
    def step(losses):
        return strategy.run(
            tf_crossdevice.training.compute_average_loss, args=(losses,)
        )

    out = step(losses)
    assert [float(v) for v in strategy.experimental_local_results(out)] == [
        pytest.approx(LOSSES.sum() / 3),
        0.0,
    ]
    assert summed(strategy, out) == pytest.approx(LOSSES.mean())
    # TensorFlow's divides by 3 examples x 2 replicas.
    tf_out = strategy.run(tf.nn.compute_average_loss, args=(losses,))
    assert summed(strategy, tf_out) == pytest.approx(LOSSES.sum() / 6)


def test_even_batches_give_tensorflows_value(strategy):
    losses = uneven(strategy, [LOSSES, 2 * LOSSES])
    ours = strategy.run(
        tf_crossdevice.training.compute_average_loss, args=(losses,)
    )
    theirs = strategy.run(tf.nn.compute_average_loss, args=(losses,))
    assert summed(strategy, ours) == pytest.approx(summed(strategy, theirs))


def test_num_examples_given_is_used_without_a_strategy():
    loss = tf_crossdevice.training.compute_average_loss(LOSSES, num_examples=6)
    assert float(loss) == pytest.approx(LOSSES.sum() / 6)


def test_no_examples_give_zero():
    empty = tf.zeros([0])
    assert float(tf_crossdevice.training.compute_average_loss(empty)) == 0.0


def test_cross_replica_context_without_num_examples_is_refused(strategy):
    with (
        strategy.scope(),
        pytest.raises(RuntimeError, match="cross-replica context"),
    ):
        tf_crossdevice.training.compute_average_loss(LOSSES)


def test_keras_loss_weighs_examples_and_divides_by_examples_present(
    strategy,
):
    loss = tf_crossdevice.training.AverageOverExamples(
        keras.losses.mean_squared_error
    )
    y_pred = [
        np.array([[1.0], [2.0]], np.float32),
        np.zeros((0, 1), np.float32),
    ]
    weights = [np.array([1.0, 0.5], np.float32), np.zeros((0,), np.float32)]

    def replica_loss(y_pred, weight):
        return loss(tf.zeros_like(y_pred), y_pred, sample_weight=weight)

    out = strategy.run(
        replica_loss, args=(uneven(strategy, y_pred), uneven(strategy, weights))
    )
    # (1 * 1 + 0.5 * 4) over the 2 examples present.
    assert summed(strategy, out) == pytest.approx(1.5)


def test_keras_loss_round_trips_through_its_config():
    loss = tf_crossdevice.training.AverageOverExamples(
        keras.losses.mean_squared_error, name="mse_over_examples"
    )
    again = tf_crossdevice.training.AverageOverExamples.from_config(
        loss.get_config()
    )
    assert again.name == "mse_over_examples"
    assert float(again(np.zeros((2, 1)), np.array([[1.0], [3.0]]))) == 5.0


def test_keras_loss_needs_a_function():
    with pytest.raises(TypeError, match="fn: expected a function"):
        tf_crossdevice.training.AverageOverExamples("mse")
