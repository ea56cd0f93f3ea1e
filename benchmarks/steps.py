"""The timed steps: inputs on devices, results sunk, results checked.

Each replica's values live in one flat variable on its device. A step (a
`tf.function`) cuts the variable into the workload's tensors on that device
(aligned pieces: no copies), all-reduces them and hands every result to one
`Assert` per device, so nothing is pruned and nothing travels back to
Python. A second trace of the same body returns the results instead; they
are compared with numpy's sum before anything is timed.

>>> layout = workloads.FlatLayout.of(((2,), (3,)))
>>> devices = tf_crossdevice.testing.cpu_devices(2)
>>> replicas = Replicas(workloads.Workload("w", layout.shapes), devices, 0)
>>> def body():
...     with tf.device(devices[0]):
...         summed = [tf.add_n(list(v.values)) for v in replicas.values()]
...     return [[s] * 2 for s in summed]
>>> pair = StepPair(body)
>>> pair.verify(replicas.check)
'value 0 replica 1: result on /job:localhost/replica:0/task:0/device:CPU:0, expected /job:localhost/replica:0/task:0/device:CPU:1'
>>> int(pair.timed())
0
"""  # noqa: E501

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_crossdevice import _tf_internal
from benchmarks import timing, workloads

Results = list[list[tf.Tensor]]  # results[k][d]: value k on replica d


def sink(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    """Keeps `tensors` alive in a tf.function without copying them anywhere.

    One `Assert` per device takes that device's tensors as data: it is
    stateful, so the function must run it and everything it reads, and with
    a true condition it does nothing else. Returns a constant 0.

    >>> @tf.function
    ... def step():
    ...     return sink([tf.ones([2]) * 3.0])
    >>> int(step())
    0
    """
    by_device: dict[str, list[tf.Tensor]] = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for device, group in by_device.items():
        with tf.device(device):
            tf.raw_ops.Assert(
                condition=tf.constant(True), data=group, summarize=0
            )
    return tf.constant(0)


def cut(flat: tf.Tensor, layout: workloads.FlatLayout) -> list[tf.Tensor]:
    """The workload's tensors of one flat buffer (aligned: no copies).

    >>> layout = workloads.FlatLayout.of(((2,), (3, 1)))
    >>> [t.numpy().tolist() for t in cut(tf.range(32.0), layout)]
    [[0.0, 1.0], [[16.0], [17.0], [18.0]]]
    """
    if len(layout.shapes) == 1:
        pieces = [flat]
    else:
        pieces = tf.split(flat, list(layout.padded_sizes))
    tensors = []
    for piece, size, shape, padded in zip(
        pieces, layout.sizes, layout.shapes, layout.padded_sizes, strict=True
    ):
        # Only the ops needed: tracing thousands of small tensors is slow.
        if padded != size:
            piece = piece[:size]
        if shape != (size,):
            piece = tf.reshape(piece, shape)
        tensors.append(piece)
    return tensors


def canonical(device: str) -> str:
    """Canonical device name; '<unplaced>' for ''.

    >>> canonical("/cpu:1"), canonical("")
    ('/job:localhost/replica:0/task:0/device:CPU:1', '<unplaced>')
    """
    return _tf_internal.canonicalize_device(device) if device else "<unplaced>"


class Replicas:
    """Flat variables holding replicas' values, and numpy's sum of them.

    Args:
        workload: the tensors of one replica.
        devices: where the replicas held here live (replica
            `first_replica + i` on `devices[i]`).
        seed: seeds the values (see `workloads.replica_data`).
        first_replica: index of the first replica held here.
        total_replicas: replicas in the whole reduction (default: those
            held here); the expected sum covers all of them.
    """

    def __init__(
        self,
        workload: workloads.Workload,
        devices: Sequence[str],
        seed: int,
        first_replica: int = 0,
        total_replicas: int | None = None,
    ):
        self.workload = workload
        self.devices = [canonical(d) for d in devices]
        self.layout = workloads.FlatLayout.of(workload.shapes)
        total = total_replicas or len(self.devices)
        held = range(first_replica, first_replica + len(self.devices))
        self.variables = []
        expected = None
        for replica in range(total):
            data = workloads.replica_data(
                self.layout, seed, workload.name, replica
            )
            if replica in held:
                with tf.device(self.devices[replica - first_replica]):
                    self.variables.append(tf.Variable(data, trainable=False))
            if expected is None:
                expected = data
            else:
                expected += data
            del data
        assert expected is not None
        self.expected = expected
        self.expected_views = self.layout.views(expected)

    def tensors(self, i: int) -> list[tf.Tensor]:
        """The workload's tensors of the i-th replica held here, on its device.

        Call inside a tf.function (the variable is read there).
        """
        with tf.device(self.devices[i]):
            return cut(self.read(i), self.layout)

    def read(self, i: int) -> tf.Tensor:
        """The i-th replica's flat buffer, read on its device.

        `Variable.value()` clears the device scope (its read is only
        colocated with the variable), so a consumer placed by the read's
        `.device` would land on the default device; this read names it.
        """
        with tf.device(self.devices[i]):
            return tf.raw_ops.ReadVariableOp(
                resource=self.variables[i].handle,
                dtype=self.variables[i].dtype,
            )

    def values(self) -> list[Any]:
        """PerReplica values of the workload's tensors (inside tf.function)."""
        per_device = [self.tensors(i) for i in range(len(self.devices))]
        return [
            _tf_internal.PerReplica(tuple(tensors[k] for tensors in per_device))
            for k in range(len(self.layout.shapes))
        ]

    def flats(self) -> list[tf.Tensor]:
        """Each replica's whole flat buffer, read on its device."""
        return [self.read(i) for i in range(len(self.devices))]

    def check(
        self, results: Sequence[Sequence[Any]], devices: Sequence[Sequence[str]]
    ) -> str | None:
        """None if `results[k][d]` is numpy's sum of value k, on device d.

        Args:
            results: the step's results, as eager tensors or arrays.
            devices: where the step placed each of them.

        Returns:
            None, or what is wrong with the first wrong result.
        """
        if len(results) != len(self.expected_views):
            return (
                f"returned {len(results)} values, expected "
                f"{len(self.expected_views)}"
            )
        for k, (per_device, want) in enumerate(
            zip(results, self.expected_views, strict=True)
        ):
            if len(per_device) != len(self.devices):
                return (
                    f"value {k}: {len(per_device)} results, expected one per "
                    f"device ({len(self.devices)})"
                )
            for d, tensor in enumerate(per_device):
                device = canonical(devices[k][d])
                if device != self.devices[d]:
                    return (
                        f"value {k} replica {d}: result on {device}, expected "
                        f"{self.devices[d]}"
                    )
                problem = mismatch(np.asarray(tensor), want)
                if problem:
                    return f"value {k} replica {d}: {problem}"
        return None

    def check_inputs(
        self, results: Sequence[Sequence[Any]], devices: Sequence[Sequence[str]]
    ) -> str | None:
        """None if `results[k][d]` is exactly replica d's value k, on d.

        For steps that hand out their inputs (baselines, pack + unpack).
        """
        for d, variable in enumerate(self.variables):
            views = self.layout.views(np.asarray(variable.value()))
            for k, want in enumerate(views):
                device = canonical(devices[k][d])
                if device != self.devices[d]:
                    return f"input {k} of replica {d} is on {device}"
                problem = mismatch(np.asarray(results[k][d]), want)
                if problem:
                    return f"input {k} of replica {d}: {problem}"
        return None


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None if equal, else how `got` differs from numpy's `want`.

    >>> mismatch(np.array([1.0, 2.0]), np.array([1.0, 3.0]))
    "1 of 2 elements differ from numpy's sum (largest difference 1)"
    """
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if np.array_equal(got, want):
        return None
    wrong = int(np.sum(got != want))
    worst = float(np.max(np.abs(got.astype(np.float64) - want)))
    return (
        f"{wrong} of {want.size} elements differ from numpy's sum (largest "
        f"difference {worst:g})"
    )


class StepPair:
    """Two traces of one step body: one returns the results, one sinks them.

    `body` returns `results[k][d]`, value k's sum on replica d. `verify`
    runs the first trace once and hands its results (eager tensors) and
    where the step placed each one (eager outputs of a multi-device function
    do not say where they were computed) to a check; then it lets go of
    that trace. `timed()` runs the same body and sinks the results on their
    devices.

    Tracing twice costs time, but each trace is then an ordinary
    `tf.function`, exactly what a user's training step would build; calling
    the first trace from the second would add a function-call boundary (and
    its per-output cost) to the timed graph when Grappler does not inline
    it.
    """

    def __init__(self, body: Callable[[], Results]):
        self.devices: list[list[str]] = []

        @tf.function(autograph=False)
        def results() -> Results:
            out = body()
            self.devices = [[t.device for t in per] for per in out]
            return out

        @tf.function(autograph=False)
        def timed() -> tf.Tensor:
            return sink([t for per_device in body() for t in per_device])

        self._results: Callable[[], Results] | None = results
        self.timed = timed

    def verify(
        self, check: Callable[[Results, list[list[str]]], str | None]
    ) -> str | None:
        """Runs the results trace once and returns `check(results, devices)`.

        The trace is dropped afterwards: a process that prepares dozens of
        candidates would otherwise keep every one of them instantiated.
        """
        if self._results is None:
            raise RuntimeError("verify: this step was verified already")
        try:
            return check(self._results(), self.devices)
        finally:
            self._results = None


@dataclasses.dataclass
class Prepared:
    """The outcome of preparing one entry for the timing rounds.

    Attributes:
        verified: matched numpy (None: nothing to verify, a baseline).
        error: why it cannot be timed, if it cannot.
        seconds_per_call: one call after warm-up (to choose reps).
        build_seconds: tracing, first runs and verification.
    """

    verified: bool | None
    error: str | None
    seconds_per_call: float
    build_seconds: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def prepare(
    build: Callable[[], tuple[Callable[[], Any], Callable[[], str | None]]],
    warmup: int,
    verifies: bool = True,
) -> tuple[Prepared, Callable[[], Any] | None]:
    """Builds an entry, checks it, warms it up and times one call.

    Args:
        build: returns (the timed call, a check that returns None when the
            results match numpy, else what is wrong).
        warmup: untimed calls after the check.
        verifies: False for baselines (their check only guards the inputs).

    Returns:
        (what happened, the timed call or None if it failed).

    >>> prepared, call = prepare(
    ...     lambda: (lambda: None, lambda: "sum is 3, not 4"), warmup=1)
    >>> prepared.verified, prepared.error, call
    (False, 'wrong result: sum is 3, not 4', None)
    """
    start = time.perf_counter()
    try:
        call, check = build()
        problem = check()
        if problem is not None:
            return (
                Prepared(
                    False if verifies else None,
                    f"wrong result: {problem}",
                    0.0,
                    time.perf_counter() - start,
                ),
                None,
            )
        for _ in range(warmup):
            call()
        seconds = min(timing.time_calls(call, 1) for _ in range(2))
    except Exception as e:  # noqa: BLE001 - the table shows it failed.
        return (
            Prepared(
                False if verifies else None,
                f"{type(e).__name__}: {timing.first_line(str(e))}",
                0.0,
                time.perf_counter() - start,
            ),
            None,
        )
    return (
        Prepared(
            True if verifies else None,
            None,
            seconds,
            time.perf_counter() - start,
        ),
        call,
    )
