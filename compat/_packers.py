"""TF 1's tensor packers, on tf_crossdevice's packing.

TF 1's all-reduce code passed gradients around as per-device lists of
(gradient, variable) pairs; its packers took and gave that shape. The
CrossDeviceOps classes now pack for themselves (`num_packs=`,
`agg_small_grads_max_bytes=`), so these exist for code that packed by hand.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice import packing

GradsAndVars = Sequence[Sequence[tuple[Any, Any]]]


class _Packer:
    def __init__(self, **plan: int) -> None:
        # Planning for no tensors checks the arguments when the packer is
        # made, as TF 1's did, by the rules the CrossDeviceOps classes apply
        # to the same arguments.
        packing.make_packer([], **plan)
        self._plan = plan
        self._packer: packing.Packer | None = None
        self._grouped: list[list[tuple[Any, Any]]] = []

    def __repr__(self) -> str:
        # The constructor call, arguments at their defaults left out; each
        # packer keeps its arguments as attributes of the same names.
        parameters = inspect.signature(type(self)).parameters.values()
        given = {p.name: (getattr(self, p.name), p.default) for p in parameters}
        parts = [
            f"{k}={v!r}" for k, (v, default) in given.items() if v != default
        ]
        return f"{type(self).__name__}({', '.join(parts)})"

    def pack(self, grouped_grads_and_vars: GradsAndVars) -> list[Any]:
        """Per device, `[(pack, None), ...]` from `[(grad, var), ...]`."""
        self._grouped = [list(device) for device in grouped_grads_and_vars]
        if not self._grouped or not self._grouped[0]:
            raise ValueError(
                "grouped_grads_and_vars: expected one non-empty list of "
                "(gradient, variable) pairs per device"
            )
        self._packer = packing.make_packer(
            [g for g, _ in self._grouped[0]], **self._plan
        )
        packed = []
        for device in self._grouped:
            with tf.device(device[0][0].device):
                packs = self._packer.pack([g for g, _ in device])
            packed.append([(p, None) for p in packs])
        return packed

    def unpack(self, summed_device_grad_packs: GradsAndVars) -> list[Any]:
        """Per device, `[(grad, var), ...]` again, from the reduced packs."""
        if self._packer is None:
            raise ValueError("unpack: call pack first")
        out = []
        for packs, device in zip(
            summed_device_grad_packs, self._grouped, strict=True
        ):
            with tf.device(packs[0][0].device):
                grads = self._packer.unpack([p for p, _ in packs])
            out.append(
                [(g, v) for g, (_, v) in zip(grads, device, strict=True)]
            )
        return out


class ConcatAndSplitPacker(_Packer):
    """TF 1's packer: concatenates the tensors and splits them in `num_packs`.

    Like TF 1's, it refuses `num_packs` below 1 (the CrossDeviceOps
    classes' `num_packs=0`, no packing, has no counterpart here).

    >>> grads = [[(tf.ones([2, 3]), "w"), (tf.ones([4]), "b")]]
    >>> packer = ConcatAndSplitPacker(num_packs=2)
    >>> [p.shape.as_list() for p, _ in packer.pack(grads)[0]]
    [[5], [5]]
    >>> unpacked = packer.unpack(packer.pack(grads))
    >>> [(g.shape.as_list(), v) for g, v in unpacked[0]]
    [([2, 3], 'w'), ([4], 'b')]
    """

    def __init__(self, num_packs: int = 1) -> None:
        if (
            isinstance(num_packs, bool)
            or not isinstance(num_packs, int)
            or num_packs < 1
        ):
            raise ValueError(
                "num_packs: expected an integer of at least 1 (TF 1's "
                f"ConcatAndSplitPacker refused fewer), got {num_packs!r}"
            )
        super().__init__(
            num_packs=num_packs,
            agg_small_grads_max_bytes=0,
            agg_small_grads_max_group=1,
        )
        self.num_packs = num_packs


class AggregateSmallTensorPacker(_Packer):
    """TF 1's packer: concatenates small tensors, up to a group size.

    `agg_small_grads_max_bytes=0` packs nothing, as the CrossDeviceOps
    classes' `agg_small_grads_max_bytes=0`.

    As in TF 1, only consecutive small tensors share a pack:

    >>> grads = [[(tf.ones([2]), "a"), (tf.ones([3]), "b"),
    ...           (tf.ones([100]), "c"), (tf.ones([4]), "d")]]
    >>> packer = AggregateSmallTensorPacker(agg_small_grads_max_bytes=20)
    >>> len(packer.pack(grads)[0])
    3
    """

    def __init__(
        self,
        agg_small_grads_max_bytes: int = 1048576,
        agg_small_grads_max_group: int = 16,
    ) -> None:
        super().__init__(
            num_packs=0,
            agg_small_grads_max_bytes=agg_small_grads_max_bytes,
            agg_small_grads_max_group=agg_small_grads_max_group,
        )
        self.agg_small_grads_max_bytes = agg_small_grads_max_bytes
        self.agg_small_grads_max_group = agg_small_grads_max_group
