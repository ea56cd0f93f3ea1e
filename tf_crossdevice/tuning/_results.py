"""What autotune measured: a `CandidateResult` per candidate (its cache files
keep them too) and the `AutotuneResult` the returned ops carry."""

from __future__ import annotations

import dataclasses
from typing import Any

from tf_crossdevice.tuning._configs import Config, from_json


@dataclasses.dataclass(frozen=True)
class CandidateResult:
    """One candidate as autotune saw it.

    Attributes:
        label: e.g. "SpecAllReduce pscpu agg_small=64KiBx1024".
        config: (class name, kwargs).
        predicted_seconds: the cost model's prediction (None: none).
        verified: matched numpy (None: not built, see `error`).
        error: why it has no time (failed, or skipped for the budget).
        build_seconds: tracing, the first runs and the check.
        median_seconds: median over all its timed rounds (the first
            interleaved rounds and, for a finalist, the confirmation).
        confirmation_rounds: rounds it was timed again as a finalist
            (0: not a finalist, or no budget left to confirm).
    """

    label: str
    config: Config
    predicted_seconds: float | None = None
    verified: bool | None = None
    error: str | None = None
    build_seconds: float = 0.0
    median_seconds: float | None = None
    confirmation_rounds: int = 0

    def describe(self) -> str:
        """One line: what the candidate cost the search and what it gave.

        >>> CandidateResult("xring", ("SpecAllReduce", {}), 0.0012, True,
        ...                 build_seconds=2.5, median_seconds=0.001,
        ...                 confirmation_rounds=3).describe()
        'xring: built in 2.5 s, median 1.0 ms (+3 confirmation rounds), 1.2 ms predicted'
        >>> CandidateResult("rechd", ("SpecAllReduce", {}),
        ...                 error="skipped: no budget left").describe()
        'rechd: not built (skipped: no budget left)'
        """  # noqa: E501
        if self.verified is None:
            return f"{self.label}: not built ({self.error})"
        timed = (
            f"median {self.median_seconds * 1e3:.1f} ms"
            f" (+{self.confirmation_rounds} confirmation rounds)"
            if self.median_seconds is not None
            else f"no time ({self.error})"
        )
        predicted = (
            ""
            if self.predicted_seconds is None
            else f", {self.predicted_seconds * 1e3:.1f} ms predicted"
        )
        return (
            f"{self.label}: built in {self.build_seconds:.1f} s, "
            f"{timed}{predicted}"
        )


@dataclasses.dataclass(frozen=True)
class AutotuneResult:
    """What `autotune` measured; the returned ops' `autotune_result`.

    Attributes:
        config: the chosen (class name, kwargs).
        label: its label.
        measurements: every candidate, in the order considered.
        budget_seconds: the budget it was measured with.
        elapsed_seconds: how long this call took.
        complete: every candidate was measured.
        from_cache: read from `cache_file`, nothing measured.
        cache_file: where the result is cached.
    """

    config: Config
    label: str
    measurements: tuple[CandidateResult, ...]
    budget_seconds: float
    elapsed_seconds: float
    complete: bool
    from_cache: bool
    cache_file: str

    def search_log(self) -> tuple[str, ...]:
        """Where the search's time went: each candidate's `describe`, in
        the order considered, then the search's own clock.

        >>> skipped = CandidateResult("rechd", ("SpecAllReduce", {}),
        ...                           error="skipped: no budget left")
        >>> AutotuneResult(("SpecAllReduce", {}), "rechd", (skipped,), 30.0,
        ...                12.5, False, False, "").search_log()
        ('rechd: not built (skipped: no budget left)', 'its own clock: 12.5 s of a 30 s budget')
        """  # noqa: E501
        return (
            *(m.describe() for m in self.measurements),
            f"its own clock: {self.elapsed_seconds:.1f} s of a "
            f"{self.budget_seconds:g} s budget",
        )


_CANDIDATE_RESULT_FIELDS = frozenset(
    f.name for f in dataclasses.fields(CandidateResult)
)


def candidate_result_from_json(data: dict[str, Any]) -> CandidateResult:
    """A cached record; fields added since it was written take their
    defaults, fields unknown here are dropped."""
    known = {k: v for k, v in data.items() if k in _CANDIDATE_RESULT_FIELDS}
    known["config"] = from_json(known["config"])
    return CandidateResult(**known)
