"""The one device-string parser (tf_crossdevice/_core/devices.py)."""

from __future__ import annotations

import pytest

from tf_crossdevice._core import devices
from tf_crossdevice._core.devices import DeviceName


@pytest.mark.parametrize(
    "device, expected",
    [
        (
            "/job:worker/replica:0/task:1/device:GPU:0",
            DeviceName("worker", 0, 1, "GPU", 0),
        ),
        ("/job:ps/task:2", DeviceName("ps", None, 2)),
        ("/device:CPU:3", DeviceName(device_type="CPU", device_index=3)),
        ("/cpu:0", DeviceName(device_type="CPU", device_index=0)),
        ("/gpu:*", DeviceName(device_type="GPU")),
        ("/job:w_1/GPU:2", DeviceName("w_1", None, None, "GPU", 2)),
        # TensorFlow's graph-mode canonical names have no job.
        (
            "/replica:0/task:0/device:CPU:1",
            DeviceName(None, 0, 0, "CPU", 1),
        ),
        ("", DeviceName()),
    ],
    ids=repr,
)
def test_parse_device(device, expected):
    assert devices.parse_device(device) == expected


@pytest.mark.parametrize(
    "device, worker",
    [
        ("/job:worker/task:3/device:CPU:0", ("worker", 0, 3)),
        ("/job:chief", ("chief", 0, 0)),
        ("/device:GPU:1", ("localhost", 0, 0)),
        ("/replica:0/task:0/device:CPU:0", ("localhost", 0, 0)),
        ("/replica:2/task:1", ("localhost", 2, 1)),
    ],
)
def test_worker_fills_in_the_local_process(device, worker):
    assert devices.parse_device(device).worker == worker


@pytest.mark.parametrize(
    "device, problem",
    [
        ("/job:worker/task:x", "bad task index in 'task:x'"),
        ("/job:1w", "bad job name in 'job:1w'"),
        ("/job:a/task:0/task:1", "repeated part 'task:1'"),
        ("/job:a:b", "malformed part 'job:a:b'"),
        ("/device:CPU", "unexpected part 'device:CPU'"),
        ("/cpu:0/gpu:0", "unexpected part 'gpu:0'"),
    ],
    ids=repr,
)
def test_malformed_device_names_the_argument_and_the_part(device, problem):
    with pytest.raises(ValueError) as info:
        devices.parse_device(device, "worker_devices[2]")
    message = str(info.value)
    assert message.startswith(f"worker_devices[2]: {problem} in device ")
    assert repr(device) in message
    assert "'/device:CPU:0'" in message  # An example of a good one.


def test_a_device_that_is_no_string_is_a_type_error():
    with pytest.raises(TypeError, match=r"^destinations\[0\]: expected a"):
        devices.parse_device(3, "destinations[0]")


def test_job_names():
    assert devices.is_job_name("worker")
    assert devices.is_job_name("w_1")
    assert not devices.is_job_name("1w")
    assert not devices.is_job_name("job:w")
    assert not devices.is_job_name(None)
