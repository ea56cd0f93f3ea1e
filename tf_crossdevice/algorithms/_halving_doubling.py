"""Recursive halving-doubling all-reduce ("rechd") for any device count.

With `n` devices let `p` be the largest power of two `<= n` and `r = n - p`.
Each device's tensor is flattened, zero-padded to a multiple of
`num_shards * p` elements and cut into `num_shards` shards of `p` chunks.
Each shard is an independent instance of the schedule in
`_halving_doubling_schedule` (virtual ranks rotated by `shard * r`):

1. fold-in: extra virtual rank `p + i` (`i < r`) sends its whole shard to
   virtual rank `i`, which adds it;
2. reduce-scatter by recursive halving among virtual ranks `0 .. p - 1`:
   step `k` pairs `v` with `v XOR 2**k`; each keeps half its chunk range,
   sends the other half and adds what it receives (message halves as the
   distance doubles, so the biggest messages go to the nearest ranks);
3. all-gather by recursive doubling over the same pairs in reverse order,
   copying (`identity` on the receiver) the partner's reduced range;
4. fold-out: virtual rank `i` sends the full result back to `p + i`.

Bytes sent per device, `S` being its padded data: `2 (p - 1) / p * S` when
`n` is a power of two. Otherwise, per shard of `S / num_shards`: an extra
rank sends 1 shard, its partner `2 (p - 1) / p + 1` shards, every other
rank `2 (p - 1) / p` shards.

Floating-point sums match numpy to a few ulps times `n` (tests use rtol
1e-2 * n for float16 and bfloat16, 1e-5 for float32, 1e-12 for float64).
Integer sums are exact.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice.algorithms import _exchange, _flat
from tf_crossdevice.algorithms import _halving_doubling_schedule as hd
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.compression import WirePolicy


# Plain Python loops over the schedule: nothing for AutoGraph to convert,
# and converting them would cost seconds per trace.
@tf.autograph.experimental.do_not_convert
def halving_doubling_all_reduce(
    tensors: Sequence[tf.Tensor],
    num_shards: int = 1,
    *,
    wire: WirePolicy | None = None,
) -> list[tf.Tensor]:
    """Sums `tensors` elementwise by recursive halving and doubling.

    Works eagerly, in `tf.function` and in TF1 graphs, for any number of
    devices; devices may be local or on other workers (only
    `tf.device(t.device)` placement is used).

    Args:
        tensors: one dense tensor per device, same shape and dtype (one of
            `_flat.SUPPORTED_DTYPES`); a tensor's device is `t.device`.
        num_shards: number of independent instances the data is split
            between.
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
    ...         tensors.append(tf.constant([1.0, 2.0]) * (i + 1))
    >>> summed = halving_doubling_all_reduce(tensors)
    >>> [t.numpy().tolist() for t in summed]
    [[6.0, 12.0], [6.0, 12.0], [6.0, 12.0]]
    >>> summed[1].device
    '/job:localhost/replica:0/task:0/device:CPU:1'
    """
    tensors = _flat.check_inputs(tensors, num_shards)
    with tf.name_scope("halving_doubling_all_reduce"):
        alone = _exchange.single(tensors)
        if alone is not None:
            return alone
        n = len(tensors)
        p = hd.num_chunks(n)
        chunks = _exchange.Chunks(tensors, num_shards * p, wire=wire)

        def moves(
            transfers: Sequence[hd.Transfer], offset: int
        ) -> list[_exchange.Move]:
            return [
                (t.src, t.dst, c)
                for t in transfers
                for c in range(offset + t.chunks.start, offset + t.chunks.stop)
            ]

        for shard, order in enumerate(hd.rank_orders(n, num_shards)):
            offset = shard * p
            chunks.step(moves(hd.fold_in(order), offset), add=True)
            for step in hd.reduce_scatter_steps(order):
                chunks.step(moves(step, offset), add=True)
            for step in hd.all_gather_steps(order):
                chunks.step(moves(step, offset), add=False)
            chunks.step(moves(hd.fold_out(order), offset), add=False)
        return chunks.joined()


def builder(
    shards: int = 1, *, wire: WirePolicy | None = None
) -> protocol.AllReduceBuilder:
    """The registry's factory: `shards` independent halving-doublings."""
    return protocol.bind_shards(
        functools.partial(halving_doubling_all_reduce, wire=wire),
        shards,
        chunks=hd.num_chunks,
    )
