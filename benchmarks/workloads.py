"""The tensor sets the benchmark reduces: one replica's float32 gradients.

The values come from `tf_crossdevice._measure.Inputs` (small integers, so
every summation order gives numpy's sum exactly).

>>> small = many_small(8)
>>> small.num_tensors, small.num_bytes <= 8 * 4096
(8, True)
"""

from __future__ import annotations

import dataclasses
import functools
import math

Shape = tuple[int, ...]

DTYPE = "float32"
_ITEMSIZE = 4

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

    @property
    def gradients(self) -> list[tuple[Shape, str]]:
        """(shape, dtype) of each tensor, as `_measure.Inputs` takes them."""
        return [(s, DTYPE) for s in self.shapes]

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
