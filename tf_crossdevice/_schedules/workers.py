"""Groups device strings by the worker (job, replica, task) that owns them.

Pure Python string parsing; no TensorFlow.

>>> from tf_crossdevice._schedules import workers
>>> workers.group_by_worker([
...     "/job:worker/replica:0/task:0/device:GPU:0",
...     "/job:worker/replica:0/task:1/device:GPU:0",
...     "/job:worker/replica:0/task:0/device:GPU:1",
... ])
[[0, 2], [1]]
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
_INDEX = re.compile(r"[0-9]+", re.ASCII)
_DEVICE_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
_DEVICE_INDEX = re.compile(r"[0-9]+|\*", re.ASCII)

# The key of the process that runs the code: devices named without a job,
# and '/job:localhost' devices, belong to it.
_LOCAL = ("localhost", 0, 0)


def _bad(device: str, index: int, problem: str) -> ValueError:
    return ValueError(
        f"devices[{index}]: {problem} in device string {device!r}; expected "
        "a TensorFlow device name such as "
        "'/job:worker/replica:0/task:1/device:GPU:0', '/device:CPU:0' or "
        "'/cpu:0'"
    )


def worker_of(device: str, index: int = 0) -> tuple[str, int, int]:
    """Returns the (job, replica, task) that owns `device`.

    A missing job means the local process, '/job:localhost'; a missing
    replica or task means 0 (as TensorFlow's canonical names fill them in).

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
    """
    if not isinstance(device, str):
        raise TypeError(
            f"devices[{index}]: expected a device string, got "
            f"{type(device).__name__} {device!r}"
        )
    job, replica, task = None, None, None
    seen_device = False
    for part in filter(None, device.split("/")):
        fields = part.split(":")
        key = fields[0]
        if key in ("job", "replica", "task"):
            if len(fields) != 2:
                raise _bad(device, index, f"malformed part {part!r}")
            value = fields[1]
            if key == "job":
                if job is not None or not _JOB_NAME.fullmatch(value):
                    raise _bad(device, index, f"bad or repeated part {part!r}")
                job = value
            else:
                if not _INDEX.fullmatch(value):
                    raise _bad(device, index, f"bad {key} index in {part!r}")
                if (replica if key == "replica" else task) is not None:
                    raise _bad(device, index, f"repeated part {part!r}")
                if key == "replica":
                    replica = int(value)
                else:
                    task = int(value)
            continue
        # A device part: 'device:TYPE:INDEX', 'TYPE:INDEX' or legacy 'cpu:0'.
        if key == "device":
            fields = fields[1:]
        if (
            seen_device
            or len(fields) != 2
            or not _DEVICE_TYPE.fullmatch(fields[0])
            or not _DEVICE_INDEX.fullmatch(fields[1])
        ):
            raise _bad(device, index, f"unexpected part {part!r}")
        seen_device = True
    if job is None:
        if replica is not None or task is not None:
            raise _bad(device, index, "a replica or task without a job")
        return _LOCAL
    return job, replica or 0, task or 0


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
    if isinstance(devices, str) or not isinstance(devices, Sequence):
        raise TypeError(
            "devices: expected a sequence of device strings, got "
            f"{type(devices).__name__} {devices!r}"
        )
    if not devices:
        raise ValueError("devices: expected at least one device, got none")
    groups: dict[tuple[str, int, int], list[int]] = {}
    for i, device in enumerate(devices):
        groups.setdefault(worker_of(device, i), []).append(i)
    return list(groups.values())
