"""An alpha-beta cost model of every all-reduce configuration of the package.

A configuration is a constructor call as plain data, `(class_name, kwargs)`:

    ("SpecAllReduce", {"all_reduce_spec": "xring", "num_packs": 1})
    ("MultiWorkerAllReduce", {"all_reduce_spec": ("pscpu/pscpu", 2, -1)})
    ("CollectiveAllReduce", {"options": {"bytes_per_pack": 4 << 20}})

and gradients are `(shape, dtype_name)` pairs, one per tensor of a replica.
`predict` gives seconds per all-reduce step, `recommend` the fastest
configuration it knows for a cluster, `fit` the constants from measured
steps. Nothing here runs a TensorFlow op.

The model (Thakur, Rabenseifner and Gropp, "Optimization of Collective
Communication Operations in MPICH", 2005), per worker process:

    seconds = alpha_net * network messages + beta_net * network bytes
            + alpha_mem * memory messages  + beta_mem * memory bytes
            + gamma * (bytes reduced + bytes copied) + delta * graph ops
            + alpha_collective * collectives launched across workers
            + step
            + beta_incast * bytes received from several senders at once
            + beta_serial * bytes of the largest pack

where "memory" is a transfer between logical devices of one process and
"network" one between worker processes (its bytes are what the busiest
worker's link carries each way, plus those of one pack it carries one
way while the other way idles, `Traffic.one_way_bytes`: so on hosts
whose link of known rate is the bottleneck `beta_net` is the inverse of
the rate the payload gets, `constants_for_link`); "bytes copied" are
the memcpys
of packing and flattening (a concatenation, a pad); `step` is a fixed
cost per all-reduce step. The counts come from
`tf_crossdevice.tuning._traffic` and follow the builders:

- ring ("xring", and the collectives' RING): `2(p-1)` messages,
  `2(p-1)/p n` bytes sent and `(p-1)/p n` reduced per device, per pack.
- recursive halving-doubling ("rechd"): `2 log2(p)` messages and the same
  bytes for a power of two `p`; otherwise the `r = p - 2**floor(log2 p)`
  extra devices fold into partners first, which pay one more message and
  `n` more bytes each way (`(2 log2 p' + 1)` messages on a partner).
- shuffle ("pscpu", "psgpu"): every device sends each shard to its owner,
  the owner sums `p` copies and broadcasts the sum: `2(p-1)` messages of
  the shard on the owner, a gather then a broadcast.
- hierarchical copy and reduction to one device: `2(p-1)` whole-tensor
  messages through one or two roots.
- a link used one way at a time: a reduction's root, a shuffle owner
  that receives more of its shards in the gather than it sends of the
  others', and halving-doubling's fold-in partner receive before they
  send, the other direction idle; those bytes count again in the
  network bytes, those of the pack with the most (other packs fill the
  idle direction: `Traffic.one_way_bytes`).
- two-level 'inner/outer': the inner algorithm on each worker's devices,
  the outer across one device per worker, then `k-1` copies back.
- packing changes how many all-reduces run and how large they are
  (`tf_crossdevice.packing` plans the packs, the collectives' too) and adds
  concat/split ops and copies on every device; spec ranges pick each pack's
  algorithm by its bytes.
- compression ('bf16', 'fp16') halves float32 wire bytes (quarters
  float64), and costs a cast at each end of every message, priced like a
  sum; a scaled message ('fp16', and 'bf16' of float64) also finds its
  largest and smallest value and multiplies at each end: 6 passes, not 2.
  The collectives compress only groups of 2 or 3 members, by one
  all-gather of the 16-bit messages that every member decodes and sums
  (`traffic.compressed_gather`); larger groups all-reduce exactly.

A worker's devices share its CPU thread pool, so their counts add; workers
run in parallel, so a step costs the busiest worker's time. The per-op
delta is what makes many small tensors slow on CPUs: every tensor costs
ops on every device whatever its size.

>>> grads = [((1000, 1000), "float32")] * 4
>>> ring = ("SpecAllReduce", {"all_reduce_spec": "xring"})
>>> pscpu = ("SpecAllReduce", {"all_reduce_spec": "pscpu"})
>>> round(predict(ring, grads, devices_per_worker=4), 4) > 0
True
>>> config, seconds = recommend(grads, num_workers=64)
>>> config[0] in ("MultiWorkerAllReduce", "CollectiveAllReduce",
...               "HierarchicalCollectiveAllReduce")
True
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

from tf_crossdevice._core import checks
from tf_crossdevice.algorithms import _spec as spec_lib
from tf_crossdevice.compression import _codec as codec
from tf_crossdevice.packing import _collective_plan as collective_packing
from tf_crossdevice.packing import _plan as packing_lib
from tf_crossdevice.tuning import _grid
from tf_crossdevice.tuning import _traffic as traffic
from tf_crossdevice.tuning._grid import Config
from tf_crossdevice.tuning._traffic import Traffic

__all__ = [
    "ALGORITHMS",
    "COMPRESSIBLE",
    "COMPRESSIONS",
    "CONFIG_NAMES",
    "Config",
    "Constants",
    "DEFAULT_CONSTANTS",
    "FIELDS",
    "Gradients",
    "ITEMSIZE",
    "LOOPBACK_FIELDS",
    "Measurement",
    "at_link_rate",
    "candidates",
    "constants_for_link",
    "features",
    "fit",
    "measured_counts",
    "nnls",
    "ordering_constants",
    "predict",
    "recommend",
    "traffic_of",
]

# The builder registry's names (tf_crossdevice.algorithms._registry, which
# imports TensorFlow; tests check the two agree).
ALGORITHMS = frozenset(
    {"hierarchical_copy", "nccl", "pscpu", "psgpu", "rechd", "xring"}
)
COMPRESSIONS = ("bf16", "fp16")
ITEMSIZE = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "complex64": 8,
    "complex128": 16,
}
# Compression applies to these only (contract of _builders/compression.py).
COMPRESSIBLE = ("float32", "float64")

Gradients: TypeAlias = Sequence[tuple[Sequence[int], str]]


@dataclasses.dataclass(frozen=True)
class Constants:
    """The model's constants, in seconds.

    Attributes:
        alpha_net: per message between worker processes.
        beta_net: per byte between worker processes: on links of known
            rate (emulated or real hosts whose wire is the bottleneck),
            the inverse of the rate the payload gets (`constants_for_link`).
        alpha_mem: per message between logical devices of one process.
        beta_mem: per byte sent between logical devices of one process
            (TensorFlow shares the buffer, so it fits near 0).
        gamma: per byte an elementwise pass touches: summed, cast, or
            copied by a concatenation or pad (packing, flattening).
        delta: per graph op run.
        alpha_collective: per collective all-reduce launched across
            workers, once per pack and worker (TensorFlow's collective
            runtime resolves each instance with its peers over the network;
            inside one process a launch is an ordinary op).
        step: per all-reduce step, whatever it does (dispatching the
            step's graph; it dominates steps of a few milliseconds).
        beta_incast: per byte a worker receives from several senders at
            once beyond one sender's share (`Traffic.incast_bytes`): the
            throughput a shaped link loses when flows converge on it.
        beta_serial: per byte of the step's largest pack, whose processing
            its own transfer cannot hide (`Traffic.serial_bytes`).

    The last two are fitted on links of known rate only; the loopback
    defaults leave them 0. The per-core terms (alpha_mem, beta_mem, gamma,
    delta, beta_serial) are divided by `cores_per_worker` where a caller
    gives one (hosts with a share of a core, `predict`).
    """

    alpha_net: float
    beta_net: float
    alpha_mem: float
    beta_mem: float
    gamma: float
    delta: float
    alpha_collective: float
    step: float
    beta_incast: float = 0.0
    beta_serial: float = 0.0

    def seconds(
        self, t: Traffic, cores_per_worker: float | None = None
    ) -> float:
        """The time of counts `t` (per-core terms over `cores_per_worker`)."""
        counts = features(t, cores_per_worker)
        return float(
            sum(
                getattr(self, name) * count
                for name, count in zip(FIELDS, counts, strict=True)
            )
        )


FIELDS = tuple(f.name for f in dataclasses.fields(Constants))
# What the loopback benchmark can tell apart, and what `DEFAULT_CONSTANTS`
# and `fit` by default fit: on loopback the cores, not a wire, bound every
# transfer, so neither incast nor a pack's serial processing shows apart
# from gamma and delta.
LOOPBACK_FIELDS = FIELDS[:8]
# Terms that a core does (a share of a core takes proportionally longer);
# the others are the wire's or the runtime's round trips.
_PER_CORE = frozenset(
    {"alpha_mem", "beta_mem", "gamma", "delta", "beta_serial"}
)


def features(
    t: Traffic, cores_per_worker: float | None = None
) -> tuple[float, ...]:
    """The counts that multiply each of `Constants`' fields, in order.

    Per-core counts are divided by `cores_per_worker` when given.

    >>> features(Traffic(net_messages=2, copy_bytes=8, mem_bytes=1, ops=3))
    (2, 0.0, 0.0, 1, 8.0, 3, 0.0, 1.0, 0.0, 0.0)
    >>> features(Traffic(ops=3, serial_bytes=10), cores_per_worker=0.5)[5:]
    (6.0, 0.0, 1.0, 0.0, 20.0)
    """
    counts = (
        t.net_messages,
        # A link that works one way at a time takes as long as if it
        # carried those bytes both ways.
        t.net_bytes + t.one_way_bytes,
        t.mem_messages,
        t.mem_bytes,
        t.reduce_bytes + t.copy_bytes,
        t.ops,
        t.collectives,
        1.0,
        t.incast_bytes,
        t.serial_bytes,
    )
    if cores_per_worker is None:
        return counts
    cores = checks.positive_number(cores_per_worker, "cores_per_worker")
    return tuple(
        c / cores if name in _PER_CORE else c
        for name, c in zip(FIELDS, counts, strict=True)
    )


# Fitted by `python -m benchmarks.cost_fit` on the loopback records that
# docs/benchmark/cost_model.md names (`fit` on every verified, timed
# candidate of their groups), so that the model ranks configurations as
# the measured steps on the benchmark's machine (logical CPU devices,
# loopback gRPC workers) rank them; that page gives the fit's errors per
# group. Other hardware needs its own `fit`; hosts on links of known rate,
# `constants_for_link`.
DEFAULT_CONSTANTS = Constants(
    alpha_net=1.521e-04,
    beta_net=4.763e-09,
    alpha_mem=5.229e-06,
    beta_mem=1.034e-11,
    gamma=7.521e-11,
    delta=2.298e-07,
    alpha_collective=5.293e-03,
    step=2.111e-03,
)

# Fitted by `python -m benchmarks.cost_fit --emulated` (`fit` of every
# field) on the 1 Gbit/s records docs/benchmark/cost_model_hosts.md names
# (a faster rate there is held out), made on
# the benchmark's emulated hosts: one network namespace per host, links
# shaped to `_EMULATED_RATE` bits/s both ways, each host an equal share of
# the machine's cores; the per-core terms are per whole core. That page
# gives the recovered link rate and the held-out predictions.
_EMULATED_RATE = 1e9
_EMULATED = Constants(
    alpha_net=0.0,
    beta_net=8.619e-09,
    alpha_mem=0.0,
    beta_mem=1.337e-10,
    gamma=0.0,
    delta=0.0,
    alpha_collective=0.0,
    step=0.0,
    beta_incast=4.702e-09,
    beta_serial=4.272e-09,
)
# Terms in wire time: they scale with the link's rate.
_PER_WIRE_BYTE = ("beta_net", "beta_incast")


def _wire_scaled(values: Sequence[float], factor: float) -> tuple[float, ...]:
    """`values`, one per field of `Constants` (constants or their counts),
    with the wire's per-byte ones multiplied by `factor`."""
    return tuple(
        v * factor if name in _PER_WIRE_BYTE else v
        for name, v in zip(FIELDS, values, strict=True)
    )


def constants_for_link(rate_bits_per_s: float) -> Constants:
    """Constants for hosts joined by links of `rate_bits_per_s`.

    The constants fitted on the benchmark's emulated hosts (links shaped
    with `tc tbf`, one worker per host), moved to this rate by
    `at_link_rate`; the per-core terms are per whole core, so pass
    `predict` and `recommend` each worker's `cores_per_worker`.

    Assumptions, to read any prediction with: the wire is each host's
    bottleneck (a rate far above what the fitting links carried makes the
    per-core and per-message terms dominate, which were fitted only where
    they were not); the per-message, per-collective and incast terms were
    fitted on at most 4 hosts with 1 or 2 devices each; full-duplex links
    into a switch that never blocks (no oversubscription, no shared
    uplinks); no latency beyond what the fitted hosts had (a bridge on one
    machine: microseconds).

    Args:
        rate_bits_per_s: each host's link rate each way, bits per second
            (as `tc` reads '1gbit': 1e9).

    Raises:
        ValueError: a rate that is not a positive number.

    >>> c = constants_for_link(10e9)
    >>> round(constants_for_link(1e9).beta_net / c.beta_net, 6)
    10.0
    """
    return at_link_rate(_EMULATED, _EMULATED_RATE, rate_bits_per_s)


def at_link_rate(
    constants: Constants, fitted_rate: float, rate_bits_per_s: float
) -> Constants:
    """`constants`, fitted on links of `fitted_rate` bits/s, for links of
    `rate_bits_per_s`: the per-byte wire terms (beta_net, beta_incast)
    scale with the links' time per byte; every other term stays.

    Args:
        constants: fitted on hosts joined by links of `fitted_rate`.
        fitted_rate: those links' rate each way, bits per second.
        rate_bits_per_s: the rate to predict for, bits per second.

    Raises:
        ValueError: a rate that is not a positive number.

    >>> c = dataclasses.replace(DEFAULT_CONSTANTS, beta_net=8e-9)
    >>> fast = at_link_rate(c, 1e9, 4e9)
    >>> fast.beta_net, fast.gamma == c.gamma
    (2e-09, True)
    """
    fitted = checks.positive_number(fitted_rate, "fitted_rate")
    rate = checks.positive_number(rate_bits_per_s, "rate_bits_per_s")
    return Constants(
        *_wire_scaled(dataclasses.astuple(constants), fitted / rate)
    )


def ordering_constants(num_workers: int) -> Constants:
    """The constants autotune orders its candidates with: the loopback fit
    (`DEFAULT_CONSTANTS`), and across workers its `beta_serial` from the
    fit on links of known rate (`constants_for_link`), as for one core per
    worker (autotune does not know the workers' cores).

    A pack's own transfer cannot hide its casts, sums and copies; loopback,
    where the cores bound every transfer, cannot tell that term apart and
    leaves it 0, which ranks one pack of every gradient first. Between
    hosts one large pack loses to several smaller ones (most of all with
    compression, whose casts then wait for the whole pack), as the
    emulated hosts measured. Workers sharing one machine get the same
    order: whether their transfers cross a wire is not in the topology.
    The bytes a link carries one way at a time (`Traffic.one_way_bytes`)
    are priced at the loopback `beta_net`, about half the link-fitted
    one at 1 Gbit/s: enough to rank one-shard pscpu, whose owner
    receives every gradient before it sends any sum back, behind two
    shards between hosts.

    Raises:
        ValueError: `num_workers` is not a positive integer.

    >>> ordering_constants(1) == DEFAULT_CONSTANTS
    True
    >>> ordering_constants(2).beta_serial == _EMULATED.beta_serial > 0
    True
    """
    if checks.positive_int(num_workers, "num_workers") == 1:
        return DEFAULT_CONSTANTS
    return dataclasses.replace(
        DEFAULT_CONSTANTS, beta_serial=_EMULATED.beta_serial
    )


class Measurement(NamedTuple):
    """One measured configuration: what `fit` takes."""

    config: Config
    gradients: Gradients
    devices_per_worker: int
    num_workers: int
    seconds: float
    # Each worker's share of the cores (hosts with a CPU quota); None: the
    # constants absorb it (loopback workers sharing one machine).
    cores_per_worker: float | None = None
    # The rate of the links between the hosts, bits/s each way, for `fit`
    # to scale its wire bytes to the rate it fits for; None: that rate.
    link_rate: float | None = None


# --- configurations -----------------------------------------------------

_PACKING = {
    "num_packs": 0,
    "agg_small_grads_max_bytes": 0,
    "agg_small_grads_max_group": 10,
}
# Each class's keyword arguments and their defaults (None: required, or
# irrelevant to the cost).
_KWARGS: dict[str, dict[str, Any]] = {
    "SpecAllReduce": {"all_reduce_spec": "xring", **_PACKING},
    "MultiWorkerAllReduce": {
        "worker_devices": None,
        "num_gpus_per_worker": None,
        "all_reduce_spec": ("pscpu/pscpu", 2, -1),
        **_PACKING,
    },
    "AllReduceCrossDeviceOps": {
        "all_reduce_alg": "nccl",
        **_PACKING,
        "num_packs": 1,
    },
    "HierarchicalCopyAllReduce": {"num_packs": 1},
    "NcclAllReduce": {"num_packs": 1},
    "ReductionToOneDevice": {"reduce_to_device": None},
    "CollectiveAllReduce": {
        "num_workers": None,
        "num_gpus_per_worker": None,
        "all_reduce_merge_scope": 32,
        "options": None,
    },
    "HierarchicalCollectiveAllReduce": {"options": None},
    "tf.ReductionToOneDevice": {},
    "tf.HierarchicalCopyAllReduce": {"num_packs": 1},
    "tf.MultiWorkerMirroredStrategy": {
        "implementation": "RING",
        "options": None,
    },
}
# Classes that take `compression=` (None, 'bf16' or 'fp16').
_COMPRESSING = frozenset(_KWARGS) - {
    "tf.ReductionToOneDevice",
    "tf.HierarchicalCopyAllReduce",
    "tf.MultiWorkerMirroredStrategy",
}
CONFIG_NAMES = tuple(sorted(_KWARGS))


def _check_config(config: object) -> tuple[str, dict[str, Any]]:
    if (
        not isinstance(config, tuple | list)
        or len(config) != 2
        or not isinstance(config[0], str)
        or not isinstance(config[1], Mapping)
    ):
        raise ValueError(
            f"config: expected (class name, kwargs dict), got {config!r}"
        )
    name, kwargs = config[0], dict(config[1])
    if name not in _KWARGS:
        raise ValueError(
            f"config: unknown class {name!r}; expected one of "
            f"{', '.join(CONFIG_NAMES)}"
        )
    allowed = dict(_KWARGS[name])
    if name in _COMPRESSING:
        allowed["compression"] = None
    for key in kwargs:
        if key not in allowed:
            raise ValueError(
                f"config: {name} takes no argument {key!r}; expected some "
                f"of {', '.join(sorted(allowed))}"
            )
    return name, {**allowed, **kwargs}


def _compression(value: object) -> str | None:
    if value is not None and value not in COMPRESSIONS:
        raise ValueError(
            f"compression: expected None or one of "
            f"{', '.join(COMPRESSIONS)}, got {value!r}"
        )
    return value  # type: ignore[return-value]


class _Tensor(NamedTuple):
    elements: int
    dtype: str

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def num_bytes(self) -> int:
        return self.elements * self.itemsize


def _check_gradients(gradients: object) -> list[_Tensor]:
    if isinstance(gradients, str | bytes) or not isinstance(
        gradients, Iterable
    ):
        raise ValueError(
            "gradients: expected a list of (shape, dtype name) pairs, got "
            f"{gradients!r}"
        )
    out = []
    for i, item in enumerate(gradients):
        where = f"gradients[{i}]"
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise ValueError(
                f"{where}: expected a (shape, dtype name) pair, got {item!r}"
            )
        shape, dtype = item
        if isinstance(shape, int) or not isinstance(shape, Iterable):
            raise ValueError(
                f"{where}: expected a shape tuple of ints, got {shape!r}"
            )
        dims = [
            checks.non_negative_int(d, f"{where} dimension {j}")
            for j, d in enumerate(shape)
        ]
        if dtype not in ITEMSIZE:
            raise ValueError(
                f"{where}: unknown dtype {dtype!r}; expected one of "
                f"{', '.join(sorted(ITEMSIZE))}"
            )
        out.append(_Tensor(math.prod(dims), dtype))
    if not out:
        raise ValueError("gradients: expected at least one (shape, dtype)")
    return out


class _Pack(NamedTuple):
    num_bytes: int
    dtype: str


def _plan_packs(
    tensors: list[_Tensor], kwargs: Mapping[str, Any]
) -> tuple[list[_Pack], list[tuple[list[float], int]]]:
    """The packs of the graph builders' packers (`tf_crossdevice.packing`), and
    each concatenating group's member bytes and pack count."""
    scheme = packing_lib.packing_scheme(
        num_packs=kwargs["num_packs"],
        agg_small_grads_max_bytes=kwargs["agg_small_grads_max_bytes"],
        agg_small_grads_max_group=kwargs["agg_small_grads_max_group"],
    )
    infos = [(t.elements, t.itemsize, t.dtype) for t in tensors]
    if scheme is packing_lib.PackingScheme.IDENTITY:
        return [_Pack(t.num_bytes, t.dtype) for t in tensors], []
    if scheme is packing_lib.PackingScheme.CONCAT_AND_SPLIT:
        plan = packing_lib.concat_and_split_plan(infos, kwargs["num_packs"])
    else:
        plan = packing_lib.small_tensor_plan(
            infos,
            kwargs["agg_small_grads_max_bytes"],
            kwargs["agg_small_grads_max_group"],
        )
    packs = []
    groups = []
    for group in plan:
        dtype = tensors[group.members[0]].dtype
        size = ITEMSIZE[dtype]
        packs += [_Pack(e * size, dtype) for e in group.pack_sizes]
        if group.concat:
            member_bytes = [float(e * size) for e in group.member_sizes]
            groups.append((member_bytes, len(group.pack_sizes)))
    return packs, groups


def _single(alg: str, size: float, n: int, k: int, shards: int) -> Traffic:
    if alg == "xring":
        return traffic.ring(size, n, k, shards)
    if alg == "nccl":  # one kernel per device, ring traffic
        return traffic.ring(size, n, k, shards, 0, 1, 0)
    if alg == "rechd":
        return traffic.halving_doubling(size, n, k, shards)
    if alg in ("pscpu", "psgpu"):
        return traffic.shuffle(size, n, k, shards, per_worker=alg == "pscpu")
    if alg == "hierarchical_copy":
        return traffic.hierarchical_copy(size, n, k).scaled(shards)
    raise ValueError(
        f"all_reduce_spec: unknown algorithm {alg!r}; expected "
        f"{spec_lib.describe_algorithms(ALGORITHMS)}"
    )


def _algorithm(alg: str, size: float, n: int, k: int, shards: int) -> Traffic:
    parts = spec_lib.split_two_level(alg)
    if parts is None:
        return _single(alg, size, n, k, shards)
    inner, outer = parts
    return traffic.two_level(
        _single(inner, size, k, k, 1) if k > 1 else traffic.NONE,
        _single(outer, size, n // k, 1, shards) if n > k else traffic.NONE,
        size,
        n,
        k,
    )


def _scaled(dtype: str, compression: str | None) -> bool:
    """Whether the codec scales each message into its range (the codec's
    own rule: bfloat16 has float32's exponent range, half and float64
    need a scale)."""
    return compression == "fp16" or dtype == "float64"


def _compress(t: Traffic, dtype: str, compression: str | None) -> Traffic:
    if compression is None or dtype not in COMPRESSIBLE:
        return t
    if not _scaled(dtype, compression):
        return t.compressed(2 / ITEMSIZE[dtype], cast_ops=2)
    # Its largest and smallest value and a multiply before the cast, a
    # multiply after it.
    return t.compressed(2 / ITEMSIZE[dtype], cast_ops=4, passes=6)


def _packed_traffic(
    tensors: list[_Tensor],
    kwargs: Mapping[str, Any],
    ranges: Sequence[spec_lib.AllReduceSpecTuple],
    n: int,
    k: int,
    compression: str | None,
) -> Traffic:
    packs, groups = _plan_packs(tensors, kwargs)
    total = traffic.NONE
    for member_bytes, num_packs in groups:
        total += traffic.pack_traffic(member_bytes, num_packs, k)
    # Equal packs cost alike: price each size once.
    each = []
    for pack, count in collections.Counter(packs).items():
        chosen = spec_lib.select_range(ranges, pack.num_bytes)
        t = _algorithm(chosen.alg, pack.num_bytes, n, k, chosen.shards)
        t = dataclasses.replace(t, serial_bytes=float(pack.num_bytes))
        each.append((_compress(t, pack.dtype, compression), count))
    return _packs_total(total, each)


def _packs_total(
    total: Traffic, packs: Iterable[tuple[Traffic, int]]
) -> Traffic:
    """`total` plus each pack's counts times its count; the serial and
    one-way bytes are the largest of any one pack's, not a sum: other
    packs' transfers hide their processing and fill the idle direction
    (`Traffic.serial_bytes`, `Traffic.one_way_bytes`)."""
    serial = one_way = 0.0
    for t, count in packs:
        total += t.scaled(count)
        serial = max(serial, t.serial_bytes)
        one_way = max(one_way, t.one_way_bytes)
    return dataclasses.replace(
        total, serial_bytes=serial, one_way_bytes=one_way
    )


def _bytes_per_pack(options: object, argument: str) -> int:
    if options is None:
        return 0
    if isinstance(options, Mapping):
        value = options.get("bytes_per_pack", 0)
    else:  # tf.distribute.experimental.CommunicationOptions
        value = getattr(options, "bytes_per_pack", 0)
    return checks.non_negative_int(value, f"{argument}.bytes_per_pack")


def _collective_traffic(
    tensors: list[_Tensor],
    packs: list[list[int]],
    n: int,
    k: int,
    hierarchical: bool,
    compression: str | None,
) -> Traffic:
    """TensorFlow's RING collective per pack, around flatten/unflatten.

    The ring is one kernel per device (no graph op per step); its CPU
    RingReducer first copies the input into the output buffer (one copy).
    """
    each = []
    workers = n // k
    # The hierarchical class reduces each worker's devices first, then runs
    # its collective with one member per worker.
    group, members_here = (workers, 1) if hierarchical else (n, k)
    # Compressed, a group of 2 or 3 members gathers 16-bit messages;
    # larger groups reduce exactly (`codec.gather_compression_pays`).
    gathers = (
        compression is not None
        and workers > 1
        and codec.gather_compression_pays(group)
    )
    launched = Traffic(collectives=1 if workers > 1 else 0)
    for pack in packs:
        size = float(sum(tensors[i].num_bytes for i in pack))
        dtype = tensors[pack[0]].dtype
        # What the pack's processing handles once its transfer is done: the
        # pack; or, gathered compressed, the `group` messages every member
        # decodes to full precision and sums.
        gathered = gathers and dtype in COMPRESSIBLE
        t = traffic.pack_traffic(
            [float(tensors[i].num_bytes) for i in pack], 1, k
        ) + Traffic(serial_bytes=size * group if gathered else size)
        if hierarchical and k > 1:
            t += traffic.one_device(size, k, k)
        if gathered:
            ratio = 2 / ITEMSIZE[dtype]
            scaled = _scaled(dtype, compression)
            t += traffic.compressed_gather(
                size, group, members_here, ratio, scaled
            )
            t += Traffic(ops=2 * group if scaled else 0)
        else:
            t += traffic.ring(size, group, members_here, 1, 0, 1, 1)
        each.append((t + launched, 1))
    return _packs_total(traffic.NONE, each)


def traffic_of(
    config: Config,
    gradients: Gradients,
    *,
    devices_per_worker: int,
    num_workers: int = 1,
) -> Traffic:
    """The busiest worker's counts for one step of `config`.

    Args and Raises: as `predict`.

    >>> t = traffic_of(("SpecAllReduce", {"all_reduce_spec": "xring"}),
    ...                [((10,), "float32")], devices_per_worker=2)
    >>> t.mem_messages, t.mem_bytes   # 2 devices x 2(p-1) chunks of 20 B
    (4.0, 80.0)
    """
    name, kwargs = _check_config(config)
    tensors = _check_gradients(gradients)
    k = checks.positive_int(devices_per_worker, "devices_per_worker")
    workers = checks.positive_int(num_workers, "num_workers")
    return _step_traffic(name, kwargs, tensors, workers * k, k)


def _step_traffic(
    name: str,
    kwargs: dict[str, Any],
    tensors: list[_Tensor],
    n: int,
    k: int,
) -> Traffic:
    """The busiest worker's counts."""
    workers = n // k
    compression = _compression(kwargs.get("compression"))
    if name in ("SpecAllReduce", "MultiWorkerAllReduce"):
        ranges = spec_lib.parse_all_reduce_spec(
            kwargs["all_reduce_spec"], ALGORITHMS
        )
        if name == "MultiWorkerAllReduce":
            devices = kwargs["worker_devices"]
            if devices is not None and len(devices) != workers:
                raise ValueError(
                    f"worker_devices: {len(devices)} workers listed, but "
                    f"num_workers={workers}"
                )
        return _packed_traffic(tensors, kwargs, ranges, n, k, compression)
    if name in ("AllReduceCrossDeviceOps", "NcclAllReduce"):
        kwargs = {**_PACKING, **kwargs}
        alg = kwargs.get("all_reduce_alg", "nccl")
        spec_lib.check_algorithm(alg, ALGORITHMS, "all_reduce_alg")
        ranges = (spec_lib.AllReduceSpecTuple(alg),)
        return _packed_traffic(tensors, kwargs, ranges, n, k, compression)
    if name in ("HierarchicalCopyAllReduce", "tf.HierarchicalCopyAllReduce"):
        kwargs = {**_PACKING, **kwargs}
        ranges = (spec_lib.AllReduceSpecTuple("hierarchical_copy"),)
        return _packed_traffic(tensors, kwargs, ranges, n, k, compression)
    if name in ("ReductionToOneDevice", "tf.ReductionToOneDevice"):
        each = [
            (
                _compress(
                    traffic.one_device(float(t.num_bytes), n, k)
                    + Traffic(serial_bytes=float(t.num_bytes)),
                    t.dtype,
                    compression,
                ),
                count,
            )
            for t, count in collections.Counter(tensors).items()
        ]
        return _packs_total(traffic.NONE, each)
    options = kwargs.get("options")
    bytes_per_pack = _bytes_per_pack(options, "options")
    sizes = [t.num_bytes for t in tensors]
    dtypes = [t.dtype for t in tensors]
    if name == "CollectiveAllReduce":
        if kwargs["num_workers"] not in (None, workers):
            raise ValueError(
                f"num_workers: config says {kwargs['num_workers']}, the "
                f"call {workers}"
            )
        scope = checks.positive_int(
            kwargs["all_reduce_merge_scope"], "all_reduce_merge_scope"
        )
        packs = collective_packing.collective_packs(
            sizes, dtypes, bytes_per_pack, scope
        )
        return _collective_traffic(tensors, packs, n, k, False, compression)
    if name == "HierarchicalCollectiveAllReduce":
        packs = collective_packing.collective_packs(
            sizes, dtypes, bytes_per_pack, len(tensors)
        )
        return _collective_traffic(tensors, packs, n, k, True, compression)
    # tf.MultiWorkerMirroredStrategy: one RING collective per pack of
    # `bytes_per_pack` (0: all values in one pack).
    implementation = kwargs["implementation"]
    if implementation not in ("RING", "AUTO"):
        raise ValueError(
            f"implementation: the model knows 'RING' and 'AUTO' (RING on "
            f"CPUs), got {implementation!r}"
        )
    packs = collective_packing.collective_packs(
        sizes, dtypes, bytes_per_pack, max(1, len(tensors))
    )
    return _collective_traffic(tensors, packs, n, k, False, None)


def predict(
    config: Config,
    gradients: Gradients,
    *,
    devices_per_worker: int,
    num_workers: int = 1,
    constants: Constants | None = None,
    cores_per_worker: float | None = None,
) -> float:
    """Predicted seconds per all-reduce step of `gradients` by `config`.

    Args:
        config: `(class_name, kwargs)`, a constructor call of one of
            `CONFIG_NAMES` ("tf.*" name TensorFlow's built-ins).
            MultiWorkerAllReduce's `worker_devices`, CollectiveAllReduce's
            `num_workers` may be left out.
        gradients: `(shape, dtype_name)` per tensor of one replica.
        devices_per_worker: replicas (devices) in each worker process.
        num_workers: worker processes.
        constants: the model's constants (default `DEFAULT_CONSTANTS`).
        cores_per_worker: each worker's cores, dividing the per-core terms
            (None: the constants as fitted; with `constants_for_link`,
            whose per-core terms are per whole core, pass it).

    Returns:
        Seconds, the busiest worker's time.

    Raises:
        ValueError: a config the model cannot price; the message names the
            argument (`config`, `all_reduce_spec`, `compression`,
            `num_packs`, `gradients[i]`, ...) and what is allowed.
        TypeError: an argument of the wrong type.

    >>> grads = [((256,), "float32")] * 1000
    >>> one_by_one = predict(("SpecAllReduce", {"all_reduce_spec": "pscpu"}),
    ...                      grads, devices_per_worker=8)
    >>> packed = predict(("SpecAllReduce", {"all_reduce_spec": "pscpu",
    ...                                     "num_packs": 1}),
    ...                  grads, devices_per_worker=8)
    >>> packed < one_by_one
    True
    """
    t = traffic_of(
        config,
        gradients,
        devices_per_worker=devices_per_worker,
        num_workers=num_workers,
    )
    return (constants or DEFAULT_CONSTANTS).seconds(t, cores_per_worker)


# --- fitting ------------------------------------------------------------


def nnls(a: Any, b: Any, max_iterations: int = 200) -> Any:
    """Non-negative least squares, Lawson and Hanson's active-set method.

    >>> import numpy as np
    >>> nnls(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([2.0, -1.0]))
    array([2., 0.])
    """
    import numpy as np

    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    cols = a.shape[1]
    x = np.zeros(cols)
    passive = np.zeros(cols, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0)))
    for _ in range(max_iterations):
        w = a.T @ (b - a @ x)
        if passive.all() or (w[~passive] <= tol).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(cols)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            negative = passive & (z <= 0)
            steps = x[negative] / (x[negative] - z[negative])
            x = x + steps.min() * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def measured_counts(
    measurement: Measurement | tuple,
    link_rate: float | None = None,
    argument: str = "measurement",
) -> tuple[float, ...]:
    """The counts `fit` multiplies each of `Constants`' fields by for one
    measurement: its `features`, the per-core ones over its
    `cores_per_worker`, the wire's per-byte ones scaled to links of
    `link_rate` bits/s where it names its own rate (`fit`'s `link_rate`).

    Raises:
        ValueError: the measurement names a link rate and `link_rate` is
            None, or a rate is not a positive number; the message names
            `argument`.

    >>> config = ("MultiWorkerAllReduce", {"all_reduce_spec": "xring"})
    >>> m = Measurement(config, [((250,), "float32")], 1, 2, 1.0, None, 4e9)
    >>> measured_counts(m, link_rate=1e9)[:2]   # 1000 bytes at a 4x rate
    (2.0, 250.0)
    """
    m = Measurement(*measurement)
    if link_rate is not None:
        link_rate = checks.positive_number(link_rate, "link_rate")
    t = traffic_of(
        m.config,
        m.gradients,
        devices_per_worker=m.devices_per_worker,
        num_workers=m.num_workers,
    )
    counts = features(t, m.cores_per_worker)
    if m.link_rate is None:
        return counts
    if link_rate is None:
        raise ValueError(
            f"link_rate: {argument} was made on links of {m.link_rate!r} "
            "bits/s; pass the rate the constants are for"
        )
    rate = checks.positive_number(m.link_rate, f"{argument}.link_rate")
    return _wire_scaled(counts, link_rate / rate)


def fit(
    measurements: Iterable[Measurement | tuple],
    *,
    relative: bool = True,
    fields: Sequence[str] = LOOPBACK_FIELDS,
    link_rate: float | None = None,
) -> Constants:
    """Fits `Constants` to measured steps by non-negative least squares.

    Args:
        measurements: `Measurement`s or tuples `(config, gradients,
            devices_per_worker, num_workers, seconds[, cores_per_worker[,
            link_rate]])`.
        relative: minimise squared relative errors (each row divided by
            its seconds), so fast and slow steps weigh alike; else
            absolute errors.
        fields: the constants to fit (the others are 0): by default those
            loopback measurements tell apart (`LOOPBACK_FIELDS`); `FIELDS`
            for hosts on links of known rate.
        link_rate: the link rate (bits/s each way) the constants are for,
            where measurements on links of several rates are fitted
            together: a measurement's own `link_rate` scales its wire
            bytes (beta_net, beta_incast) by `link_rate / its rate`, as
            `at_link_rate` moves the constants. Where one rate's wire
            hides the cores' work, another's shows it: fitted together,
            the per-core terms are resolved. None: every measurement is on
            the same links (or none).

    Returns:
        The constants; a field no measurement exercises is 0.

    Raises:
        ValueError: no measurements, a non-positive time or rate, an
            unknown field, a config `predict` rejects, or a measurement's
            `link_rate` without the fit's.

    >>> grads = [((1000,), "float32")] * 10
    >>> rows = [(("SpecAllReduce", {"all_reduce_spec": s, "num_packs": p}),
    ...          grads, d, 1, predict(("SpecAllReduce",
    ...          {"all_reduce_spec": s, "num_packs": p}), grads,
    ...          devices_per_worker=d))
    ...         for s in ("xring", "pscpu", "rechd") for p in (0, 1, 4)
    ...         for d in (2, 4, 8)]
    >>> c = fit(rows)
    >>> abs(c.delta / DEFAULT_CONSTANTS.delta - 1) < 0.01
    True
    """
    import numpy as np

    chosen = []
    for field in fields:
        if field not in FIELDS:
            raise ValueError(
                f"fields: unknown constant {field!r}; expected some of "
                f"{', '.join(FIELDS)}"
            )
        chosen.append(FIELDS.index(field))
    if link_rate is not None:
        link_rate = checks.positive_number(link_rate, "link_rate")
    rows, times = [], []
    for i, m in enumerate(measurements):
        m = Measurement(*m)
        seconds = checks.positive_number(m.seconds, f"measurements[{i}]")
        counts = measured_counts(m, link_rate, f"measurements[{i}]")
        rows.append([counts[j] for j in chosen])
        times.append(seconds)
    if not rows:
        raise ValueError("measurements: expected at least one")
    a = np.array(rows, dtype=float)
    b = np.array(times, dtype=float)
    if relative:
        a, b = a / b[:, None], np.ones_like(b)
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    x = nnls(a / scale, b) / scale
    values = dict.fromkeys(FIELDS, 0.0)
    for j, value in zip(chosen, x, strict=True):
        values[FIELDS[j]] = float(value)
    return Constants(**values)


# --- recommendation -----------------------------------------------------


def candidates(
    num_workers: int, devices_per_worker: int, *, device_type: str = "CPU"
) -> list[Config]:
    """The configurations `recommend` compares: the package's one list.

    Every algorithm at 1 to 8 shards with every packing, spec ranges
    across workers and the between-graph collectives (no compression: it
    changes the numbers, so the caller opts in). autotune times a
    selection of it, and so does the benchmark.

    Args:
        num_workers: worker processes.
        devices_per_worker: replicas in each worker process.
        device_type: "GPU" adds NCCL: `SpecAllReduce("nccl")` on one
            worker, the two-level specs "nccl/..." across workers with
            several devices each.

    >>> len(candidates(1, 4)) > 10
    True
    >>> candidates(2, 1)[0]
    ('MultiWorkerAllReduce', {'all_reduce_spec': ('pscpu/pscpu', 2, -1)})
    """
    return _grid.candidates(num_workers, devices_per_worker, device_type)


def recommend(
    gradients: Gradients,
    *,
    num_workers: int,
    devices_per_worker: int = 1,
    constants: Constants | None = None,
    cores_per_worker: float | None = None,
) -> tuple[Config, float]:
    """The fastest of `candidates` by `predict`, and its predicted seconds.

    What the answer assumes, for a cluster far larger than any measured
    one: the constants' machine (the loopback defaults: the benchmark's
    2-core machine, where the cores bound every transfer; or
    `constants_for_link(rate)`: hosts whose link of that rate is the
    bottleneck, a non-blocking switch, one worker per host); every worker
    has `devices_per_worker` replicas and `cores_per_worker` cores; and the
    per-message, per-collective, incast and per-pack terms keep the values
    fitted on at most 4 workers (so for 64 to 1024 workers the latency
    terms, which grow with the worker count, are extrapolated, and any
    that fitted 0 make latency-bound algorithms look no better than
    bandwidth-bound ones). No compression: it changes the numbers, so
    the caller opts in.

    Args:
        gradients: `(shape, dtype_name)` per tensor of one replica.
        num_workers: worker processes (1: one process, `SpecAllReduce` and
            friends; more: `MultiWorkerAllReduce` or the collectives).
        devices_per_worker: replicas in each worker process.
        constants: default `DEFAULT_CONSTANTS`.
        cores_per_worker: as `predict`.

    Returns:
        `(config, seconds)`. A single-worker config builds with
        `getattr(tf_crossdevice, config[0])(**config[1])`; a
        MultiWorkerAllReduce config needs `worker_devices` and
        `num_gpus_per_worker` added, a collective one goes into
        `tf_crossdevice.MultiWorkerMirroredStrategy`.

    >>> config, seconds = recommend([((64,), "float32")] * 100,
    ...                             num_workers=1, devices_per_worker=4)
    >>> ops = getattr(tf_crossdevice, config[0])(**config[1])
    >>> isinstance(ops, tf.distribute.CrossDeviceOps), seconds > 0
    (True, True)
    """
    tensors = _check_gradients(gradients)
    grads = [((t.elements,), t.dtype) for t in tensors]
    workers = checks.positive_int(num_workers, "num_workers")
    k = checks.positive_int(devices_per_worker, "devices_per_worker")
    best: tuple[float, int, Config] | None = None
    for i, config in enumerate(candidates(workers, k)):
        seconds = predict(
            config,
            grads,
            devices_per_worker=k,
            num_workers=workers,
            constants=constants,
            cores_per_worker=cores_per_worker,
        )
        if best is None or seconds < best[0]:
            best = (seconds, i, config)
    assert best is not None
    return best[2], best[0]
