"""What an op of a traced graph waits for: the overlap tests' one question.

A collective can start once every op it depends on, through data or
control edges (automatic control dependencies included), has run.
"""

from __future__ import annotations

from collections.abc import Iterable

import tensorflow as tf


def ancestors(ops: Iterable[tf.Operation]) -> set[tf.Operation]:
    """Every op `ops` wait for: their inputs and control inputs,
    transitively (the ops themselves only if one waits for another)."""
    seen: set[tf.Operation] = set()
    stack = list(ops)
    while stack:
        current = stack.pop()
        for parent in [t.op for t in current.inputs] + current.control_inputs:
            if parent not in seen:
                seen.add(parent)
                stack.append(parent)
    return seen
