"""Ring all-reduce (TensorFlow 1's "xring") as a TensorFlow graph builder.

Each device's tensor is flattened, zero-padded to a multiple of
`num_shards * n` elements and cut into `num_shards` shards of `n` chunks.
Shard `s` is reduced by its own ring (`_ring_schedule.ring_orders`: even
shards run forwards, odd shards backwards, rotated by `s // 2`): `n - 1`
reduce-scatter steps, in which each device adds the chunk it receives from
its predecessor, then `n - 1` all-gather steps, in which it keeps the fully
reduced chunk it receives (an `identity` on the receiving device, so the
chunk really travels the ring instead of going straight from its owner to
everyone). Each device thus sends `2 (n - 1) / n` of its (padded) data.

Floating-point sums are added in ring order, not numpy's order; they match
numpy to a few ulps times `n` (tests use rtol 1e-2 * n for float16 and
bfloat16, 1e-5 for float32, 1e-12 for float64). Integer sums are exact.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice.algorithms import _exchange, _flat
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _ring_schedule as ring
from tf_crossdevice.compression import WirePolicy


# Plain Python loops over the schedule: nothing for AutoGraph to convert,
# and converting them would cost seconds per trace.
@tf.autograph.experimental.do_not_convert
def ring_all_reduce(
    tensors: Sequence[tf.Tensor],
    num_shards: int = 1,
    *,
    wire: WirePolicy | None = None,
) -> list[tf.Tensor]:
    """Sums `tensors` elementwise with `num_shards` parallel rings.

    Works eagerly, in `tf.function` and in TF1 graphs; devices may be local or
    on other workers (only `tf.device(t.device)` placement is used).

    Args:
        tensors: one dense tensor per device, same shape and dtype (one of
            `_flat.SUPPORTED_DTYPES`); a tensor's device is `t.device`.
        num_shards: number of independent rings the data is split between.
        wire: how values cross workers: float32 and float64 values travel
            as 16 bits with a codec (see
            `tf_crossdevice.compression.WirePolicy`); None: as they are.

    Returns:
        The sum, one tensor per input: the i-th on `tensors[i].device`, with
        the inputs' shape and dtype. One input gives an identity copy.

    Raises:
        ValueError: `tensors` is empty, shapes differ, or `num_shards` is not
            a positive integer.
        TypeError: an input is not a `tf.Tensor` or dtypes are unsupported
            or differ.

    Example:

    >>> from tf_crossdevice import testing
    >>> tensors = []
    >>> for i, device in enumerate(testing.cpu_devices(3)):
    ...     with tf.device(device):
    ...         tensors.append(tf.constant([1, 2, 3]) * (i + 1))
    >>> summed = ring_all_reduce(tensors, num_shards=2)
    >>> [t.numpy().tolist() for t in summed]
    [[6, 12, 18], [6, 12, 18], [6, 12, 18]]
    >>> summed[2].device
    '/job:localhost/replica:0/task:0/device:CPU:2'
    """
    tensors = _flat.check_inputs(tensors, num_shards)
    with tf.name_scope("ring_all_reduce"):
        alone = _exchange.single(tensors)
        if alone is not None:
            return alone
        n = len(tensors)
        chunks = _exchange.Chunks(tensors, num_shards * n, wire=wire)
        for shard, order in enumerate(ring.ring_orders(n, num_shards)):
            offset = shard * n
            for step in ring.reduce_scatter_steps(order):
                chunks.step(
                    [(t.src, t.dst, offset + t.chunk) for t in step], add=True
                )
            for step in ring.all_gather_steps(order):
                chunks.step(
                    [(t.src, t.dst, offset + t.chunk) for t in step], add=False
                )
        return chunks.joined()


def builder(
    shards: int = 1, *, wire: WirePolicy | None = None
) -> protocol.AllReduceBuilder:
    """The registry's factory: `ring_all_reduce` with `shards` rings."""
    return protocol.bind_shards(
        functools.partial(ring_all_reduce, wire=wire),
        shards,
        chunks=lambda n: n,
    )
