"""Measuring inputs: replicas' gradients with numpy's sum, and the check.

`Inputs` holds each replica's gradients (small random integers, one flat
variable per dtype on the replica's device) and numpy's sum of them, and
checks a step's results against that sum (`mismatch`, exactly, or
`mismatch_beyond`, within a tolerance) and against where they should be.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import tensorflow as tf

from tf_crossdevice import compression as codec
from tf_crossdevice._core import tf_internal

# (shape, dtype) of each gradient of one replica.
Gradients: TypeAlias = Sequence[tuple[Sequence[int], Any]]
Results: TypeAlias = list[list[Any]]  # results[k][d]: value k on replica d
Check: TypeAlias = Callable[[Results, list[list[str]]], "str | None"]

# TensorFlow's CPU kernels share the buffer of Split/Slice pieces that start
# on this boundary (EIGEN_MAX_ALIGN_BYTES): cutting inputs copies nothing.
_ALIGN_BYTES = 64


def _padded(size: int, dtype: tf.DType) -> int:
    """Elements from a gradient's start to the next one's (64-byte aligned)."""
    align = max(1, _ALIGN_BYTES // dtype.size)
    return -(-max(size, 1) // align) * align


def canonical(device: str) -> str:
    """Canonical device name; '<unplaced>' for ''."""
    return tf_internal.canonicalize_device(device) if device else "<unplaced>"


def replica_seed(seed: int, replica: int) -> int:
    """A seed for one replica's values, the same in every process."""
    digest = hashlib.sha256(f"{seed}/{replica}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def read_on(variable: tf.Variable, device: str) -> tf.Tensor:
    """`variable`'s value, read by an op placed on `device`.

    `Variable.value()` clears the device scope, so its read would not say
    where it runs; this one does.

    >>> v = tf.Variable([1.0, 2.0])
    >>> read_on(v, "/cpu:0").numpy().tolist()
    [1.0, 2.0]
    """
    with tf.device(device):
        return tf.raw_ops.ReadVariableOp(
            resource=variable.handle, dtype=variable.dtype
        )


class Inputs:
    """Replicas' gradients on their devices, and numpy's sum of them.

    Values are small integers, so every summation order gives numpy's sum
    exactly. A replica's values of one dtype live in one flat variable,
    each gradient starting on a 64-byte boundary.

    Args:
        gradients: (shape, dtype) of each gradient of one replica.
        devices: replica `first_replica + i` lives on `devices[i]`.
        seed: seeds the values (`replica_seed`).
        first_replica: the first replica held here.
        total_replicas: replicas in the whole reduction (default: those
            held here); `expected` sums all of them.
    """

    def __init__(
        self,
        gradients: Gradients,
        devices: Sequence[str],
        seed: int = 0,
        first_replica: int = 0,
        total_replicas: int | None = None,
    ):
        self.shapes = [tuple(int(d) for d in s) for s, _ in gradients]
        self.dtypes = [tf.as_dtype(d) for _, d in gradients]
        self.devices = [canonical(d) for d in devices]
        # dtype -> [(gradient index, offset, size)]; dtype -> buffer length.
        self.layout: dict[Any, list[tuple[int, int, int]]] = {}
        length: dict[Any, int] = {}
        for k, (shape, dtype) in enumerate(
            zip(self.shapes, self.dtypes, strict=True)
        ):
            size, start = math.prod(shape), length.get(dtype, 0)
            self.layout.setdefault(dtype, []).append((k, start, size))
            length[dtype] = start + _padded(size, dtype)
        total = total_replicas or len(self.devices)
        self.variables: list[dict[Any, tf.Variable]] = []
        self.expected_flats: dict[Any, np.ndarray] = {}
        # Sum of the replicas' absolute values: bounds rounding errors.
        self.magnitude_flats: dict[Any, np.ndarray] = {}
        for replica in range(total):
            rng = np.random.default_rng(replica_seed(seed, replica))
            flats = {}
            for dtype, pieces in self.layout.items():
                span = 4 if dtype.size < 4 else 100  # exact in 16-bit floats
                flat = np.zeros(length[dtype], dtype.as_numpy_dtype)
                for _, offset, size in pieces:
                    flat[offset : offset + size] = rng.integers(
                        -span, span + 1, size
                    )
                flats[dtype] = flat
                if dtype in self.expected_flats:
                    self.expected_flats[dtype] += flat
                    self.magnitude_flats[dtype] += np.abs(flat)
                else:
                    self.expected_flats[dtype] = flat.copy()
                    self.magnitude_flats[dtype] = np.abs(flat)
            i = replica - first_replica
            if 0 <= i < len(self.devices):
                with tf.device(self.devices[i]):
                    self.variables.append(
                        {
                            d: tf.Variable(f, trainable=False)
                            for d, f in flats.items()
                        }
                    )
        self.expected = self._views(self.expected_flats)
        self.magnitudes = self._views(self.magnitude_flats)

    def _views(self, flats: Mapping[Any, np.ndarray]) -> list[np.ndarray]:
        views: list[Any] = [None] * len(self.shapes)
        for dtype, pieces in self.layout.items():
            for k, offset, size in pieces:
                views[k] = flats[dtype][offset : offset + size].reshape(
                    self.shapes[k]
                )
        return views

    def read(self, i: int, dtype: Any) -> tf.Tensor:
        """Replica i's flat buffer of `dtype`, read on its device."""
        return read_on(self.variables[i][dtype], self.devices[i])

    def flats(self) -> list[tf.Tensor]:
        """Each replica's flat buffer (one dtype only), on its device."""
        if len(self.layout) != 1:
            raise ValueError(f"flats: needs one dtype, have {len(self.layout)}")
        (dtype,) = self.layout
        return [self.read(i, dtype) for i in range(len(self.devices))]

    def tensors(self, i: int) -> list[tf.Tensor]:
        """Replica i's gradients, cut from its buffers (in a tf.function).

        One `tf.split` per dtype cuts the buffer at the 64-byte boundaries,
        so every piece shares the buffer; a gradient shorter than its
        padded piece is then sliced (a copy, as any unaligned cut is) and
        reshaped. Constants are shared within the replica: a few nodes per
        gradient, not one slice with three constants each.
        """
        out: list[Any] = [None] * len(self.shapes)
        with tf.device(self.devices[i]):
            consts: dict[tuple[int, ...], tf.Tensor] = {}

            def const(values: tuple[int, ...]) -> tf.Tensor:
                if values not in consts:
                    consts[values] = tf.constant(values, tf.int32)
                return consts[values]

            for dtype, pieces in self.layout.items():
                flat = self.read(i, dtype)
                padded = [_padded(size, dtype) for *_, size in pieces]
                cut = tf.split(flat, padded) if len(pieces) > 1 else [flat]
                for (k, _, size), piece, length in zip(
                    pieces, cut, padded, strict=True
                ):
                    if size != length:
                        piece = tf.slice(piece, const((0,)), const((size,)))
                    if self.shapes[k] != (size,):
                        piece = tf.reshape(piece, const(self.shapes[k]))
                    out[k] = piece
        return out

    def values(self) -> list[Any]:
        """One PerReplica value per gradient (inside a tf.function)."""
        per_device = [self.tensors(i) for i in range(len(self.devices))]
        return [
            tf_internal.PerReplica(tuple(t[k] for t in per_device))
            for k in range(len(self.shapes))
        ]

    def check(self, results: Results, devices: list[list[str]]) -> str | None:
        """None if `results[k][d]` is numpy's sum of gradient k, on device d."""
        return self._compare(results, devices, lambda d: self.expected)

    def check_close(self, relative: float) -> Check:
        """A check allowing each element of gradient k's sum an error of
        `relative` times the sum of the replicas' absolute values there
        (lossy transfers: each rounding of a partial sum stays within it).
        """

        def check(results: Results, devices: list[list[str]]) -> str | None:
            return self._compare(
                results,
                devices,
                lambda d: self.expected,
                self.magnitudes,
                relative,
            )

        return check

    def check_for(self, compression: str | None, num_workers: int) -> Check:
        """The check of an all-reduce with `compression` across
        `num_workers` workers: numpy's sum exactly without it, else within
        the codec's rounding (`compression.sum_tolerance`)."""
        if not compression:
            return self.check
        return self.check_close(codec.sum_tolerance(compression, num_workers))

    def check_inputs(
        self, results: Results, devices: list[list[str]]
    ) -> str | None:
        """None if `results[k][d]` is replica d's own gradient k, on d."""

        def inputs(d: int) -> list[np.ndarray]:
            held = {
                t: np.asarray(v.value()) for t, v in self.variables[d].items()
            }
            return self._views(held)

        return self._compare(results, devices, inputs)

    def _compare(
        self,
        results: Results,
        devices: list[list[str]],
        want: Callable[[int], list[np.ndarray]],
        magnitudes: list[np.ndarray] | None = None,
        relative: float = 0.0,
    ) -> str | None:
        wanted: dict[int, list[np.ndarray]] = {}

        def problem(k: int, d: int, got: np.ndarray) -> str | None:
            if d not in wanted:
                wanted[d] = want(d)
            want_k = wanted[d][k]
            if magnitudes is None or not np.issubdtype(
                want_k.dtype, np.floating
            ):
                return mismatch(got, want_k)
            return mismatch_beyond(got, want_k, relative * magnitudes[k])

        return self.compare_each(results, devices, problem)

    def compare_each(
        self,
        results: Results,
        devices: list[list[str]],
        problem: Callable[[int, int, np.ndarray], str | None],
    ) -> str | None:
        """None if there is one result per gradient and replica, each on
        its replica's device, and `problem(k, d, result)` is None for each;
        else the first thing wrong."""
        if len(results) != len(self.shapes):
            return (
                f"returned {len(results)} values, expected {len(self.shapes)}"
            )
        for d, device in enumerate(self.devices):
            for k, per_device in enumerate(results):
                if len(per_device) != len(self.devices):
                    return (
                        f"value {k}: {len(per_device)} results, expected "
                        f"{len(self.devices)}"
                    )
                got = canonical(devices[k][d])
                if got != device:
                    return f"value {k} replica {d}: on {got}, expected {device}"
                wrong = problem(k, d, np.asarray(per_device[d]))
                if wrong:
                    return f"value {k} replica {d}: {wrong}"
        return None


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if equal, else how `got` differs from numpy's `want`.

    >>> mismatch(np.array([1.0, 2.0]), np.array([1.0, 3.0]))
    '1 of 2 elements differ from numpy (largest difference 1)'
    """
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    wrong = int(np.count_nonzero(got != want))
    if not wrong:
        return None
    worst = float(np.max(np.abs(got.astype(np.float64) - want)))
    return (
        f"{wrong} of {want.size} elements differ from numpy (largest "
        f"difference {worst:g})"
    )


def mismatch_beyond(
    got: np.ndarray, want: np.ndarray, tolerance: np.ndarray
) -> str | None:
    """None if `got` is within `tolerance` of `want` element by element.

    >>> mismatch_beyond(np.array([1.0, 2.5]), np.array([1.0, 2.0]),
    ...                 np.array([0.1, 0.1]))
    '1 of 2 elements differ from numpy by more than the tolerance (largest \
difference 0.5)'
    """
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    error = np.abs(got.astype(np.float64) - want)
    wrong = int(np.count_nonzero(~(error <= tolerance)))
    if not wrong:
        return None
    return (
        f"{wrong} of {want.size} elements differ from numpy by more than the "
        f"tolerance (largest difference {float(np.max(error)):g})"
    )
