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

Compression: `build(..., wire=WirePolicy(codec='bf16' | 'fp16'))` makes
float32 and float64 values cross workers as 16 bits (see
`tf_crossdevice.compression.WirePolicy`); for 'inner/outer' only the outer
stage compresses. The built-in factories take the `wire=` keyword; one
registered without it is refused any policy with a codec or its own
`same_worker`. Algorithms never see PowerSGD: a policy that has it reaches
them without it (PowerSGD is applied around the all-reduce).

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

import dataclasses
import re
from typing import Any, TypeAlias

from tf_crossdevice import compression as wire_policy
from tf_crossdevice._core import checks
from tf_crossdevice.algorithms import _halving_doubling as halving_doubling
from tf_crossdevice.algorithms import _hierarchical_copy as hierarchical_copy
from tf_crossdevice.algorithms import _nccl as nccl
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _ring as ring
from tf_crossdevice.algorithms import _shuffle as shuffle
from tf_crossdevice.algorithms import _spec as spec_lib
from tf_crossdevice.algorithms import _two_level as two_level

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

# Built-in factories: these take the wire= keyword.
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
    wire: wire_policy.WirePolicy | None = None,
    argument: str = "alg",
) -> AllReduceBuilder:
    """The builder for algorithm `name` with `shards` shards.

    Args:
        name: a registered name or 'inner/outer' of two.
        shards: parallel sub-all-reduces; for 'inner/outer', of the outer
            stage (the inner one has one shard, as in TensorFlow 1).
        group_devices: for 'inner/outer' only: devices -> positions per
            worker (default: the grouping of `wire.same_worker`, by job,
            replica and task unless the policy has its own).
        wire: a `tf_crossdevice.compression.WirePolicy`: with a codec,
            float32 and float64 values crossing workers travel as 16 bits
            (the outer stage of 'inner/outer'); its `same_worker` says
            which links cross (tests fake workers). None: `WirePolicy()`.
        argument: the caller's name for `name`, for error messages.

    Raises:
        ValueError: an unknown name, `shards` less than 1, `group_devices`
            with a single-level name, or a policy with a codec or its own
            `same_worker` for a registered algorithm that does not take one.
        TypeError: `shards` is not an int, or `wire` is not a WirePolicy.
    """
    check_algorithm(name, argument)
    checks.positive_int(shards, "shards")
    # The algorithms move PowerSGD's factors like any other values.
    wire = dataclasses.replace(wire_policy.check_wire(wire), powersgd=None)
    parts = spec_lib.split_two_level(name)
    if parts is None:
        if group_devices is not None:
            raise ValueError(
                f"group_devices: only 'inner/outer' algorithms group devices "
                f"into workers; {name!r} has one level"
            )
        return _make(name, shards, wire)
    inner, outer = parts
    return two_level.builder(
        _FACTORIES[inner](1),
        _make(outer, shards, wire),
        group_devices,
        wire=wire,
    )


def _make(
    name: str, shards: int, wire: wire_policy.WirePolicy
) -> AllReduceBuilder:
    if wire == wire_policy.WirePolicy():
        return _FACTORIES[name](shards)
    if name not in _COMPRESSING:
        raise ValueError(
            f"compression: algorithm {name!r} was registered without "
            f"compression support; expected None, or one of "
            f"{', '.join(sorted(_COMPRESSING))}"
        )
    factory: Any = _FACTORIES[name]
    return factory(shards, wire=wire)
