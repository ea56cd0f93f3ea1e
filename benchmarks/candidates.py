"""What the benchmark compares: our CrossDeviceOps and TensorFlow's.

A `Candidate` is plain data (it crosses process boundaries as JSON); `build`
turns it into a step body in the process that runs it. Families: "ours"
and "tf" (ReductionToOneDevice, HierarchicalCopy with 1 and 4 packs,
MirroredStrategy's default; across workers MultiWorkerMirroredStrategy's
collective all-reduce).

Ours are a selection of the package's list, `tf_crossdevice.cost_model
.candidates` (which the cost model prices and autotune selects from too):
every algorithm at one shard with every packing that changes the
computation for the workload, and MultiWorkerAllReduce's default spec;
across workers, each again with every compression codec.

>>> from benchmarks import workloads
>>> group = single_process_candidates(workloads.many_small(8))
>>> [c.name for c in select(group, "SpecAllReduce (pscpu|xring)$")][-2:]
['ours SpecAllReduce pscpu', 'ours SpecAllReduce xring']
>>> check_patterns(group, "xring$,xrign$")
Traceback (most recent call last):
...
ValueError: --candidates: 'xrign$' matches none of our candidates here
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

import tf_crossdevice
from benchmarks import workloads as workloads_lib
from tf_crossdevice.compression import PowerSGD
from tf_crossdevice.tuning import cost_model

PACKS_1 = {"num_packs": 1}
PACKS_4 = {"num_packs": 4}
MWMS_BYTES_PER_PACK = (4 << 20, 32 << 20)
# Wire compression of ours across workers (MultiWorkerAllReduce's
# compression=); every multi-worker setting also runs with each.
COMPRESSIONS = cost_model.COMPRESSIONS
# PowerSGD (`tf_crossdevice.compression.PowerSGD`, compressing from the
# first step) at this rank runs with MultiWorkerAllReduce's default spec and
# with our flat collective: its P and Q are a few MiB, so the algorithm that
# carries them matters little, and it is not in the package's list (it
# changes the training, so autotune never picks it).
POWERSGD = "powersgd"
POWERSGD_RANK = 4
_POWERSGD = {"compression": POWERSGD, "powersgd_rank": POWERSGD_RANK}
# Our collectives, each inside tf_crossdevice.MultiWorkerMirroredStrategy.
STRATEGY_OPS = ("CollectiveAllReduce", "HierarchicalCollectiveAllReduce")

# --- what the benchmark takes from the package's list --------------------
#
# Taken from `cost_model.candidates`: in one process ReductionToOneDevice,
# hierarchical copy (HierarchicalCopyAllReduce, and AllReduceCrossDeviceOps
# for small-tensor aggregation, which that class does not take) and
# SpecAllReduce; across workers (one device each) MultiWorkerAllReduce, and
# the collectives for `strategy_candidates`. Left out of it, and why:
# - shard counts above 1 ((alg, n, -1) specs), except MultiWorkerAllReduce's
#   default spec (MULTI_WORKER_DEFAULT_SPEC, the class's own, so that a
#   choice of it gets a name here) and, above 2 workers, pscpu with one
#   shard per worker and the class's own packing (the one spec whose
#   shuffle sends every worker the same bytes): timing 2, 4 and 8 would
#   multiply a group's run by four.
# - spec ranges (a list of (alg, shards, max_bytes)): a range runs, per
#   pack, one of the algorithms timed alone here.
# - collectives with 32 MiB packs: each between-graph candidate starts its
#   own worker processes, so the benchmark keeps the class's own choice
#   and 4 MiB.
STRATEGY_LEFT_OUT_BYTES_PER_PACK = frozenset({32 << 20})
MULTI_WORKER_DEFAULT_SPEC = ("pscpu/pscpu", 2, -1)
# Every multi-worker setting runs again with each of COMPRESSIONS (the list
# leaves compression to the caller): the compression targets
# (`targets.COMPRESSION_TARGETS`) compare bf16 with the same setting.
# The order the tables list our algorithms in (MultiWorkerAllReduce's
# default spec first, then the list's own order in one process); an
# algorithm not listed goes last.
ALGORITHM_ORDER = (
    MULTI_WORKER_DEFAULT_SPEC,
    "pscpu",
    "psgpu",
    "xring",
    "rechd",
)
# --quick's few of ours: one or two per class.
QUICK = frozenset(
    {
        "ours ReductionToOneDevice",
        "ours HierarchicalCopy num_packs=0",
        "ours HierarchicalCopy agg_small=64KiBx1024",
        "ours SpecAllReduce pscpu agg_small=64KiBx1024",
        "ours SpecAllReduce xring num_packs=1",
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1)",
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) num_packs=1",
        "ours MultiWorkerAllReduce xring",
        "ours MultiWorkerAllReduce xring num_packs=1",
        "ours CollectiveAllReduce",
        "ours HierarchicalCollectiveAllReduce",
    }
)
# Our algorithms the single-process groups leave out, and why.
SKIPPED = {
    "ours NcclAllReduce, SpecAllReduce nccl (and nccl/*)": "NCCL has no CPU "
    "kernel; on CPU devices it sums on one device",
    "ours SpecAllReduce pscpu/pscpu (and other a/b specs)": "one process is "
    "one worker: only the inner stage runs, already measured alone",
}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to all-reduce, as data: a unique name (table, JSON, plot,
    --candidates), its family ("ours" or "tf"), the kind of constructor
    `build` uses and its (JSON-compatible) arguments."""

    name: str
    family: str
    kind: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


def _label(packing: dict[str, Any]) -> str:
    suffix = ""
    if "compression" in packing:
        packing = dict(packing)
        suffix = f" compression={packing.pop('compression')}"
    if "powersgd_rank" in packing:
        suffix += f" rank={packing.pop('powersgd_rank')}"
    if "num_packs" in packing:
        return f" num_packs={packing['num_packs']}{suffix}"
    if packing:
        return (
            f" agg_small={packing['agg_small_grads_max_bytes'] >> 10}KiB"
            f"x{packing['agg_small_grads_max_group']}{suffix}"
        )
    return suffix


def _applies(c: Candidate, workload: workloads_lib.Workload) -> bool:
    """Whether the candidate's packing changes what is reduced.

    num_packs=1 only concatenates (one tensor stays as it is); num_packs>1
    also splits; aggregation needs two tensors of at most its size.
    """
    if c.family == "ours" and c.kwargs.get("num_packs") == 1:
        return workload.num_tensors > 1
    limit = c.kwargs.get("agg_small_grads_max_bytes", 0)
    small = [s for s in workload.shapes if math.prod(s) * 4 <= limit]
    return not limit or len(small) >= 2


def _hierarchical_copy(packing: Mapping[str, Any]) -> Candidate:
    """Ours hierarchical copy: AllReduceCrossDeviceOps, which packs by
    default (hence num_packs=0 unless `packing` sets it)."""
    kwargs = {"num_packs": 0, "all_reduce_alg": "hierarchical_copy"}
    label = _label(dict(packing)).strip() or "num_packs=0"
    return Candidate(
        f"ours HierarchicalCopy {label}",
        "ours",
        "ours_all_reduce",
        kwargs | dict(packing),
    )


def _spec(name: str, spec: Any, packing: Mapping[str, Any]) -> Candidate:
    """Ours SpecAllReduce or MultiWorkerAllReduce with `spec`."""
    kind = "ours_spec" if name == "SpecAllReduce" else "ours_multi_worker"
    kwargs = {"all_reduce_spec": spec} | dict(packing)
    return Candidate(_spec_name(name, spec, packing), "ours", kind, kwargs)


def _spec_name(name: str, spec: Any, packing: Mapping[str, Any]) -> str:
    shown = spec if isinstance(spec, str) else repr(spec)
    return f"ours {name} {shown}{_label(dict(packing))}"


def _from_grid(
    config: cost_model.Config, num_workers: int = 1
) -> Candidate | None:
    """The benchmark's candidate for a configuration of
    `cost_model.candidates(num_workers, 1)`; None for what it leaves out
    (see above)."""
    name, kwargs = config
    if name == "ReductionToOneDevice" and not kwargs:
        return Candidate("ours ReductionToOneDevice", "ours", "ours_r1d")
    if name == "HierarchicalCopyAllReduce" or (
        name == "AllReduceCrossDeviceOps"
        and kwargs.get("all_reduce_alg") == "hierarchical_copy"
    ):
        packing = {
            k: v
            for k, v in kwargs.items()
            if k != "all_reduce_alg" and (k, v) != ("num_packs", 0)
        }
        return _hierarchical_copy(packing)
    spec = kwargs.get("all_reduce_spec")
    one_shard = isinstance(spec, str) and "#" not in spec
    per_worker = num_workers > 2 and kwargs == {
        "all_reduce_spec": ("pscpu", num_workers, -1)
    }
    if name in ("SpecAllReduce", "MultiWorkerAllReduce") and (
        one_shard or spec == MULTI_WORKER_DEFAULT_SPEC or per_worker
    ):
        packing = {k: v for k, v in kwargs.items() if k != "all_reduce_spec"}
        return _spec(name, spec, packing)
    return None


def _order(c: Candidate) -> tuple[int, int]:
    """Sort key: by class as `_KINDS`, then by ALGORITHM_ORDER."""
    alg = c.kwargs.get("all_reduce_spec")
    rank = len(ALGORITHM_ORDER)
    if alg in ALGORITHM_ORDER:
        rank = ALGORITHM_ORDER.index(alg)
    return _KINDS.index(c.kind), rank


_KINDS = ("ours_r1d", "ours_all_reduce", "ours_spec", "ours_multi_worker")


def _ours(num_workers: int) -> list[Candidate]:
    """Ours from the package's list (one device per worker across
    workers)."""
    grid = cost_model.candidates(num_workers=num_workers, devices_per_worker=1)
    kept = (_from_grid(config, num_workers) for config in grid)
    return [c for c in kept if c is not None]


_PACKING_KEYS = frozenset(
    {
        "num_packs",
        "agg_small_grads_max_bytes",
        "agg_small_grads_max_group",
        "compression",
        "powersgd_rank",
    }
)


def name_of(config: tuple[str, Mapping[str, Any]]) -> str | None:
    """The name here of our candidate built as `config`, a (class name,
    kwargs) pair as `tf_crossdevice.autotune` returns it; None where the
    benchmark names no such candidate (no all_reduce_spec, or arguments
    its candidates never set).

    >>> name_of(("MultiWorkerAllReduce", {
    ...     "all_reduce_spec": ["pscpu/pscpu", 2, -1], "num_packs": 0,
    ...     "agg_small_grads_max_bytes": 65536,
    ...     "agg_small_grads_max_group": 1024, "compression": "bf16"}))
    "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) agg_small=64KiBx1024 \
compression=bf16"
    >>> name_of(("CollectiveAllReduce", {"options": {}})) is None
    True
    """
    name, kwargs = config
    if "all_reduce_spec" not in kwargs:
        return None
    spec = kwargs["all_reduce_spec"]
    spec = tuple(spec) if isinstance(spec, list) else spec  # from JSON
    packing = {
        k: v
        for k, v in kwargs.items()
        if k != "all_reduce_spec" and (k, v) != ("num_packs", 0)
    }
    aggregates = "agg_small_grads_max_bytes" in packing
    if set(packing) - _PACKING_KEYS or aggregates != (
        "agg_small_grads_max_group" in packing
    ):
        return None
    return _spec_name(name, spec, packing)


def single_process_candidates(
    workload: workloads_lib.Workload, quick: bool = False
) -> list[Candidate]:
    """The candidates on one process's logical CPU devices (`quick`: few):
    TF's built-ins, then ours (`_ours(1)`)."""
    out = [
        Candidate("TF ReductionToOneDevice", "tf", "tf_r1d"),
        Candidate("TF HierarchicalCopy num_packs=1", "tf", "tf_hc", PACKS_1),
        Candidate("TF HierarchicalCopy num_packs=4", "tf", "tf_hc", PACKS_4),
        # TF 2.21 MirroredStrategy's default: CollectiveAllReduce.
        Candidate("TF MirroredStrategy default", "tf", "tf_mirrored_default"),
    ]
    if quick:
        del out[2]
    out += sorted(_ours(1), key=_order)
    return [c for c in out if _applies(c, workload) and _kept(c, quick)]


def _kept(c: Candidate, quick: bool) -> bool:
    return not quick or c.family != "ours" or c.name in QUICK


def multi_worker_candidates(
    workload: workloads_lib.Workload,
    quick: bool = False,
    num_workers: int = 2,
    pack_sizes: Sequence[int] = (),
) -> list[Candidate]:
    """The candidates across `num_workers` worker processes (one CPU
    replica each). TensorFlow's strategy runs RING with each of
    `pack_sizes` (bytes; none given: MWMS_BYTES_PER_PACK).

    Ours run in one client driving the workers (MultiWorkerAllReduce from
    `_ours(num_workers)`, MULTI_WORKER_DEFAULT_SPEC first, each setting
    then with each of COMPRESSIONS); MultiWorkerMirroredStrategy ("mwms",
    default options: AUTO, which is RING on CPU, one pack) runs
    between-graph. Our between-graph ones are `strategy_candidates`.

    >>> from benchmarks import workloads
    >>> [c.name for c in multi_worker_candidates(
    ...     workloads.resnet50(), num_workers=3) if "', 3, -1)" in c.name]
    ["ours MultiWorkerAllReduce ('pscpu', 3, -1)", \
"ours MultiWorkerAllReduce ('pscpu', 3, -1) compression=bf16", \
"ours MultiWorkerAllReduce ('pscpu', 3, -1) compression=fp16"]
    """
    out = [
        Candidate("TF MWMS default", "tf", "mwms"),
        Candidate("TF MWMS RING", "tf", "mwms", {"implementation": "RING"}),
    ]
    for size in () if quick else (pack_sizes or MWMS_BYTES_PER_PACK):
        out.append(
            Candidate(
                f"TF MWMS RING{_pack_label(size)}",
                "tf",
                "mwms",
                {"implementation": "RING", "bytes_per_pack": size},
            )
        )
    if not quick:  # driven by our client, like ours
        out.append(
            Candidate("TF ReductionToOneDevice (in-graph)", "tf", "tf_r1d")
        )
    settings = sorted(
        (c for c in _ours(num_workers) if c.kind == "ours_multi_worker"),
        key=_order,
    )
    out += settings
    for codec in COMPRESSIONS:
        out += [
            _spec(
                "MultiWorkerAllReduce",
                c.kwargs["all_reduce_spec"],
                _packing(c) | {"compression": codec},
            )
            for c in settings
        ]
    # One pack: the compressor's exact rest (biases, norms, small kernels)
    # then crosses as one message, not one per tensor.
    out.append(
        _spec(
            "MultiWorkerAllReduce",
            MULTI_WORKER_DEFAULT_SPEC,
            PACKS_1 | _POWERSGD,
        )
    )
    return [c for c in out if _applies(c, workload) and _kept(c, quick)]


def compression_of(kwargs: Mapping[str, Any]) -> Any:
    """A candidate's `compression` argument: its codec's name as it is, or
    for POWERSGD a new compressor at the candidate's rank, compressing from
    the first step (one per reduction: it holds that reduction's state)."""
    if kwargs.get("compression") != POWERSGD:
        return kwargs.get("compression")
    return PowerSGD(rank=kwargs["powersgd_rank"], start_step=0)


def _packing(c: Candidate) -> dict[str, Any]:
    return {k: v for k, v in c.kwargs.items() if k != "all_reduce_spec"}


def strategy_candidates(
    quick: bool = False, pack_sizes: Sequence[int] = ()
) -> list[Candidate]:
    """Ours between-graph ("ours_mwms"): CollectiveAllReduce and
    HierarchicalCollectiveAllReduce in tf_crossdevice's
    MultiWorkerMirroredStrategy, one process per worker with k local
    devices, each class with its own packing and the grid's pack sizes
    (less STRATEGY_LEFT_OUT_BYTES_PER_PACK), or with `pack_sizes` (bytes)
    when given, and, unless `quick`, wire compression
    (each of COMPRESSIONS; the class's own packing). `quick`: the class's
    own packing only.

    >>> [c.name for c in strategy_candidates(quick=True)]
    ['ours CollectiveAllReduce', 'ours HierarchicalCollectiveAllReduce']
    >>> for c in strategy_candidates()[:4]:
    ...     print(c.name)
    ours CollectiveAllReduce
    ours CollectiveAllReduce bytes_per_pack=4MiB
    ours CollectiveAllReduce compression=bf16
    ours CollectiveAllReduce compression=fp16
    """
    grid = cost_model.candidates(num_workers=2, devices_per_worker=1)
    out = []
    for ops in STRATEGY_OPS:
        sizes = (
            [0, *pack_sizes]
            if pack_sizes
            else [
                size
                for name, kwargs in grid
                if name == ops
                and (
                    size := (kwargs.get("options") or {}).get(
                        "bytes_per_pack", 0
                    )
                )
                not in STRATEGY_LEFT_OUT_BYTES_PER_PACK
            ]
        )
        settings: list[tuple[str, dict[str, Any]]] = [
            (_pack_label(size), {"bytes_per_pack": size}) for size in sizes
        ]
        for codec in COMPRESSIONS:
            settings.append(
                (
                    f" compression={codec}",
                    {"bytes_per_pack": 0, "compression": codec},
                )
            )
        if ops == STRATEGY_OPS[0]:
            powersgd = {"bytes_per_pack": 0} | _POWERSGD
            settings.append((_label(dict(_POWERSGD)), powersgd))
        for label, kwargs in settings:
            out.append(
                Candidate(
                    f"ours {ops}{label}",
                    "ours",
                    "ours_mwms",
                    {"cross_device_ops": ops} | kwargs,
                )
            )
    return [c for c in out if _kept(c, quick)]


def _pack_label(size: int) -> str:
    """' bytes_per_pack=4MiB' (KiB below a MiB); '' for the class's own."""
    if not size:
        return ""
    if size % (1 << 20) == 0:
        return f" bytes_per_pack={size >> 20}MiB"
    return f" bytes_per_pack={size >> 10}KiB"


def _compile(patterns: str) -> list[re.Pattern[str]]:
    compiled = []
    for pattern in filter(None, patterns.split(",")):
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ValueError(
                f"--candidates: {pattern!r} is not a regular expression ({e}); "
                r"escape ( ) [ ] . * + ? with \ to match them literally"
            ) from None
    return compiled


def select(candidates: Sequence[Candidate], patterns: str) -> list[Candidate]:
    """TF's built-ins (every ratio needs them) and ours matching `patterns`.

    `patterns`: comma-separated regular expressions (re.search); empty
    keeps everything.

    Raises:
        ValueError: a pattern is not a regular expression.
    """
    wanted = _compile(patterns)
    return [
        c
        for c in candidates
        if not wanted
        or c.family == "tf"
        or any(w.search(c.name) for w in wanted)
    ]


def check_patterns(candidates: Sequence[Candidate], patterns: str) -> None:
    """Raises ValueError for a pattern matching none of our candidates.

    A typo would otherwise run TF's built-ins alone, for hours.
    """
    ours = [c.name for c in candidates if c.family == "ours"]
    unmatched = [
        repr(w.pattern)
        for w in _compile(patterns)
        if not any(w.search(name) for name in ours)
    ]
    if unmatched:
        verb = "matches" if len(unmatched) == 1 else "match"
        raise ValueError(
            f"--candidates: {', '.join(unmatched)} {verb} none of our "
            "candidates here"
        )


# One MirroredStrategy per device list: strategies over the same devices in
# one process number their collective instances alike, so a second one
# would reuse instance keys for different tensors.
_STRATEGIES: dict[tuple[str, ...], Any] = {}


def build(candidate: Candidate, devices: Sequence[str]) -> Any:
    """The candidate as a `tf.distribute.CrossDeviceOps` over `devices`.

    MirroredStrategy's default is its strategy's `extended.batch_reduce_to`
    standing in for `batch_reduce`. Call outside `tf.function`.

    Raises:
        ValueError: a kind that cannot be built here ("mwms" and
            "ours_mwms" run in their own processes).
    """
    kind, kwargs = candidate.kind, dict(candidate.kwargs)
    if isinstance(kwargs.get("all_reduce_spec"), list):  # JSON made it one
        kwargs["all_reduce_spec"] = tuple(kwargs["all_reduce_spec"])
    if kind == "tf_mirrored_default":
        key = tuple(devices)
        if key not in _STRATEGIES:
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
        extended = _STRATEGIES[key].extended
        return types.SimpleNamespace(batch_reduce=extended.batch_reduce_to)
    if kind == "tf_r1d":
        return tf.distribute.ReductionToOneDevice()
    if kind == "tf_hc":
        return tf.distribute.HierarchicalCopyAllReduce(**kwargs)
    if kind == "ours_r1d":
        return tf_crossdevice.ReductionToOneDevice(**kwargs)
    if kind == "ours_all_reduce":
        return tf_crossdevice.AllReduceCrossDeviceOps(**kwargs)
    if kind == "ours_spec":
        return tf_crossdevice.SpecAllReduce(**kwargs)
    if kind == "ours_multi_worker":
        workers = sorted(
            {d.split("/device:")[0] for d in devices},
            key=lambda w: int(w.rsplit(":", 1)[1]),
        )
        if "compression" in kwargs:
            kwargs["compression"] = compression_of(kwargs)
        kwargs.pop("powersgd_rank", None)
        return tf_crossdevice.MultiWorkerAllReduce(workers, 0, **kwargs)
    raise ValueError(f"candidate.kind: {kind!r} cannot be built here")
