"""What autotune times: a selection of `cost_model.candidates`, likeliest
first (tf_crossdevice.tuning._candidates). Nothing is built or run here."""

from __future__ import annotations

import types

import pytest

from tf_crossdevice.tuning import _cache, _candidates, _configs, cost_model
from tf_crossdevice.tuning import _topology as topology_lib

# A few small tensors of three dtypes: every packing but aggregation
# changes them (all are small and few, so aggregation packs them as one
# pack does).
GRADIENTS = [
    ((3, 4), "float32"),
    ((50,), "float32"),
    ((7,), "float64"),
    ((2, 2), "float32"),
    ((5,), "int64"),
]
CPU4 = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(4)]
GPU4 = [f"/job:localhost/replica:0/task:0/device:GPU:{i}" for i in range(4)]
WORKERS_2X2 = [
    f"/job:worker/replica:0/task:{t}/device:CPU:{i}"
    for t in (0, 1)
    for i in (0, 1)
]
GPU_WORKERS_2X2 = [d.replace("CPU", "GPU") for d in WORKERS_2X2]
BETWEEN_GRAPH = {"CollectiveAllReduce", "HierarchicalCollectiveAllReduce"}


def timed(devices, gradients=GRADIENTS):
    """(topology, gradients, autotune's timed candidates)."""
    topology = topology_lib.Topology.of(devices)
    grads = topology_lib.normalize_gradients(gradients)
    return topology, grads, _candidates.timed_candidates(topology, grads)


def predict(config, topology, grads):
    return cost_model.predict(
        config,
        grads,
        devices_per_worker=topology.local_devices,
        num_workers=topology.num_workers,
        constants=cost_model.ordering_constants(topology.num_workers),
    )


def grid(topology):
    return cost_model.candidates(
        topology.num_workers,
        topology.local_devices,
        device_type=topology.device_type,
    )


def uncompressed(config):
    name, kwargs = config
    return name, {k: v for k, v in kwargs.items() if k != "compression"}


def uses_nccl(config):
    return "nccl" in str(config[1].get("all_reduce_spec", ""))


@pytest.mark.parametrize(
    "devices",
    [CPU4, GPU4, WORKERS_2X2, GPU_WORKERS_2X2],
    ids=["cpu4", "gpu4", "2_workers_x2", "2_gpu_workers_x2"],
)
def test_every_timed_candidate_is_in_the_package_list(devices):
    topology, grads, configs = timed(devices)
    listed = grid(topology)
    plain = [c for c in configs if "compression" not in c[1]]
    assert len(plain) == 20
    assert len(set(map(_configs.label, configs))) == len(configs)
    for config in configs:
        assert uncompressed(config) in listed, config
        # In-graph: the collectives run in each worker's own program.
        assert config[0] not in BETWEEN_GRAPH
        assert predict(config, topology, grads) > 0


def test_nccl_is_timed_on_gpus_only():
    for devices in (CPU4, WORKERS_2X2):
        assert not any(map(uses_nccl, timed(devices)[2]))
    _, _, one_worker = timed(GPU4)
    assert {c[1]["all_reduce_spec"] for c in one_worker if uses_nccl(c)} == {
        "nccl"
    }
    _, _, workers = timed(GPU_WORKERS_2X2)
    specs = {c[1]["all_reduce_spec"] for c in workers if uses_nccl(c)}
    assert {"nccl/xring", "nccl/rechd", "nccl/pscpu"} <= specs


def test_the_fastest_predicted_come_first():
    topology, grads, configs = timed(CPU4)
    seconds = [predict(c, topology, grads) for c in configs]
    assert seconds == sorted(seconds)
    # The first eight are the eight fastest of the whole list, aggregation
    # aside (on these gradients it packs as num_packs=1 does).
    rivals = [
        predict(c, topology, grads)
        for c in grid(topology)
        if "agg_small_grads_max_bytes" not in c[1]
    ]
    # ReductionToOneDevice, 3 hierarchical copies, 4 algorithms x 4 shard
    # counts x 3 packings.
    assert len(rivals) == 1 + 3 + 4 * 4 * 3
    assert seconds[:8] == sorted(rivals)[:8]


def test_each_algorithm_keeps_its_fastest_configuration():
    """However the model ranks them, every algorithm is timed once at
    least, in its fastest predicted configuration."""
    topology, grads, configs = timed(CPU4)
    families = {
        "ReductionToOneDevice": "ReductionToOneDevice",
        "hierarchical copy": "HierarchicalCopyAllReduce",
        "pscpu": "SpecAllReduce pscpu",
        "psgpu": "SpecAllReduce psgpu",
        "xring": "SpecAllReduce xring",
        "rechd": "SpecAllReduce rechd",
    }
    for family, prefix in families.items():

        def fastest(configs, prefix=prefix):
            return min(
                predict(c, topology, grads)
                for c in configs
                if _configs.label(c).startswith(prefix)
                and "agg_small_grads_max_bytes" not in c[1]
            )

        assert fastest(configs) == fastest(grid(topology)), family


def test_packing_that_changes_nothing_is_left_out():
    one = timed(CPU4, [((8,), "float32")])[2]
    # One tensor: one pack or aggregation leaves it as it is.
    assert not [c for c in one if c[1].get("num_packs") == 1]
    assert not [c for c in one if "agg_small_grads_max_bytes" in c[1]]
    assert [c for c in one if c[1].get("num_packs") == 4]  # 4 packs split
    # Five tensors of 4 KB: one aggregation group is one pack.
    small = [((1000,), "float32")] * 5
    assert not [
        c
        for c in timed(CPU4[:2], small)[2]
        if "agg_small_grads_max_bytes" in c[1]
    ]
    # One more of 80 KB (above the 64 KiB limit), or more tensors than one
    # group holds: aggregation is not one pack.
    for grads in (small + [((20000,), "float32")], [((10,), "float32")] * 1025):
        aggregated = [
            c
            for c in timed(CPU4[:2], grads)[2]
            if "agg_small_grads_max_bytes" in c[1]
        ]
        assert aggregated


def test_workers_also_time_the_likeliest_four_compressed():
    topology, grads, configs = timed(WORKERS_2X2)
    assert {c[0] for c in configs} == {"MultiWorkerAllReduce"}
    plain = [c for c in configs if "compression" not in c[1]]
    compressed = [c for c in configs if "compression" in c[1]]
    assert len(compressed) == 8
    assert {c[1]["compression"] for c in compressed} == {"bf16", "fp16"}
    twins = {_configs.label(uncompressed(c)) for c in compressed}
    likeliest = sorted(plain, key=lambda c: predict(c, topology, grads))[:4]
    assert twins == set(map(_configs.label, likeliest))
    # The class's default spec (two-level, two shards) is among the plain.
    specs = {c[1]["all_reduce_spec"] for c in plain}
    assert ("pscpu/pscpu", 2, -1) in specs
    # Integers are never compressed.
    ints = timed(WORKERS_2X2, [((4,), "int32"), ((4,), "int64")])[2]
    assert ints and not [c for c in ints if "compression" in c[1]]
    # One worker: nothing crosses workers, nothing to compress.
    assert not [c for c in timed(CPU4)[2] if "compression" in c[1]]


def test_across_workers_one_big_pack_pays_its_processing():
    """64 tensors of 128 KiB (32,768 float32 each) across 2 workers: on
    loopback the fit has no serial term and ranks one pack (fewer messages
    and ops) first; across workers the order adds beta_serial per byte of
    the largest pack, 8 MiB packed against 128 KiB apart, which turns the
    order."""
    big = [((1 << 15,), "float32")] * 64
    topology = topology_lib.Topology.of(
        [f"/job:worker/replica:0/task:{t}/device:CPU:0" for t in (0, 1)]
    )
    grads = topology_lib.normalize_gradients(big)
    apart = ("MultiWorkerAllReduce", {"all_reduce_spec": "xring"})
    packed = (
        "MultiWorkerAllReduce",
        {"all_reduce_spec": "xring", "num_packs": 1},
    )
    serial = cost_model.constants_for_link(1e9).beta_serial
    constants = cost_model.ordering_constants(2)
    assert constants.beta_serial == serial > 0
    assert cost_model.ordering_constants(1) == cost_model.DEFAULT_CONSTANTS

    def seconds(config, constants):
        return cost_model.predict(
            config,
            grads,
            devices_per_worker=1,
            num_workers=2,
            constants=constants,
        )

    loopback = cost_model.DEFAULT_CONSTANTS
    assert seconds(packed, loopback) < seconds(apart, loopback)
    for config, largest in ((packed, 8 << 20), (apart, 128 << 10)):
        assert seconds(config, constants) - seconds(
            config, loopback
        ) == pytest.approx(serial * largest)
    plan = _candidates.ordered([packed, apart], topology, grads)
    assert [c for c, _ in plan] == [apart, packed]


def test_unpredicted_candidates_keep_the_list_order(monkeypatch):
    def cannot_predict(config, gradients, **counts):
        raise ValueError(f"config: cannot model {config[0]}")

    monkeypatch.setattr(
        _candidates,
        "cost_model",
        types.SimpleNamespace(
            predict=cannot_predict,
            ordering_constants=cost_model.ordering_constants,
            candidates=cost_model.candidates,
            ALGORITHMS=cost_model.ALGORITHMS,
            COMPRESSIBLE=cost_model.COMPRESSIBLE,
        ),
    )
    topology, grads, configs = timed(CPU4)
    plan = _candidates.ordered(configs, topology, grads)
    assert all(seconds is None for _, seconds in plan)
    positions = [grid(topology).index(c) for c, _ in plan]
    assert positions == sorted(positions)
    assert plan[0][0] == ("ReductionToOneDevice", {})


def test_ordered_puts_the_unpredicted_last_in_their_order(monkeypatch):
    topology, grads, configs = timed(CPU4)

    def only_packed(
        config, gradients, *, devices_per_worker, num_workers, constants
    ):
        assert (devices_per_worker, num_workers) == (4, 1)
        assert constants == cost_model.DEFAULT_CONSTANTS
        if not config[1].get("num_packs"):
            raise ValueError("config: cannot model it")
        return 1.0 / config[1]["num_packs"]

    monkeypatch.setattr(
        _candidates,
        "cost_model",
        types.SimpleNamespace(
            predict=only_packed,
            ordering_constants=cost_model.ordering_constants,
        ),
    )
    plan = _candidates.ordered(configs, topology, grads)
    assert sorted(map(_configs.label, (c for c, _ in plan))) == sorted(
        map(_configs.label, configs)
    )
    predicted = [seconds for _, seconds in plan if seconds is not None]
    assert predicted == sorted(predicted) and predicted[0] == 0.25  # 4 packs
    unpredicted = [c for c, seconds in plan if seconds is None]
    assert plan[-len(unpredicted) :] == [(c, None) for c in unpredicted]
    assert unpredicted == [c for c in configs if not c[1].get("num_packs")]


def test_the_cache_file_changes_with_the_candidate_list(monkeypatch, tmp_path):
    topology = topology_lib.Topology.of(CPU4)
    grads = topology_lib.normalize_gradients(GRADIENTS)
    before = _cache.cache_file(topology, grads, tmp_path)
    assert _cache.cache_file(topology, grads, tmp_path) == before
    monkeypatch.setattr(_candidates, "MOST", 10)
    assert len(_candidates.timed_candidates(topology, grads)) == 10
    assert _cache.cache_file(topology, grads, tmp_path) != before
