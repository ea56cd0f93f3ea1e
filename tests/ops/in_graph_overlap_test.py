"""In-graph `MultiWorkerAllReduce`: a layer's sum waits for its own layer.

Backpropagation computes the last layer's gradient first and the first
layer's last. In one client graph nothing orders the reductions but their
inputs, so the last layer's sum can cross the network while earlier
gradients are computed, unless the algorithm ties it to them: one
concatenated pack of every gradient (`num_packs=1`), or a layout that puts
the last layer's small gradient beside an earlier one.

The step is traced, not run, on two workers' device names (placement
happens only when a graph runs, so no cluster is needed): each worker
computes the gradients of a small tanh network whose middle kernel
(1024 x 1024 floats, 4 MiB) is as large as a layout group
(`algorithms._protocol.GROUP_BYTES`), and the sums of the last layer's
kernel must not depend, through data or control edges, on any worker's
first-layer gradient. `num_packs=1` is the negative control.
"""

from __future__ import annotations

import itertools

import pytest
import tensorflow as tf

import tf_crossdevice
from tests.graph_ancestors import ancestors
from tf_crossdevice._core import tf_internal

WORKERS = ["/job:worker/task:0", "/job:worker/task:1"]
DEVICES = [f"{w}/device:CPU:0" for w in WORKERS]
# Layer widths: input 3, two hidden layers of 1024, output 1.
WIDTHS = [3, 1024, 1024, 1]


def gradients_on(device: str, seed: int) -> list[tf.Tensor]:
    """One replica's gradients of its network's kernels, first layer first."""
    with tf.device(device):
        x = tf.random.stateless_normal([4, WIDTHS[0]], [seed, 0])
        kernels = [
            tf.random.stateless_normal([a, b], [seed, k + 1])
            for k, (a, b) in enumerate(itertools.pairwise(WIDTHS))
        ]
        with tf.GradientTape() as tape:
            tape.watch(kernels)
            hidden = x
            for kernel in kernels:
                hidden = tf.tanh(hidden @ kernel)
            loss = tf.reduce_sum(hidden)
        return tape.gradient(loss, kernels)


def traced_sums(**kwargs):
    """The graph of one in-graph step: each replica's gradients and the
    sums `batch_reduce` returns, `sums[k]` the per-replica sums of kernel k."""
    ops = tf_crossdevice.MultiWorkerAllReduce(WORKERS, 0, **kwargs)
    traced = {}

    @tf.function
    def step():
        grads = [gradients_on(d, i) for i, d in enumerate(DEVICES)]
        pairs = [
            (tf_internal.PerReplica(tuple(g[k] for g in grads)), None)
            for k in range(len(WIDTHS) - 1)
        ]
        sums = ops.batch_reduce("sum", pairs)
        traced["grads"] = grads
        traced["sums"] = [list(s.values) for s in sums]
        return [s.values[0] for s in sums]

    step.get_concrete_function()
    return traced["grads"], traced["sums"]


def waits_for_first_layer(kwargs) -> list[bool]:
    """For each replica's sum of the last kernel: whether it waits for
    some worker's first-layer gradient."""
    grads, sums = traced_sums(**kwargs)
    first = {g[0].op for g in grads}
    return [bool(first & ancestors([s.op])) for s in sums[-1]]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"compression": "bf16"},
        {"all_reduce_spec": "xring"},
        {"all_reduce_spec": "pscpu/xring"},
        {"agg_small_grads_max_bytes": 64 << 10},
    ],
    ids=repr,
)
def test_last_layer_sum_waits_for_the_last_layer_only(kwargs):
    assert waits_for_first_layer(kwargs) == [False, False]


def test_one_pack_waits_for_the_whole_backward_pass():
    assert waits_for_first_layer({"num_packs": 1}) == [True, True]
