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


_CANDIDATE_RESULT_FIELDS = frozenset(
    f.name for f in dataclasses.fields(CandidateResult)
)


def candidate_result_from_json(data: dict[str, Any]) -> CandidateResult:
    """A cached record; fields added since it was written take their
    defaults, fields unknown here are dropped."""
    known = {k: v for k, v in data.items() if k in _CANDIDATE_RESULT_FIELDS}
    known["config"] = from_json(known["config"])
    return CandidateResult(**known)
