"""Counts the bytes a TensorFlow graph moves between devices (test helper).

Stable API, shared by the builders' traffic tests:

- `cross_device_bytes(graph) -> {(src_device, dst_device): bytes}`
- `bytes_sent_by_device(graph) -> {src_device: bytes}`

An edge counts when the op producing a tensor and an op consuming it sit on
different devices. TensorFlow sends a tensor to a device once however many
ops there consume it, so each (tensor, destination device) pair counts once.
Ops with no device ('') are skipped: where they run is not known until
placement. Device names are canonicalised with `tf.DeviceSpec` (missing job
becomes 'localhost', missing replica and task 0), so '/device:CPU:1' and
'/job:localhost/replica:0/task:0/device:CPU:1' are the same device.

Get the graph of a `tf.function` with `f.get_concrete_function(...).graph`.

Example:

>>> from tests import traffic_util
>>> graph = tf.Graph()
>>> with graph.as_default():
...     with tf.device("/device:CPU:0"):
...         x = tf.zeros([10], tf.float32)
...     with tf.device("/device:CPU:1"):
...         y = x + x  # one 40-byte send, although two inputs read x
...         z = tf.identity(x)  # same tensor, same device: still one send
...     w = tf.identity(x)  # no device: skipped
>>> traffic_util.cross_device_bytes(graph)
{('/job:localhost/replica:0/task:0/device:CPU:0', \
'/job:localhost/replica:0/task:0/device:CPU:1'): 40}
>>> traffic_util.bytes_sent_by_device(graph)
{'/job:localhost/replica:0/task:0/device:CPU:0': 40}
"""

from __future__ import annotations

import collections

import tensorflow as tf

_DEFAULTS = tf.DeviceSpec(job="localhost", replica=0, task=0)


def canonical_device(device: str) -> str:
    """Full device name: missing job is 'localhost', replica and task 0.

    Example:

    >>> canonical_device("/device:CPU:1")
    '/job:localhost/replica:0/task:0/device:CPU:1'
    """
    return _DEFAULTS.make_merged_spec(
        tf.DeviceSpec.from_string(device)
    ).to_string()


def cross_device_bytes(graph: tf.Graph) -> dict[tuple[str, str], int]:
    """Bytes moved between each (source, destination) device pair.

    Args:
        graph: a `tf.Graph` (e.g. a concrete function's `.graph`).

    Returns:
        `{(src_device, dst_device): bytes}` over canonical device names, from
        each crossing tensor's static size (elements times dtype size).

    Raises:
        ValueError: a tensor crossing devices has no static size, so its
            bytes cannot be counted.
    """
    totals: dict[tuple[str, str], int] = collections.defaultdict(int)
    seen: set[tuple[str, str]] = set()
    for op in graph.get_operations():
        if not op.device:
            continue
        dst = canonical_device(op.device)
        for tensor in op.inputs:
            if not tensor.op.device:
                continue
            src = canonical_device(tensor.op.device)
            if src == dst or (tensor.name, dst) in seen:
                continue
            seen.add((tensor.name, dst))
            size = tensor.shape.num_elements()
            if size is None:
                raise ValueError(
                    f"graph: tensor {tensor.name!r} goes from {src} to {dst} "
                    f"with no static shape ({tensor.shape}); its bytes cannot "
                    "be counted"
                )
            totals[(src, dst)] += size * tensor.dtype.size
    return dict(totals)


def bytes_sent_by_device(graph: tf.Graph) -> dict[str, int]:
    """Total bytes each device sends to other devices in `graph`.

    Args:
        graph: a `tf.Graph`.

    Returns:
        `{src_device: bytes}`; devices that send nothing are absent.

    Raises:
        ValueError: as `cross_device_bytes`.
    """
    sent: dict[str, int] = collections.defaultdict(int)
    for (src, _), size in cross_device_bytes(graph).items():
        sent[src] += size
    return dict(sent)
