"""The tensor sets the benchmark reduces: one replica's float32 gradients.

The values come from `tf_crossdevice.tuning.measure.Inputs` (small integers, so
every summation order gives numpy's sum exactly).

>>> w = bert_base()
>>> w.num_tensors, round(w.num_elements / 1e6, 1)
(199, 109.5)
>>> [w.name for w in sweep(4, 16)], many_small(10).truncated(3).name
(['sweep_4B', 'sweep_8B', 'sweep_16B'], 'many_small[10][:3]')
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re

import tensorflow as tf

Shape = tuple[int, ...]
H, FF = 768, 3072  # BERT-base's hidden and intermediate sizes
# BERT-base's trainable variables (uncased, 12 layers, vocabulary 30522, 512
# positions) in the reference order: word, position and token type
# embeddings and their LayerNorm; per layer query, key, value and attention
# output kernels and biases, LayerNorm, intermediate and output kernels and
# biases, LayerNorm; the pooler.
_BERT_LAYER: tuple[Shape, ...] = ((H, H), (H,)) * 4 + (
    (H,), (H,), (H, FF), (FF,), (FF, H), (H,), (H,), (H,),
)  # fmt: skip
BERT_BASE_SHAPES: tuple[Shape, ...] = (
    ((30522, H), (512, H), (2, H), (H,), (H,))
    + _BERT_LAYER * 12
    + ((H, H), (H,))
)
# Small tensors of a typical model (biases, norms, tiny kernels), each at
# most 4 KiB of float32; `many_small` cycles through them.
_SMALL_SHAPES: tuple[Shape, ...] = (
    (1024,), (64,), (512,), (10,), (256,), (3, 3, 16), (128,), (1000,),
    (32, 32), (1,),
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Workload:
    """One replica's tensors (all float32): a name, shapes, a description."""

    name: str
    shapes: tuple[Shape, ...]
    description: str = ""
    dtype = "float32"

    @property
    def num_tensors(self) -> int:
        return len(self.shapes)

    @property
    def num_elements(self) -> int:
        return sum(math.prod(s) for s in self.shapes)

    @property
    def num_bytes(self) -> int:
        return self.num_elements * 4

    def truncated(self, num_tensors: int) -> Workload:
        """The first `num_tensors` tensors, named so the report says so."""
        if num_tensors >= self.num_tensors:
            return self
        return Workload(
            f"{self.name}[:{num_tensors}]",
            self.shapes[:num_tensors],
            f"first {num_tensors} of {self.num_tensors} tensors of {self.name}",
        )


@functools.lru_cache(maxsize=1)
def resnet50() -> Workload:
    """`tf.keras.applications.ResNet50(weights=None)`'s trainable variables.

    Builds the model once per process (about a second, no download): 214
    tensors, 25,583,592 values.
    """
    model = tf.keras.applications.ResNet50(weights=None)
    shapes = tuple(tuple(map(int, v.shape)) for v in model.trainable_variables)
    del model
    tf.keras.backend.clear_session()
    return Workload(
        "resnet50", shapes, "tf.keras.applications.ResNet50 trainable variables"
    )


def bert_base() -> Workload:
    return Workload(
        "bert_base",
        BERT_BASE_SHAPES,
        "BERT-base (12 layers, hidden 768) trainable variables",
    )


def many_small(count: int = 1000) -> Workload:
    """`count` tensors of at most 4 KiB each (biases, norms, small kernels)."""
    shapes = tuple(_SMALL_SHAPES[i % len(_SMALL_SHAPES)] for i in range(count))
    name = "many_small" if count == 1000 else f"many_small[{count}]"
    return Workload(name, shapes, f"{count} tensors of 4 B to 4 KiB")


def sweep_sizes(
    min_bytes: int = 4, max_bytes: int = 256 << 20, step: int = 2
) -> list[int]:
    """Sizes from `min_bytes` to `max_bytes`, each `step` times the last.

    >>> sweep_sizes(4, 1 << 20, step=16)
    [4, 64, 1024, 16384, 262144]
    """
    if min_bytes < 4 or min_bytes % 4 or step < 2:
        raise ValueError(
            f"sweep: expected min_bytes a multiple of 4 and step >= 2, got "
            f"min_bytes={min_bytes}, step={step}"
        )
    sizes = [min_bytes]
    while sizes[-1] * step <= max_bytes:
        sizes.append(sizes[-1] * step)
    return sizes


def sweep(
    min_bytes: int = 4, max_bytes: int = 256 << 20, step: int = 2
) -> list[Workload]:
    """One float32 tensor of each of `sweep_sizes`."""
    return [single_tensor(s) for s in sweep_sizes(min_bytes, max_bytes, step)]


def single_tensor(num_bytes: int) -> Workload:
    """One float32 tensor of `num_bytes` bytes (a point of the sweep)."""
    return Workload(
        f"sweep_{num_bytes}B",
        ((num_bytes // 4,),),
        f"one tensor of {num_bytes} bytes",
    )


def named(name: str) -> Workload:
    """The workload a record names: 'resnet50', 'bert_base', 'many_small',
    'many_small[N]', 'sweep_NB', each possibly truncated ('[:n]').

    >>> named("many_small[10][:3]").shapes
    ((1024,), (64,), (512,))

    Raises:
        ValueError: a name none of the workloads here has.
    """
    match = re.fullmatch(r"(.+?)(?:\[:(\d+)\])?", name)
    assert match is not None
    base, count = match[1], match[2]
    small = re.fullmatch(r"many_small(?:\[(\d+)\])?", base)
    sweep_point = re.fullmatch(r"sweep_(\d+)B", base)
    if base == "resnet50":
        workload = resnet50()
    elif base == "bert_base":
        workload = bert_base()
    elif small:
        workload = many_small(int(small[1] or 1000))
    elif sweep_point:
        workload = single_tensor(int(sweep_point[1]))
    else:
        raise ValueError(f"name: no workload {name!r}")
    return workload.truncated(int(count)) if count else workload
