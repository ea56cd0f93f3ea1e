"""Timing calls: an entry's build, check and warm-up, then interleaved rounds.

`prepare` builds an entry, checks it and times one call (`Prepared`);
`interleaved_rounds` times every entry once per round in a fresh random
order, so that a noisy neighbour slows all of them alike; `Timing` is one
entry's record. An entry is any call and its check; TensorFlow steps and
their inputs are `_steps` and `_measure_inputs`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from tf_crossdevice._core import checks as _checks

TimeFn: TypeAlias = Callable[[int], float]  # seconds per call of n calls


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
