"""TensorFlow device strings, parsed in one place.

Pure Python (no TensorFlow): every part of the package that needs the job,
task or type of a device asks `parse_device`, so a device string means the
same thing everywhere and a malformed one gets the same message.

>>> from tf_crossdevice._core import devices
>>> name = devices.parse_device("/job:worker/replica:0/task:1/device:GPU:0")
>>> name.job, name.task, name.device_type, name.device_index
('worker', 1, 'GPU', 0)
>>> name.worker
('worker', 0, 1)
>>> devices.parse_device("/cpu:1").worker  # No job: the local process.
('localhost', 0, 0)
"""

from __future__ import annotations

import dataclasses
import functools
import re

_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
_INDEX = re.compile(r"[0-9]+", re.ASCII)
_DEVICE_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*", re.ASCII)
_DEVICE_INDEX = re.compile(r"[0-9]+|\*", re.ASCII)

# The job of the process that runs the code: devices named without a job
# (TensorFlow's graph-mode names, '/replica:0/task:0/device:CPU:0') and
# '/job:localhost' devices belong to it.
LOCAL_JOB = "localhost"

_EXAMPLES = (
    "a TensorFlow device name such as "
    "'/job:worker/replica:0/task:1/device:GPU:0', '/device:CPU:0' or '/cpu:0'"
)


@dataclasses.dataclass(frozen=True)
class DeviceName:
    """The parts of a device string; None where the string leaves one out.

    `device_type` is upper case ("CPU", "GPU"); `device_index` is None for
    a missing index and for '*'.
    """

    job: str | None = None
    replica: int | None = None
    task: int | None = None
    device_type: str | None = None
    device_index: int | None = None

    @property
    def worker(self) -> tuple[str, int, int]:
        """(job, replica, task) of the process that owns the device.

        A missing job is the local process ('localhost'); a missing replica
        or task is 0, as TensorFlow's canonical names fill them in.
        """
        return (self.job or LOCAL_JOB, self.replica or 0, self.task or 0)

    def to_string(self) -> str:
        """The device string of the parts named, in TensorFlow's order.

        >>> DeviceName("worker", 0, 1, "CPU", 0).to_string()
        '/job:worker/replica:0/task:1/device:CPU:0'
        >>> DeviceName(device_type="GPU", device_index=1).to_string()
        '/device:GPU:1'
        """
        parts = [
            f"/{key}:{value}"
            for key, value in (
                ("job", self.job),
                ("replica", self.replica),
                ("task", self.task),
            )
            if value is not None
        ]
        if self.device_type is not None:
            index = "*" if self.device_index is None else self.device_index
            parts.append(f"/device:{self.device_type}:{index}")
        return "".join(parts)


def is_job_name(name: object) -> bool:
    """Whether `name` is a valid job name ('worker', 'ps', 'chief', ...).

    >>> is_job_name("worker"), is_job_name("1w"), is_job_name("")
    (True, False, False)
    """
    return isinstance(name, str) and bool(_JOB_NAME.fullmatch(name))


def parse_device(device: object, argument: str = "device") -> DeviceName:
    """Parses a full or partial TensorFlow device string.

    Args:
        device: e.g. '/job:worker/task:3/device:CPU:0', '/device:GPU:1',
            '/cpu:0', '/replica:0/task:0/device:CPU:0' or '' (nothing
            named).
        argument: the caller's name for it, for error messages (e.g.
            'worker_devices[1]').

    Returns:
        The parts the string names.

    Raises:
        TypeError: `device` is not a string.
        ValueError: `device` is not a well-formed device string; the message
            names `argument`, the string and its bad part.

    >>> parse_device("/job:ps/task:0/cpu:0")
    DeviceName(job='ps', replica=None, task=0, device_type='CPU', \
device_index=0)
    >>> parse_device("/job:w/task:x", "worker_devices[1]")
    Traceback (most recent call last):
    ...
    ValueError: worker_devices[1]: bad task index in 'task:x' in device \
string '/job:w/task:x'; expected a TensorFlow device name such as \
'/job:worker/replica:0/task:1/device:GPU:0', '/device:CPU:0' or '/cpu:0'
    """
    if not isinstance(device, str):
        raise TypeError(
            f"{argument}: expected a device string, got "
            f"{type(device).__name__} {device!r}"
        )
    return _parse(device, argument)


# The same few device strings are parsed for every value a batch reduces,
# while tracing; a DeviceName is immutable, so the parses are shared.
@functools.lru_cache(maxsize=4096)
def _parse(device: str, argument: str) -> DeviceName:
    def bad(problem: str) -> ValueError:
        return ValueError(
            f"{argument}: {problem} in device string {device!r}; expected "
            f"{_EXAMPLES}"
        )

    parts: dict[str, str | int | None] = {}
    for part in filter(None, device.split("/")):
        fields = part.split(":")
        key = fields[0]
        if key in ("job", "replica", "task"):
            if len(fields) != 2:
                raise bad(f"malformed part {part!r}")
            if key in parts:
                raise bad(f"repeated part {part!r}")
            if key == "job":
                if not _JOB_NAME.fullmatch(fields[1]):
                    raise bad(f"bad job name in {part!r}")
                parts["job"] = fields[1]
            else:
                if not _INDEX.fullmatch(fields[1]):
                    raise bad(f"bad {key} index in {part!r}")
                parts[key] = int(fields[1])
            continue
        # A device part: 'device:TYPE:INDEX', 'TYPE:INDEX' or legacy 'cpu:0'.
        if key == "device":
            fields = fields[1:]
        if (
            "device_type" in parts
            or len(fields) != 2
            or not _DEVICE_TYPE.fullmatch(fields[0])
            or not _DEVICE_INDEX.fullmatch(fields[1])
        ):
            raise bad(f"unexpected part {part!r}")
        parts["device_type"] = fields[0].upper()
        parts["device_index"] = None if fields[1] == "*" else int(fields[1])
    return DeviceName(**parts)  # type: ignore[arg-type]
