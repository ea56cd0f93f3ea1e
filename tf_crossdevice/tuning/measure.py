"""Measuring all-reduce steps: inputs, a numpy check, interleaved timing.

What the library needs to compare candidates (for selection and autotuning)
and what the benchmark study (`benchmarks/`, not installed) builds on. A
step is a `tf.function` whose body returns `results[k][d]`, value k reduced
on replica d. Each step is traced, run once and checked against numpy's sum
(values and placement), warmed up, then timed: every step once per round,
in a fresh random order each round, so that a noisy neighbour slows all of
them alike. A step that gives a wrong number is never timed.

>>> devices = tf_crossdevice.testing.cpu_devices(2)
>>> timings = measure_cross_device_ops(
...     {"xring": tf_crossdevice.SpecAllReduce("xring"),
...      "TF ReductionToOneDevice": tf.distribute.ReductionToOneDevice()},
...     devices, [((100,), "float32"), ((3, 4), "float64")],
...     rounds=3, target_seconds=0.001)
>>> [(t.name, t.verified, len(t.samples)) for t in timings]
[('xring', True, 3), ('TF ReductionToOneDevice', True, 3)]
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np
import tensorflow as tf

from tf_crossdevice._core import checks as _checks
from tf_crossdevice._core import tf_internal
from tf_crossdevice.compression import _codec as codec
from tf_crossdevice.ops import _base

__all__ = [
    "Check",
    "Gradients",
    "Inputs",
    "Prepared",
    "Results",
    "Step",
    "TimeFn",
    "Timing",
    "all_reduce_body",
    "canonical",
    "first_line",
    "interleaved_rounds",
    "measure",
    "measure_cross_device_ops",
    "mismatch",
    "mismatch_beyond",
    "prepare",
    "read_on",
    "replica_seed",
    "reps_for",
    "sink",
    "time_calls",
    "timer",
]

# (shape, dtype) of each gradient of one replica.
Gradients: TypeAlias = Sequence[tuple[Sequence[int], Any]]
Results: TypeAlias = list[list[Any]]  # results[k][d]: value k on replica d
Check: TypeAlias = Callable[[Results, list[list[str]]], "str | None"]
TimeFn: TypeAlias = Callable[[int], float]  # seconds per call of n calls

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


def sink(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Keeps `tensors` alive in a tf.function without copying them.

    One stateful `Assert` per device takes that device's tensors as data
    (with a true condition it does nothing else). Returns a constant 0.
    Assert reads its data in host memory, so on a GPU it takes one
    element of each tensor (which still needs the whole tensor computed)
    rather than copying every result to the host.
    """
    by_device: dict[str, list[tf.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for device, group in by_device.items():
        with tf.device(device):
            if "GPU" in device.upper():
                group = [tf.reshape(t, [-1])[:1] for t in group]
            tf.raw_ops.Assert(
                condition=tf.constant(True), data=group, summarize=0
            )
    return tf.constant(0)


class Step:
    """Two traces of one body: one returns the results, one sinks them.

    `verify` runs the first once, checks its results and where the step
    placed them, and lets go of it; `timed` is an ordinary tf.function, as a
    training step would be, that sinks the results on their devices.

    One trace cannot serve both: a call that returns 8 x 1000 results spends
    most of its time handing them back (about 5x the sinking step), and a
    sinking function that calls the returning trace runs no faster.
    """

    def __init__(self, body: Callable[[], Results]):
        self.devices: list[list[str]] = []

        def results() -> Results:
            out = body()
            self.devices = [[t.device for t in per] for per in out]
            return out

        self._results: Callable[[], Results] | None = tf.function(
            results, autograph=False
        )
        self.timed = tf.function(
            lambda: sink([t for per in body() for t in per]), autograph=False
        )

    def verify(self, check: Check) -> str | None:
        """`check(results, devices)` of one run (once per step)."""
        if self._results is None:
            raise RuntimeError("verify: this step was verified already")
        try:
            return check(self._results(), self.devices)
        finally:
            self._results = None


@dataclasses.dataclass(frozen=True)
class Prepared:
    """An entry after its build, check and warm-up.

    Attributes:
        verified: matched numpy (None: nothing to check, e.g. a baseline).
        error: why it cannot be timed.
        seconds_per_call: one call after warm-up (chooses the reps).
        build_seconds: tracing, first runs and the check.
        search_seconds: for an entry chosen by a search (autotune), how
            long the search took, before the build.
        chosen: for such an entry, what the search chose.
        search: for such an entry, one line per step of the search (each
            candidate's build and time, or why it has none): where its
            time went.
    """

    verified: bool | None
    error: str | None
    seconds_per_call: float
    build_seconds: float
    search_seconds: float | None = None
    chosen: str | None = None
    search: tuple[str, ...] | None = None


def prepare(
    build: Callable[[], tuple[Callable[[], Any], Callable[[], str | None]]],
    warmup: int = 2,
    verifies: bool = True,
) -> tuple[Prepared, Callable[[], Any] | None]:
    """Builds an entry, checks it, warms it up and times one call.

    Args:
        build: returns (the timed call, a check: None or what is wrong).
        warmup: untimed calls after the check.
        verifies: False where the check only guards inputs (baselines).

    Returns:
        (what happened, the timed call; None if it failed).

    >>> prepared, call = prepare(lambda: (lambda: None, lambda: "3, not 4"))
    >>> prepared.verified, prepared.error, call
    (False, 'wrong result: 3, not 4', None)
    """
    start = time.perf_counter()
    failed = False if verifies else None
    try:
        call, check = build()
        problem = check()
        if problem is not None:
            error = f"wrong result: {problem}"
            return Prepared(
                failed, error, 0.0, time.perf_counter() - start
            ), None
        for _ in range(warmup):
            call()
        seconds = min(time_calls(call, 1) for _ in range(2))
    except Exception as e:  # noqa: BLE001 - the record says it failed.
        error = f"{type(e).__name__}: {first_line(str(e))}"
        return Prepared(failed, error, 0.0, time.perf_counter() - start), None
    verified = True if verifies else None
    return Prepared(verified, None, seconds, time.perf_counter() - start), call


def time_calls(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call of `reps` back-to-back calls of `fn`."""
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def timer(call: Callable[[], object]) -> TimeFn:
    """A function timing n back-to-back calls of `call` (seconds per call)."""
    return lambda reps: time_calls(call, reps)


def reps_for(
    seconds_per_call: float, target_seconds: float, max_reps: int
) -> int:
    """Calls per measurement so that one lasts about `target_seconds`.

    >>> reps_for(0.001, 0.05, 100), reps_for(2.0, 0.05, 100)
    (50, 1)
    """
    if seconds_per_call <= 0:
        return max_reps
    return max(1, min(max_reps, math.ceil(target_seconds / seconds_per_call)))


def interleaved_rounds(
    timers: Mapping[str, TimeFn],
    reps: Mapping[str, int],
    rounds: int,
    seed: int = 0,
    on_measurement: Callable[[str], object] | None = None,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Times every entry once per round, in a new random order each round.

    Args:
        timers: name -> function timing n calls (seconds per call).
        reps: name -> calls per measurement.
        rounds: at least 1.
        seed: seeds each round's order.
        on_measurement: called with the name after each measurement (also
            for an entry that failed earlier and is skipped).

    Returns:
        (samples, errors): each entry's seconds per call, round by round;
        for an entry that raised, its error (its samples are dropped).
    """
    _checks.positive_int(rounds, "rounds")
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in timers}
    errors: dict[str, str] = {}
    order = list(timers)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            if name not in errors:
                try:
                    samples[name].append(timers[name](reps[name]))
                except Exception as e:  # noqa: BLE001 - reported.
                    errors[name] = f"{type(e).__name__}: {first_line(str(e))}"
                    samples.pop(name)
            if on_measurement is not None:
                on_measurement(name)
    return samples, errors


@dataclasses.dataclass(frozen=True)
class Timing:
    """One entry's record: its check, its build and its timed rounds.

    Attributes:
        name: the entry.
        verified: matched numpy before timing (None: not checked).
        error: why it has no samples, if it has none.
        build_seconds: tracing, the first runs and the check.
        reps: calls per measurement.
        samples: seconds per call, one per round, in round order.
        median_seconds, q25_seconds, q75_seconds: of the samples (None
            without samples).
        search_seconds, chosen, search: see `Prepared`.
    """

    name: str
    verified: bool | None
    error: str | None
    build_seconds: float
    reps: int
    samples: tuple[float, ...]
    median_seconds: float | None
    q25_seconds: float | None
    q75_seconds: float | None
    search_seconds: float | None = None
    chosen: str | None = None
    search: tuple[str, ...] | None = None

    @classmethod
    def of(
        cls,
        name: str,
        prepared: Prepared,
        reps: int,
        samples: Sequence[float],
        error: str | None = None,
    ) -> Timing:
        """The record; quartiles by the inclusive method.

        >>> t = Timing.of("a", Prepared(True, None, 1.0, 0.5), 1,
        ...               [4.0, 1.0, 3.0, 2.0])
        >>> t.median_seconds, t.q25_seconds, t.q75_seconds
        (2.5, 1.75, 3.25)
        """
        error = prepared.error or error
        values = sorted(samples) if error is None else []
        q25 = q75 = values[0] if values else None
        if len(values) > 1:
            q25, _, q75 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(
            name=name,
            verified=prepared.verified,
            error=error,
            build_seconds=prepared.build_seconds,
            reps=reps,
            samples=tuple(samples) if error is None else (),
            median_seconds=statistics.median(values) if values else None,
            q25_seconds=q25,
            q75_seconds=q75,
            search_seconds=prepared.search_seconds,
            chosen=prepared.chosen,
            search=prepared.search,
        )


def measure(
    bodies: Mapping[str, Callable[[], Results]],
    inputs: Inputs,
    *,
    checks: Mapping[str, Check | None] | None = None,
    rounds: int = 5,
    warmup: int = 2,
    target_seconds: float = 0.05,
    max_reps: int = 100,
    seed: int = 0,
) -> list[Timing]:
    """Verifies, warms up and times step bodies in interleaved rounds.

    Args:
        bodies: name -> a body returning `results[k][d]` (traced into a
            `Step`).
        inputs: what the bodies reduce; `inputs.check` verifies each body
            unless `checks` names another check, or None (not verified).
        rounds: timing rounds.
        warmup: untimed calls after the check.
        target_seconds: each measurement repeats the step about this long.
        max_reps: at most this many calls per measurement.
        seed: seeds the round order.

    Returns:
        One record per body, in the order of `bodies`.
    """
    checks = checks or {}
    prepared: dict[str, Prepared] = {}
    timers: dict[str, TimeFn] = {}
    reps: dict[str, int] = {}
    for name, body in bodies.items():
        check = checks.get(name, inputs.check)

        def build(body: Any = body, check: Any = check) -> Any:
            step = Step(body)
            return step.timed, lambda: step.verify(check) if check else None

        prepared[name], call = prepare(build, warmup, check is not None)
        if call is not None:
            timers[name] = timer(call)
            reps[name] = reps_for(
                prepared[name].seconds_per_call, target_seconds, max_reps
            )
    samples, errors = interleaved_rounds(timers, reps, rounds, seed)
    return [
        Timing.of(
            name, p, reps.get(name, 0), samples.get(name, []), errors.get(name)
        )
        for name, p in prepared.items()
    ]


def all_reduce_body(
    cross_device_ops: tf.distribute.CrossDeviceOps, inputs: Inputs
) -> Callable[[], Results]:
    """A body that sums every gradient of `inputs` with one batch_reduce."""

    def body() -> Results:
        values = [(v, v) for v in inputs.values()]
        reduced = cross_device_ops.batch_reduce(
            tf.distribute.ReduceOp.SUM, values
        )
        return [list(_base.per_destination(r)) for r in reduced]

    return body


def measure_cross_device_ops(
    candidates: Mapping[str, tf.distribute.CrossDeviceOps],
    devices: Sequence[str],
    gradients: Gradients,
    *,
    seed: int = 0,
    **options: Any,
) -> list[Timing]:
    """`measure` of each CrossDeviceOps summing `gradients` on `devices`.

    Args:
        candidates: name -> a CrossDeviceOps.
        devices: one replica per device.
        gradients: (shape, dtype) of each gradient of one replica.
        seed: seeds the values and the round order.
        **options: rounds, warmup, target_seconds, max_reps (`measure`).
    """
    inputs = Inputs(gradients, devices, seed)
    bodies = {n: all_reduce_body(c, inputs) for n, c in candidates.items()}
    return measure(bodies, inputs, seed=seed, **options)


def first_line(text: str, limit: int = 300) -> str:
    r"""The gist of an error message in one line of at most `limit` chars.

    TensorFlow's messages open with a generic line and the place a node was
    defined; the cause comes after. Lines ending with ':' join the next.

    >>> first_line("Graph execution error:\n\nDetected at node x defined "
    ...            "at:\n  File a.py\n\nShapes differ [[{{node x}}]]")
    'Graph execution error: Shapes differ [[{{node x}}]]'
    """
    gist = ""
    for line in text.strip().splitlines():
        if not line.strip() or line.startswith((" ", "\t", "Detected at node")):
            continue
        gist = f"{gist} {line.strip()}".strip()
        if not line.rstrip().endswith(":"):
            break
    return gist if len(gist) <= limit else gist[: limit - 3] + "..."
