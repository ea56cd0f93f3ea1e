"""Turns an entry's timing samples into a group's figures (JSON-ready).

A group is one workload on one set of replicas (n logical devices of one
process, or p worker processes). Its entries are candidates ("ours", "tf"),
rooflines and baselines, each with per-round samples. A result's time is its
median minus its baseline's median: the all-reduce's own cost, as nccl-tests
would time it, without the cost of producing its inputs.

>>> from benchmarks import workloads
>>> entries = [
...     {"name": "base", "family": "baseline", "baseline": None,
...      "samples": [1.0, 1.0, 1.0], "verified": None, "error": None},
...     {"name": "roof", "family": "roofline", "baseline": None,
...      "samples": [1.0, 1.0, 1.0], "verified": True, "error": None},
...     {"name": "tf", "family": "tf", "baseline": "base",
...      "samples": [5.0, 5.0, 5.0], "verified": True, "error": None},
...     {"name": "ours", "family": "ours", "baseline": "base",
...      "samples": [3.0, 3.0, 3.0], "verified": True, "error": None}]
>>> group = make_group_record(
...     setting="single_process", workload=workloads.single_tensor(8),
...     num_replicas=2, entries=entries, rounds=3)
>>> [(r["name"], r["time_seconds"], r["ratio_to_tf_best"],
...   r["roofline_fraction"]) for r in group["results"]]
[('roof', 1.0, 4.0, 1.0), ('tf', 4.0, 1.0, 0.25), ('ours', 2.0, 2.0, 0.5)]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import timing
from benchmarks import workloads as workloads_lib


def make_group_record(
    *,
    setting: str,
    workload: workloads_lib.Workload,
    num_replicas: int,
    entries: Sequence[dict[str, Any]],
    rounds: int,
    roofline_time: Callable[[float], float] | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The group's JSON record from its entries' samples.

    Each result's `time_seconds` is its median minus its baseline's median
    (None when that is not above zero: the step is within noise of the
    baseline). algbw = bytes / time; busbw = algbw * 2 (n - 1) / n. The
    roofline is the fastest verified roofline entry; `roofline_fraction` is
    roofline time / time and `ratio_to_tf_best` is TF's best time / time.

    Args:
        setting: "single_process" or "multi_worker".
        workload: what each replica held.
        num_replicas: n (devices) or p (workers).
        entries: dicts with name, family, baseline (a name or None),
            samples (seconds per call, one per round), verified, error, and
            anything else to keep (copied into the record).
        rounds: the rounds that were run.
        roofline_time: turns a roofline entry's net seconds into the
            roofline time for the workload (default: the same seconds).
        extra: more fields for the group record.
    """
    medians = {
        e["name"]: timing.summarize(e["samples"]).median
        for e in entries
        if e["samples"] and e["error"] is None
    }
    size = workload.num_bytes
    bus_factor = 2 * (num_replicas - 1) / num_replicas
    results = []
    baselines = {}
    for e in entries:
        record = dict(e)
        samples = record.pop("samples")
        summary = timing.summarize(samples) if samples else None
        record["step_seconds"] = summary.as_dict() if summary else None
        if e["family"] == "baseline":
            baselines[e["name"]] = record
            continue
        net = None
        if summary is not None and e["error"] is None:
            base = medians.get(e["baseline"], 0.0) if e["baseline"] else 0.0
            if e["baseline"] and e["baseline"] not in medians:
                record["error"] = f"baseline {e['baseline']!r} has no time"
            elif summary.median - base > 0:
                net = summary.median - base
                record["net_q25_seconds"] = max(summary.q25 - base, 0.0)
                record["net_q75_seconds"] = summary.q75 - base
        if net is not None and e["family"] == "roofline" and roofline_time:
            record["measured_seconds"] = net
            net = roofline_time(net)
        record["time_seconds"] = net
        results.append(record)

    def best(family: str) -> dict[str, Any] | None:
        timed = [
            r
            for r in results
            if r["family"] == family
            and r["verified"]
            and r["time_seconds"] is not None
        ]
        return min(timed, key=lambda r: r["time_seconds"]) if timed else None

    roof, tf_best, ours_best = best("roofline"), best("tf"), best("ours")
    for r in results:
        t = r["time_seconds"]
        r["algbw_GBps"] = size / t / 1e9 if t else None
        r["busbw_GBps"] = r["algbw_GBps"] * bus_factor if t else None
        r["roofline_fraction"] = (
            roof["time_seconds"] / t if t and roof else None
        )
        r["ratio_to_tf_best"] = (
            tf_best["time_seconds"] / t if t and tf_best else None
        )
    return {
        "setting": setting,
        "workload": workload.name,
        "description": workload.description,
        "num_replicas": num_replicas,
        "num_tensors": workload.num_tensors,
        "size_bytes": size,
        "count": workload.num_elements,
        "dtype": workload.dtype,
        "rounds": rounds,
        "error": None,
        "skipped": None,
        "roofline": roof["name"] if roof else None,
        "roofline_seconds": roof["time_seconds"] if roof else None,
        "tf_best": tf_best["name"] if tf_best else None,
        "tf_best_seconds": tf_best["time_seconds"] if tf_best else None,
        "ours_best": ours_best["name"] if ours_best else None,
        "ours_best_seconds": ours_best["time_seconds"] if ours_best else None,
        "baselines": baselines,
        "results": results,
        **(extra or {}),
    }


def attach_samples(
    entries: Sequence[dict[str, Any]],
    samples: dict[str, list[float]],
    errors: dict[str, str],
) -> None:
    """Stores each entry's timed samples, and the error that stopped it.

    >>> entries = [{"name": "a", "error": None}, {"name": "b", "error": None}]
    >>> attach_samples(entries, {"a": [1.0]}, {"b": "boom"})
    >>> entries
    [{'name': 'a', 'error': None, 'samples': [1.0]}, {'name': 'b', 'error': 'while timing: boom', 'samples': []}]
    """  # noqa: E501
    for entry in entries:
        entry["samples"] = samples.get(entry["name"], [])
        if entry["name"] in errors:
            entry["error"] = f"while timing: {errors[entry['name']]}"


def finalists(record: dict[str, Any], also: Sequence[str] = ()) -> list[str]:
    """The entries a confirmation re-times, with the baselines they need.

    The best of each family (ours, TF's, roofline, bound) is the minimum
    over noisy medians, and the family with more candidates gets the
    luckier minimum. Timing the chosen few again, side by side, gives
    figures free of that selection bias. `also` adds entries the targets
    compare against (e.g. "TF ReductionToOneDevice").

    >>> record = {"ours_best": "a", "tf_best": "b", "roofline": None,
    ...           "results": [
    ...     {"name": "a", "family": "ours", "baseline": "base"},
    ...     {"name": "b", "family": "tf", "baseline": "base"},
    ...     {"name": "c", "family": "tf", "baseline": "base"}]}
    >>> finalists(record, also=["c", "missing"])
    ['a', 'b', 'c', 'base']
    """
    by_name = {r["name"]: r for r in record["results"]}
    bound = [
        r["name"]
        for r in record["results"]
        if r["family"] == "bound" and r.get("time_seconds") is not None
    ]
    chosen = [record["ours_best"], record["tf_best"], record["roofline"]]
    names = [n for n in [*chosen, *bound, *also] if n in by_name]
    names = list(dict.fromkeys(names))
    baselines = [
        by_name[n]["baseline"] for n in names if by_name[n]["baseline"]
    ]
    return names + list(dict.fromkeys(baselines))


def add_confirmation(
    record: dict[str, Any],
    samples: dict[str, list[float]],
    errors: dict[str, str],
    roofline_time: Callable[[float], float] | None = None,
) -> None:
    """Stores the finalists' re-timed figures as `record["confirmed"]`.

    Times are net of their baselines from the same confirmation rounds.
    `confirmed["times"]` maps each finalist to its net seconds (None:
    within noise, or it failed this time); the ratios use those times.

    >>> record = {"ours_best": "a", "tf_best": "b", "roofline": "r",
    ...           "results": [
    ...     {"name": "a", "family": "ours", "baseline": "base"},
    ...     {"name": "b", "family": "tf", "baseline": "base"},
    ...     {"name": "r", "family": "roofline", "baseline": None}]}
    >>> add_confirmation(record, {"a": [3.0], "b": [5.0], "r": [1.0],
    ...                           "base": [1.0]}, {})
    >>> c = record["confirmed"]
    >>> c["times"], c["ratio_to_tf_best"], c["roofline_fraction"]
    ({'a': 2.0, 'b': 4.0, 'r': 1.0}, 2.0, 0.5)
    """
    medians = {
        name: timing.summarize(values).median
        for name, values in samples.items()
        if values and name not in errors
    }
    times: dict[str, float | None] = {}
    for r in record["results"]:
        name = r["name"]
        if name not in samples:
            continue
        net = None
        base = r["baseline"]
        if name in medians and (base is None or base in medians):
            net = medians[name] - (medians[base] if base else 0.0)
            if net <= 0:
                net = None
        if net is not None and r["family"] == "roofline" and roofline_time:
            net = roofline_time(net)
        times[name] = net
    ours = times.get(record["ours_best"])
    tf_best = times.get(record["tf_best"])
    roof = times.get(record["roofline"])
    record["confirmed"] = {
        "rounds": max((len(v) for v in samples.values()), default=0),
        "times": times,
        "samples": samples,
        "errors": errors,
        "ratio_to_tf_best": tf_best / ours if tf_best and ours else None,
        "roofline_fraction": roof / ours if roof and ours else None,
    }


def confirmed_time(group: dict[str, Any], name: str | None) -> float | None:
    """`name`'s net time from the confirmation rounds, else from the rounds.

    >>> confirmed_time({"confirmed": {"times": {"a": 2.0}}, "results": []},
    ...                "a")
    2.0
    """
    confirmed = group.get("confirmed") or {}
    if name in confirmed.get("times", {}):
        return confirmed["times"][name]
    result = next((r for r in group["results"] if r["name"] == name), None)
    if result is None or not result["verified"] or result["error"]:
        return None
    return result["time_seconds"]
