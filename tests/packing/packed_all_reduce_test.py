"""Tests of `tf_crossdevice.packing._packed_all_reduce`: the packing
arguments' checks and pack / all-reduce / unpack with a given all-reduce."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tf_crossdevice import testing
from tf_crossdevice.packing._packed_all_reduce import (
    check_packing,
    packed_all_reduce,
)

SETTINGS = {
    "identity": (0, 0, 10),
    "concat_2": (2, 0, 10),
    "agg_small": (0, 64, 3),
}


def test_check_packing_returns_the_three_ints():
    assert check_packing(2, 0, 10) == (2, 0, 10)
    assert check_packing(0, 64, 1) == (0, 64, 1)


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((-1, 0, 10), ValueError, "num_packs"),
        ((0, -1, 10), ValueError, "agg_small_grads_max_bytes"),
        ((0, 0, -1), ValueError, "agg_small_grads_max_group"),
        ((0, 8, 0), ValueError, "agg_small_grads_max_group: expected >= 1"),
        ((2, 8, 10), ValueError, "has no effect while num_packs=2"),
        ((1.5, 0, 10), TypeError, "num_packs"),
    ],
)
def test_check_packing_rejects(args, error, match):
    with pytest.raises(error, match=match):
        check_packing(*args)


def _sum_on_each_device(calls):
    """A batch all-reduce that adds on each device and records its calls."""

    def all_reduce_batch(values, indices):
        calls.append((len(values), list(indices)))
        out = []
        for value in values:
            total = tf.add_n(list(value))
            sums = []
            for t in value:
                with tf.device(t.device):
                    sums.append(tf.identity(total))
            out.append(sums)
        return out

    return all_reduce_batch


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_packed_all_reduce_sums_every_value(setting):
    num_packs, max_bytes, max_group = SETTINGS[setting]
    devices = testing.cpu_devices(3)
    rng = np.random.default_rng(1)
    shapes = [(2, 3), (), (5,), (1, 4), (7,)]
    arrays = [
        [rng.normal(size=s).astype(np.float32) for s in shapes] for _ in devices
    ]
    batch = []
    for k in range(len(shapes)):
        per_device = []
        for d, device in enumerate(devices):
            with tf.device(device):
                per_device.append(tf.constant(arrays[d][k]))
        batch.append(per_device)
    calls: list = []
    result = packed_all_reduce(
        batch,
        _sum_on_each_device(calls),
        num_packs=num_packs,
        agg_small_grads_max_bytes=max_bytes,
        agg_small_grads_max_group=max_group,
    )
    assert len(result) == len(shapes)
    for k, per_device in enumerate(result):
        expected = sum(arrays[d][k] for d in range(len(devices)))
        for d, value in enumerate(per_device):
            assert value.device == devices[d]
            np.testing.assert_allclose(value.numpy(), expected, rtol=1e-5)
    if setting == "identity":
        # No packing: one batched all-reduce of every value.
        assert calls == [(len(shapes), list(range(len(shapes))))]
    else:
        # Packing: one all-reduce per pack, indices counted from 0.
        assert all(n == 1 for n, _ in calls)
        assert [i for _, (i,) in calls] == list(range(len(calls)))
        assert len(calls) < len(shapes)


def test_values_of_unknown_shape_are_all_reduced_after_the_packs():
    devices = testing.cpu_devices(2)
    calls: list = []
    specs = [
        [tf.TensorSpec([2], tf.float32)] * 2,
        [tf.TensorSpec(None, tf.float32)] * 2,
        [tf.TensorSpec([3], tf.float32)] * 2,
    ]

    @tf.function(input_signature=[specs])
    def reduce(batch):
        placed = []
        for value in batch:
            per_device = []
            for t, device in zip(value, devices, strict=True):
                with tf.device(device):
                    per_device.append(tf.identity(t))
            placed.append(per_device)
        return packed_all_reduce(
            placed,
            _sum_on_each_device(calls),
            num_packs=1,
            agg_small_grads_max_bytes=0,
            agg_small_grads_max_group=10,
        )

    values = [
        [np.ones(2, np.float32), 2 * np.ones(2, np.float32)],
        [np.arange(4, dtype=np.float32), np.ones(4, np.float32)],
        [np.ones(3, np.float32), np.ones(3, np.float32)],
    ]
    result = reduce(values)
    for value, out in zip(values, result, strict=True):
        for t in out:
            np.testing.assert_allclose(t.numpy(), value[0] + value[1])
    # One pack of the two static values (index 0), then the dynamic one
    # with the index after the static values.
    assert calls == [(1, [0]), (1, [2])]
