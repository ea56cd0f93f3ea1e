"""Fitting the cost model to measured steps.

A `Measurement` is one configuration's measured step; `measured_counts`
are the counts each constant multiplies for it, moved to the link rate
the fit is for; `fit` solves for the constants (`Constants.fitted`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from tf_crossdevice._core import checks
from tf_crossdevice.tuning._cost_constants import (
    LOOPBACK_FIELDS,
    Constants,
    features,
    field_indices,
    wire_scaled,
)
from tf_crossdevice.tuning._cost_inputs import Gradients
from tf_crossdevice.tuning._cost_traffic import traffic_of
from tf_crossdevice.tuning._grid import Config


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
    return wire_scaled(counts, link_rate / rate)


def fit(
    measurements: Iterable[Measurement | tuple],
    *,
    relative: bool = True,
    fields: Sequence[str] = LOOPBACK_FIELDS,
    link_rate: float | None = None,
) -> Constants:
    """Fits `Constants` to measured steps by non-negative least squares
    (`Constants.fitted`).

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
        ImportError: SciPy is not installed (the `fit` extra).

    >>> from tf_crossdevice.tuning.cost_model import DEFAULT_CONSTANTS, predict
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
    field_indices(fields)  # an unknown field is named before anything else
    if link_rate is not None:
        link_rate = checks.positive_number(link_rate, "link_rate")
    rows, times = [], []
    for i, m in enumerate(measurements):
        m = Measurement(*m)
        seconds = checks.positive_number(m.seconds, f"measurements[{i}]")
        rows.append(measured_counts(m, link_rate, f"measurements[{i}]"))
        times.append(seconds)
    if not rows:
        raise ValueError("measurements: expected at least one")
    return Constants.fitted(rows, times, relative=relative, fields=fields)
