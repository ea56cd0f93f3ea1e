"""The CrossDeviceOps that suits a list of devices and their links.

This is the rule `select_cross_device_ops` falls back on when it has no
gradients to tune for, and the local reducer `HierarchicalCollectiveAllReduce`
uses inside each worker when none is given. It measures nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from absl import logging

from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice._core import tf_internal
from tf_crossdevice.ops import _links as topology
from tf_crossdevice.ops import _single_host as _ops
from tf_crossdevice.ops import _spec as _spec_ops

# Small-tensor packing for CPU devices: each op costs a fixed overhead on a
# CPU, so many small tensors are concatenated into few ops (tensors of up to
# 64 KiB, in groups of up to 1024).
_CPU_PACK_BYTES = 64 * 1024
_CPU_PACK_GROUP = 1024


def default_cross_device_ops(
    canonical: Sequence[str], link_matrix: topology.LinkMatrix | None = None
) -> tf.distribute.CrossDeviceOps:
    """The rule for canonical device strings (see select_cross_device_ops).

    >>> cpus = [f"/job:localhost/replica:0/task:0/device:CPU:{i}"
    ...         for i in (0, 1)]
    >>> type(default_cross_device_ops(cpus)).__name__
    'SpecAllReduce'
    """
    names = [devices_lib.parse_device(d) for d in canonical]
    kinds = {n.device_type for n in names}
    if kinds != {"GPU"}:
        logging.info(
            "select_cross_device_ops: %s are not all GPUs; using pscpu with "
            "small tensors packed.",
            ", ".join(canonical),
        )
        return _spec_ops.SpecAllReduce(
            "pscpu",
            num_packs=0,
            agg_small_grads_max_bytes=_CPU_PACK_BYTES,
            agg_small_grads_max_group=_CPU_PACK_GROUP,
        )
    if len({n.worker for n in names}) > 1:
        logging.info(
            "select_cross_device_ops: GPUs of several workers; "
            "hierarchical copy with 1 pack."
        )
        return _ops.HierarchicalCopyAllReduce(num_packs=1)
    if link_matrix is None:
        link_matrix = _local_link_matrix(canonical)
    if topology.is_dgx1_like(link_matrix):
        logging.info(
            "select_cross_device_ops: DGX-1-like links; "
            "hierarchical copy with 8 packs."
        )
        return _ops.HierarchicalCopyAllReduce(num_packs=8)
    logging.info("select_cross_device_ops: NCCL all-reduce.")
    return _ops.NcclAllReduce(num_packs=1)


def _local_link_matrix(devices: Sequence[str]) -> list[list[bool]]:
    links = tf_internal.local_gpu_links()
    ids = [devices_lib.parse_device(d).device_index for d in devices]
    matrix = [[False] * len(devices) for _ in devices]
    for i, device in enumerate(devices):
        for j, other in enumerate(ids):
            matrix[i][j] = other in links.get(device, [])
    return matrix
