"""What the cost model prices: configurations and gradients, checked.

A configuration is a constructor call as plain data, `(class_name,
kwargs)`, of one of `CONFIG_NAMES`; gradients are `(shape, dtype_name)`
pairs, one per tensor of a replica. `check_config` fills in a class's
defaults, `check_gradients` reads the tensors; both name the bad argument.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from tf_crossdevice import compression
from tf_crossdevice._core import checks

# The builder registry's names (tf_crossdevice.algorithms._registry, which
# imports TensorFlow; tests check the two agree).
ALGORITHMS = frozenset(
    {"hierarchical_copy", "nccl", "pscpu", "psgpu", "rechd", "xring"}
)
# The codecs the model prices: the package's own list.
COMPRESSIONS = compression.COMPRESSIONS
ITEMSIZE = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "complex64": 8,
    "complex128": 16,
}
# Compression applies to these only (contract of _builders/compression.py).
COMPRESSIBLE = ("float32", "float64")

Gradients: TypeAlias = Sequence[tuple[Sequence[int], str]]

PACKING = {
    "num_packs": 0,
    "agg_small_grads_max_bytes": 0,
    "agg_small_grads_max_group": 10,
}
# Each class's keyword arguments and their defaults (None: required, or
# irrelevant to the cost).
_KWARGS: dict[str, dict[str, Any]] = {
    "SpecAllReduce": {"all_reduce_spec": "xring", **PACKING},
    "MultiWorkerAllReduce": {
        "worker_devices": None,
        "num_gpus_per_worker": None,
        "all_reduce_spec": ("pscpu/pscpu", 2, -1),
        **PACKING,
    },
    "AllReduceCrossDeviceOps": {
        "all_reduce_alg": "nccl",
        **PACKING,
        "num_packs": 1,
    },
    "HierarchicalCopyAllReduce": {"num_packs": 1},
    "NcclAllReduce": {"num_packs": 1},
    "ReductionToOneDevice": {"reduce_to_device": None},
    "CollectiveAllReduce": {
        "num_workers": None,
        "num_gpus_per_worker": None,
        "all_reduce_merge_scope": None,
        "options": None,
    },
    "HierarchicalCollectiveAllReduce": {"options": None},
    "tf.ReductionToOneDevice": {},
    "tf.HierarchicalCopyAllReduce": {"num_packs": 1},
    "tf.MultiWorkerMirroredStrategy": {
        "implementation": "RING",
        "options": None,
    },
}
# Classes that take `compression=` (None, 'bf16' or 'fp16').
_COMPRESSING = frozenset(_KWARGS) - {
    "tf.ReductionToOneDevice",
    "tf.HierarchicalCopyAllReduce",
    "tf.MultiWorkerMirroredStrategy",
}
CONFIG_NAMES = tuple(sorted(_KWARGS))


def check_config(config: object) -> tuple[str, dict[str, Any]]:
    """The class name of `config` and its kwargs with the class's defaults.

    Raises:
        ValueError: not a `(class name, kwargs)` pair, an unknown class or
            an argument the class does not take; the message says which.

    >>> check_config(("HierarchicalCopyAllReduce", {}))
    ('HierarchicalCopyAllReduce', {'num_packs': 1, 'compression': None})
    """
    if (
        not isinstance(config, tuple | list)
        or len(config) != 2
        or not isinstance(config[0], str)
        or not isinstance(config[1], Mapping)
    ):
        raise ValueError(
            f"config: expected (class name, kwargs dict), got {config!r}"
        )
    name, kwargs = config[0], dict(config[1])
    if name not in _KWARGS:
        raise ValueError(
            f"config: unknown class {name!r}; expected one of "
            f"{', '.join(CONFIG_NAMES)}"
        )
    allowed = dict(_KWARGS[name])
    if name in _COMPRESSING:
        allowed["compression"] = None
    for key in kwargs:
        if key not in allowed:
            raise ValueError(
                f"config: {name} takes no argument {key!r}; expected some "
                f"of {', '.join(sorted(allowed))}"
            )
    return name, {**allowed, **kwargs}


class Tensor(NamedTuple):
    """One gradient tensor as the model sees it: elements and dtype."""

    elements: int
    dtype: str

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def num_bytes(self) -> int:
        return self.elements * self.itemsize


def check_gradients(gradients: object) -> list[Tensor]:
    """The tensors of `gradients`, `(shape, dtype_name)` pairs.

    Raises:
        ValueError: not a non-empty list of such pairs; the message names
            the bad item (`gradients[i]`) and what is allowed.

    >>> check_gradients([((2, 3), "float32")])
    [Tensor(elements=6, dtype='float32')]
    """
    if isinstance(gradients, str | bytes) or not isinstance(
        gradients, Iterable
    ):
        raise ValueError(
            "gradients: expected a list of (shape, dtype name) pairs, got "
            f"{gradients!r}"
        )
    out = []
    for i, item in enumerate(gradients):
        where = f"gradients[{i}]"
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ValueError(
                f"{where}: expected a (shape, dtype name) pair, got {item!r}"
            )
        shape, dtype = item
        if isinstance(shape, int) or not isinstance(shape, Iterable):
            raise ValueError(
                f"{where}: expected a shape tuple of ints, got {shape!r}"
            )
        dims = [
            checks.non_negative_int(d, f"{where} dimension {j}")
            for j, d in enumerate(shape)
        ]
        if dtype not in ITEMSIZE:
            raise ValueError(
                f"{where}: unknown dtype {dtype!r}; expected one of "
                f"{', '.join(sorted(ITEMSIZE))}"
            )
        out.append(Tensor(math.prod(dims), dtype))
    if not out:
        raise ValueError("gradients: expected at least one (shape, dtype)")
    return out
