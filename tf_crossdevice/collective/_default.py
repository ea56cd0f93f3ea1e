"""The strategy's collective when the user names none, chosen from what it
can see: the worker count and the local devices.

Measured between emulated hosts (docs/guides/choosing-an-algorithm.md):
with one device per worker the flat `CollectiveAllReduce` is the fastest
exact collective; with several CPU devices per worker, its one ring over
every device of every worker sends each pack's bytes across worker
boundaries once per local device, and `HierarchicalCollectiveAllReduce`
(a local sum, one member per worker, a local copy) ran 1.4x faster. On
GPUs the flat class runs NCCL over every GPU, which already keeps a
node's traffic inside it, so the flat class stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from absl import logging

from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice.collective._all_reduce import CollectiveAllReduce
from tf_crossdevice.collective._hierarchical import (
    HierarchicalCollectiveAllReduce,
)
from tf_crossdevice.ops import CrossDeviceOpsAdapter

_logged: set[tuple[str, int, int]] = set()


def default_collective(
    devices: Sequence[str], num_workers: int
) -> CrossDeviceOpsAdapter:
    """The collective for `devices` (this worker's) on `num_workers`
    workers, the choice logged once per process and setting.

    >>> type(default_collective(["/cpu:0"], 4)).__name__
    'CollectiveAllReduce'
    >>> type(default_collective(["/cpu:0", "/cpu:1"], 4)).__name__
    'HierarchicalCollectiveAllReduce'
    >>> type(default_collective(["/cpu:0", "/cpu:1"], 1)).__name__
    'CollectiveAllReduce'
    """
    kinds = {devices_lib.parse_device(d).device_type for d in devices}
    hierarchical = len(devices) > 1 and num_workers > 1 and kinds == {"CPU"}
    ops: CrossDeviceOpsAdapter = (
        HierarchicalCollectiveAllReduce()
        if hierarchical
        else CollectiveAllReduce()
    )
    _log_choice(type(ops).__name__, len(devices), num_workers)
    return ops


def _log_choice(name: str, local: int, workers: int) -> None:
    if (name, local, workers) in _logged:
        return
    _logged.add((name, local, workers))
    why = (
        "several CPU devices per worker: one collective member per worker "
        "sends each pack across workers once"
        if name == "HierarchicalCollectiveAllReduce"
        else "the fastest exact collective measured for this setting"
    )
    logging.info(
        "tf_crossdevice: MultiWorkerMirroredStrategy chose %s for %d local "
        "device(s) on each of %d worker(s) (%s); pass cross_device_ops= to "
        "choose another",
        name,
        local,
        workers,
        why,
    )
