"""PowerSGD's state, one compressed tensor at a time: its layout as a
matrix, and its variables (every replica's copy of the factor Q and its
error feedback), created on first use and tracked for checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from tf_crossdevice._core import tf_internal
from tf_crossdevice.compression._replica_devices import replica_device


class Layout(NamedTuple):
    """How one compressed tensor is laid out as a matrix.

    Attributes:
        shape: the tensor's shape.
        n: the matrix's rows (the product of every dimension but the last).
        m: the matrix's columns (the last dimension).
        r: the factors' columns: min(n, m, the compressor's rank).
    """

    shape: tuple[int, ...]
    n: int
    m: int
    r: int


@dataclasses.dataclass(frozen=True)
class MatrixState:
    """The state of one compressed tensor (see `PowerSGD.state`).

    Attributes:
        position: the tensor's index in the batch.
        shape: the tensor's shape.
        matrix_shape: (n, m), the matrix it is reshaped to.
        rank: r = min(n, m, the compressor's rank).
        q: the factor Q, (m, r): the last step's all-reduced Q (before the
            next step orthogonalises it), or the seeded initial one; the
            first replica's copy.
        errors: the error feedback of each replica, (n, m) each.
        q_replicas: every replica's copy of Q, each on its replica's
            device (the first is `q`): the same values, kept where they are
            used, so that no step reads Q across a worker boundary.
    """

    position: int
    shape: tuple[int, ...]
    matrix_shape: tuple[int, int]
    rank: int
    q: tf.Variable
    errors: tuple[tf.Variable, ...]
    q_replicas: tuple[tf.Variable, ...]


class Matrix(tf.Module):
    """The variables of one compressed tensor, tracked for checkpoints."""

    def __init__(
        self, qs: list[tf.Variable], errors: list[tf.Variable], name: str
    ) -> None:
        super().__init__(name=name)
        self.q = qs[0]
        self.q_copies = qs[1:]
        self.errors = errors


def matrix_key(position: int) -> str:
    """The name of the compressed tensor at `position`'s variables."""
    return f"value_{position}"


def new_matrix(
    layout: Layout,
    dtype: Any,
    position: int,
    seed: int,
    devices: Sequence[str] | None,
    replicas: int,
) -> Matrix:
    """The variables of the compressed tensor at `position`, one set per
    replica on its device: Q seeded by (`seed`, `position`), the same on
    every replica and worker, and a zero error.

    Created outside any tf.function (`tf.init_scope`), so that a trace can
    create them on first use.
    """
    _, n, m, r = layout
    with tf.init_scope():
        qs, errors = [], []
        for i in range(replicas):
            with replica_device(devices, i):
                qs.append(
                    tf_internal.new_resource_variable(
                        tf.random.stateless_normal(
                            (m, r), seed=(seed, position), dtype=dtype
                        ),
                        trainable=False,
                        name=f"powersgd_q_{position}" + f"_{i}" * (i > 0),
                    )
                )
                errors.append(
                    tf_internal.new_resource_variable(
                        tf.zeros((n, m), dtype),
                        trainable=False,
                        name=f"powersgd_error_{position}_{i}",
                    )
                )
    return Matrix(qs, errors, matrix_key(position))
