"""PowerSGD's first all-reduce waits for the last layers' gradients only.

Backpropagation computes the last layer's gradients first and the first
layer's last. The collectives run one after another in the order they are
issued, so the all-reduce PowerSGD issues first must carry gradients that
exist early: if it needed the first layer's, every factor would wait for
the whole backward pass. PowerSGD issues, bucket by bucket (last layers
first), the bucket's Ps and then its Qs, and the exactly summed rest last.

The step is traced, not run: two replicas on two logical CPUs compute the
gradients of a tanh network whose middle kernel (3072 x 3072 floats,
36 MiB) fills a default bucket (25 MiB) alone, and the compressor sums them
with an all-reduce that records each call's tensors. The first call's
tensors must not depend, through data or control edges, on either
replica's first-layer gradients; the last call is the exact rest. One
bucket of everything (`bucket_bytes=0`) is the negative control.
"""

from __future__ import annotations

import itertools

import pytest
import tensorflow as tf

import tf_crossdevice
from tests.graph_ancestors import ancestors
from tf_crossdevice.compression import PowerSGD

DEVICES = tf_crossdevice.testing.cpu_devices(2)
# Input 8, two hidden layers of 3072, output 1: the first kernel (8 x 3072)
# and the middle one are compressed, the last (3072 x 1, rank 1) is not.
WIDTHS = [8, 3072, 3072, 1]


def gradients_on(device: str, seed: int) -> list[tf.Tensor]:
    """One replica's gradients: each layer's kernel, then its bias."""
    with tf.device(device):
        x = tf.random.stateless_normal([4, WIDTHS[0]], [seed, 0])
        weights = []
        for k, (a, b) in enumerate(itertools.pairwise(WIDTHS)):
            weights += [
                tf.random.stateless_normal([a, b], [seed, k + 1]),
                tf.zeros([b]),
            ]
        with tf.GradientTape() as tape:
            tape.watch(weights)
            hidden = x
            for kernel, bias in zip(weights[::2], weights[1::2], strict=True):
                hidden = tf.tanh(hidden @ kernel + bias)
            loss = tf.reduce_sum(hidden)
        return tape.gradient(loss, weights)


def traced_calls(compressor: PowerSGD):
    """Each replica's gradients, and the batches the compressor all-reduced,
    in the order it issued them."""
    calls: list[list[list[tf.Tensor]]] = []
    traced = {}

    def all_sum(batch):
        calls.append(batch)
        return [[tf.add_n(list(value))] * len(value) for value in batch]

    @tf.function
    def step():
        grads = [gradients_on(d, i) for i, d in enumerate(DEVICES)]
        traced["grads"] = grads
        batch = [list(per_replica) for per_replica in zip(*grads, strict=True)]
        sums = compressor.sum(batch, all_sum, DEVICES)
        return [s[0] for s in sums]

    step.get_concrete_function()
    return traced["grads"], calls


def first_call_waits_for_first_layer(compressor: PowerSGD) -> bool:
    grads, calls = traced_calls(compressor)
    first_layer = {g[0].op for g in grads}  # each replica's first kernel
    first_call = [t for value in calls[0] for t in value]
    return bool(first_layer & ancestors(t.op for t in first_call))


def test_default_buckets_start_before_the_first_layer():
    compressor = PowerSGD(rank=2)
    assert not first_call_waits_for_first_layer(compressor)


def test_calls_come_bucket_by_bucket_then_the_exact_rest():
    grads, calls = traced_calls(PowerSGD(rank=2))
    # Bucket of the middle kernel (P, Q), bucket of the first (P, Q), then
    # the exact rest: the three biases and the last kernel.
    assert len(calls) == 5
    rank = 2
    assert calls[0][0][0].shape == [3072 * rank]  # middle kernel's P
    assert calls[2][0][0].shape == [8 * rank]  # first kernel's P (8 x 3072)
    exact = calls[-1]
    assert [v[0].shape.as_list() for v in exact] == [
        [3072],
        [3072],
        [3072, 1],
        [1],
    ]


@pytest.mark.parametrize("bucket_bytes", [0, 1 << 30])
def test_one_bucket_waits_for_the_whole_backward_pass(bucket_bytes):
    compressor = PowerSGD(rank=2, bucket_bytes=bucket_bytes)
    assert first_call_waits_for_first_layer(compressor)
