"""Progress marks: which collective of a step has started and not ended.

A collective op is opaque while it waits for its peers. So that the stall
report can name the one a step waits in, a step traced inside
`tf_crossdevice.reporting_unreachable_peers` brackets each collective it
launches with two increments of a counter of its own (an int64 resource
variable on the collective's device): one that the collective waits for,
one that waits for the collective. An odd count is a collective that has
started and not ended; the report reads the counters from its own thread
while the step runs. A counter per collective, not one per step: the
function's automatic control dependencies order the ops that share a
resource, and one shared counter would run the collectives one after
another.

Steps traced outside such a block carry no marks and cost nothing more.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import tf_internal

# The most marks kept (the newest): a retraced step makes new ones.
_KEPT = 4096

_local = threading.local()
_lock = threading.Lock()
_marks: collections.deque[Mark] = collections.deque(maxlen=_KEPT)


@dataclasses.dataclass(frozen=True)
class Mark:
    """One collective of a traced step.

    Attributes:
        counter: its counter (odd: started and not ended).
        index: its place among the collectives the step's trace launched
            on its device, from 1.
        what: the op, its tensor and device, in words.
        trace: the traced function's graph name.
        device: the collective's device.
    """

    counter: Any
    index: int
    what: str
    trace: str
    device: str


@contextlib.contextmanager
def marking() -> Iterator[None]:
    """Collectives launched while tracing in this block get marks."""
    before = getattr(_local, "on", False)
    _local.on = True
    try:
        yield
    finally:
        _local.on = before


def launch(device: str, op: Any, *args: Any, **kwargs: Any) -> tf.Tensor:
    """`op(*args, **kwargs)`, bracketed by marks when a function is traced
    inside `marking()`."""
    if not getattr(_local, "on", False) or not tf.inside_function():
        return op(*args, **kwargs)
    graph = tf.compat.v1.get_default_graph()
    with tf.init_scope(), tf.device(device):
        counter = tf_internal.new_resource_variable(
            tf.constant(0, tf.int64), trainable=False, name="progress"
        )
    with tf.control_dependencies([counter.assign_add(1)]):
        out = op(*args, **kwargs)
    with tf.control_dependencies([out]):
        counter.assign_add(1)
    with _lock:
        index = 1 + sum(
            1 for m in _marks if m.trace == graph.name and m.device == device
        )
        _marks.append(
            Mark(
                counter,
                index,
                _describe(op, args, kwargs, device),
                graph.name,
                device,
            )
        )
    return out


def _describe(op: Any, args: Any, kwargs: Any, device: str) -> str:
    kind = getattr(op, "__name__", "collective").replace("_v2", "")
    tensor: Any = args[0] if args else tf.constant(0.0)
    size = tensor.shape.num_elements()
    dtype = tensor.dtype
    amount = (
        f"{dtype.name}[{size}] ({_mib(size * dtype.size)})"
        if size is not None
        else f"{dtype.name} of unknown size"
    )
    name = kwargs.get("name")
    named = f" '{name}'" if name else ""
    return f"{kind.replace('_', '-')}{named} of {amount} on {device}"


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.3g} MiB" if nbytes >= 2**20 else f"{nbytes} B"


def in_flight() -> list[tuple[Mark, int]]:
    """The marked collectives that have started and not ended, each with
    how many collectives its trace launched on its device, oldest trace
    first."""
    with _lock:
        marks = list(_marks)
    totals = collections.Counter((m.trace, m.device) for m in marks)
    waiting = []
    for mark in marks:
        try:
            count = int(mark.counter.read_value())
        except (tf.errors.OpError, ValueError):
            continue
        if count % 2:
            waiting.append((mark, totals[(mark.trace, mark.device)]))
    return waiting


def describe_in_flight() -> str:
    """A sentence naming the collectives in flight ('' without marks)."""
    waiting = in_flight()
    if not waiting:
        return ""
    first, total = waiting[0]
    others = len(waiting) - 1
    more = f" ({others} more in flight)" if others else ""
    return (
        f"It waits in collective {first.index} of {total} on its device: "
        f"{first.what}{more}."
    )
