"""autotune: time candidate CrossDeviceOps on the real devices, keep the best.

`autotune` reads the topology and gradients (`_topology`), lists the
candidates and orders them by the cost model's prediction (`_candidates`),
builds and checks each against numpy within the time budget, times the
survivors in interleaved rounds (`measure`), times the near-best finalists
again, caches the winner (`_cache`) and returns it as a ready
CrossDeviceOps (`_configs.make_ops`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
import statistics
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, TypeVar

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import checks as _checks
from tf_crossdevice.tuning import _candidates
from tf_crossdevice.tuning import measure as _measure
from tf_crossdevice.tuning._cache import (
    CACHE_FORMAT,
    cache_file,
    cached_result,
    read_cache,
    write_cache,
)
from tf_crossdevice.tuning._configs import Config, label, make_ops
from tf_crossdevice.tuning._results import AutotuneResult, CandidateResult
from tf_crossdevice.tuning._topology import (
    GradientList,
    Topology,
    normalize_gradients,
    num_bytes,
    topology_of,
)

Key = TypeVar("Key", bound=Hashable)

_ROUNDS = 5
# Confirmation among the finalists: those within this of the best median.
_WITHIN = 0.15
_FINALISTS = 3
_CONFIRM_ROUNDS = (3, 2 * _ROUNDS)  # fewest worth running, most
_TARGET_SECONDS = 0.02  # one measurement repeats a step about this long
_MAX_REPS = 50
_SAFETY = 1.25  # on estimated build times and on planned rounds


def autotune(
    gradients: Any,
    devices: Any,
    *,
    budget_seconds: float = 60,
    cache_dir: Any = None,
) -> tf.distribute.CrossDeviceOps:
    """Measures candidate all-reduce configurations and returns the fastest.

    Candidates are a selection of the package's configurations
    (`tf_crossdevice.cost_model.candidates`): those one client builds in
    its own graph (`SpecAllReduce` with the registry's algorithms and
    shards, NCCL on GPUs, hierarchical copy, `ReductionToOneDevice`;
    across workers `MultiWorkerAllReduce` with flat and two-level specs),
    with each packing that changes the gradients (one or four packs,
    small-tensor aggregation of up to 64 KiB in groups of 1024, none). The
    cost model (`tf_crossdevice.cost_model.predict`; across workers with
    the serial cost of a pack that links of known rate measured, so that
    one pack of every gradient is not ranked first) keeps each algorithm's
    fastest-predicted configuration and the fastest others, 20 in all;
    across workers, for float gradients, the first four are also tried
    with each `compression` codec. They are tried fastest-predicted
    first; any the model cannot price follow in the list's order.

    Each candidate reduces random integer gradients of the given shapes on
    the real devices inside a `tf.function`; its result is checked against
    numpy (exactly; within the codec's rounding with compression) before it
    counts. Building and checking count against the budget: a candidate
    whose estimated build (scaled from the builds so far) and timing (the
    first rounds and 3 confirmation rounds, below) would not fit in what is
    left is skipped. Builds cannot be interrupted, so a
    slow one can overrun the estimate; at least one candidate is always
    built, even past the budget, until one verifies. The verified ones are
    then timed in interleaved rounds (every candidate once per round, in a
    new random order). The finalists (up to three within 15% of the best
    median, at least the best two) are timed again in up to 10 more
    interleaved rounds among themselves where the budget left allows at
    least 3 (else a log line says so), so that noise in the short first
    rounds does not decide between near-equal ones. The finalist with the
    smallest median over all its samples wins (without confirmation: the
    candidate with the smallest median).

    Progress is logged with absl logging at INFO, one line per candidate
    ("autotune [3/12] SpecAllReduce xring num_packs=1: 4.21 ms, 31 s of
    budget left") and one per confirmed finalist ("autotune: finalist
    SpecAllReduce psgpu num_packs=1: 2.83 ms, median of 5 + 10
    confirmation rounds"). The returned object's `autotune_result`
    attribute (an `AutotuneResult`) holds every measurement and the cache
    file.

    The choice is cached in a JSON file in `cache_dir` (None:
    `$XDG_CACHE_HOME`, else `~/.cache`, + `/tf_crossdevice/autotune`), named
    by a hash of the topology (device type, devices per worker, workers,
    TensorFlow and package versions), the gradients' shapes and dtypes and
    the list of candidates (a choice among other candidates is not reused).
    A later call with the same ones returns the cached choice without
    measuring (logged at INFO, with the file's path), unless that was
    measured with a smaller budget and left candidates out. Delete the file
    to measure again. Unreadable files are
    ignored with a warning; writes are atomic.

    Across workers only in-graph reductions can be timed from one client:
    between-graph collectives (`CollectiveAllReduce`,
    `HierarchicalCollectiveAllReduce` in
    `tf_crossdevice.MultiWorkerMirroredStrategy`) run in every worker's own
    program and are not measured here; the cost model ranks them
    (`select_cross_device_ops`).

    Args:
        gradients: what will be reduced: a Keras model (its trainable
            weights), or a list of (shape, dtype) pairs, tensors or
            variables.
        devices: the replicas' devices: device strings of this process, or
            of the workers of a cluster this process is connected to
            ('/job:worker/task:1/device:CPU:0'), or a cluster spec (dict or
            `tf.train.ClusterSpec`): then this process connects to the
            cluster (`tf.config.experimental_connect_to_cluster`, which
            changes process-wide state) and uses every worker's GPUs, else
            CPUs (the same count on each).
        budget_seconds: time for building, checking and timing, > 0.
        cache_dir: folder of the cache files (created if missing).

    Returns:
        A new CrossDeviceOps of the fastest configuration, with an
        `autotune_result` attribute.

    Raises:
        TypeError, ValueError: a bad argument (the message names it).
        RuntimeError: no candidate reduced correctly (the errors listed).

    >>> import tempfile
    >>> gradients = [((1000,), "float32"), ((10, 10), "float32")]
    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> with tempfile.TemporaryDirectory() as cache:
    ...     ops = tf_crossdevice.autotune(
    ...         gradients, devices, budget_seconds=3, cache_dir=cache)
    ...     again = tf_crossdevice.autotune(
    ...         gradients, devices, budget_seconds=3, cache_dir=cache)
    >>> ops.autotune_result.measurements[0].verified
    True
    >>> again.autotune_result.from_cache, type(again) is type(ops)
    (True, True)
    """
    start = time.monotonic()
    _checks.positive_number(budget_seconds, "budget_seconds")
    grads = normalize_gradients(gradients)
    topology = topology_of(devices)
    path = cache_file(topology, grads, cache_dir)
    entry = read_cache(path, topology)
    if entry is not None and (
        entry["complete"] or entry["budget_seconds"] >= budget_seconds
    ):
        result = cached_result(entry, path, time.monotonic() - start)
        return _with_result(make_ops(entry["config"], topology), result)
    result = _search(grads, topology, budget_seconds, start, path)
    write_cache(
        path,
        {
            "format": CACHE_FORMAT,
            "config": list(result.config),
            "label": result.label,
            "budget_seconds": budget_seconds,
            "complete": result.complete,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "devices": list(topology.devices),
            "measurements": [
                dataclasses.asdict(m) for m in result.measurements
            ],
        },
    )
    return _with_result(make_ops(result.config, topology), result)


def _with_result(
    ops: tf.distribute.CrossDeviceOps, result: AutotuneResult
) -> tf.distribute.CrossDeviceOps:
    ops.autotune_result = result  # type: ignore[attr-defined]
    return ops


@dataclasses.dataclass
class _Built:
    """The candidates built so far: a record of each one considered, and
    the timer and reps of each that verified, by its index in the plan."""

    records: list[CandidateResult] = dataclasses.field(default_factory=list)
    # (graph units, build seconds) of each verified build.
    builds: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    timers: dict[int, _measure.TimeFn] = dataclasses.field(default_factory=dict)
    reps: dict[int, int] = dataclasses.field(default_factory=dict)
    per_round: float = 0.0  # seconds one timing round will take

    def add(
        self,
        i: int,
        units: float,
        prepared: _measure.Prepared,
        call: Any,
    ) -> None:
        """Keeps candidate i's verified step (`units`, as `_graph_units`)
        for timing."""
        self.builds.append((units, prepared.build_seconds))
        self.timers[i] = _measure.timer(call)
        self.reps[i] = _measure.reps_for(
            prepared.seconds_per_call, _TARGET_SECONDS, _MAX_REPS
        )
        self.per_round += self.reps[i] * prepared.seconds_per_call


def _search(
    gradients: GradientList,
    topology: Topology,
    budget: float,
    start: float,
    path: pathlib.Path,
) -> AutotuneResult:
    """Builds, checks and times the candidates within the budget."""

    def seconds_left() -> float:  # negative once overrun
        return budget - (time.monotonic() - start)

    plan = _candidates.ordered(
        _candidates.timed_candidates(topology, gradients), topology, gradients
    )
    built = _build_candidates(plan, gradients, topology, seconds_left)
    if not built.timers:
        failures = "; ".join(f"{m.label}: {m.error}" for m in built.records)
        raise RuntimeError(f"autotune: no candidate verified: {failures}")
    rounds, samples, errors = _first_rounds(built, seconds_left())
    left = seconds_left()
    records, best = _confirm_best(built, rounds, samples, errors, left)
    chosen = records[best]
    elapsed = time.monotonic() - start
    measured = sum(1 for m in records if m.median_seconds is not None)
    logging.info(
        "autotune: chose %s (%.2f ms, median of %d rounds; %d of %d "
        "candidates timed) in %.0f s of a %g s budget",
        chosen.label,
        statistics.median(samples[best]) * 1e3,
        len(samples[best]),
        measured,
        len(plan),
        elapsed,
        budget,
    )
    return AutotuneResult(
        config=chosen.config,
        label=chosen.label,
        measurements=tuple(records),
        budget_seconds=budget,
        elapsed_seconds=elapsed,
        complete=all(m.verified is not None for m in records),
        from_cache=False,
        cache_file=str(path),
    )


def _build_candidates(
    plan: Sequence[tuple[Config, float | None]],
    gradients: GradientList,
    topology: Topology,
    seconds_left: Callable[[], float],
) -> _Built:
    """Builds and checks the candidates in the plan's order; skips each
    whose estimated build and timing would not fit in the budget left
    (`_skip_reason`), once one has verified."""
    inputs = _measure.Inputs(gradients, topology.devices)
    total = len(plan)
    built = _Built()
    for i, (config, predicted) in enumerate(plan):
        name = label(config)
        record = functools.partial(CandidateResult, name, config, predicted)
        left = seconds_left()
        units = _graph_units(config, gradients, topology)
        why = _skip_reason(units, built, left)
        if why is not None:
            logging.info("autotune [%d/%d] %s: %s", i + 1, total, name, why)
            built.records.append(record(error=why))
            continue
        try:
            ops = make_ops(config, topology)
        except (TypeError, ValueError) as e:
            built.records.append(record(False, f"{e}"))
            continue
        check = inputs.check_for(
            config[1].get("compression"), topology.num_workers
        )
        prepared, call = _prepare(_measure.all_reduce_body(ops, inputs), check)
        left = seconds_left()
        if call is None:
            logging.info(
                "autotune [%d/%d] %s: failed (%s), %.0f s of budget left",
                i + 1,
                total,
                name,
                prepared.error,
                max(left, 0),
            )
        else:
            built.add(i, units, prepared, call)
            logging.info(
                "autotune [%d/%d] %s: %.2f ms, %.0f s of budget left",
                i + 1,
                total,
                name,
                prepared.seconds_per_call * 1e3,
                max(left, 0),
            )
        built.records.append(
            record(prepared.verified, prepared.error, prepared.build_seconds)
        )
    return built


def _prepare(body: Any, check: _measure.Check) -> tuple[_measure.Prepared, Any]:
    """`measure.prepare` of a step of `body`, checked by `check`."""

    def build() -> Any:
        step = _measure.Step(body)
        return step.timed, lambda: step.verify(check)

    return _measure.prepare(build, warmup=1)


def _skip_reason(units: float, built: _Built, left: float) -> str | None:
    """Why a candidate of `units` (`_graph_units`) is not built with `left`
    seconds of budget (None: build it): once one has verified, its
    estimated build, the first rounds with it and the fewest confirmation
    rounds of the finalists (with the rounds' margin) must fit."""
    estimate = _build_estimate(units, built.builds)
    guess = max(_TARGET_SECONDS, built.per_round / max(len(built.timers), 1))
    timing = _SAFETY * (
        _ROUNDS * (built.per_round + guess)
        + _CONFIRM_ROUNDS[0] * _FINALISTS * guess
    )
    if built.timers and estimate + timing > left:
        return (
            f"skipped: estimated {estimate:.1f} s to build and "
            f"{timing:.1f} s to time, {max(left, 0):.0f} s of budget left"
        )
    return None


def _first_rounds(
    built: _Built, left: float
) -> tuple[int, dict[int, list[float]], dict[str, str]]:
    """Times the verified candidates in interleaved rounds, as many as fit
    in the `left` seconds of budget (at most `_ROUNDS`, at least one).

    Returns:
        (the rounds run, the samples of each candidate that has some, the
        errors of those that raised, by index as a string).
    """
    # A round costs more than its calls (ordering, the timer itself): plan
    # with the margin, or the rounds would end past the budget.
    per_round = _SAFETY * built.per_round
    rounds = confirmation_rounds(per_round, left, 1, _ROUNDS) or 1
    timed, errors = _measure.interleaved_rounds(
        {str(i): t for i, t in built.timers.items()},
        {str(i): r for i, r in built.reps.items()},
        rounds,
    )
    samples = {int(k): v for k, v in timed.items() if v}
    return rounds, samples, errors


def _confirm_best(
    built: _Built,
    rounds: int,
    samples: dict[int, list[float]],
    errors: dict[str, str],
    left: float,
) -> tuple[list[CandidateResult], int]:
    """Times the finalists again (`_confirm`) in the `left` seconds of
    budget and picks the fastest.

    Returns:
        (the records with their errors, medians and confirmation rounds;
        the best's index, among the confirmed finalists if any).
    """
    final, confirmed, failed = _confirm(samples, built.timers, built.reps, left)
    errors |= {str(i): e for i, e in failed.items()}
    records = list(built.records)
    for k, error in errors.items():
        records[int(k)] = dataclasses.replace(
            records[int(k)], verified=True, error=error
        )
    if len(final) >= 2 and not confirmed:
        logging.info(
            "autotune: no confirmation of the %d finalists (%.1f s of "
            "budget left, too little for %d rounds)",
            len(final),
            max(left, 0),
            _CONFIRM_ROUNDS[0],
        )
    if not samples:
        raise RuntimeError(f"autotune: every candidate failed: {errors}")
    records = [
        dataclasses.replace(
            m,
            median_seconds=(
                statistics.median(samples[i]) if i in samples else None
            ),
            confirmation_rounds=(
                confirmed if i in final and i in samples else 0
            ),
        )
        for i, m in enumerate(records)
    ]
    for i in final if confirmed else ():
        logging.info(
            "autotune: finalist %s: %s",
            records[i].label,
            f"{statistics.median(samples[i]) * 1e3:.2f} ms, median of "
            f"{rounds} + {confirmed} confirmation rounds"
            if i in samples
            else f"failed ({records[i].error})",
        )
    # Confirmed finalists were timed together, later: compare only them.
    contenders = [i for i in final if i in samples] if confirmed else []
    return records, fastest(
        {i: samples[i] for i in contenders} if contenders else samples
    )


# --- Measuring -------------------------------------------------------------


def _graph_units(
    config: Config, gradients: GradientList, topology: Topology
) -> float:
    """A rough count of the ops a configuration traces, to scale build
    times measured on earlier candidates (only ratios matter)."""
    kwargs = config[1]
    n = len(topology.devices)
    num_tensors = len(gradients)
    packs = num_tensors
    if kwargs.get("num_packs"):
        packs = kwargs["num_packs"] * len({d for _, d in gradients})
    elif kwargs.get("agg_small_grads_max_bytes"):
        limit = kwargs["agg_small_grads_max_bytes"]
        group = kwargs.get("agg_small_grads_max_group", 10)
        small = sum(1 for g in gradients if num_bytes(g) <= limit)
        packs = num_tensors - small + math.ceil(small / group)
    per_pack = 2.0
    spec = kwargs.get("all_reduce_spec", "")
    if isinstance(spec, (tuple, list)):
        alg, shards = str(spec[0]), int(spec[1]) if len(spec) > 1 else 1
    else:
        alg, _, count = str(spec).partition("#")
        shards = int(count) if count.isdigit() else 1
    for part in alg.split("/"):
        if part == "xring":
            per_pack += 2 * n * shards
        elif part == "rechd":
            per_pack += 2 * math.ceil(math.log2(max(n, 2))) + 2
        elif part in ("pscpu", "psgpu"):
            per_pack += 2 * shards
        elif part:
            per_pack += 4
    packing = num_tensors if packs != num_tensors else 0
    return n * (packs * per_pack + packing)


def _build_estimate(units: float, built: list[tuple[float, float]]) -> float:
    """Seconds to build `units`, scaled from earlier (units, seconds)."""
    scaled = [seconds * units / u for u, seconds in built if u > 0]
    return _SAFETY * statistics.median(scaled) if scaled else 0.0


def finalists(
    medians: Mapping[Key, float],
    within: float = _WITHIN,
    most: int = _FINALISTS,
) -> list[Key]:
    """The candidates to time again: fastest first, those whose median is
    within `within` (relative) of the best, at most `most`, and at least
    two where two or more were timed (the runner-up is always checked).

    >>> finalists({"ring": 1.3, "pscpu": 1.0, "psgpu": 1.1, "rechd": 1.12})
    ['pscpu', 'psgpu', 'rechd']
    >>> finalists({"ring": 3.0, "pscpu": 1.0}), finalists({"pscpu": 1.0})
    (['pscpu', 'ring'], ['pscpu'])
    """
    order = sorted(medians, key=lambda k: medians[k])
    if not order:
        return []
    limit = medians[order[0]] * (1 + within)
    close = [k for k in order if medians[k] <= limit]
    return order[: max(min(len(close), most), min(2, len(order)))]


def confirmation_rounds(
    seconds_per_round: float,
    seconds_left: float,
    least: int = _CONFIRM_ROUNDS[0],
    most: int = _CONFIRM_ROUNDS[1],
) -> int:
    """How many timing rounds fit in the budget left: at most `most`, 0
    where not even `least` fit (confirmation rounds by default; the first
    rounds use least=1, most=_ROUNDS).

    >>> confirmation_rounds(0.1, 2.0), confirmation_rounds(0.1, 0.55)
    (10, 5)
    >>> confirmation_rounds(0.1, 0.25), confirmation_rounds(0.1, -3.0)
    (0, 0)

    The first rounds with a 25% margin on 0.1 s per round, 0.5 s left:

    >>> confirmation_rounds(1.25 * 0.1, 0.5, 1, 5)
    4
    """
    if seconds_per_round <= 0:
        return most
    # 1e-9: 0.6 / 0.2 is 2.999..., three rounds fit.
    fit = math.floor(max(seconds_left, 0.0) / seconds_per_round + 1e-9)
    fit = min(most, fit)
    return fit if fit >= least else 0


def fastest(samples: Mapping[Key, Sequence[float]]) -> Key:
    """The entry with the smallest median of its samples (the first of
    equal ones).

    >>> fastest({"pscpu": [3.4, 2.7, 3.5, 3.3], "psgpu": [2.9, 2.8, 3.0]})
    'psgpu'
    """
    timed = [k for k, v in samples.items() if v]
    if not timed:
        raise ValueError("samples: expected an entry with samples, got none")
    return min(timed, key=lambda k: statistics.median(samples[k]))


def _confirm(
    samples: dict[Key, list[float]],
    timers: Mapping[Key, _measure.TimeFn],
    reps: Mapping[Key, int],
    seconds_left: float,
) -> tuple[list[Key], int, dict[Key, str]]:
    """Times the finalists of `samples` again in interleaved rounds, as
    many as fit in `seconds_left`, and adds the new samples to theirs.

    Returns:
        (the finalists, the rounds run (0: none fit), errors of finalists
        that raised; their samples are dropped from `samples`).
    """
    medians = {k: statistics.median(v) for k, v in samples.items() if v}
    chosen = finalists(medians)
    if len(chosen) < 2:
        return chosen, 0, {}
    # Rounds cost more than their calls (ordering, the timer itself) and
    # medians are noisy: plan with a margin so the search ends within the
    # budget.
    per_round = _SAFETY * sum(reps[k] * medians[k] for k in chosen)
    rounds = confirmation_rounds(per_round, seconds_left, *_CONFIRM_ROUNDS)
    if not rounds:
        return chosen, 0, {}
    names = {str(k): k for k in chosen}
    more, failed = _measure.interleaved_rounds(
        {n: timers[k] for n, k in names.items()},
        {n: reps[k] for n, k in names.items()},
        rounds,
        seed=1,
    )
    for name, values in more.items():
        samples[names[name]].extend(values)
    for name in failed:
        samples.pop(names[name])
    return chosen, rounds, {names[n]: e for n, e in failed.items()}
