"""The cost model's constants: what each prices, the values shipped.

`Constants` holds one number per term of the model (`FIELDS`): it prices
a step's counts (`seconds`, through `features`) and is fitted to measured
ones (`fitted`). The package ships two fits: `DEFAULT_CONSTANTS`, on the
benchmark's loopback workers, and one on emulated hosts joined by links
of known rate, which `constants_for_link` moves to another rate
(`at_link_rate`). `ordering_constants` is what autotune orders its
candidates with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from tf_crossdevice._core import checks
from tf_crossdevice.tuning import _cost_least_squares as least_squares
from tf_crossdevice.tuning._traffic import Traffic


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

    @classmethod
    def fitted(
        cls,
        counts: ArrayLike,
        seconds: ArrayLike,
        *,
        relative: bool = True,
        fields: Sequence[str] | None = None,
    ) -> Constants:
        """The constants that price `counts` nearest to the measured
        `seconds`.

        Non-negative least squares (SciPy's: the `fit` extra) on the
        counts' columns scaled to unit norm. `cost_model.fit` fits
        measurements through it.

        Args:
            counts: one row per step: the step's count per field, in the
                order of `FIELDS` (its `features`, or `measured_counts`).
            seconds: each step's time, positive.
            relative: minimise squared relative errors (each row divided
                by its seconds), so fast and slow steps weigh alike; else
                absolute errors.
            fields: the constants to fit (the others are 0); None: all.

        Returns:
            The constants; a field no row exercises is 0.

        Raises:
            ValueError: an unknown field, no rows, a row without one count
                per field, or not one positive time per row.
            ImportError: SciPy is not installed.

        >>> steps = [[1, 0, 0, 0, 0, 0, 0, 1, 0, 0],   # 1 message
        ...          [2, 0, 0, 0, 0, 0, 0, 1, 0, 0]]   # 2 messages
        >>> c = Constants.fitted(steps, [3e-3, 5e-3])
        >>> round(c.alpha_net, 9), round(c.step, 9)
        (0.002, 0.001)
        """
        chosen = field_indices(FIELDS if fields is None else fields)
        a = np.asarray(counts, dtype=float)
        b = np.asarray(seconds, dtype=float)
        if a.ndim != 2 or not len(a) or a.shape[1] != len(FIELDS):
            raise ValueError(
                f"counts: expected rows of {len(FIELDS)} counts (one per "
                f"field of FIELDS), got shape {a.shape}"
            )
        if b.shape != (len(a),):
            raise ValueError(
                f"seconds: expected one time per row of counts ({len(a)}), "
                f"got shape {b.shape}"
            )
        bad = np.flatnonzero(~(b > 0))
        if bad.size:
            raise ValueError(
                f"seconds[{bad[0]}]: expected a positive time, got "
                f"{float(b[bad[0]])}"
            )
        x = least_squares.nonnegative_least_squares(
            a[:, chosen], b, relative=relative
        )
        values = dict.fromkeys(FIELDS, 0.0)
        for j, value in zip(chosen, x, strict=True):
            values[FIELDS[j]] = float(value)
        return cls(**values)


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


def field_indices(fields: Sequence[str]) -> list[int]:
    """The positions of `fields` in `FIELDS`.

    Raises:
        ValueError: a name that is not a field of `Constants`.

    >>> field_indices(["step", "alpha_net"])
    [7, 0]
    """
    chosen = []
    for field in fields:
        if field not in FIELDS:
            raise ValueError(
                f"fields: unknown constant {field!r}; expected some of "
                f"{', '.join(FIELDS)}"
            )
        chosen.append(FIELDS.index(field))
    return chosen


# Fitted by `python -m benchmarks.cost_fit` on the loopback records
# (benchmarks/records/) that docs/benchmark/cost_model.md names (`fit` on
# every verified, timed candidate of their groups), so that the model
# ranks configurations as the measured steps on the benchmark's machine
# (logical CPU devices, loopback gRPC workers) rank them; that page gives
# the fit's errors per group. Other hardware needs its own `fit`; hosts on
# links of known rate, `constants_for_link`.
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
# field) on the 1 Gbit/s records (benchmarks/records/) that
# docs/benchmark/cost_model_hosts.md names (a faster rate there is held
# out), made on the benchmark's emulated hosts: one network namespace per
# host, links shaped to `_EMULATED_RATE` bits/s both ways, each host an
# equal share of the machine's cores; the per-core terms are per whole
# core. That page gives the recovered link rate and the held-out
# predictions.
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


def wire_scaled(values: Sequence[float], factor: float) -> tuple[float, ...]:
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
        *wire_scaled(dataclasses.astuple(constants), fitted / rate)
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
