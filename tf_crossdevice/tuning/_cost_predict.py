"""Pricing configurations: `predict` one, `recommend` the fastest.

`candidates` is the package's one list of configurations (`_grid`), which
`recommend` prices for a cluster with `predict`.
"""

from __future__ import annotations

from tf_crossdevice._core import checks
from tf_crossdevice.tuning import _grid
from tf_crossdevice.tuning._cost_constants import DEFAULT_CONSTANTS, Constants
from tf_crossdevice.tuning._cost_inputs import Gradients, check_gradients
from tf_crossdevice.tuning._cost_traffic import traffic_of
from tf_crossdevice.tuning._grid import Config


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
    tensors = check_gradients(gradients)
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
