"""The package's candidate list: every configuration anything compares.

`candidates` is the one list. The cost model prices all of it
(`cost_model.candidates`, `cost_model.recommend`); autotune times a
selection of it (`_candidates.timed_candidates`); the benchmark study
times another (`benchmarks/candidates.py`). A configuration is a
constructor call as plain data, `(class name, kwargs)` (`Config`), and a
spec is written one way: the algorithm's name for one shard, `(alg,
shards, -1)` for more, a list of `(alg, shards, limit)` for ranges.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, TypeAlias

Config: TypeAlias = tuple[str, Mapping[str, Any]]

# Small-tensor aggregation: tensors of up to 64 KiB concatenated in groups
# of up to 1024, so that many small gradients cost a few reductions rather
# than one each.
AGGREGATE = {
    "agg_small_grads_max_bytes": 64 << 10,
    "agg_small_grads_max_group": 1024,
}
# None, one pack per dtype, four, small-tensor aggregation.
PACKINGS: tuple[dict[str, int], ...] = (
    {},
    {"num_packs": 1},
    {"num_packs": 4},
    AGGREGATE,
)
SHARDS = (1, 2, 4, 8)
# Across workers the list also has pscpu with one shard per worker (where
# SHARDS lacks that count): the shuffle sums shard j on worker j mod
# shards, so only then does every worker send and receive the same bytes,
# 2(p-1)/p of the gradients, as a bandwidth-optimal all-reduce. With 2
# shards on 3 workers, workers 0 and 1 each send 1.5 times the gradients.
# The collectives' `options.bytes_per_pack` (0: the class's own packing).
BYTES_PER_PACK = (0, 4 << 20, 32 << 20)
# MultiWorkerAllReduce's default spec: pscpu within each worker, then pscpu
# across workers in two shards.
MULTI_WORKER_DEFAULT_SPEC = ("pscpu/pscpu", 2, -1)
# The classes that reduce inside the calling client's graph; the others
# (the collectives) run in every worker's own program.
IN_GRAPH = frozenset(
    {
        "ReductionToOneDevice",
        "HierarchicalCopyAllReduce",
        "AllReduceCrossDeviceOps",
        "SpecAllReduce",
        "MultiWorkerAllReduce",
    }
)


def spec(alg: str, shards: int = 1) -> Any:
    """A spec of one algorithm as the list writes it.

    >>> spec("xring"), spec("pscpu/pscpu", 2)
    ('xring', ('pscpu/pscpu', 2, -1))
    """
    return alg if shards == 1 else (alg, shards, -1)


def candidates(
    num_workers: int, devices_per_worker: int, device_type: str = "CPU"
) -> list[Config]:
    """Every configuration of the package for a cluster.

    One worker: `ReductionToOneDevice`; hierarchical copy
    (`HierarchicalCopyAllReduce` with 0, 1 or 4 packs, and
    `AllReduceCrossDeviceOps` for small-tensor aggregation, which that
    class does not take); `SpecAllReduce` with pscpu, psgpu, xring and
    rechd at 1 to 8 shards, and on GPUs NCCL, each with every packing.

    Several workers: `MultiWorkerAllReduce` with its default spec, xring,
    rechd and pscpu at 1 to 8 shards (and pscpu at one shard per worker),
    and where a worker has several
    devices the two-level specs (inner pscpu or xring, and NCCL on GPUs;
    outer xring, rechd or pscpu), spec ranges (a latency-bound algorithm
    for packs up to 64 KiB or 1 MiB, a bandwidth-bound one above), each
    with every packing; then the between-graph collectives with each of
    `BYTES_PER_PACK`.

    No compression: it changes the numbers, so the caller opts in.

    Args:
        num_workers: worker processes.
        devices_per_worker: replicas in each worker process.
        device_type: "GPU" adds NCCL; anything else does not.

    Returns:
        The configurations, in a fixed order: within a class, by spec,
        then by packing as `PACKINGS`.

    >>> grid = candidates(1, 4)
    >>> grid[0], ("SpecAllReduce", {"all_reduce_spec": "xring"}) in grid
    (('ReductionToOneDevice', {}), True)
    >>> any("nccl" in str(kwargs) for _, kwargs in grid)
    False
    >>> any("nccl" in str(kwargs) for _, kwargs in candidates(1, 4, "GPU"))
    True
    >>> def specs(n):
    ...     return [kw.get("all_reduce_spec") for _, kw in candidates(n, 1)]
    >>> spec("pscpu", 3) in specs(3), spec("pscpu", 3) in specs(2)
    (True, False)
    """
    gpu = device_type == "GPU"
    out: list[Config] = []
    if num_workers == 1:
        out.append(("ReductionToOneDevice", {}))
        for p in (0, 1, 4):
            out.append(("HierarchicalCopyAllReduce", {"num_packs": p}))
        out.append(
            (
                "AllReduceCrossDeviceOps",
                {"all_reduce_alg": "hierarchical_copy", "num_packs": 0}
                | AGGREGATE,
            )
        )
        specs: list[Any] = [spec("nccl")] if gpu else []
        specs += [
            spec(alg, shards)
            for alg in ("pscpu", "psgpu", "xring", "rechd")
            for shards in SHARDS
        ]
        for s, packing in itertools.product(specs, PACKINGS):
            out.append(("SpecAllReduce", {"all_reduce_spec": s, **packing}))
        return out
    algs = ["xring", "rechd", "pscpu"]
    if devices_per_worker > 1:
        inners = ["nccl", "pscpu", "xring"] if gpu else ["pscpu", "xring"]
        algs += [
            f"{inner}/{outer}"
            for inner in inners
            for outer in ("xring", "rechd", "pscpu")
        ]
    specs = [MULTI_WORKER_DEFAULT_SPEC]
    specs += [
        s
        for alg in algs
        for s in (spec(alg, shards) for shards in SHARDS)
        if s != MULTI_WORKER_DEFAULT_SPEC
    ]
    if num_workers not in SHARDS:
        specs.append(spec("pscpu", num_workers))
    # Latency-bound algorithm for small packs, bandwidth-bound for large.
    small = "pscpu/rechd" if devices_per_worker > 1 else "rechd"
    large = "pscpu/xring" if devices_per_worker > 1 else "xring"
    for limit in (64 << 10, 1 << 20):
        for shards in (1, 2, 4):
            specs.append([(small, 1, limit), (large, shards, -1)])
    for s, packing in itertools.product(specs, PACKINGS):
        out.append(("MultiWorkerAllReduce", {"all_reduce_spec": s, **packing}))
    for size in BYTES_PER_PACK:
        options = {"bytes_per_pack": size}
        out.append(("CollectiveAllReduce", {"options": options}))
        out.append(("HierarchicalCollectiveAllReduce", {"options": options}))
    return out
