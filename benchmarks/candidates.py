"""What the benchmark compares: our CrossDeviceOps and TensorFlow's.

A `Candidate` is plain data (it crosses process boundaries as JSON); `build`
turns it into a reduce function in the process that runs it.

Families:
- "ours": tf_crossdevice's classes, every algorithm with every packing
  setting that changes the computation for the workload at hand.
- "tf": TensorFlow's built-ins: `tf.distribute.ReductionToOneDevice`,
  `tf.distribute.HierarchicalCopyAllReduce(num_packs=1 and 4)`,
  MirroredStrategy's default (TF 2.21: `CollectiveAllReduce`), and across
  workers MultiWorkerMirroredStrategy's collective all-reduce.

>>> from benchmarks import workloads
>>> names = [c.name for c in single_process_candidates(
...     workloads.single_tensor(1024), quick=True)]
>>> "TF ReductionToOneDevice" in names, "ours ReductionToOneDevice" in names
(True, True)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks import workloads as workloads_lib

# Small-tensor aggregation setting the benchmark tries: tensors up to 64 KiB
# concatenated in groups of up to 1024.
AGG_MAX_BYTES = 64 << 10
AGG_MAX_GROUP = 1024

# Packing settings: (label, keyword arguments).
NO_PACKING: dict[str, int] = {}
PACKS_1 = {"num_packs": 1}
PACKS_4 = {"num_packs": 4}
AGGREGATE = {
    "agg_small_grads_max_bytes": AGG_MAX_BYTES,
    "agg_small_grads_max_group": AGG_MAX_GROUP,
}
PACKINGS: tuple[dict[str, int], ...] = (NO_PACKING, PACKS_1, PACKS_4, AGGREGATE)

# Single-process all_reduce_spec algorithms. The hierarchical ones (a/b) are
# their inner stage alone in one process, and nccl has no CPU kernel.
SINGLE_PROCESS_SPECS = ("pscpu", "psgpu", "xring", "rechd")
# Across workers (one replica each).
MULTI_WORKER_SPECS: tuple[Any, ...] = (
    ("pscpu/pscpu", 2, -1),  # MultiWorkerAllReduce's default
    "pscpu",
    "xring",
    "rechd",
)
MWMS_BYTES_PER_PACK = (4 << 20, 32 << 20)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One way to all-reduce, described as data.

    Attributes:
        name: unique, human-readable label (table, JSON, plot legend).
        family: "ours" or "tf".
        kind: which constructor `build` uses (see `_KINDS`).
        kwargs: its arguments (JSON-compatible).
        note: anything the reader should know (e.g. what it falls back to).
    """

    name: str
    family: str
    kind: str
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A candidate that does not apply here, and why."""

    name: str
    reason: str


def _packing_label(packing: dict[str, int]) -> str:
    if not packing:
        return ""
    if "num_packs" in packing:
        return f" num_packs={packing['num_packs']}"
    return (
        f" agg_small={packing['agg_small_grads_max_bytes'] >> 10}KiB"
        f"x{packing['agg_small_grads_max_group']}"
    )


def packing_applies(
    packing: dict[str, int], workload: workloads_lib.Workload
) -> bool:
    """Whether a packing setting changes what is reduced for `workload`.

    num_packs=1 concatenates tensors (a single tensor stays as it is);
    num_packs>1 also splits, so it applies to any workload; aggregation
    needs at least two tensors of at most its size.

    >>> one = workloads_lib.single_tensor(64)
    >>> [packing_applies(p, one) for p in PACKINGS]
    [True, False, True, False]
    """
    if not packing:
        return True
    num_packs = packing.get("num_packs", 0)
    if num_packs == 1:
        return workload.num_tensors > 1
    if num_packs > 1:
        return True
    small = sum(
        1
        for s in workload.shapes
        if math.prod(s) * 4 <= packing["agg_small_grads_max_bytes"]
    )
    return small >= 2


def _spec_label(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    return "(" + ", ".join(repr(x) for x in spec) + ")"


def single_process_candidates(
    workload: workloads_lib.Workload, quick: bool = False
) -> list[Candidate]:
    """The candidates for one process with several logical CPU devices.

    Args:
        workload: decides which packing settings apply.
        quick: a small set (one or two per algorithm family) for `--quick`.
    """
    tf_family = [
        Candidate("TF ReductionToOneDevice", "tf", "tf_r1d"),
        Candidate(
            "TF HierarchicalCopy num_packs=1", "tf", "tf_hc", {"num_packs": 1}
        ),
    ]
    if not quick:
        tf_family.append(
            Candidate(
                "TF HierarchicalCopy num_packs=4",
                "tf",
                "tf_hc",
                {"num_packs": 4},
            )
        )
    tf_family += [
        Candidate(
            "TF MirroredStrategy default",
            "tf",
            "tf_mirrored_default",
            note="TF 2.21 MirroredStrategy's default cross_device_ops: "
            "CollectiveAllReduce",
        ),
    ]
    ours = [Candidate("ours ReductionToOneDevice", "ours", "ours_r1d")]
    hc_packings = (NO_PACKING, AGGREGATE) if quick else PACKINGS
    for packing in hc_packings:
        hc_kwargs = {"num_packs": 0, **packing}
        ours.append(
            Candidate(
                "ours HierarchicalCopy"
                + (_packing_label(packing) or " num_packs=0"),
                "ours",
                "ours_all_reduce",
                {"all_reduce_alg": "hierarchical_copy", **hc_kwargs},
                note="select_cross_device_ops' pick for CPUs"
                if not packing
                else "",
            )
        )
    settings = [(s, p) for s in SINGLE_PROCESS_SPECS for p in PACKINGS]
    if quick:
        settings = [("pscpu", AGGREGATE), ("xring", PACKS_1)]
    for spec, packing in settings:
        ours.append(
            Candidate(
                f"ours SpecAllReduce {spec}{_packing_label(packing)}",
                "ours",
                "ours_spec",
                {"all_reduce_spec": spec, **packing},
            )
        )
    return [c for c in tf_family + ours if _applies(c, workload)]


def _compile(patterns: str) -> list[re.Pattern[str]]:
    compiled = []
    for pattern in (p for p in patterns.split(",") if p):
        try:
            compiled.append(re.compile(pattern))
        except re.error as e:
            raise ValueError(
                f"--candidates: {pattern!r} is not a regular expression ({e}); "
                r"escape ( ) [ ] . * + ? with \ to match them literally"
            ) from None
    return compiled


def select(candidates: Sequence[Candidate], patterns: str) -> list[Candidate]:
    """The candidates a `--candidates` value keeps.

    Args:
        candidates: every candidate of a group.
        patterns: comma-separated regular expressions; a candidate of ours is
            kept if its name matches one of them anywhere (`re.search`).
            Empty keeps everything. TensorFlow's built-ins are always kept:
            every ratio and target in the report is measured against them.

    Raises:
        ValueError: a pattern is not a valid regular expression (names it).

    >>> from benchmarks import workloads
    >>> group = single_process_candidates(workloads.many_small(8))
    >>> [c.name for c in select(group, "SpecAllReduce (pscpu|xring)$")]
    ... # doctest: +NORMALIZE_WHITESPACE
    ['TF ReductionToOneDevice', 'TF HierarchicalCopy num_packs=1',
     'TF HierarchicalCopy num_packs=4', 'TF MirroredStrategy default',
     'ours SpecAllReduce pscpu', 'ours SpecAllReduce xring']
    """
    wanted = _compile(patterns)
    if not wanted:
        return list(candidates)
    return [
        c
        for c in candidates
        if c.family == "tf" or any(w.search(c.name) for w in wanted)
    ]


def check_patterns(candidates: Sequence[Candidate], patterns: str) -> None:
    """Raises if a `--candidates` pattern matches none of our `candidates`.

    A typo would otherwise run TF's built-ins alone, for hours.

    Raises:
        ValueError: names the patterns that match nothing (or is not valid).

    >>> from benchmarks import workloads
    >>> check_patterns(single_process_candidates(workloads.many_small(8)),
    ...                "xring$,xrign$")
    Traceback (most recent call last):
    ...
    ValueError: --candidates: 'xrign$' matches none of our candidates here
    """
    ours = [c.name for c in candidates if c.family == "ours"]
    unmatched = [
        w.pattern
        for w in _compile(patterns)
        if not any(w.search(name) for name in ours)
    ]
    if unmatched:
        raise ValueError(
            f"--candidates: {', '.join(repr(p) for p in unmatched)} "
            f"match{'es' if len(unmatched) == 1 else ''} none of our "
            "candidates here"
        )


def single_process_skipped() -> list[Skipped]:
    """Our algorithms the single-process benchmark leaves out, and why.

    >>> single_process_skipped()[0].name
    'ours NcclAllReduce'
    """
    no_gpu = "NCCL has no CPU kernel; on CPU devices it sums on one device"
    return [
        Skipped("ours NcclAllReduce", no_gpu),
        Skipped("ours SpecAllReduce nccl (and nccl/*)", no_gpu),
        Skipped(
            "ours SpecAllReduce pscpu/pscpu (and other a/b specs)",
            "one process is one worker: only the inner stage runs, which is "
            "the single-level algorithm already measured",
        ),
    ]


def multi_worker_candidates(
    workload: workloads_lib.Workload, quick: bool = False
) -> list[Candidate]:
    """The candidates across worker processes (one CPU replica per worker).

    Ours run in one client process driving the workers (MultiWorkerAllReduce);
    MultiWorkerMirroredStrategy runs between-graph in its own processes.

    >>> [c.name for c in multi_worker_candidates(
    ...     workloads_lib.many_small(8), quick=True)][:3]
    ['TF MWMS default', 'TF MWMS RING', "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1)"]
    """  # noqa: E501
    tf_family = [
        Candidate(
            "TF MWMS default",
            "tf",
            "mwms",
            {},
            note="MultiWorkerMirroredStrategy collective all-reduce, default "
            "CommunicationOptions (AUTO: RING on CPU, one pack)",
        ),
        Candidate("TF MWMS RING", "tf", "mwms", {"implementation": "RING"}),
    ]
    if not quick:
        for bytes_per_pack in MWMS_BYTES_PER_PACK:
            tf_family.append(
                Candidate(
                    f"TF MWMS RING bytes_per_pack={bytes_per_pack >> 20}MiB",
                    "tf",
                    "mwms",
                    {
                        "implementation": "RING",
                        "bytes_per_pack": bytes_per_pack,
                    },
                )
            )
        tf_family.append(
            Candidate(
                "TF ReductionToOneDevice (in-graph)",
                "tf",
                "tf_r1d",
                note="driven by our client, like ours",
            )
        )
    specs: Sequence[Any] = MULTI_WORKER_SPECS
    packings = PACKINGS
    if quick:
        specs = (MULTI_WORKER_SPECS[0], "xring")
        packings = (NO_PACKING, PACKS_1)
    ours = []
    for spec in specs:
        for packing in packings:
            ours.append(
                Candidate(
                    f"ours MultiWorkerAllReduce {_spec_label(spec)}"
                    f"{_packing_label(packing)}",
                    "ours",
                    "ours_multi_worker",
                    {
                        "all_reduce_spec": list(spec)
                        if isinstance(spec, tuple)
                        else spec,
                        **packing,
                    },
                )
            )
    return [c for c in tf_family + ours if _applies(c, workload)]


def _applies(candidate: Candidate, workload: workloads_lib.Workload) -> bool:
    packing = {
        k: v
        for k, v in candidate.kwargs.items()
        if k in ("num_packs", "agg_small_grads_max_bytes")
        and v
        and candidate.family == "ours"
    }
    if "agg_small_grads_max_bytes" in packing:
        packing["agg_small_grads_max_group"] = candidate.kwargs[
            "agg_small_grads_max_group"
        ]
    return packing_applies(packing, workload)


ReduceFn = Callable[[list[Any]], list[Any]]


def build(candidate: Candidate, devices: Sequence[str]) -> ReduceFn:
    """A function that all-reduces (SUM) a list of PerReplica values.

    Called outside `tf.function` (it may create a strategy); the function it
    returns is called inside one and returns one DistributedValues per input.

    Args:
        candidate: what to build; its kind must not be "mwms" (that one runs
            in its own processes, see `multi_worker.py`).
        devices: the replicas' devices.

    Raises:
        ValueError: an unknown kind.

    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> reduce = build(Candidate("ours xring", "ours", "ours_spec",
    ...                          {"all_reduce_spec": "xring"}), devices)
    >>> value = tf_crossdevice.testing.per_replica(
    ...     [tf.constant([1.0]), tf.constant([2.0])], devices)
    >>> [v.numpy().tolist() for v in reduce([value])[0].values]
    [[3.0], [3.0]]
    """
    import tensorflow as tf

    import tf_crossdevice

    sum_op = tf.distribute.ReduceOp.SUM
    kind, kwargs = candidate.kind, dict(candidate.kwargs)
    if kind == "tf_mirrored_default":
        strategy = mirrored_strategy(devices)

        def reduce_with_strategy(values: list[Any]) -> list[Any]:
            return strategy.extended.batch_reduce_to(
                sum_op, [(v, v) for v in values]
            )

        return reduce_with_strategy
    if kind == "tf_r1d":
        ops: Any = tf.distribute.ReductionToOneDevice()
    elif kind == "tf_hc":
        ops = tf.distribute.HierarchicalCopyAllReduce(**kwargs)
    elif kind == "ours_r1d":
        ops = tf_crossdevice.ReductionToOneDevice(**kwargs)
    elif kind == "ours_all_reduce":
        ops = tf_crossdevice.AllReduceCrossDeviceOps(**kwargs)
    elif kind == "ours_spec":
        ops = tf_crossdevice.SpecAllReduce(**_spec_kwargs(kwargs))
    elif kind == "ours_multi_worker":
        workers = sorted(
            {d.split("/device:")[0] for d in devices},
            key=lambda w: int(w.rsplit(":", 1)[1]),
        )
        ops = tf_crossdevice.MultiWorkerAllReduce(
            workers, 0, **_spec_kwargs(kwargs)
        )
    else:
        raise ValueError(
            f"candidate.kind: {kind!r} cannot be built here; expected one of "
            f"{', '.join(_KINDS)}"
        )

    def reduce_with_ops(values: list[Any]) -> list[Any]:
        return ops.batch_reduce(sum_op, [(v, v) for v in values])

    return reduce_with_ops


# One MirroredStrategy per device list: each strategy numbers its collective
# instances from the same start, so two strategies over the same devices in
# one process would reuse instance keys for different tensors.
_MIRRORED_STRATEGIES: dict[tuple[str, ...], Any] = {}


def mirrored_strategy(devices: Sequence[str]) -> Any:
    """The process's `tf.distribute.MirroredStrategy` over `devices`.

    >>> devices = tf_crossdevice.testing.cpu_devices(2)
    >>> mirrored_strategy(devices) is mirrored_strategy(devices)
    True
    """
    import tensorflow as tf

    key = tuple(devices)
    if key not in _MIRRORED_STRATEGIES:
        _MIRRORED_STRATEGIES[key] = tf.distribute.MirroredStrategy(list(key))
    return _MIRRORED_STRATEGIES[key]


_KINDS = (
    "tf_mirrored_default",
    "tf_r1d",
    "tf_hc",
    "ours_r1d",
    "ours_all_reduce",
    "ours_spec",
    "ours_multi_worker",
)


def _spec_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """JSON turned the spec's tuple into a list; SpecAllReduce wants a tuple."""
    spec = kwargs.get("all_reduce_spec")
    if isinstance(spec, list):
        kwargs = {**kwargs, "all_reduce_spec": tuple(spec)}
    return kwargs
