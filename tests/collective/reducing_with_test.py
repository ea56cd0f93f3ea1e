"""MultiWorkerMirroredStrategy.reducing_with: functions traced inside the
block reduce with the given CrossDeviceOps, those traced outside with the
strategy's own; a collective class is bound to the strategy's devices."""

from __future__ import annotations

import pytest
import tensorflow as tf

import tf_crossdevice


class _Doubling(tf.distribute.ReductionToOneDevice):
    """Sums as TensorFlow's class does, then doubles: a result no real
    reduction gives, so a test sees which ops reduced."""

    def batch_reduce(self, reduce_op, value_destination_pairs, options=None):
        reduced = super().batch_reduce(
            reduce_op, value_destination_pairs, options
        )
        return [
            tf.nest.map_structure(lambda t: 2 * t, r, expand_composites=True)
            for r in reduced
        ]


@pytest.fixture(scope="module")
def strategy():
    tf_crossdevice.testing.request_cpu_devices(2)
    return tf_crossdevice.MultiWorkerMirroredStrategy(
        local_devices=["/cpu:0", "/cpu:1"]
    )


def _sums(strategy, step) -> list[float]:
    return [float(v) for v in strategy.experimental_local_results(step())]


def _step(strategy):
    def replica():
        ctx = tf.distribute.get_replica_context()
        one = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
        return ctx.all_reduce("sum", one)

    return tf.function(lambda: strategy.run(replica))


def test_a_function_traced_inside_reduces_with_the_given_ops(strategy):
    inside, outside = _step(strategy), _step(strategy)
    with strategy.reducing_with(_Doubling()):
        assert _sums(strategy, inside) == [6.0, 6.0]  # 2 x (1 + 2)
    # Traced outside: the strategy's own (the block is over).
    assert _sums(strategy, outside) == [3.0, 3.0]
    # A traced function keeps what it was traced with.
    assert _sums(strategy, inside) == [6.0, 6.0]


def test_a_collective_class_is_bound_to_the_strategys_devices(strategy):
    step = _step(strategy)
    ops = tf_crossdevice.CollectiveAllReduce(compression="bf16")
    with strategy.reducing_with(ops):
        assert _sums(strategy, step) == [3.0, 3.0]
    # One bound copy per object, kept beside it.
    (bound,) = [b for o, b in strategy.extended._bound_ops.values() if o is ops]
    assert bound.reducer.local_devices == tuple(
        strategy.extended.worker_devices
    )


def test_anything_else_is_refused(strategy):
    with (
        pytest.raises(
            TypeError,
            match=r"cross_device_ops: expected a tf.distribute.CrossDeviceOps "
            r"\(a class of tf_crossdevice, say\), got str",
        ),
        strategy.reducing_with("ring"),
    ):
        pass
