"""autotune's budget, on a fake clock: which candidates are built, which are
skipped, and that the search ends within the budget.

autotune runs for real except for what costs time: `time.monotonic()` (a
virtual clock that moves only when a fake below moves it), building a
candidate (`measure.prepare`: a fixed cost, a fixed seconds per call) and
timing it (`measure.timer`: reps times its seconds per call). The rest is
the real search (`_autotune._search`: its skip rule, its build estimates,
the first rounds through `measure.interleaved_rounds`, the confirmation,
the choice), so the numbers below can be worked out by hand.
"""

from __future__ import annotations

import time

import pytest

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice.tuning import _autotune, _candidates, _topology, measure

GRADIENTS = [((3, 4), "float32"), ((50,), "float32")]
# Eight candidates alike to `_graph_units` (so each build estimate is 1.25
# times the median of the builds so far), tried in this order.
CONFIGS = [("FakeAllReduce", {"all_reduce_spec": f"fake{i}"}) for i in range(8)]


class FakeClock:
    """`time` for autotune: `monotonic()` is virtual time, moved only by
    `advance`; everything else is the real `time` module."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name):
        return getattr(time, name)


class FakeOps:
    """What `make_ops` returns here: the config, nothing to run."""

    def __init__(self, config):
        self.config = config


class FakeSearch:
    """Patches autotune so that building candidate i costs `build[i]`
    virtual seconds (and fails if `fails[i]`), and one call of it takes
    `per_call[i]` seconds, at every timing."""

    def __init__(self, monkeypatch, build, per_call, fails=()):
        self.clock = FakeClock()
        self.build, self.per_call, self.fails = build, per_call, set(fails)
        self.built: list[int] = []  # candidates prepared, in order
        self.timed: dict[int, list[int]] = {}  # candidate -> reps of each
        self._current = None
        monkeypatch.setattr(_autotune, "time", self.clock)
        monkeypatch.setattr(
            _candidates, "timed_candidates", lambda t, g: list(CONFIGS)
        )
        monkeypatch.setattr(
            _candidates, "ordered", lambda cs, t, g: [(c, None) for c in cs]
        )
        monkeypatch.setattr(_autotune, "make_ops", lambda c, t: FakeOps(c))
        monkeypatch.setattr(measure, "all_reduce_body", self._body)
        monkeypatch.setattr(measure, "prepare", self._prepare)
        monkeypatch.setattr(measure, "timer", self._timer)

    def _body(self, ops, inputs):
        # Called for each candidate just before its prepare.
        self._current = CONFIGS.index(ops.config)
        return lambda: None

    def _prepare(self, build, warmup=2, verifies=True):
        i = self._current
        self.built.append(i)
        self.clock.advance(self.build[i])
        if i in self.fails:
            error = "wrong result: fake"
            return measure.Prepared(False, error, 0.0, self.build[i]), None
        prepared = measure.Prepared(True, None, self.per_call[i], self.build[i])
        return prepared, i

    def _timer(self, i):
        def time_reps(reps):
            self.timed.setdefault(i, []).append(reps)
            self.clock.advance(reps * self.per_call[i])
            return self.per_call[i]

        return time_reps

    def autotune(self, budget, cache_dir):
        ops = tf_crossdevice.autotune(
            GRADIENTS,
            testing.cpu_devices(2),
            budget_seconds=budget,
            cache_dir=cache_dir,
        )
        assert isinstance(ops, FakeOps)
        assert ops.config == ops.autotune_result.config
        return ops.autotune_result


def test_the_candidates_cost_alike_to_the_build_estimate():
    """The hand arithmetic below relies on it."""
    topology = _topology.Topology.of(testing.cpu_devices(2))
    grads = _topology.normalize_gradients(GRADIENTS)
    units = {_autotune._graph_units(c, grads, topology) for c in CONFIGS}
    assert len(units) == 1
    assert _autotune._SAFETY == 1.25
    assert (_autotune._ROUNDS, _autotune._FINALISTS) == (5, 3)
    assert _autotune._CONFIRM_ROUNDS == (3, 10)
    assert measure.reps_for(0.08, _autotune._TARGET_SECONDS, 50) == 1


def test_candidates_that_do_not_fit_are_skipped_and_the_search_ends_in_time(
    tmp_path, monkeypatch
):
    """Budget 10 s; every build 2 s; one call (1 rep each, all >= 20 ms)
    0.10, 0.08, 0.09 s for the first three, faster for the rest.

    Before candidate i the search skips it if estimate + timing > left,
    estimate = 1.25 * 2 = 2.5 s, guess = per_round / built, timing =
    1.25 * (5 * (per_round + guess) + 3 * 3 * guess):

        i  left  per_round  guess  timing                      sum
        0   10   (none built yet: always built)
        1    8   0.10       0.10   1.25 * (1.00 + 0.90) = 2.375  4.875 built
        2    6   0.18       0.09   1.25 * (1.35 + 0.81) = 2.7    5.2   built
        3    4   0.27       0.09   1.25 * (1.80 + 0.81) = 3.2625 5.7625 skip
        4-7  4   the same                                        skip

    Candidate 3 is skipped for its timing: its build alone (2.5) fits in 4.

    First rounds: 4 s left, 1.25 * 0.27 = 0.3375 s planned a round, 11 fit,
    at most 5: 5 * 0.27 = 1.35 s, clock at 7.35. Finalists: within 15% of
    0.08 (0.092): 1 and 2; a round of them 1.25 * 0.17 = 0.2125 s planned,
    12 fit in 2.65 s, at most 10: 10 * 0.17 = 1.7 s. Elapsed 9.05 s.
    Chosen: candidate 1 (0.08 s); the faster ones after it were never built.
    """
    per_call = [0.10, 0.08, 0.09, 0.01, 0.02, 0.03, 0.04, 0.05]
    search = FakeSearch(monkeypatch, build=[2.0] * 8, per_call=per_call)
    result = search.autotune(10, tmp_path)

    assert search.built == [0, 1, 2]
    records = result.measurements
    assert [m.verified for m in records] == [True] * 3 + [None] * 5
    for m in records[3:]:
        assert m.error == (
            "skipped: estimated 2.5 s to build and 3.3 s to time, "
            "4 s of budget left"
        )
        assert m.median_seconds is None and m.build_seconds == 0.0
    assert [m.build_seconds for m in records[:3]] == [2.0] * 3
    assert [m.median_seconds for m in records[:3]] == pytest.approx(
        per_call[:3]
    )
    assert search.timed == {0: [1] * 5, 1: [1] * 15, 2: [1] * 15}
    assert [m.confirmation_rounds for m in records] == [0, 10, 10] + [0] * 5
    assert result.config == CONFIGS[1]
    assert result.label == "FakeAllReduce fake1"
    assert not result.complete and not result.from_cache
    assert result.elapsed_seconds == pytest.approx(9.05)
    assert result.elapsed_seconds <= result.budget_seconds == 10


def test_a_first_candidate_costing_more_than_the_budget_is_still_built(
    tmp_path, monkeypatch
):
    """Budget 10 s, the first build 12 s: it is built (the search always
    builds one), everything after it is skipped (estimate 1.25 * 12 = 15 s,
    timing 1.25 * (5 * 0.2 + 9 * 0.1) = 2.375 s, nothing left), and it
    gets one timing round although none fits. Elapsed 12 + 0.1 = 12.1 s:
    the documented overrun, one build's worth, not the whole list's."""
    search = FakeSearch(
        monkeypatch, build=[12.0] + [2.0] * 7, per_call=[0.10] + [0.01] * 7
    )
    result = search.autotune(10, tmp_path)

    assert search.built == [0]
    assert search.timed == {0: [1]}
    first, *rest = result.measurements
    assert first.verified and first.build_seconds == 12.0
    assert first.median_seconds == pytest.approx(0.10)
    assert first.confirmation_rounds == 0
    for m in rest:
        assert m.verified is None
        assert m.error == (
            "skipped: estimated 15.0 s to build and 2.4 s to time, "
            "0 s of budget left"
        )
    assert result.config == CONFIGS[0] and not result.complete
    assert result.elapsed_seconds == pytest.approx(12.1)


def test_candidates_are_built_past_the_budget_until_one_verifies(
    tmp_path, monkeypatch
):
    """Budget 10 s; the first build fails after 12 s. Nothing verified yet,
    so the second is built too (2 s, clock at 14); a failed build teaches
    no estimate: the third's is 1.25 * 2 = 2.5 s, with 1.25 * (5 * 0.16 +
    9 * 0.08) = 1.9 s of timing, and -4 s left: skipped, as are the rest.
    One round of the second (0.08 s): elapsed 14.08 s."""
    search = FakeSearch(
        monkeypatch,
        build=[12.0] + [2.0] * 7,
        per_call=[0.10, 0.08] + [0.01] * 6,
        fails={0},
    )
    result = search.autotune(10, tmp_path)

    assert search.built == [0, 1]
    assert search.timed == {1: [1]}
    failed, chosen, *rest = result.measurements
    assert failed.verified is False and failed.build_seconds == 12.0
    assert failed.error == "wrong result: fake"
    assert failed.median_seconds is None
    assert chosen.verified and chosen.median_seconds == pytest.approx(0.08)
    for m in rest:
        assert m.verified is None
        assert m.error == (
            "skipped: estimated 2.5 s to build and 1.9 s to time, "
            "0 s of budget left"
        )
    assert result.config == CONFIGS[1]
    assert result.elapsed_seconds == pytest.approx(14.08)
