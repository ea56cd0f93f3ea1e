"""The tensor sets the benchmark reduces, and the data it fills them with.

A workload is a list of float32 shapes: one replica's gradients. Every
replica holds its own values, small random integers stored as float32, so
that any summation order gives the exact sum and results can be compared
with numpy's bit for bit.

Each replica's tensors live in one flat buffer; every tensor starts at a
multiple of `ALIGN_ELEMENTS` elements. TensorFlow then cuts the buffer into
the tensors without copying (CPU `Split` and `Slice` share the buffer when
the pieces are 64-byte aligned), so the benchmark's inputs cost a few ops
per step instead of one captured variable per tensor.

>>> small = many_small(8)
>>> small.num_tensors, small.num_bytes <= 8 * 4096
(8, True)
>>> layout = FlatLayout.of(((3,), (2, 2)))
>>> layout.offsets, layout.padded_sizes, layout.total_elements
((0, 16), (16, 16), 32)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Sequence

import numpy as np

Shape = tuple[int, ...]

# 64 bytes of float32: TensorFlow's CPU kernels (EIGEN_MAX_ALIGN_BYTES) share
# the buffer of pieces that start and end on this boundary.
ALIGN_ELEMENTS = 16
DTYPE = "float32"
_ITEMSIZE = 4
# Values are integers in [-VALUE_RANGE, VALUE_RANGE]: sums of up to 2**24 /
# VALUE_RANGE replicas are exact in float32.
VALUE_RANGE = 100

# The shapes of BERT-base's trainable variables (uncased, 12 layers, hidden
# 768, intermediate 3072, vocabulary 30522, 512 positions), in the order of
# the reference implementation: embeddings, 12 encoder layers, pooler.
_HIDDEN = 768
_INTERMEDIATE = 3072
_BERT_EMBEDDINGS: tuple[Shape, ...] = (
    (30522, _HIDDEN),  # word embeddings
    (512, _HIDDEN),  # position embeddings
    (2, _HIDDEN),  # token type embeddings
    (_HIDDEN,),  # embedding LayerNorm gamma
    (_HIDDEN,),  # embedding LayerNorm beta
)
_BERT_LAYER: tuple[Shape, ...] = (
    (_HIDDEN, _HIDDEN),  # attention query kernel
    (_HIDDEN,),  # query bias
    (_HIDDEN, _HIDDEN),  # key kernel
    (_HIDDEN,),  # key bias
    (_HIDDEN, _HIDDEN),  # value kernel
    (_HIDDEN,),  # value bias
    (_HIDDEN, _HIDDEN),  # attention output kernel
    (_HIDDEN,),  # attention output bias
    (_HIDDEN,),  # attention LayerNorm gamma
    (_HIDDEN,),  # attention LayerNorm beta
    (_HIDDEN, _INTERMEDIATE),  # intermediate kernel
    (_INTERMEDIATE,),  # intermediate bias
    (_INTERMEDIATE, _HIDDEN),  # output kernel
    (_HIDDEN,),  # output bias
    (_HIDDEN,),  # output LayerNorm gamma
    (_HIDDEN,),  # output LayerNorm beta
)
_BERT_POOLER: tuple[Shape, ...] = ((_HIDDEN, _HIDDEN), (_HIDDEN,))
BERT_BASE_SHAPES: tuple[Shape, ...] = (
    _BERT_EMBEDDINGS + _BERT_LAYER * 12 + _BERT_POOLER
)

# Small tensors of a typical model (biases, norms, tiny kernels), each at
# most 4 KiB of float32; `many_small` cycles through them.
_SMALL_SHAPES: tuple[Shape, ...] = (
    (1024,),
    (64,),
    (512,),
    (10,),
    (256,),
    (3, 3, 16),
    (128,),
    (1000,),
    (32, 32),
    (1,),
)


@dataclasses.dataclass(frozen=True)
class Workload:
    """One replica's tensors: a name and their shapes (all float32).

    Attributes:
        name: short identifier used in tables, JSON and flags.
        shapes: the shapes, in order.
        description: what the set is, for the report.
    """

    name: str
    shapes: tuple[Shape, ...]
    description: str = ""

    @property
    def num_tensors(self) -> int:
        return len(self.shapes)

    @property
    def num_elements(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    @property
    def num_bytes(self) -> int:
        return self.num_elements * _ITEMSIZE

    @property
    def dtype(self) -> str:
        return DTYPE

    def truncated(self, num_tensors: int) -> Workload:
        """The first `num_tensors` tensors, named so the report says so.

        >>> many_small(10).truncated(3).name
        'many_small[10][:3]'
        """
        if num_tensors >= self.num_tensors:
            return self
        return Workload(
            f"{self.name}[:{num_tensors}]",
            self.shapes[:num_tensors],
            f"first {num_tensors} of {self.num_tensors} tensors of {self.name}",
        )


@functools.lru_cache(maxsize=1)
def resnet50_shapes() -> tuple[Shape, ...]:
    """Shapes of `tf.keras.applications.ResNet50(weights=None)`'s variables.

    Builds the model once per process (about a second, no download) and
    keeps only the shapes: 214 tensors, 25,583,592 float32 values.

    >>> shapes = resnet50_shapes()
    >>> len(shapes), shapes[0]
    (214, (7, 7, 3, 64))
    """
    import tensorflow as tf

    model = tf.keras.applications.ResNet50(weights=None)
    shapes = tuple(
        tuple(int(d) for d in v.shape) for v in model.trainable_variables
    )
    del model
    tf.keras.backend.clear_session()
    return shapes


def resnet50() -> Workload:
    """ResNet-50's gradients (built with Keras, `weights=None`)."""
    return Workload(
        "resnet50",
        resnet50_shapes(),
        "tf.keras.applications.ResNet50(weights=None) trainable variables",
    )


def bert_base() -> Workload:
    """BERT-base's gradients (shapes written down in this module).

    >>> w = bert_base()
    >>> w.num_tensors, round(w.num_elements / 1e6, 1)
    (199, 109.5)
    """
    return Workload(
        "bert_base",
        BERT_BASE_SHAPES,
        "BERT-base (12 layers, hidden 768) trainable variables",
    )


def many_small(count: int = 1000) -> Workload:
    """`count` tensors of at most 4 KiB each (biases, norms, small kernels).

    >>> w = many_small(1000)
    >>> w.num_tensors, max(math.prod(s) for s in w.shapes) * 4
    (1000, 4096)
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count: expected an int >= 1, got {count!r}")
    shapes = tuple(_SMALL_SHAPES[i % len(_SMALL_SHAPES)] for i in range(count))
    return Workload(
        "many_small" if count == 1000 else f"many_small[{count}]",
        shapes,
        f"{count} tensors of 4 B to 4 KiB",
    )


def sweep_sizes(
    min_bytes: int = 4, max_bytes: int = 256 << 20, step: int = 2
) -> list[int]:
    """Sizes in bytes from `min_bytes` to `max_bytes`, times `step` each.

    >>> sweep_sizes(4, 64)
    [4, 8, 16, 32, 64]
    >>> sweep_sizes(4, 1 << 20, step=16)
    [4, 64, 1024, 16384, 262144]
    """
    if min_bytes < 4 or min_bytes % 4:
        raise ValueError(
            f"min_bytes: expected a multiple of 4 (float32) >= 4, got "
            f"{min_bytes}"
        )
    if max_bytes < min_bytes:
        raise ValueError(
            f"max_bytes: expected >= min_bytes ({min_bytes}), got {max_bytes}"
        )
    if step < 2:
        raise ValueError(f"step: expected an int >= 2, got {step}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size *= step
    return sizes


def sweep(
    min_bytes: int = 4, max_bytes: int = 256 << 20, step: int = 2
) -> list[Workload]:
    """The sweep's workloads: one tensor of each of `sweep_sizes`.

    >>> [w.name for w in sweep(4, 16)]
    ['sweep_4B', 'sweep_8B', 'sweep_16B']
    """
    return [single_tensor(s) for s in sweep_sizes(min_bytes, max_bytes, step)]


def single_tensor(num_bytes: int) -> Workload:
    """One float32 tensor of `num_bytes` bytes (a point of the size sweep).

    >>> single_tensor(1 << 20).shapes
    ((262144,),)
    """
    if num_bytes < 4 or num_bytes % 4:
        raise ValueError(
            f"num_bytes: expected a positive multiple of 4, got {num_bytes}"
        )
    return Workload(
        f"sweep_{num_bytes}B",
        ((num_bytes // 4,),),
        f"one tensor of {num_bytes} bytes",
    )


@dataclasses.dataclass(frozen=True)
class FlatLayout:
    """Where each tensor of a workload sits in a replica's flat buffer.

    Attributes:
        shapes: the tensors' shapes.
        sizes: their element counts.
        offsets: where each starts, a multiple of `ALIGN_ELEMENTS`.
        padded_sizes: the elements from each offset to the next (the last
            one runs to the end of the buffer).
        total_elements: the buffer's length.
    """

    shapes: tuple[Shape, ...]
    sizes: tuple[int, ...]
    offsets: tuple[int, ...]
    padded_sizes: tuple[int, ...]
    total_elements: int

    @classmethod
    def of(cls, shapes: Sequence[Shape]) -> FlatLayout:
        shapes = tuple(tuple(s) for s in shapes)
        sizes = tuple(math.prod(s) for s in shapes)
        padded = tuple(
            -(-max(n, 1) // ALIGN_ELEMENTS) * ALIGN_ELEMENTS for n in sizes
        )
        offsets = tuple(int(x) for x in np.cumsum((0,) + padded[:-1]))
        return cls(shapes, sizes, offsets, padded, sum(padded))

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """The tensors of a flat numpy buffer (views, not copies).

        >>> layout = FlatLayout.of(((2,), (1, 2)))
        >>> [v.tolist() for v in layout.views(np.arange(32))]
        [[0, 1], [[16, 17]]]
        """
        return [
            flat[o : o + n].reshape(s)
            for o, n, s in zip(
                self.offsets, self.sizes, self.shapes, strict=True
            )
        ]


def replica_seed(seed: int, workload: str, replica: int) -> int:
    """A seed for one replica's values, stable across processes.

    >>> replica_seed(0, "resnet50", 1) == replica_seed(0, "resnet50", 1)
    True
    >>> replica_seed(0, "resnet50", 1) == replica_seed(0, "resnet50", 2)
    False
    """
    text = f"{seed}/{workload}/{replica}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def replica_data(
    layout: FlatLayout, seed: int, workload: str, replica: int
) -> np.ndarray:
    """One replica's flat float32 buffer: integers, zero padding.

    >>> layout = FlatLayout.of(((5,),))
    >>> a = replica_data(layout, 0, "w", 1)
    >>> a.dtype, a.shape, bool(np.all(a[5:] == 0))
    (dtype('float32'), (16,), True)
    >>> bool(np.array_equal(a, replica_data(layout, 0, "w", 1)))
    True
    """
    rng = np.random.default_rng(replica_seed(seed, workload, replica))
    flat = np.zeros(layout.total_elements, np.float32)
    for offset, size in zip(layout.offsets, layout.sizes, strict=True):
        flat[offset : offset + size] = rng.integers(
            -VALUE_RANGE, VALUE_RANGE + 1, size, dtype=np.int16
        )
    return flat
