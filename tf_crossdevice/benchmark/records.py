"""Turns an entry's timing samples into a group's figures (JSON-ready).

A group is one workload on one set of replicas (n logical devices of one
process, or p worker processes). Its entries are candidates ("ours", "tf"),
rooflines and baselines, each with per-round samples. A result's time is its
median minus its baseline's median: the all-reduce's own cost, as nccl-tests
would time it, without the cost of producing its inputs.

>>> from tf_crossdevice.benchmark import workloads
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

from tf_crossdevice.benchmark import timing
from tf_crossdevice.benchmark import workloads as workloads_lib


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
