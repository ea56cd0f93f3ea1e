"""Picks a CrossDeviceOps from the devices and how they are linked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import checks
from tf_crossdevice._core import values as values_lib
from tf_crossdevice.ops import (
    LinkMatrix,
    check_link_matrix,
    default_cross_device_ops,
)
from tf_crossdevice.tuning import cost_model
from tf_crossdevice.tuning._cache import cache_file, read_cache
from tf_crossdevice.tuning._configs import label, make_ops
from tf_crossdevice.tuning._topology import Topology, normalize_gradients


def select_cross_device_ops(
    devices: Sequence[str],
    link_matrix: LinkMatrix | None = None,
    *,
    gradients: Any = None,
    cache_dir: Any = None,
) -> tf.distribute.CrossDeviceOps:
    """The CrossDeviceOps that suits `devices` (and `gradients`).

    With `gradients`, in this order:

    - `tf_crossdevice.autotune`'s cached choice for the same topology
      (device type, devices per worker, workers, versions) and gradient
      shapes and dtypes, from `cache_dir` (None: autotune's default
      folder). Nothing is measured here: run `autotune` once for that.
    - Else the cost model's recommendation (`cost_model.recommend`).

    Otherwise, or without `gradients`, these rules:

    - Any device that is not a GPU: `SpecAllReduce("pscpu",
      agg_small_grads_max_bytes=64 KiB, agg_small_grads_max_group=1024)`:
      small tensors packed into groups, each summed in shards on the CPU.
      On CPU devices every tensor costs a few ops on every device whatever
      its size, so reducing many small gradients one by one is dominated by
      that per-op cost; packing them into a few groups removes most of it,
      and summing each group in shards spreads the work over the devices.
      It is a safe default, not always the best: on some models another
      algorithm with the same packing is faster, which `autotune` finds.
    - GPUs whose links form a DGX-1-like hybrid cube-mesh (8 GPUs, each
      linked to the three others of its quad and to its peer in the other
      quad): `HierarchicalCopyAllReduce(num_packs=8)`.
    - Other GPUs of one worker: `NcclAllReduce(num_packs=1)`.
    - GPUs of several workers (NCCL runs inside one process):
      `HierarchicalCopyAllReduce(num_packs=1)`.

    Args:
        devices: the replicas' device strings.
        link_matrix: for GPUs, `link_matrix[i][j]` is true when device i has a
            direct link (NVLink) to device j. None reads the links TensorFlow
            reports for the local GPUs.
        gradients: what will be reduced, as `autotune` takes it (a Keras
            model, or a list of (shape, dtype) pairs, tensors or variables).
        cache_dir: where autotune's cache files are (None: its default).

    Devices of this process's job that it does not have (GPUs named on a
    machine without them) are logged as a warning naming them and the
    choice, which is still made for the devices as named. Checking lists
    the process's devices, which initializes TensorFlow's runtime (as
    building a strategy does): configure logical devices before calling.

    Returns:
        A new CrossDeviceOps instance.

    Raises:
        ValueError: `devices` is empty or holds an unparsable device string,
            or `link_matrix` is not len(devices) x len(devices), or a bad
            `gradients` entry.
        TypeError: `devices` is not a list of strings, or `gradients` is
            not one of the kinds above.

    >>> select_cross_device_ops(["/cpu:0", "/cpu:1"]).__class__.__name__
    'SpecAllReduce'
    >>> dgx1 = tf_crossdevice.select_cross_device_ops(
    ...     [f"/gpu:{i}" for i in range(8)],
    ...     link_matrix=tf_crossdevice.ops.dgx1_link_matrix())
    >>> type(dgx1).__name__, dgx1._num_packs
    ('HierarchicalCopyAllReduce', 8)
    """
    checks.string_list(devices, "devices", "device string")
    canonical = [values_lib.canonical_device(d, "devices") for d in devices]
    if link_matrix is not None:
        check_link_matrix(link_matrix, len(devices))
    chosen = None
    if gradients is not None:
        chosen = _from_gradients(canonical, gradients, cache_dir)
    if chosen is None:
        chosen = default_cross_device_ops(canonical, link_matrix)
    missing = values_lib.missing_devices(canonical)
    if missing:
        # Not an error: a plan for another machine is a fair use, but on
        # this one a typo or a missing GPU picks for devices that never run.
        logging.warning(
            "select_cross_device_ops: %s not in this process (it has %s); "
            "chose %r for the devices as named",
            ", ".join(missing),
            values_lib.local_device_names(),
            chosen,
        )
    return chosen


def _from_gradients(
    devices: list[str], gradients: Any, cache_dir: Any
) -> tf.distribute.CrossDeviceOps | None:
    """autotune's cached choice, else the cost model's; None: neither."""
    grads = normalize_gradients(gradients)
    where = Topology.of(devices)
    path = cache_file(where, grads, cache_dir)
    entry = read_cache(path, where)
    if entry is not None:
        logging.info(
            "select_cross_device_ops: autotune's %s (cached in %s)",
            entry["label"],
            path,
        )
        return make_ops(entry["config"], where)
    config, seconds = cost_model.recommend(
        grads,
        num_workers=where.num_workers,
        devices_per_worker=where.local_devices,
    )
    logging.info(
        "select_cross_device_ops: the cost model's %s (%.3g ms predicted)",
        label(config),
        seconds * 1e3,
    )
    return make_ops(config, where)
