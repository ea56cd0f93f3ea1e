"""Groups device strings by the worker (job, replica, task) that owns them.

Pure Python string parsing; no TensorFlow.

>>> from tf_crossdevice._core import workers
>>> workers.group_by_worker([
...     "/job:worker/replica:0/task:0/device:GPU:0",
...     "/job:worker/replica:0/task:1/device:GPU:0",
...     "/job:worker/replica:0/task:0/device:GPU:1",
... ])
[[0, 2], [1]]
"""

from __future__ import annotations

from collections.abc import Sequence

from tf_crossdevice._core import checks
from tf_crossdevice._core import devices as devices_lib


def worker_of(device: str, index: int = 0) -> tuple[str, int, int]:
    """Returns the (job, replica, task) that owns `device`.

    A missing job means the local process, '/job:localhost' (TensorFlow
    leaves the job out of graph-mode device names); a missing replica or
    task means 0 (as TensorFlow's canonical names fill them in).

    Args:
        device: a TensorFlow device string, full or partial.
        index: the device's position in the caller's list (error messages).

    Raises:
        TypeError: `device` is not a string.
        ValueError: `device` is not a well-formed device string.

    >>> worker_of("/job:worker/task:3/device:CPU:0")
    ('worker', 0, 3)
    >>> worker_of("/device:GPU:1")
    ('localhost', 0, 0)
    >>> worker_of("/replica:0/task:0/device:CPU:1")
    ('localhost', 0, 0)
    """
    return devices_lib.parse_device(device, f"devices[{index}]").worker


def group_by_worker(devices: Sequence[str]) -> list[list[int]]:
    """Groups the positions of `devices` by the worker that owns each.

    Workers are told apart by (job, replica, task). Devices without a job
    belong to the local process, together with '/job:localhost' devices;
    missing replica or task indices mean 0. Groups come in the order of
    their first device; positions within a group ascend.

    Args:
        devices: device strings, e.g. `[t.device for t in tensors]`; at
            least one. A device may repeat.

    Returns:
        A list of groups; each group lists positions into `devices`, and
        every position is in exactly one group.

    Raises:
        TypeError: `devices` is a string, or not a sequence of strings.
        ValueError: `devices` is empty or holds a malformed device string.

    >>> group_by_worker(["/job:ps/task:0/cpu:0", "/device:CPU:1",
    ...                  "/job:ps/replica:0/task:0/device:CPU:1", ""])
    [[0, 2], [1, 3]]
    """
    checks.string_list(devices, "devices", "device string")
    groups: dict[tuple[str, int, int], list[int]] = {}
    for i, device in enumerate(devices):
        groups.setdefault(worker_of(device, i), []).append(i)
    return list(groups.values())
