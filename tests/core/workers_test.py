"""Tests for tf_crossdevice._core.workers (grouping devices by worker)."""

from __future__ import annotations

import pytest

from tf_crossdevice._core import workers

W = "/job:worker/replica:0/task:{}/device:{}:{}"


@pytest.mark.parametrize(
    "devices, expected",
    [
        ([W.format(0, "CPU", 0)], [[0]]),
        (
            [W.format(0, "GPU", 0), W.format(0, "GPU", 1)],
            [[0, 1]],
        ),
        (
            [W.format(t, "GPU", g) for t in range(3) for g in range(2)],
            [[0, 1], [2, 3], [4, 5]],
        ),
        (
            # Interleaved: groups in order of first appearance.
            [W.format(t, "GPU", g) for g in range(2) for t in (1, 0)],
            [[0, 2], [1, 3]],
        ),
        (
            # Same task, different jobs or replicas: different workers.
            [
                "/job:worker/replica:0/task:0/device:CPU:0",
                "/job:ps/replica:0/task:0/device:CPU:0",
                "/job:worker/replica:1/task:0/device:CPU:0",
                "/job:worker/replica:0/task:0/device:GPU:0",
            ],
            [[0, 3], [1], [2]],
        ),
        (
            # Partial names: missing replica / task mean 0.
            [
                "/job:worker/task:1/device:CPU:0",
                "/job:worker/replica:0/task:1/device:GPU:0",
                "/job:worker/device:CPU:0",
                "/job:worker/replica:0/task:0/cpu:0",
            ],
            [[0, 1], [2, 3]],
        ),
        (
            # No job: the local process, the same as /job:localhost.
            [
                "/device:CPU:1",
                "",
                "/job:localhost/replica:0/task:0/device:CPU:0",
                "/cpu:0",
                "GPU:0",
                "/job:worker/task:0/device:CPU:0",
                "/device:GPU:*",
            ],
            [[0, 1, 2, 3, 4, 6], [5]],
        ),
        (
            # A device may repeat.
            [W.format(0, "CPU", 0)] * 3 + [W.format(1, "CPU", 0)],
            [[0, 1, 2], [3]],
        ),
        (
            ["/job:worker/replica:0/task:10/device:CPU:0"]
            + ["/job:worker/replica:0/task:1/device:CPU:0"],
            [[0], [1]],
        ),
        (("/job:a/task:0", "/job:b/task:0", "/job:a/task:0"), [[0, 2], [1]]),
    ],
    ids=[
        "one",
        "one_worker",
        "three_workers",
        "interleaved",
        "job_replica_task_all_count",
        "partial_names",
        "local",
        "repeats",
        "task_10_is_not_task_1",
        "tuple_input",
    ],
)
def test_group_by_worker(devices, expected):
    assert workers.group_by_worker(devices) == expected


@pytest.mark.parametrize(
    "device, expected",
    [
        ("/job:worker/replica:2/task:3/device:TPU:0", ("worker", 2, 3)),
        ("/job:chief/task:0", ("chief", 0, 0)),
        ("/task:0/job:w_1/replica:1", ("w_1", 1, 0)),
        ("/device:CPU:0", ("localhost", 0, 0)),
        ("", ("localhost", 0, 0)),
        # TensorFlow's graph-mode canonical names have no job.
        ("/replica:0/task:0/device:CPU:1", ("localhost", 0, 0)),
        ("/task:1/device:CPU:0", ("localhost", 0, 1)),
    ],
    ids=repr,
)
def test_worker_of(device, expected):
    assert workers.worker_of(device) == expected


@pytest.mark.parametrize(
    "device, message",
    [
        ("/job:worker/task:x/device:CPU:0", "bad task index in 'task:x'"),
        ("/job:worker/replica:-1", "bad replica index"),
        ("/job:/task:0", "bad job name in 'job:'"),
        ("/job:1w/task:0", "bad job name in 'job:1w'"),
        ("/job:a/job:b", "repeated part 'job:b'"),
        ("/job:a/task:0/task:1", "repeated part 'task:1'"),
        ("/job:a:b", "malformed part 'job:a:b'"),
        ("/job:a/device:CPU", "unexpected part 'device:CPU'"),
        ("/job:a/device:CPU:0/device:CPU:1", "unexpected part 'device:CPU:1'"),
        ("/job:a/foo", "unexpected part 'foo'"),
        ("/job:a/CPU:x", "unexpected part 'CPU:x'"),
    ],
    ids=repr,
)
def test_malformed_device_raises(device, message):
    devices = ["/device:CPU:0", device]
    with pytest.raises(ValueError) as info:
        workers.group_by_worker(devices)
    assert str(info.value).startswith("devices[1]: ")
    assert message in str(info.value)
    assert repr(device) in str(info.value)


@pytest.mark.parametrize(
    "devices, error, message",
    [
        ([], ValueError, "expected at least one device"),
        ("/device:CPU:0", TypeError, "expected a list of device strings"),
        (None, TypeError, "expected a list of device strings"),
        ({"/cpu:0"}, TypeError, "expected a list of device strings"),
        (["/cpu:0", 3], TypeError, "devices[1]: expected a device string"),
    ],
    ids=["empty", "string", "none", "set", "non_string_item"],
)
def test_bad_input_raises(devices, error, message):
    with pytest.raises(error) as info:
        workers.group_by_worker(devices)
    assert message in str(info.value)
