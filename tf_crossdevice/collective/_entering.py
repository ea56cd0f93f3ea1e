"""Which collective a worker waits in, for a launcher that watches it.

TensorFlow's collective ops say nothing while they wait, and their state
(the executor's, the collective executor's) is not ours to read from
another thread. So when a launcher watches this worker
(`tf_crossdevice._core.heartbeat`), each collective the package launches
first runs a small host op that records its name and instance key in the
worker's heartbeat file. The record runs once the collective's input
exists and the worker's previous collective on that device has ended, and
the collective waits for it: a worker whose record names a collective is
in it, or past it. Workers that stall in one collective name it, and the
late ones an earlier one. Steps traced while nobody watches get no record
op, and cost nothing.

Each record names the op, the unit of the step it carries (`unit`: "pack
2 of 4, 3 tensors") and the instance key, which is the same on every
worker for the same collective:

    all_reduce of pack 2 of 4 (3 tensors) in CollectiveAllReduce, instance
    key 1234
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_crossdevice._core import heartbeat

_UNIT: contextvars.ContextVar[str] = contextvars.ContextVar(
    "tf_crossdevice_collective_unit", default=""
)

# Function graph -> device -> its last collective op so far.
_last: weakref.WeakKeyDictionary[Any, dict[str, Any]] = (
    weakref.WeakKeyDictionary()
)


@contextlib.contextmanager
def unit(label: str) -> Iterator[None]:
    """Names the part of a step whose collectives are built in the block
    ('pack 2 of 4 (3 tensors)')."""
    token = _UNIT.set(label)
    try:
        yield
    finally:
        _UNIT.reset(token)


def pack_label(position: int, count: int, tensors: int, sparse: bool) -> str:
    """'pack 2 of 4 (3 tensors)' for the unit at `position` (from 0) of a
    step's `count`; an IndexedSlices travels alone: 'pack 4 of 4
    (IndexedSlices)'."""
    noun = "tensor" if tensors == 1 else "tensors"
    what = "IndexedSlices" if sparse else f"{tensors} {noun}"
    return f"pack {position + 1} of {count} ({what})"


def launch(
    device: str, op: Any, inputs: Sequence[Any], **kwargs: Any
) -> tf.Tensor:
    """`op(*inputs, **kwargs)` (a collective op on `device`), recorded as
    entered first if a launcher watches this worker."""
    if not heartbeat.watched():
        return op(*inputs, **kwargs)
    what = _describe(kwargs.get("name", op.__name__))
    key: Any = kwargs["instance_key"]
    if tf.executing_eagerly():
        heartbeat.entering(f"{what}, instance key {int(key)}")
        return op(*inputs, **kwargs)
    if not isinstance(key, tf.Tensor):
        # A TF 1 graph's keys are fixed when it is built: it gets no record.
        return op(*inputs, **kwargs)
    graph = tf.compat.v1.get_default_graph()
    last = _last.setdefault(graph, {})
    after = [t for t in inputs if isinstance(t, tf.Tensor)]
    if device in last:
        after.append(last[device])
    with tf.control_dependencies(after):
        # The record passes the instance key on to the collective: a data
        # edge, which nothing prunes. Stateless, because tf.function runs
        # stateful ops in program order, which would chain the records of
        # different devices and deadlock a collective of several of this
        # worker's devices (one device's next record waiting for its
        # collective, which waits for another device's record).
        key = tf.numpy_function(
            lambda k: _entering(what, k),
            [key],
            tf.int32,
            stateful=False,
            name="entering",
        )
    key.set_shape([])
    out = op(*inputs, **{**kwargs, "instance_key": key})
    last[device] = out.op
    return out


def _describe(name: str) -> str:
    # The group's ops are named "<group>_<kind>" (`Group`).
    for kind in ("compressed_all_gather", "all_reduce", "all_gather"):
        if name.endswith(f"_{kind}"):
            group = name[: -len(kind) - 1]
            break
    else:
        group, kind = name, "collective"
    where = _UNIT.get()
    return f"{kind} of {where} in {group}" if where else f"{kind} in {group}"


def _entering(what: str, key: Any) -> np.int32:
    heartbeat.entering(f"{what}, instance key {int(key)}")
    return np.int32(key)
