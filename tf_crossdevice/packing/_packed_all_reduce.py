"""Packing around the single-worker all-reduce classes' reductions.

`check_packing` validates the packing arguments those classes share
(`num_packs`, `agg_small_grads_max_bytes`, `agg_small_grads_max_group`);
`packed_all_reduce` packs each device's tensors with `_pack`, sums the packs
with the all-reduce it is given and unpacks the sums; `PackedAllReduce` is
the two together, a function of a batch. The all-reduce is a
callable only: which algorithm sums is the caller's business (the `ops`
classes pass one built from `algorithms`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import tensorflow as tf

from tf_crossdevice._core import checks
from tf_crossdevice.packing import _pack as _packing

BatchAllReduce: TypeAlias = Callable[
    [Sequence[Sequence[tf.Tensor]], Sequence[int]], list[list[tf.Tensor]]
]
"""`(values[k][d], index of each value) -> sums[k][d]`, the d-th on
`values[k][d].device`: what an algorithm offers to reduce a whole batch."""


def check_packing(
    num_packs: Any,
    agg_small_grads_max_bytes: Any,
    agg_small_grads_max_group: Any,
) -> tuple[int, int, int]:
    """Validates the packing arguments shared by the all-reduce classes."""
    num_packs = checks.non_negative_int(num_packs, "num_packs")
    max_bytes = checks.non_negative_int(
        agg_small_grads_max_bytes, "agg_small_grads_max_bytes"
    )
    max_group = checks.non_negative_int(
        agg_small_grads_max_group, "agg_small_grads_max_group"
    )
    if max_bytes > 0 and max_group < 1:
        raise ValueError(
            "agg_small_grads_max_group: expected >= 1 when "
            f"agg_small_grads_max_bytes > 0, got {max_group}"
        )
    if num_packs > 0 and max_bytes > 0:
        raise ValueError(
            f"agg_small_grads_max_bytes={max_bytes} has no effect while "
            f"num_packs={num_packs} concatenates every tensor into packs; "
            "pass num_packs=0 to aggregate small tensors instead"
        )
    return num_packs, max_bytes, max_group


def packed_all_reduce(
    batch: Sequence[Sequence[tf.Tensor]],
    all_reduce_batch: BatchAllReduce,
    *,
    num_packs: int,
    agg_small_grads_max_bytes: int,
    agg_small_grads_max_group: int,
) -> list[list[tf.Tensor]]:
    """Packs each device's tensors, all-reduces the packs, unpacks.

    With packing on, each pack is all-reduced on its own (packing sets how
    many all-reduces run and how big they are). With packing off, the
    values (and those that cannot be packed) are all-reduced as one batch
    (e.g. `algorithms._protocol.all_reduce_batch`: per dtype, one layout
    per group of a few MiB), so that the graph does not grow with values x
    devices x algorithm steps.

    Args:
        batch: `batch[k][d]` is value k on device d (same devices for all k).
        all_reduce_batch: sums a batch of packs, given their indices in the
            batch; the d-th sum of each on the d-th pack's device.

    Returns:
        `result[k][d]`, the sum of value k, on device d.

    Values whose static shape is not fully known cannot be packed; each of
    them is all-reduced on its own (as TensorFlow's packers do).
    """
    static = [k for k, v in enumerate(batch) if v[0].shape.is_fully_defined()]
    results: list[list[tf.Tensor]] = [[] for _ in batch]
    if static:
        packed = _pack_and_all_reduce(
            [batch[k] for k in static],
            all_reduce_batch,
            num_packs=num_packs,
            agg_small_grads_max_bytes=agg_small_grads_max_bytes,
            agg_small_grads_max_group=agg_small_grads_max_group,
        )
        for k, summed in zip(static, packed, strict=True):
            results[k] = summed
    dynamic = [k for k in range(len(batch)) if k not in set(static)]
    if dynamic:
        summed = all_reduce_batch(
            [batch[k] for k in dynamic],
            [len(static) + j for j in range(len(dynamic))],
        )
        for k, sums in zip(dynamic, summed, strict=True):
            results[k] = sums
    return results


@dataclasses.dataclass(frozen=True)
class PackedAllReduce:
    """`all_reduce_batch` after packing, as one function of a batch.

    Attributes:
        all_reduce_batch: sums a batch of packs (see `packed_all_reduce`).
        num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group:
            the packing, as `check_packing` returns it.
    """

    all_reduce_batch: BatchAllReduce
    num_packs: int = 0
    agg_small_grads_max_bytes: int = 0
    agg_small_grads_max_group: int = 10

    def __call__(
        self, batch: Sequence[Sequence[tf.Tensor]]
    ) -> list[list[tf.Tensor]]:
        return packed_all_reduce(
            batch,
            self.all_reduce_batch,
            num_packs=self.num_packs,
            agg_small_grads_max_bytes=self.agg_small_grads_max_bytes,
            agg_small_grads_max_group=self.agg_small_grads_max_group,
        )


def _pack_and_all_reduce(
    batch: Sequence[Sequence[tf.Tensor]],
    all_reduce_batch: BatchAllReduce,
    *,
    num_packs: int,
    agg_small_grads_max_bytes: int,
    agg_small_grads_max_group: int,
) -> list[list[tf.Tensor]]:
    num_devices = len(batch[0])
    devices = [t.device for t in batch[0]]
    packer = _packing.make_packer(
        [value[0] for value in batch],
        num_packs=num_packs,
        agg_small_grads_max_bytes=agg_small_grads_max_bytes,
        agg_small_grads_max_group=agg_small_grads_max_group,
    )
    packs_per_device = []
    for d, device in enumerate(devices):
        with tf.device(device):
            packs_per_device.append(packer.pack([value[d] for value in batch]))
    packs = [
        [packs[j] for packs in packs_per_device]
        for j in range(packer.num_packs)
    ]
    if num_packs or agg_small_grads_max_bytes:
        # Packing decides how many all-reduces run and how big they are:
        # each pack keeps its own (few packs, so a small graph).
        summed_packs = [
            all_reduce_batch([p], [j])[0] for j, p in enumerate(packs)
        ]
    else:
        # No packing: every value is a "pack"; one batched all-reduce per
        # dtype and range keeps the graph from growing with the values.
        summed_packs = all_reduce_batch(packs, list(range(packer.num_packs)))
    per_device = []
    for d, device in enumerate(devices):
        with tf.device(device):
            per_device.append(packer.unpack([pack[d] for pack in summed_packs]))
    return [
        [per_device[d][k] for d in range(num_devices)]
        for k in range(len(batch))
    ]
