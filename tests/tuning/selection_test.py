"""select_cross_device_ops: the choice follows devices and links."""

import dataclasses
import types

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

import tf_crossdevice
from tf_crossdevice.ops import _links as topology
from tf_crossdevice.tuning import _cache, _selection, _topology

GPUS = [f"/gpu:{i}" for i in range(8)]


def test_cpu_devices_get_a_packed_configuration():
    """On CPUs the default packs small tensors."""
    devices = tf_crossdevice.testing.cpu_devices(4)
    ops = tf_crossdevice.select_cross_device_ops(devices)
    assert type(ops) is tf_crossdevice.SpecAllReduce
    assert [r.alg for r in ops.all_reduce_spec] == ["pscpu"]
    assert ops._agg_small_grads_max_bytes == 64 * 1024
    assert ops._agg_small_grads_max_group == 1024
    # Packed means fewer all-reduces than tensors: 50 small tensors go
    # through the spec algorithm as one pack, and the sums are numpy's.
    calls = []
    packed = ops.reducer.all_reduce
    original = packed.all_reduce_batch
    ops = ops.with_reducer(
        dataclasses.replace(
            ops.reducer,
            all_reduce=dataclasses.replace(
                packed,
                all_reduce_batch=lambda p, i: calls.extend(i) or original(p, i),
            ),
        )
    )
    arrays = [np.arange(10, dtype=np.float32) * (k + 1) for k in range(50)]
    pairs = [
        (
            tf_crossdevice.testing.per_replica([tf.constant(a)] * 4, devices),
            None,
        )
        for a in arrays
    ]
    results = ops.batch_reduce("sum", pairs)
    assert calls == [0]
    for array, result in zip(arrays, results, strict=True):
        for component in result.values:
            np.testing.assert_array_equal(component.numpy(), 4 * array)


def test_devices_this_process_lacks_are_named_in_a_warning(monkeypatch):
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("this process has GPUs")
    warnings = []
    monkeypatch.setattr(
        absl_logging, "warning", lambda msg, *a: warnings.append(msg % a)
    )
    tf_crossdevice.select_cross_device_ops(["/cpu:0", "/cpu:1"])
    assert warnings == []
    ops = tf_crossdevice.select_cross_device_ops(["/cpu:0", "/gpu:0", "gpu:1"])
    gpu = "/job:localhost/replica:0/task:0/device:GPU"
    cpus = ", ".join(f"/device:CPU:{i}" for i in range(8))
    assert warnings == [
        f"select_cross_device_ops: {gpu}:0, {gpu}:1 not in this process (it "
        f"has {cpus}); chose {ops!r} for the devices as named"
    ]
    assert repr(ops).startswith("SpecAllReduce(all_reduce_spec='pscpu'")


def test_gpus_named_on_a_machine_without_them_still_get_nccl(monkeypatch):
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("this process has GPUs")
    warnings = []
    monkeypatch.setattr(
        absl_logging, "warning", lambda msg, *a: warnings.append(msg % a)
    )
    ops = tf_crossdevice.select_cross_device_ops(["/gpu:0", "/gpu:1"])
    assert type(ops) is tf_crossdevice.NcclAllReduce
    (warning,) = warnings
    assert "device:GPU:0, /job:localhost/replica:0/task:0/device:GPU:1 " in (
        warning
    )
    assert warning.endswith("chose NcclAllReduce() for the devices as named")


def test_a_mix_of_cpu_and_gpu_is_treated_as_cpu():
    ops = tf_crossdevice.select_cross_device_ops(["/cpu:0", "/gpu:0"])
    assert type(ops) is tf_crossdevice.SpecAllReduce


def test_dgx1_links_get_hierarchical_copy_with_8_packs():
    ops = tf_crossdevice.select_cross_device_ops(
        GPUS, link_matrix=topology.dgx1_link_matrix()
    )
    assert type(ops) is tf_crossdevice.HierarchicalCopyAllReduce
    assert ops._num_packs == 8


def test_fully_connected_gpus_count_as_dgx1_like():
    full = [[i != j for j in range(8)] for i in range(8)]
    ops = tf_crossdevice.select_cross_device_ops(GPUS, link_matrix=full)
    assert type(ops) is tf_crossdevice.HierarchicalCopyAllReduce


def test_dgx1_missing_one_link_gets_nccl():
    links = topology.dgx1_link_matrix()
    links[0][4] = links[4][0] = False
    ops = tf_crossdevice.select_cross_device_ops(GPUS, link_matrix=links)
    assert type(ops) is tf_crossdevice.NcclAllReduce


def test_four_gpus_get_nccl():
    full = [[i != j for j in range(4)] for i in range(4)]
    ops = tf_crossdevice.select_cross_device_ops(GPUS[:4], link_matrix=full)
    assert type(ops) is tf_crossdevice.NcclAllReduce
    assert ops._num_packs == 1


def test_gpus_of_several_workers_never_get_nccl():
    devices = [
        f"/job:worker/task:{t}/device:GPU:{i}" for t in (0, 1) for i in (0, 1)
    ]
    full = [[True] * 4 for _ in range(4)]
    ops = tf_crossdevice.select_cross_device_ops(devices, link_matrix=full)
    assert type(ops) is tf_crossdevice.HierarchicalCopyAllReduce
    assert ops._num_packs == 1


@pytest.mark.parametrize(
    "devices, link_matrix, error, message",
    [
        ([], None, ValueError, "devices"),
        ("/cpu:0", None, TypeError, "devices"),
        (["/cpu:0", 1], None, TypeError, "devices"),
        (["/bogus:0:1:2"], None, ValueError, "devices"),
        (GPUS, [[True] * 8] * 7, ValueError, "link_matrix.*8 rows"),
        (GPUS[:2], [[True], [True]], ValueError, "link_matrix: row 0"),
    ],
)
def test_bad_arguments(devices, link_matrix, error, message):
    with pytest.raises(error, match=message):
        tf_crossdevice.select_cross_device_ops(devices, link_matrix)


# --- With gradients: autotune's cache, then the cost model, then the rules.

GRADIENTS = [((10, 10), "float32"), ((10,), "float32")]


def cache_choice(tmp_path, devices, config, label="cached"):
    canonical = [
        tf_crossdevice._core.values.canonical_device(d, "d") for d in devices
    ]
    where = _topology.Topology.of(canonical)
    grads = _topology.normalize_gradients(GRADIENTS)
    path = _cache.cache_file(where, grads, tmp_path)
    _cache.write_cache(
        path,
        {
            "format": _cache.CACHE_FORMAT,
            "config": list(config),
            "label": label,
            "budget_seconds": 1.0,
            "complete": True,
        },
    )
    return path


def fixed_cost_model(monkeypatch):
    """A cost model that recommends SpecAllReduce("rechd#3") for anything:
    a choice none of the rules makes."""

    def recommend(gradients, *, num_workers, devices_per_worker=1):
        return ("SpecAllReduce", {"all_reduce_spec": "rechd#3"}), 0.001

    monkeypatch.setattr(
        _selection, "cost_model", types.SimpleNamespace(recommend=recommend)
    )


def test_a_cached_autotune_choice_wins(tmp_path, monkeypatch):
    fixed_cost_model(monkeypatch)
    devices = tf_crossdevice.testing.cpu_devices(4)
    config = ("SpecAllReduce", {"all_reduce_spec": "xring#2", "num_packs": 1})
    cache_choice(tmp_path, devices, config)
    ops = tf_crossdevice.select_cross_device_ops(
        devices, gradients=GRADIENTS, cache_dir=tmp_path
    )
    assert type(ops) is tf_crossdevice.SpecAllReduce
    assert [(r.alg, r.shards) for r in ops.all_reduce_spec] == [("xring", 2)]
    assert ops._num_packs == 1
    # Other gradients have no cached choice: the cost model's.
    other = tf_crossdevice.select_cross_device_ops(
        devices, gradients=GRADIENTS[:1], cache_dir=tmp_path
    )
    assert [(r.alg, r.shards) for r in other.all_reduce_spec] == [("rechd", 3)]


def test_the_cache_wins_over_the_cost_model_which_wins_over_rules(
    tmp_path, monkeypatch
):
    asked = []

    def recommend(gradients, *, num_workers, devices_per_worker=1):
        asked.append((gradients, num_workers, devices_per_worker))
        return ("ReductionToOneDevice", {}), 0.001

    model = types.SimpleNamespace(recommend=recommend)
    monkeypatch.setattr(_selection, "cost_model", model)
    devices = tf_crossdevice.testing.cpu_devices(2)
    ops = tf_crossdevice.select_cross_device_ops(
        devices, gradients=GRADIENTS, cache_dir=tmp_path
    )
    assert type(ops) is tf_crossdevice.ReductionToOneDevice
    assert asked == [(GRADIENTS, 1, 2)]
    cache_choice(
        tmp_path, devices, ("SpecAllReduce", {"all_reduce_spec": "rechd"})
    )
    ops = tf_crossdevice.select_cross_device_ops(
        devices, gradients=GRADIENTS, cache_dir=tmp_path
    )
    assert [r.alg for r in ops.all_reduce_spec] == ["rechd"]
    assert len(asked) == 1
    # Without gradients, neither is asked.
    ops = tf_crossdevice.select_cross_device_ops(devices)
    assert [r.alg for r in ops.all_reduce_spec] == ["pscpu"]
    assert len(asked) == 1


def test_a_cached_multi_worker_choice_gets_the_devices_workers(
    tmp_path, monkeypatch
):
    fixed_cost_model(monkeypatch)
    devices = [f"/job:worker/task:{t}/device:GPU:0" for t in (0, 1)]
    config = (
        "MultiWorkerAllReduce",
        {"all_reduce_spec": ["pscpu/pscpu", 2, -1]},
    )
    cache_choice(tmp_path, devices, config)
    ops = tf_crossdevice.select_cross_device_ops(
        devices, gradients=GRADIENTS, cache_dir=tmp_path
    )
    assert type(ops) is tf_crossdevice.MultiWorkerAllReduce
    assert ops.worker_devices == (
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    )
    assert ops._num_gpus_per_worker == 1


def test_a_corrupt_cached_choice_falls_back_with_a_warning(
    tmp_path, monkeypatch
):
    fixed_cost_model(monkeypatch)
    warnings = []
    monkeypatch.setattr(
        absl_logging, "warning", lambda msg, *a: warnings.append(msg % a)
    )
    devices = tf_crossdevice.testing.cpu_devices(2)
    path = cache_choice(tmp_path, devices, ("SpecAllReduce", {}))
    path.write_text("not json")
    ops = tf_crossdevice.select_cross_device_ops(
        devices, gradients=GRADIENTS, cache_dir=tmp_path
    )
    assert [r.alg for r in ops.all_reduce_spec] == ["rechd"]
    assert len(warnings) == 1 and "corrupt" in warnings[0]


def test_bad_gradients_are_named(tmp_path):
    with pytest.raises(TypeError, match=r"gradients\[0\]: expected"):
        tf_crossdevice.select_cross_device_ops(
            ["/cpu:0"], gradients=[3], cache_dir=tmp_path
        )
