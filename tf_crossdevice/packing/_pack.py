"""Packs a list of tensors into fewer, larger ones before an all-reduce.

`make_packer` plans once from one device's tensors (static shapes and dtypes);
the packer it returns is then applied to every device's list. Its ops land
wherever the caller's `tf.device` scope puts them (a 1-D tensor packed alone
gets no op and stays where it is). The plan comes from
`tf_crossdevice.packing._plan`; see there for the two schemes.

Example: three devices' gradients, packed into 2 packs, summed pack by pack
and unpacked, equal the sums of the gradients.

>>> grads = [[tf.fill([2, 3], float(d)), tf.fill([4], 10.0 * d)]
...          for d in range(1, 4)]
>>> packer = make_packer(grads[0], num_packs=2, agg_small_grads_max_bytes=0,
...                      agg_small_grads_max_group=10)
>>> packs = [packer.pack(g) for g in grads]
>>> [p.shape.as_list() for p in packs[0]]
[[5], [5]]
>>> summed = [tf.add_n(list(same)) for same in zip(*packs)]
>>> [t.numpy().tolist() for t in packer.unpack(summed)]
[[[6.0, 6.0, 6.0], [6.0, 6.0, 6.0]], [60.0, 60.0, 60.0, 60.0]]
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice.packing import _plan as packing_schedule


class Packer(abc.ABC):
    """Packs one device's tensors and unpacks the (reduced) packs.

    Attributes:
        num_packs: how many tensors `pack` returns and `unpack` takes.
    """

    num_packs: int

    @abc.abstractmethod
    def pack(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """Returns the packs of `tensors` (same shapes and dtypes as planned).

        Raises:
            ValueError: `tensors` differ in number, shape or dtype from the
                tensors the packer was made for.
        """

    @abc.abstractmethod
    def unpack(self, packs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """Returns tensors of the original shapes and dtypes, in order.

        Raises:
            ValueError: `packs` differ in number, shape or dtype from what
                `pack` returns.
        """


def _check_count(name: str, values: Sequence[tf.Tensor], expected: int):
    if len(values) != expected:
        raise ValueError(
            f"{name}: expected {expected} tensors, got {len(values)}"
        )


def _check_like(
    name: str,
    values: Sequence[tf.Tensor],
    shapes: Sequence[tf.TensorShape],
    dtypes: Sequence[tf.DType],
) -> None:
    _check_count(name, values, len(shapes))
    for i, (value, shape, dtype) in enumerate(
        zip(values, shapes, dtypes, strict=True)
    ):
        if (
            value.dtype.base_dtype != dtype
            or not value.shape.is_compatible_with(shape)
        ):
            raise ValueError(
                f"{name}[{i}]: expected {dtype.name} of shape {shape}, got "
                f"{value.dtype.base_dtype.name} of shape {value.shape}"
            )


def _flatten(tensor: tf.Tensor, num_elements: int) -> tf.Tensor:
    """`tensor` as a 1-D tensor; one of static shape `[num_elements]` as it is.

    Anything else is reshaped, which also checks its size at run time.

    >>> _flatten(tf.ones([2, 3]), 6).shape.as_list()
    [6]
    >>> t = tf.ones([4])
    >>> _flatten(t, 4) is t
    True
    """
    if tensor.shape == tf.TensorShape([num_elements]):
        return tensor
    return tf.reshape(tensor, [num_elements])


class _IdentityPacker(Packer):
    """Leaves the tensors as they are."""

    def __init__(self, num_tensors: int):
        self.num_packs = num_tensors

    def pack(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        _check_count("tensors", tensors, self.num_packs)
        return list(tensors)

    def unpack(self, packs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        _check_count("packs", packs, self.num_packs)
        return list(packs)


class _PlannedPacker(Packer):
    """Applies a `PackPlan` with reshape, concat and split."""

    def __init__(
        self,
        plan: packing_schedule.PackPlan,
        shapes: Sequence[tf.TensorShape],
        dtypes: Sequence[tf.DType],
    ):
        self._plan = plan
        self._shapes = tuple(shapes)
        self._dtypes = tuple(dtypes)
        self.num_packs = packing_schedule.num_packs(plan)
        pack_shapes: list[tf.TensorShape] = []
        pack_dtypes: list[tf.DType] = []
        for group in plan:
            dtype = self._dtypes[group.members[0]]
            if group.concat:
                pack_shapes.extend(
                    tf.TensorShape([n]) for n in group.pack_sizes
                )
            else:
                pack_shapes.append(self._shapes[group.members[0]])
            pack_dtypes.extend([dtype] * len(group.pack_sizes))
        self._pack_shapes = tuple(pack_shapes)
        self._pack_dtypes = tuple(pack_dtypes)

    def pack(self, tensors: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        _check_like("tensors", tensors, self._shapes, self._dtypes)
        packs = []
        for group in self._plan:
            if not group.concat:
                packs.append(tensors[group.members[0]])
                continue
            if not group.pack_sizes:
                continue
            flat = [
                _flatten(tensors[i], n)
                for i, n in zip(group.members, group.member_sizes, strict=True)
            ]
            joined = flat[0] if len(flat) == 1 else tf.concat(flat, axis=0)
            if len(group.pack_sizes) == 1:
                packs.append(joined)
            else:
                packs.extend(tf.split(joined, list(group.pack_sizes), axis=0))
        return packs

    def unpack(self, packs: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        _check_like("packs", packs, self._pack_shapes, self._pack_dtypes)
        tensors: list[tf.Tensor | None] = [None] * len(self._shapes)
        start = 0
        for group in self._plan:
            group_packs = packs[start : start + len(group.pack_sizes)]
            start += len(group.pack_sizes)
            if not group.concat:
                tensors[group.members[0]] = group_packs[0]
                continue
            if not group_packs:
                for i in group.members:
                    tensors[i] = tf.zeros(self._shapes[i], self._dtypes[i])
                continue
            joined = (
                group_packs[0]
                if len(group_packs) == 1
                else tf.concat(list(group_packs), axis=0)
            )
            parts = (
                [joined]
                if len(group.members) == 1
                else tf.split(joined, list(group.member_sizes), axis=0)
            )
            for i, part in zip(group.members, parts, strict=True):
                shape = self._shapes[i]
                # A part that has the shape already needs no reshape: under
                # tf.function Grappler removes it, but tracing one per tensor
                # per device doubles the trace time of many small tensors.
                tensors[i] = (
                    part if part.shape == shape else tf.reshape(part, shape)
                )
        return tensors  # type: ignore[return-value]


def make_packer(
    tensors: Sequence[tf.Tensor],
    *,
    num_packs: int,
    agg_small_grads_max_bytes: int,
    agg_small_grads_max_group: int,
) -> Packer:
    """Plans how to pack lists of tensors shaped like `tensors`.

    With `num_packs > 0` (concat-and-split), the tensors of each dtype are
    flattened, concatenated in order and split into `num_packs` packs of
    near-equal element count (fewer if the dtype has fewer elements; none if
    it has no elements). With `agg_small_grads_max_bytes > 0` (small-tensor
    aggregation), tensors of at most that many bytes are concatenated per
    dtype, in order, into packs of at most `agg_small_grads_max_group`
    tensors; larger tensors, and a small tensor left alone, pass through
    unchanged. With both 0, the packer leaves the tensors as they are.

    Args:
        tensors: one device's tensors; only their static shapes and dtypes are
            read. Every list later given to `pack` must match them.
        num_packs: packs per dtype for concat-and-split, or 0.
        agg_small_grads_max_bytes: largest size in bytes (elements times
            dtype size) that small-tensor aggregation packs, or 0.
        agg_small_grads_max_group: most tensors per aggregated pack, at least
            1 when `agg_small_grads_max_bytes > 0`.

    Returns:
        The packer. It places no ops itself: call it under `tf.device`.

    Raises:
        TypeError: a packing argument is not an int.
        ValueError: a packing argument is out of range, both schemes are on,
            or packing is on and a tensor's static shape is not fully defined.

    >>> packer = make_packer([tf.ones([2]), tf.ones([3]), tf.ones([100])],
    ...                      num_packs=0, agg_small_grads_max_bytes=20,
    ...                      agg_small_grads_max_group=16)
    >>> packer.num_packs
    2
    >>> [p.shape.as_list() for p in packer.pack(
    ...     [tf.ones([2]), tf.ones([3]), tf.ones([100])])]
    [[5], [100]]
    """
    scheme = packing_schedule.packing_scheme(
        num_packs=num_packs,
        agg_small_grads_max_bytes=agg_small_grads_max_bytes,
        agg_small_grads_max_group=agg_small_grads_max_group,
    )
    if scheme is packing_schedule.PackingScheme.IDENTITY:
        return _IdentityPacker(len(tensors))
    shapes = [tf.TensorShape(t.shape) for t in tensors]
    dtypes = [t.dtype.base_dtype for t in tensors]
    for i, shape in enumerate(shapes):
        if not shape.is_fully_defined():
            raise ValueError(
                f"tensors[{i}]: static shape {shape} is not fully defined, "
                "and packing needs static shapes; pass num_packs=0 and "
                "agg_small_grads_max_bytes=0 to reduce it unpacked"
            )
    infos = [
        packing_schedule.TensorInfo(
            shape.num_elements(), dtype.size, dtype.name
        )
        for shape, dtype in zip(shapes, dtypes, strict=True)
    ]
    if scheme is packing_schedule.PackingScheme.CONCAT_AND_SPLIT:
        plan = packing_schedule.concat_and_split_plan(infos, num_packs)
    else:
        plan = packing_schedule.small_tensor_plan(
            infos, agg_small_grads_max_bytes, agg_small_grads_max_group
        )
    return _PlannedPacker(plan, shapes, dtypes)
