"""Tests for the wire policy (tf_crossdevice.compression.WirePolicy)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from tf_crossdevice import testing
from tf_crossdevice.algorithms import _registry as registry
from tf_crossdevice.compression import PowerSGD, WirePolicy
from tf_crossdevice.compression import _wire_policy as wire_policy

TASK0_CPU0 = "/job:worker/replica:0/task:0/device:CPU:0"
TASK0_CPU1 = "/job:worker/replica:0/task:0/device:CPU:1"
TASK1_CPU0 = "/job:worker/replica:0/task:1/device:CPU:0"
POWERSGD_REPR = (
    "PowerSGD(rank=4, start_step=0, min_compression_size=4096, seed=0, "
    "bucket_bytes=26214400, min_compression_rate=2.0)"
)
FROM_COMPRESSION_ALLOWED = (
    "expected one of None, 'bf16', 'fp16' or a "
    "tf_crossdevice.compression.PowerSGD"
)


def test_the_default_compresses_nothing_and_groups_by_task():
    policy = WirePolicy()
    assert policy.codec is None
    assert policy.powersgd is None
    assert policy.compression is None
    assert policy.same_worker is wire_policy.default_same_worker
    assert policy.crosses(TASK0_CPU0, TASK1_CPU0) is True
    assert policy.crosses(TASK0_CPU0, TASK0_CPU1) is False


def test_crosses_follows_its_same_worker():
    def same_index_parity(a, b):
        index = tf.DeviceSpec.from_string(a).device_index
        return index % 2 == tf.DeviceSpec.from_string(b).device_index % 2

    policy = WirePolicy("bf16", same_worker=same_index_parity)
    assert policy.crosses(TASK0_CPU0, TASK0_CPU1) is True
    assert policy.crosses(TASK0_CPU0, TASK1_CPU0) is False


@pytest.mark.parametrize("codec", [None, "bf16", "fp16"])
def test_from_compression_round_trips_a_codec(codec):
    policy = WirePolicy.from_compression(codec)
    assert policy == WirePolicy(codec=codec)
    assert (policy.codec, policy.powersgd) == (codec, None)
    assert policy.compression == codec


def test_from_compression_round_trips_powersgd_and_passes_a_policy():
    compressor = PowerSGD()
    policy = WirePolicy.from_compression(compressor)
    assert policy.codec is None
    assert policy.powersgd is compressor
    assert policy.compression is compressor
    assert WirePolicy.from_compression(policy) is policy


@pytest.mark.parametrize("bad", ["int8", "BF16", "", 16, True, tf.bfloat16])
def test_from_compression_names_the_argument(bad):
    with pytest.raises(ValueError) as e:
        WirePolicy.from_compression(bad)
    assert str(e.value) == (
        f"compression: unknown value {bad!r}; {FROM_COMPRESSION_ALLOWED}"
    )
    with pytest.raises(ValueError) as e:
        WirePolicy.from_compression(bad, "options.compression")
    assert str(e.value) == (
        f"options.compression: unknown value {bad!r}; "
        f"{FROM_COMPRESSION_ALLOWED}"
    )


def test_an_unknown_codec_names_codec():
    with pytest.raises(ValueError) as e:
        WirePolicy(codec="int8")
    assert str(e.value) == (
        "codec: unknown value 'int8'; expected one of None, 'bf16', 'fp16'"
    )


def test_codec_and_powersgd_together_name_both():
    with pytest.raises(ValueError) as e:
        WirePolicy(codec="bf16", powersgd=PowerSGD())
    assert str(e.value) == (
        "codec, powersgd: expected at most one of them, got codec='bf16' "
        f"and powersgd={POWERSGD_REPR}"
    )


def test_wrong_types_name_the_field():
    with pytest.raises(TypeError) as e:
        WirePolicy(powersgd="powersgd")  # type: ignore[arg-type]
    assert str(e.value) == (
        "powersgd: expected None or a tf_crossdevice.compression.PowerSGD, "
        "got str 'powersgd'"
    )
    with pytest.raises(TypeError) as e:
        WirePolicy(same_worker=3)  # type: ignore[arg-type]
    assert str(e.value) == (
        "same_worker: expected a callable (device, device) -> bool, got int 3"
    )


def test_a_policy_is_one_frozen_value():
    policy = WirePolicy("fp16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.codec = "bf16"  # type: ignore[misc]
    assert policy == WirePolicy.from_compression("fp16")
    assert policy != WirePolicy("bf16")
    assert len({policy, WirePolicy("fp16"), WirePolicy()}) == 2


def test_builders_take_only_a_policy_for_wire():
    with pytest.raises(TypeError) as e:
        registry.build("xring", wire="bf16")  # type: ignore[arg-type]
    assert str(e.value) == (
        "wire: expected None or a tf_crossdevice.compression.WirePolicy, "
        "got str 'bf16'"
    )


def test_algorithms_never_see_powersgd():
    calls = []

    def factory(shards):
        calls.append(shards)
        return registry.build("xring", shards)

    registry.register("plain_wire_test", factory)
    try:
        built = registry.build(
            "plain_wire_test", 2, wire=WirePolicy(powersgd=PowerSGD())
        )
        cpus = testing.cpu_devices(2)
        tensors = []
        for i, d in enumerate(cpus):
            with tf.device(d):
                tensors.append(tf.constant([1.0, 2.0, 3.0]) * (i + 1))
        sums = [s.numpy() for s in built(tensors, 0)]
        assert calls == [2]
        for s in sums:
            np.testing.assert_array_equal(s, [3.0, 6.0, 9.0])
        with pytest.raises(ValueError) as e:
            registry.build(
                "plain_wire_test", wire=WirePolicy(same_worker=str.__eq__)
            )
        assert str(e.value) == (
            "compression: algorithm 'plain_wire_test' was registered without "
            "compression support; expected None, or one of "
            "hierarchical_copy, nccl, pscpu, psgpu, rechd, xring"
        )
    finally:
        registry.unregister("plain_wire_test")
