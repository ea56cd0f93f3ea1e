"""Every TensorFlow private this package touches, in one place.

Checked against TensorFlow 2.21. TensorFlow exposes no public constructor for
PerReplica / Mirrored values, no public device canonicaliser and no public
NCCL op wrapper; everything else in tf_crossdevice uses the public API.
"""

from __future__ import annotations

from tensorflow.python.distribute import collective_util, device_util
from tensorflow.python.distribute import values as _values

PerReplica = _values.PerReplica
Mirrored = _values.Mirrored
DistributedValues = _values.DistributedValues
# tf.distribute.experimental.CommunicationOptions(...) builds one of these.
CommunicationOptions = collective_util.Options


def canonicalize_device(device: str) -> str:
    """Full device name, e.g. '/job:localhost/replica:0/task:0/device:CPU:1'."""
    return device_util.canonicalize(device)


def resolve_device(device: str) -> str:
    """`device` completed from the enclosing `tf.device` scope, canonical.

    What TensorFlow's CrossDeviceOps do with destination strings: under
    `tf.device("/job:worker/task:1")`, "/cpu:0" is task 1's CPU.
    """
    return device_util.resolve(device)


def nccl_all_sum(tensors):
    """TensorFlow's NCCL all-reduce (sum) over tensors on distinct GPUs."""
    from tensorflow.python.ops import nccl_ops  # Loads the NCCL kernels.

    return nccl_ops.all_sum(tensors)


def local_gpu_links() -> dict[str, list[int]]:
    """Each local GPU's canonical name -> the TF GPU ids it has links to."""
    from tensorflow.python.client import device_lib

    links = {}
    for device in device_lib.list_local_devices():
        if device.device_type == "GPU":
            links[canonicalize_device(device.name)] = [
                link.device_id for link in device.locality.links.link
            ]
    return links
