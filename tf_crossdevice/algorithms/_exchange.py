"""The chunks of a chunked all-reduce, and the steps that move them.

Ring and halving-doubling share this part: every device's tensor is cut
into the same number of flat chunks, each step of a schedule moves chunks
between devices (adding the received chunk to the receiver's own, or
replacing it with the received one), and at the end each device joins its
chunks back into a tensor. Only the schedules differ
(`_ring_schedule`, `_halving_doubling_schedule`).

>>> from tf_crossdevice import testing
>>> tensors = []
>>> for i, device in enumerate(testing.cpu_devices(2)):
...     with tf.device(device):
...         tensors.append(tf.constant([1.0, 2.0]) * (i + 1))
>>> chunks = Chunks(tensors, 2)
>>> chunks.step([(1, 0, 0), (0, 1, 1)], add=True)   # reduce-scatter
>>> chunks.step([(0, 1, 0), (1, 0, 1)], add=False)  # all-gather
>>> [t.numpy().tolist() for t in chunks.joined()]
[[3.0, 6.0], [3.0, 6.0]]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import tensorflow as tf

from tf_crossdevice.algorithms import _flat
from tf_crossdevice.compression import Wire, WirePolicy

Move = tuple[int, int, int]
"""(source device index, destination device index, chunk index)."""


class Chunks:
    """Each device's flat chunks while a schedule runs.

    Args:
        tensors: one tensor per device (already checked by
            `_flat.check_inputs`); `tensors[i].device` says where.
        num_chunks: chunks per device (`_flat.split_flat` pads to a
            multiple of it).
        wire: how values cross workers (see
            `tf_crossdevice.compression.WirePolicy`); transfers between
            workers travel through its `Wire`.
    """

    def __init__(
        self,
        tensors: Sequence[tf.Tensor],
        num_chunks: int,
        *,
        wire: WirePolicy | None = None,
    ):
        self._tensors = list(tensors)
        self._devices = [t.device for t in tensors]
        self._wire = Wire(self._devices, tensors[0].dtype, wire)
        self._chunks = [_flat.split_flat(t, num_chunks) for t in tensors]

    def step(self, moves: Iterable[Move], add: bool) -> None:
        """One schedule step: every move reads the chunks as they were
        before the step. `add`: the receiver adds the received chunk to its
        own (reduce); else the received chunk replaces its own (gather).
        """
        received = []
        for src, dst, c in moves:
            device = self._devices[dst]
            with tf.device(device):
                if add:
                    value = self._chunks[dst][c] + self._wire.receive(
                        self._chunks[src][c], device
                    )
                else:
                    value = self._wire.copy(self._chunks[src][c], device)
            received.append((dst, c, value))
        for dst, c, value in received:
            self._chunks[dst][c] = value

    def joined(self) -> list[tf.Tensor]:
        """Each device's chunks joined into a tensor like its input."""
        return [
            _flat.join_flat([self._wire.settle(c) for c in chunks], tensor)
            for chunks, tensor in zip(self._chunks, self._tensors, strict=True)
        ]


def single(tensors: Sequence[tf.Tensor]) -> list[tf.Tensor] | None:
    """The sum of one tensor (a copy on its device); None for several.

    >>> single([tf.constant([1.0])])[0].numpy().tolist()
    [1.0]
    """
    if len(tensors) != 1:
        return None
    with tf.device(tensors[0].device):
        return [tf.identity(tensors[0])]
