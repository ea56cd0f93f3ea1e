"""Keras model.fit under MirroredStrategy ends where one device ends.

Each class reduces the gradients of a small model on 4 logical CPU devices;
the weights after two epochs must equal those of the same training on one
device (float tolerance), and the class must really have been called.
"""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests import contract

keras = tf.keras

CLASSES = {
    "reduction_to_one_device": tf_crossdevice.ReductionToOneDevice,
    "nccl": tf_crossdevice.NcclAllReduce,
    "hierarchical_copy": tf_crossdevice.HierarchicalCopyAllReduce,
    "hierarchical_copy_small_tensor_packing": (
        lambda: tf_crossdevice.AllReduceCrossDeviceOps(
            "hierarchical_copy",
            num_packs=0,
            agg_small_grads_max_bytes=1024,
            agg_small_grads_max_group=4,
        )
    ),
}

BATCH = 16  # Global batch: 4 per replica.


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = (x @ rng.normal(size=(5, 1)) + 0.5).astype(np.float32)
    return x, y


def build_model(initial_weights=None):
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(1),
        ]
    )
    if initial_weights is not None:
        model.set_weights(initial_weights)
    model.compile(
        optimizer=keras.optimizers.SGD(0.05), loss="mse", jit_compile=False
    )
    return model


def train(model):
    x, y = data()
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.fixture(scope="module")
def reference():
    keras.utils.set_random_seed(1)
    initial = build_model().get_weights()
    return initial, train(build_model(initial))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_fit_matches_one_device(name, reference):
    initial, expected = reference
    ops = CLASSES[name]()
    calls = contract.count_batch_reduce_calls(ops)
    strategy = tf.distribute.MirroredStrategy(
        tf_crossdevice.testing.cpu_devices(4), cross_device_ops=ops
    )
    with strategy.scope():
        model = build_model(initial)
    weights = train(model)
    assert calls, "MirroredStrategy never called the CrossDeviceOps"
    assert not np.allclose(weights[0], initial[0]), "training did nothing"
    for got, want in zip(weights, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
