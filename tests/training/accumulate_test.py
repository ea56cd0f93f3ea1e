"""GradientAccumulator: one all-reduce per k micro-batches, numpy's update.

A linear model on 2 logical CPU replicas, k=3 micro-batches of 4 examples
(2 per replica) per update, under tf.distribute.MirroredStrategy with our
single-worker classes and under our MultiWorkerMirroredStrategy (one
worker). After each k-th micro-batch the weights equal numpy's SGD step on
the k micro-batches concatenated (mean loss), before it they are
unchanged, and the CrossDeviceOps reduced exactly once per k micro-batches
(a counter variable that each reduce call increments in the graph, so it
counts executions, not traces).
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice

keras = tf.keras

DEVICES = tf_crossdevice.testing.cpu_devices(2)
K = 3
MICRO_BATCH = 4  # The global micro-batch: 2 examples per replica.
LEARNING_RATE = 0.1


def counting(cls, *args, **kwargs):
    """An instance of `cls` that counts its executed reduce calls.

    The counter lives outside any strategy; the strategy's bound copy of a
    collective class (a shallow copy) shares it.
    """

    class Counting(cls):
        def reduce(self, *a, **kw):
            self.reduces.assign_add(1)
            return super().reduce(*a, **kw)

        def batch_reduce(self, *a, **kw):
            self.reduces.assign_add(1)
            return super().batch_reduce(*a, **kw)

    ops = Counting(*args, **kwargs)
    with tf.device(DEVICES[0]):
        ops.reduces = tf.Variable(0, dtype=tf.int64, trainable=False)
    return ops


STRATEGIES = {
    "mirrored_reduction_to_one_device": lambda: _mirrored(
        counting(tf_crossdevice.ReductionToOneDevice)
    ),
    "mirrored_xring": lambda: _mirrored(
        counting(tf_crossdevice.AllReduceCrossDeviceOps, "xring")
    ),
    "multi_worker_collective": lambda: _multi_worker(
        counting(tf_crossdevice.CollectiveAllReduce)
    ),
}


def _mirrored(ops):
    return tf.distribute.MirroredStrategy(DEVICES, cross_device_ops=ops), ops


def _multi_worker(ops):
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=ops, local_devices=["/cpu:0", "/cpu:1"]
    )
    return strategy, ops


def _data(updates):
    rng = np.random.default_rng(0)
    n = updates * K * MICRO_BATCH
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = rng.normal(size=(n, 2)).astype(np.float32)
    w0 = rng.normal(size=(3, 2)).astype(np.float32)
    b0 = rng.normal(size=(2,)).astype(np.float32)
    return x, y, w0, b0


def _numpy_sgd_step(w, b, x, y):
    """One SGD step on the mean over the batch of 0.5 * |x w + b - y|^2."""
    residual = x.astype(np.float64) @ w + b - y
    return (
        w - LEARNING_RATE * x.T @ residual / len(x),
        b - LEARNING_RATE * residual.mean(axis=0),
    )


def _setup(strategy, w0, b0, steps=K):
    with strategy.scope():
        w = tf.Variable(w0)
        b = tf.Variable(b0)
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
        accumulator = tf_crossdevice.GradientAccumulator([w, b], steps=steps)

    @tf.function
    def train_step(x, y):
        def micro_step(x, y):
            with tf.GradientTape() as tape:
                per_example = 0.5 * tf.reduce_sum(
                    tf.square(x @ w + b - y), axis=1
                )
                loss = tf.nn.compute_average_loss(per_example)
            accumulator.accumulate(tape.gradient(loss, [w, b]))

        strategy.run(micro_step, args=(x, y))
        return accumulator.maybe_apply_gradients(optimizer)

    return w, b, optimizer, train_step


def _split(strategy, x, y):
    """Replica r gets rows [2r, 2r + 2) of the global micro-batch."""
    half = len(x) // 2

    def rows(ctx):
        r = ctx.replica_id_in_sync_group
        return x[r * half : (r + 1) * half], y[r * half : (r + 1) * half]

    return strategy.experimental_distribute_values_from_function(rows)


@pytest.mark.parametrize("make", STRATEGIES.values(), ids=STRATEGIES)
def test_each_update_is_numpys_step_on_the_concatenated_batch(make):
    strategy, ops = make()
    updates = 2
    x, y, w0, b0 = _data(updates)
    w, b, optimizer, train_step = _setup(strategy, w0, b0)
    expected_w, expected_b = w0.astype(np.float64), b0.astype(np.float64)
    for update in range(updates):
        for micro in range(K):
            start = (update * K + micro) * MICRO_BATCH
            rows = slice(start, start + MICRO_BATCH)
            applied = bool(train_step(*_split(strategy, x[rows], y[rows])))
            assert applied == (micro == K - 1)
            if not applied:  # Nothing moves, nothing crosses the wire.
                assert int(ops.reduces.numpy()) == update
                np.testing.assert_allclose(w.numpy(), expected_w, rtol=1e-5)
        batch = slice(update * K * MICRO_BATCH, (update + 1) * K * MICRO_BATCH)
        expected_w, expected_b = _numpy_sgd_step(
            expected_w, expected_b, x[batch], y[batch]
        )
        assert int(ops.reduces.numpy()) == update + 1
        assert int(optimizer.iterations.numpy()) == update + 1
        for variable, expected in ((w, expected_w), (b, expected_b)):
            for copy in strategy.experimental_local_results(variable):
                np.testing.assert_allclose(
                    copy.numpy(), expected, rtol=1e-5, atol=1e-6
                )


def test_collectives_run_only_in_the_update_branch():
    strategy, _ = STRATEGIES["multi_worker_collective"]()
    x, y, w0, b0 = _data(1)
    _, _, _, train_step = _setup(strategy, w0, b0)
    inputs = _split(strategy, x[:MICRO_BATCH], y[:MICRO_BATCH])
    concrete = train_step.get_concrete_function(*inputs)
    collective = {"CollectiveReduceV2", "CollectiveGatherV2"}
    outer = {op.type for op in concrete.graph.get_operations()}
    assert not outer & collective
    branches = [
        f
        for f in concrete.graph.as_graph_def().library.function
        if collective & {node.op for node in f.node_def}
    ]
    assert branches, "no collective in any branch"
    assert all("true" in f.signature.name for f in branches)


def test_sparse_and_missing_gradients():
    strategy, ops = _mirrored(counting(tf_crossdevice.ReductionToOneDevice))
    table0 = np.arange(8, dtype=np.float32).reshape(4, 2)
    with strategy.scope():
        table = tf.Variable(table0)
        unused = tf.Variable([1.0])
        optimizer = keras.optimizers.SGD(1.0)
        accumulator = tf_crossdevice.GradientAccumulator(
            [table, unused], steps=2
        )

    @tf.function
    def train_step(ids):
        def micro_step(ids):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    tf.reduce_sum(tf.gather(table, ids), axis=1)
                )
            grads = tape.gradient(loss, [table, unused])
            assert isinstance(grads[0], tf.IndexedSlices) and grads[1] is None
            accumulator.accumulate(grads)

        strategy.run(micro_step, args=(ids,))
        return accumulator.maybe_apply_gradients(optimizer)

    # Micro-batch 1: replicas look up rows 0 and 1; micro-batch 2: 1 and 3.
    for rows in ([0, 1], [1, 3]):
        ids = strategy.experimental_distribute_values_from_function(
            lambda ctx, rows=rows: tf.constant(
                [rows[ctx.replica_id_in_sync_group]]
            )
        )
        train_step(ids)
    # Each lookup's gradient is 1 / 2 (the global micro-batch) per element,
    # averaged over the 2 micro-batches: 1 / 4 per lookup.
    lookups = np.array([1, 2, 0, 1], dtype=np.float32)[:, None]
    np.testing.assert_allclose(table.numpy(), table0 - lookups / 4)
    np.testing.assert_allclose(unused.numpy(), [1.0])
    assert int(ops.reduces.numpy()) == 1


def test_keras_gradient_accumulation_fails_under_a_strategy():
    """Why GradientAccumulator exists: Keras's all-reduce in a cond."""
    strategy = tf.distribute.MirroredStrategy(
        DEVICES, cross_device_ops=tf_crossdevice.ReductionToOneDevice()
    )
    with strategy.scope():
        w = tf.Variable([1.0])
        optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)

    @tf.function
    def train_step():
        def micro_step():
            optimizer.apply_gradients([(tf.constant([1.0]), w)])

        strategy.run(micro_step)

    with pytest.raises(RuntimeError, match="merge_call"):
        train_step()


def test_invalid_arguments_name_the_argument():
    w = tf.Variable([1.0])
    with pytest.raises(
        ValueError, match=r"^steps: expected an int >= 1, got 0"
    ):
        tf_crossdevice.GradientAccumulator([w], steps=0)
    with pytest.raises(TypeError, match=r"^steps: expected an int >= 1"):
        tf_crossdevice.GradientAccumulator([w], steps=2.0)
    with pytest.raises(ValueError, match=r"^variables: expected at least one"):
        tf_crossdevice.GradientAccumulator([], steps=2)
    accumulator = tf_crossdevice.GradientAccumulator([w], steps=2)
    with pytest.raises(ValueError, match=r"^gradients: expected 1 .*got 2"):
        accumulator.accumulate([tf.constant([1.0]), tf.constant([1.0])])


def test_maybe_apply_gradients_refuses_the_replica_context():
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        w = tf.Variable([1.0])
        optimizer = keras.optimizers.SGD(0.1)
        accumulator = tf_crossdevice.GradientAccumulator([w], steps=2)

    @tf.function
    def train_step():
        strategy.run(lambda: accumulator.maybe_apply_gradients(optimizer))

    with pytest.raises(RuntimeError, match="outside strategy.run"):
        train_step()
