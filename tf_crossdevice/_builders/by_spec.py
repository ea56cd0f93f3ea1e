"""Runs one all_reduce_spec algorithm over tensors placed on devices.

Which devices each algorithm gathers on:
- pscpu: each worker's host CPU (`.../device:CPU:0` of the worker).
- psgpu: the replicas' own devices (TF 1: the workers' GPUs, which are the
  replicas on a GPU machine; on logical CPU devices the same rule spreads the
  shards over the replica CPUs).
- a/b (two-level): `a` inside each worker with one shard, `b` across one
  representative per worker with the spec's shards (as TF 1 did); the
  workers are the (job, replica, task) parts of the device names.
- nccl: TensorFlow's NCCL kernels on GPUs; on other devices it logs once and
  sums on the first device (see `nccl.py`). Shards split each tensor into
  that many independent NCCL all-reduces.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice._builders import (
    _flat,
    halving_doubling,
    nccl,
    ring,
    shuffle,
    two_level,
)
from tf_crossdevice._schedules import spec as spec_lib
from tf_crossdevice._schedules import workers

Algorithm = spec_lib.Algorithm


def worker_cpu(device: str) -> str:
    """The host CPU of the worker that holds `device`.

    >>> worker_cpu("/job:worker/replica:0/task:1/device:GPU:3")
    '/job:worker/replica:0/task:1/device:CPU:0'
    >>> worker_cpu("")
    '/device:CPU:0'
    """
    if not device:
        return "/device:CPU:0"
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(device_type="CPU", device_index=0).to_string()


def spec_all_reduce(
    tensors: Sequence[tf.Tensor],
    alg: spec_lib.AlgorithmLike,
    num_shards: int = 1,
    groups: Sequence[Sequence[int]] | None = None,
) -> list[tf.Tensor]:
    """All-reduce (sum) of one tensor per device with algorithm `alg`.

    Args:
        tensors: one dense tensor per device, same shape and dtype.
        alg: an all_reduce_spec algorithm name, e.g. "xring" or "nccl/rechd".
        num_shards: parallel sub-all-reduces (for two-level: of the outer
            stage).
        groups: tensor positions per worker; default from the device names.
            Tests pass fake workers made of local devices.

    Returns:
        The sums, the i-th on `tensors[i].device`.

    >>> devices = tf_crossdevice.testing.cpu_devices(4)
    >>> tensors = []
    >>> for i, d in enumerate(devices):
    ...     with tf.device(d):
    ...         tensors.append(tf.fill([3], float(i)))
    >>> two_workers = [[0, 1], [2, 3]]
    >>> out = spec_all_reduce(tensors, "pscpu/pscpu", 2, groups=two_workers)
    >>> [t.numpy().tolist() for t in out]
    [[6.0, 6.0, 6.0], [6.0, 6.0, 6.0], [6.0, 6.0, 6.0], [6.0, 6.0, 6.0]]
    """
    algorithm = spec_lib.to_algorithm(alg)
    tensors = list(tensors)
    if not tensors:
        raise ValueError("tensors: expected at least one tensor, got none")
    hierarchy = spec_lib.is_hierarchical(algorithm)
    if hierarchy is None:
        cpus = _distinct(worker_cpu(t.device) for t in tensors)
        return _flat_all_reduce(algorithm, tensors, num_shards, cpus)
    inner, outer = hierarchy
    if groups is None:
        groups = workers.group_by_worker([t.device for t in tensors])

    def inner_all_reduce(group_tensors):
        cpus = [worker_cpu(group_tensors[0].device)]
        return _flat_all_reduce(inner, group_tensors, 1, cpus)

    def outer_all_reduce(representatives):
        cpus = _distinct(worker_cpu(t.device) for t in representatives)
        return _flat_all_reduce(outer, representatives, num_shards, cpus)

    return two_level.two_level_all_reduce(
        tensors, groups, inner_all_reduce, outer_all_reduce
    )


def _distinct(devices) -> list[str]:
    return list(dict.fromkeys(devices))


def _flat_all_reduce(
    alg: Algorithm,
    tensors: list[tf.Tensor],
    num_shards: int,
    cpus: list[str],
) -> list[tf.Tensor]:
    if alg == Algorithm.XRING:
        return ring.ring_all_reduce(tensors, num_shards)
    if alg == Algorithm.RECHD:
        return halving_doubling.halving_doubling_all_reduce(tensors, num_shards)
    if alg == Algorithm.PSCPU:
        return shuffle.shuffle_all_reduce(tensors, cpus, num_shards)
    if alg == Algorithm.PSGPU:
        devices = _distinct(t.device for t in tensors)
        return shuffle.shuffle_all_reduce(tensors, devices, num_shards)
    if alg == Algorithm.NCCL:
        return _sharded_nccl(tensors, num_shards)
    raise ValueError(
        f"alg: {alg.value!r} is not a single-level algorithm; expected one "
        "of nccl, pscpu, psgpu, rechd, xring"
    )


def _sharded_nccl(tensors: list[tf.Tensor], num_shards: int) -> list[tf.Tensor]:
    if num_shards == 1:
        return nccl.nccl_all_reduce(tensors)
    pieces = [_flat.split_flat(t, num_shards) for t in tensors]
    summed = [
        nccl.nccl_all_reduce([p[s] for p in pieces]) for s in range(num_shards)
    ]
    out = []
    for i, t in enumerate(tensors):
        with tf.device(t.device):
            out.append(
                _flat.join_flat([summed[s][i] for s in range(num_shards)], t)
            )
    return out
