"""Interleaved timing rounds and their statistics (pure Python).

Shared machines are noisy: a neighbour's burst slows whatever runs at that
moment. So every entry is timed once per round, in a fresh random order each
round, and each entry's figure is the median over rounds, with the quartiles
and extremes as its spread. Ratios between entries then compare measurements
taken side by side.

>>> calls = []
>>> entries = {"a": lambda reps: calls.append(("a", reps)) or 0.002,
...            "b": lambda reps: calls.append(("b", reps)) or 0.001}
>>> samples, errors = interleaved_rounds(entries, {"a": 1, "b": 3}, rounds=2)
>>> samples, errors
({'a': [0.002, 0.002], 'b': [0.001, 0.001]}, {})
>>> sorted(calls)
[('a', 1), ('a', 1), ('b', 3), ('b', 3)]
>>> summarize([3.0, 1.0, 2.0, 10.0, 2.5]).median
2.5
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

# An entry times `reps` back-to-back calls and returns seconds per call.
TimeFn = Callable[[int], float]


@dataclasses.dataclass(frozen=True)
class Summary:
    """Statistics of one entry's per-round times, in seconds per call.

    Attributes:
        median: the median over rounds.
        q25: first quartile.
        q75: third quartile.
        minimum: the fastest round.
        maximum: the slowest round.
        samples: every round's time, in round order.
    """

    median: float
    q25: float
    q75: float
    minimum: float
    maximum: float
    samples: tuple[float, ...]

    @property
    def iqr(self) -> float:
        return self.q75 - self.q25

    def as_dict(self) -> dict[str, object]:
        return {
            "median": self.median,
            "q25": self.q25,
            "q75": self.q75,
            "min": self.minimum,
            "max": self.maximum,
            "samples": list(self.samples),
        }


def summarize(samples: Sequence[float]) -> Summary:
    """Median, quartiles (inclusive method) and extremes of `samples`.

    Raises:
        ValueError: `samples` is empty.

    >>> s = summarize([4.0, 1.0, 3.0, 2.0])
    >>> s.median, s.q25, s.q75, s.minimum, s.maximum
    (2.5, 1.75, 3.25, 1.0, 4.0)
    """
    if not samples:
        raise ValueError("samples: expected at least one time, got none")
    values = sorted(samples)
    if len(values) == 1:
        q25 = q75 = values[0]
    else:
        q25, _, q75 = statistics.quantiles(values, n=4, method="inclusive")
    return Summary(
        median=statistics.median(values),
        q25=q25,
        q75=q75,
        minimum=values[0],
        maximum=values[-1],
        samples=tuple(samples),
    )


def time_calls(fn: Callable[[], object], reps: int) -> float:
    """Seconds per call of `reps` back-to-back calls of `fn`.

    >>> time_calls(lambda: None, 10) >= 0
    True
    """
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def reps_for(
    seconds_per_call: float, target_seconds: float, max_reps: int
) -> int:
    """Calls per measurement so that one measurement lasts `target_seconds`.

    >>> reps_for(0.001, 0.05, 100), reps_for(2.0, 0.05, 100)
    (50, 1)
    >>> reps_for(0.0, 0.05, 100)
    100
    """
    if seconds_per_call <= 0:
        return max_reps
    return max(1, min(max_reps, math.ceil(target_seconds / seconds_per_call)))


def interleaved_rounds(
    entries: Mapping[str, TimeFn],
    reps: Mapping[str, int],
    rounds: int,
    seed: int = 0,
    on_measurement: Callable[[str], object] | None = None,
) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Times every entry once per round, in a new random order each round.

    Args:
        entries: name -> function timing `reps` calls (seconds per call).
        reps: name -> calls per measurement.
        rounds: how many rounds, at least 1.
        seed: seeds the order of each round.
        on_measurement: called with the name after each measurement, or
            where an entry that failed is skipped (for a progress bar).

    Returns:
        `(samples, errors)`: each entry's per-round seconds per call, and
        for entries that raised, the error (they leave the rounds then; their
        samples so far are dropped).
    """
    if rounds < 1:
        raise ValueError(f"rounds: expected an int >= 1, got {rounds}")
    rng = random.Random(seed)
    samples: dict[str, list[float]] = {name: [] for name in entries}
    errors: dict[str, str] = {}
    order = list(entries)
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            if name not in errors:
                try:
                    samples[name].append(entries[name](reps[name]))
                except Exception as e:  # noqa: BLE001 - reported, not hidden.
                    errors[name] = f"{type(e).__name__}: {first_line(str(e))}"
                    samples.pop(name, None)
            if on_measurement is not None:
                on_measurement(name)
    return samples, errors


def first_line(text: str, limit: int = 300) -> str:
    r"""The gist of an error message in one line of at most `limit` chars.

    TensorFlow's messages start with a generic line ("Graph execution
    error:") and a traceback of where the node was defined; the cause comes
    after. Lines ending with ':' are joined with the next unindented one.

    >>> first_line("Graph execution error:\n\nDetected at node x defined "
    ...            "at:\n  File a.py\n\nShapes differ [[{{node x}}]]")
    'Graph execution error: Shapes differ [[{{node x}}]]'
    """
    lines = [
        line.strip()
        for line in text.strip().splitlines()
        if line.strip()
        and not line.startswith((" ", "\t"))
        and not line.startswith("Detected at node")
    ]
    gist = ""
    for line in lines:
        gist = f"{gist} {line}".strip()
        if not line.endswith(":"):
            break
    return gist if len(gist) <= limit else gist[: limit - 3] + "..."
