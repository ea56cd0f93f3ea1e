"""Every all-reduce algorithm by name: one line each, two-level ones composed.

`build(name, shards)` returns an `AllReduceBuilder` (see `_protocol`): the
CrossDeviceOps classes dispatch through it and nothing else. A name is one
of `algorithm_names()` or 'inner/outer', two of them: `inner` reduces
within each worker with one shard, `outer` across one device per worker
with `shards` (TensorFlow 1 had nccl/xring, nccl/rechd, nccl/pscpu and
pscpu/pscpu; every pair works). Error messages list the names from here.

Adding an algorithm: write a module with a factory `builder(shards) ->
AllReduceBuilder` and add one line to `_FACTORIES` (or call `register`);
tests/algorithms/builders_test.py then runs the builder contract on it.

Compression: `build(..., compression='bf16' | 'fp16')` makes float32 and
float64 values cross workers as 16 bits (see `tf_crossdevice.compression`);
for 'inner/outer' only the outer stage compresses. The built-in factories
take `compression=` and `same_worker=` keywords; a registered one that does
not is refused with compression.

>>> from tf_crossdevice.algorithms import _registry as registry
>>> all_reduce = registry.build("pscpu/xring", shards=2)
>>> tensors = []
>>> for i, d in enumerate(tf_crossdevice.testing.cpu_devices(3)):
...     with tf.device(d):
...         tensors.append(tf.constant([1.0, 2.0]) * (i + 1))
>>> [t.numpy().tolist() for t in all_reduce(tensors, 0)]
[[6.0, 12.0], [6.0, 12.0], [6.0, 12.0]]
>>> registry.build("xrign")
Traceback (most recent call last):
...
ValueError: alg: unknown algorithm 'xrign'; expected one of hierarchical_copy, nccl, pscpu, psgpu, rechd, xring, or 'inner/outer' naming two of them (e.g. 'hierarchical_copy/xring')
"""  # noqa: E501

from __future__ import annotations

import re
from typing import Any, TypeAlias

from tf_crossdevice._core import checks
from tf_crossdevice.algorithms import _halving_doubling as halving_doubling
from tf_crossdevice.algorithms import _hierarchical_copy as hierarchical_copy
from tf_crossdevice.algorithms import _nccl as nccl
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _ring as ring
from tf_crossdevice.algorithms import _shuffle as shuffle
from tf_crossdevice.algorithms import _spec as spec_lib
from tf_crossdevice.algorithms import _two_level as two_level
from tf_crossdevice.compression import _codec as codec

AllReduceBuilder: TypeAlias = protocol.AllReduceBuilder
BuilderFactory: TypeAlias = protocol.BuilderFactory

_FACTORIES: dict[str, BuilderFactory] = {
    "hierarchical_copy": hierarchical_copy.builder,
    "nccl": nccl.builder,
    "pscpu": shuffle.pscpu_builder,
    "psgpu": shuffle.psgpu_builder,
    "rechd": halving_doubling.builder,
    "xring": ring.builder,
}

# Built-in factories: these take the compression= and same_worker= keywords.
_COMPRESSING = frozenset(_FACTORIES)

_NAME = re.compile(r"[a-z][a-z0-9_]*", re.ASCII)


def algorithm_names() -> frozenset[str]:
    """The registered single-level names.

    >>> sorted(algorithm_names())
    ['hierarchical_copy', 'nccl', 'pscpu', 'psgpu', 'rechd', 'xring']
    """
    return frozenset(_FACTORIES)


def register(name: str, factory: BuilderFactory) -> None:
    """Adds an algorithm under `name`.

    Args:
        name: lower-case letters, digits and '_', starting with a letter.
        factory: `shards -> AllReduceBuilder`.

    Raises:
        ValueError: a malformed name, or one already registered.
        TypeError: `factory` is not callable.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"name: expected lower-case letters, digits and '_' starting "
            f"with a letter, got {name!r}"
        )
    if name in _FACTORIES:
        raise ValueError(f"name: {name!r} is already registered")
    if not callable(factory):
        raise TypeError(
            "factory: expected a callable shards -> AllReduceBuilder, got "
            f"{type(factory).__name__} {factory!r}"
        )
    _FACTORIES[name] = factory


def unregister(name: str) -> None:
    """Removes `name`; builders already built keep working.

    Raises:
        ValueError: `name` is not registered.
    """
    if name not in _FACTORIES:
        raise ValueError(
            f"name: {name!r} is not registered; expected one of "
            f"{', '.join(sorted(_FACTORIES))}"
        )
    del _FACTORIES[name]


def check_algorithm(name: object, argument: str = "alg") -> str:
    """Returns `name` if `build` accepts it; else raises ValueError.

    The message names `argument`, the bad value (or bad part of an
    'inner/outer' name) and the registered names.
    """
    return spec_lib.check_algorithm(name, algorithm_names(), argument)


def build(
    name: str,
    shards: int = 1,
    *,
    group_devices: two_level.GroupDevices | None = None,
    same_worker: codec.SameWorker | None = None,
    compression: str | None = None,
    argument: str = "alg",
) -> AllReduceBuilder:
    """The builder for algorithm `name` with `shards` shards.

    Args:
        name: a registered name or 'inner/outer' of two.
        shards: parallel sub-all-reduces; for 'inner/outer', of the outer
            stage (the inner one has one shard, as in TensorFlow 1).
        group_devices: for 'inner/outer' only: devices -> positions per
            worker (default: `same_worker`'s grouping, else by job, replica
            and task).
        same_worker: the "same worker?" predicate, (device, device) ->
            bool; default by job, replica and task. Tests fake workers.
        compression: None, 'bf16' or 'fp16': float32 and float64 values
            crossing workers travel as 16 bits (the outer stage of
            'inner/outer').
        argument: the caller's name for `name`, for error messages.

    Raises:
        ValueError: an unknown name, `shards` less than 1, `group_devices`
            with a single-level name, a bad `compression`, or compression
            with a registered algorithm that does not support it.
        TypeError: `shards` is not an int.
    """
    check_algorithm(name, argument)
    checks.positive_int(shards, "shards")
    compression = codec.check_compression(compression)
    parts = spec_lib.split_two_level(name)
    if parts is None:
        if group_devices is not None:
            raise ValueError(
                f"group_devices: only 'inner/outer' algorithms group devices "
                f"into workers; {name!r} has one level"
            )
        return _make(name, shards, compression, same_worker)
    inner, outer = parts
    return two_level.builder(
        _FACTORIES[inner](1),
        _make(outer, shards, compression, same_worker),
        group_devices,
        same_worker,
    )


def _make(
    name: str,
    shards: int,
    compression: str | None,
    same_worker: codec.SameWorker | None,
) -> AllReduceBuilder:
    if compression is None and same_worker is None:
        return _FACTORIES[name](shards)
    if name not in _COMPRESSING:
        raise ValueError(
            f"compression: algorithm {name!r} was registered without "
            f"compression support; expected None, or one of "
            f"{', '.join(sorted(_COMPRESSING))}"
        )
    factory: Any = _FACTORIES[name]
    return factory(shards, compression=compression, same_worker=same_worker)
