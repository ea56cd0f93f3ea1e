"""Shuffle all-reduce: gather shards on a few devices, sum, scatter back.

TensorFlow 1 called it `pscpu` when the gather devices are the workers' CPUs
and `psgpu` when they are the workers' GPUs: `pscpu_builder` gathers on each
worker's host CPU, `psgpu_builder` on the replicas' own devices (on logical
CPU devices that spreads the shards over the replica CPUs).

Each device sends its tensor (S bytes, in shards) to the gather devices and
receives the S-byte sum back; gather device k receives n·S_k and sends
n·S_k, where S_k is the size of the shards it owns. It suits few devices or
a fast host link; for many devices prefer a ring.

Example on 4 logical CPUs, summed on a fifth (`pscpu` style):

>>> from tf_crossdevice.algorithms._shuffle import shuffle_all_reduce
>>> cpus = tf_crossdevice.testing.cpu_devices(5)
>>> tensors = []
>>> for i, d in enumerate(cpus[:4]):
...     with tf.device(d):
...         tensors.append(tf.constant([1.0, 2.0, 3.0]) * (i + 1))
>>> sums = shuffle_all_reduce(tensors, [cpus[4]], num_shards=2)
>>> sums[3].numpy(), sums[3].device == cpus[3]
(array([10., 20., 30.], dtype=float32), True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import tensorflow as tf

from tf_crossdevice._core import devices as devices_lib
from tf_crossdevice.algorithms import _flat
from tf_crossdevice.algorithms import _protocol as protocol
from tf_crossdevice.algorithms import _shuffle_schedule as shuffle_schedule
from tf_crossdevice.compression import Wire, WirePolicy


def _split(flat: tf.Tensor, num_elements: int | None, num_shards: int):
    """Cuts a flat tensor into shards; None elements means unknown size."""
    if num_shards == 1:
        return [flat]
    if num_elements is not None:
        sizes = shuffle_schedule.shard_sizes(num_elements, num_shards)
        return tf.split(flat, sizes)
    # Size known only at run time: pad to a multiple of num_shards; the pad
    # is stripped after the sum.
    n = tf.size(flat)
    pad = (num_shards - n % num_shards) % num_shards
    return tf.split(tf.pad(flat, [[0, pad]]), num_shards)


# Plain Python over a static schedule: autograph would only slow tracing.
@tf.autograph.experimental.do_not_convert
def shuffle_all_reduce(
    tensors: Sequence[tf.Tensor],
    gather_devices: Sequence[str],
    num_shards: int = 1,
    *,
    wire: WirePolicy | None = None,
) -> list[tf.Tensor]:
    """Sums `tensors` elementwise by gathering shards on `gather_devices`.

    Each tensor is flattened and cut into `num_shards` contiguous shards
    (sizes differ by at most one element; empty shards are skipped). Shard j
    of every device is copied to `gather_devices[j % len(gather_devices)]`,
    summed there with `tf.add_n`, and the sum is copied back to every
    device, where the shards are concatenated and reshaped. A single tensor
    (or one with no elements) is returned as a copy on its own device, with
    no traffic. Tensors whose
    size is only known at run time are zero-padded to a multiple of
    `num_shards` and the pad is stripped afterwards.

    Works eagerly, inside `tf.function` and in TF1 graphs; places ops only
    with `tf.device(t.device)` and `tf.device(gather_device)`.

    Args:
        tensors: one dense tensor per device, all of one shape and dtype;
            each tensor's `.device` says where it lives.
        gather_devices: where shards are summed, e.g. each worker's
            '/device:CPU:0' (pscpu) or the GPUs (psgpu). May include the
            devices of `tensors`.
        num_shards: how many shards each tensor is cut into, at least 1.
        wire: how values cross workers: float32 and float64 values travel
            as 16 bits with a codec (see
            `tf_crossdevice.compression.WirePolicy`); None: as they are.

    Returns:
        The sums: element i is on `tensors[i].device` with the shape and
        dtype of `tensors[i]`.

    Raises:
        TypeError: `tensors` are not dense tensors, dtypes differ or are not
            in `_flat.SUPPORTED_DTYPES`, or `gather_devices` is not a
            sequence of strings.
        ValueError: `tensors` or `gather_devices` is empty, shapes differ,
            or `num_shards` is less than 1 (TypeError if not an int).
    """
    tensors = _flat.check_inputs(tensors, num_shards)
    if isinstance(gather_devices, str) or not isinstance(
        gather_devices, Sequence
    ):
        raise TypeError(
            "gather_devices: expected a list of device strings, got "
            f"{type(gather_devices).__name__} {gather_devices!r}"
        )
    if not gather_devices:
        raise ValueError("gather_devices: expected at least one device")
    for k, d in enumerate(gather_devices):
        if not isinstance(d, str):
            raise TypeError(
                f"gather_devices[{k}]: expected a device string, got "
                f"{type(d).__name__} {d!r}"
            )

    num_elements = tensors[0].shape.num_elements()
    if num_elements is None:
        # The shapes agree, so one static shape fixes the size for all.
        num_elements = next(
            (
                t.shape.num_elements()
                for t in tensors[1:]
                if t.shape.is_fully_defined()
            ),
            None,
        )
    if num_elements == 0 or len(tensors) == 1:
        # Nothing to send: the sum of one tensor is itself, and the sum of
        # empty tensors is empty.
        outputs = []
        for t in tensors:
            with tf.device(t.device):
                outputs.append(tf.identity(t))
        return outputs

    transfers = Wire(
        [t.device for t in tensors] + list(gather_devices),
        tensors[0].dtype,
        wire,
    )
    shards_per_device = []
    for t in tensors:
        with tf.device(t.device):
            flat = tf.reshape(t, [-1])
            shards_per_device.append(_split(flat, num_elements, num_shards))

    owners = shuffle_schedule.shard_gather_devices(
        num_shards, len(gather_devices)
    )
    sizes = (
        shuffle_schedule.shard_sizes(num_elements, num_shards)
        if num_elements is not None
        else [None] * num_shards
    )
    sums = []
    for j, owner in enumerate(owners):
        if sizes[j] == 0:
            continue
        gather = gather_devices[owner]
        with tf.device(gather):
            sums.append(
                tf.add_n(
                    [transfers.receive(s[j], gather) for s in shards_per_device]
                )
            )

    outputs = []
    for t in tensors:
        # Compressed, each sum is encoded once and decoded on every device.
        here = (
            [transfers.copy(s, t.device) for s in sums]
            if transfers.active
            else sums
        )
        with tf.device(t.device):
            flat = here[0] if len(here) == 1 else tf.concat(here, 0)
            if num_elements is None and num_shards > 1:
                flat = flat[: tf.size(t)]
            shape = t.shape if t.shape.is_fully_defined() else tf.shape(t)
            outputs.append(tf.reshape(flat, shape))
    return outputs


def worker_cpu(device: str) -> str:
    """The host CPU of the worker that holds `device`.

    >>> worker_cpu("/job:worker/replica:0/task:1/device:GPU:3")
    '/job:worker/replica:0/task:1/device:CPU:0'
    >>> worker_cpu("")
    '/device:CPU:0'
    """
    if not device:
        return "/device:CPU:0"
    name = devices_lib.parse_device(device)
    return dataclasses.replace(
        name, device_type="CPU", device_index=0
    ).to_string()


def _distinct(devices) -> list[str]:
    return list(dict.fromkeys(devices))


def pscpu_builder(
    shards: int = 1, *, wire: WirePolicy | None = None
) -> protocol.AllReduceBuilder:
    """The registry's "pscpu": gathers on the workers' host CPUs."""

    def pscpu(tensors: Sequence[tf.Tensor], num_shards: int):
        cpus = _distinct(worker_cpu(t.device) for t in tensors)
        return shuffle_all_reduce(tensors, cpus, num_shards, wire=wire)

    return protocol.bind_shards(pscpu, shards)


def psgpu_builder(
    shards: int = 1, *, wire: WirePolicy | None = None
) -> protocol.AllReduceBuilder:
    """The registry's "psgpu": gathers on the replicas' own devices."""

    def psgpu(tensors: Sequence[tf.Tensor], num_shards: int):
        devices = _distinct(t.device for t in tensors)
        return shuffle_all_reduce(tensors, devices, num_shards, wire=wire)

    return protocol.bind_shards(psgpu, shards)
