"""The strategy's collective when given none: chosen from the local
devices and the worker count, logged once."""

from __future__ import annotations

import pytest
from absl import logging as absl_logging

import tf_crossdevice
from tf_crossdevice.collective import _default

CPU = "/job:worker/replica:0/task:0/device:CPU"
GPU = "/job:worker/replica:0/task:0/device:GPU"


@pytest.mark.parametrize(
    "devices, workers, expected",
    [
        ([f"{CPU}:0"], 1, "CollectiveAllReduce"),
        ([f"{CPU}:0"], 4, "CollectiveAllReduce"),
        ([f"{CPU}:0", f"{CPU}:1"], 1, "CollectiveAllReduce"),
        ([f"{CPU}:0", f"{CPU}:1"], 2, "HierarchicalCollectiveAllReduce"),
        ([f"{GPU}:0", f"{GPU}:1"], 2, "CollectiveAllReduce"),
    ],
)
def test_choice(devices, workers, expected):
    ops = _default.default_collective(devices, workers)
    assert type(ops).__name__ == expected
    # With its defaults: no compression, TensorFlow's default options.
    assert ops.compression is None


def test_choice_is_logged_once(monkeypatch):
    lines = []
    monkeypatch.setattr(_default, "_logged", set())
    monkeypatch.setattr(
        absl_logging, "info", lambda fmt, *args: lines.append(fmt % args)
    )
    for _ in range(3):
        _default.default_collective([f"{CPU}:0", f"{CPU}:1"], 3)
    assert lines == [
        "tf_crossdevice: MultiWorkerMirroredStrategy chose "
        "HierarchicalCollectiveAllReduce for 2 local device(s) on each of 3 "
        "worker(s) (several CPU devices per worker: one collective member "
        "per worker sends each pack across workers once); pass "
        "cross_device_ops= to choose another"
    ]


def test_strategy_alone_keeps_the_flat_class():
    # One worker: nothing crosses a worker boundary, the flat class stays.
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        local_devices=tf_crossdevice.testing.cpu_devices(2)
    )
    assert type(strategy.extended._cross_device_ops).__name__ == (
        "CollectiveAllReduce"
    )
