"""Tests for tf_crossdevice.cost_model and _schedules.traffic (no TF ops)."""

from __future__ import annotations

import functools
import inspect
import math
import re

import numpy as np
import pytest

import tf_crossdevice
from tf_crossdevice.algorithms import _halving_doubling_schedule as hd
from tf_crossdevice.algorithms import _registry as registry
from tf_crossdevice.algorithms import _ring_schedule as ring_schedule
from tf_crossdevice.tuning import _cost_least_squares as least_squares
from tf_crossdevice.tuning import _traffic as traffic
from tf_crossdevice.tuning import cost_model

# Only the transfer terms, so predictions are Thakur's formulas exactly,
# plus the graph builders' flattening: a pad and a concatenation of the
# tensor on each device, priced like sums.
ALPHA, BETA, GAMMA = 1e-5, 1e-9, 2e-10
FLAT_COPIES = 2
TRANSFERS_ONLY = cost_model.Constants(
    alpha_net=ALPHA,
    beta_net=BETA,
    alpha_mem=0.0,
    beta_mem=0.0,
    gamma=GAMMA,
    delta=0.0,
    alpha_collective=0.0,
    step=0.0,
)
TRUE = cost_model.Constants(
    alpha_net=2e-4,
    beta_net=5e-9,
    alpha_mem=6e-6,
    beta_mem=4e-11,
    gamma=3e-10,
    delta=8e-7,
    alpha_collective=1e-3,
    step=2e-3,
)


def one_tensor(num_bytes):
    return [((num_bytes // 4,), "float32")]


def spec(alg, **kwargs):
    return ("MultiWorkerAllReduce", {"all_reduce_spec": alg, **kwargs})


def test_algorithms_match_the_builder_registry():
    assert registry.algorithm_names() == cost_model.ALGORITHMS


@pytest.mark.parametrize("p", [2, 3, 8, 96, 1024])
def test_ring_is_thakurs_formula(p):
    n = 4 * 2**20 * p  # divisible by p: no padding
    predicted = cost_model.predict(
        spec("xring"),
        one_tensor(n),
        devices_per_worker=1,
        num_workers=p,
        constants=TRANSFERS_ONLY,
    )
    expected = (
        2 * (p - 1) * ALPHA
        + 2 * (p - 1) / p * n * BETA
        + (p - 1) / p * n * GAMMA
        + FLAT_COPIES * n * GAMMA
    )
    assert predicted == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p", [2, 4, 64, 1024])
def test_halving_doubling_is_thakurs_formula_for_powers_of_two(p):
    n = 4 * 2**20 * p
    predicted = cost_model.predict(
        spec("rechd"),
        one_tensor(n),
        devices_per_worker=1,
        num_workers=p,
        constants=TRANSFERS_ONLY,
    )
    expected = (
        2 * math.log2(p) * ALPHA
        + 2 * (p - 1) / p * n * BETA
        + (p - 1) / p * n * GAMMA
        + FLAT_COPIES * n * GAMMA
    )
    assert predicted == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("p", [3, 6, 96, 1000])
def test_halving_doubling_folds_extra_devices_in_and_out(p):
    n = 4 * 2**22
    q = 2 ** int(math.log2(p))
    predicted = cost_model.predict(
        spec("rechd"),
        one_tensor(n),
        devices_per_worker=1,
        num_workers=p,
        constants=TRANSFERS_ONLY,
    )
    # The partner of an extra device: one more message and n more bytes
    # out, n more bytes reduced; its link takes the extra's n bytes in
    # and sends n back, one way each time, so the wire prices those n
    # again (what the partner carries one way).
    expected = (
        (2 * math.log2(q) + 1) * ALPHA
        + (2 * (q - 1) / q + 2) * n * BETA
        + ((q - 1) / q + 1) * n * GAMMA
        + FLAT_COPIES * n * GAMMA
    )
    assert predicted == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("n", range(2, 10))
def test_halving_doubling_counts_match_the_schedule(n):
    """Rank 0's sends, counted from the schedule's transfers."""
    order = hd.rank_orders(n, 1)[0]
    chunk_bytes = 1024 / hd.num_chunks(n)
    transfers = [
        *hd.fold_in(order),
        *(t for step in hd.reduce_scatter_steps(order) for t in step),
        *(t for step in hd.all_gather_steps(order) for t in step),
        *hd.fold_out(order),
    ]
    sent = [t for t in transfers if t.src == order[0]]
    counted = traffic.halving_doubling(1024.0, n, 1)
    assert counted.net_messages == len(sent)
    assert counted.net_bytes == pytest.approx(
        sum(len(t.chunks) for t in sent) * chunk_bytes
    )


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_ring_counts_match_the_schedule(n):
    order = ring_schedule.ring_orders(n, 1)[0]
    steps = [
        *ring_schedule.reduce_scatter_steps(order),
        *ring_schedule.all_gather_steps(order),
    ]
    sent = sum(1 for step in steps for t in step if t.src == 0)
    counted = traffic.ring(float(n * 100), n, 1)
    assert counted.net_messages == sent == 2 * (n - 1)
    assert counted.net_bytes == pytest.approx(sent * 100)


def test_shuffle_gathers_on_the_first_worker_and_broadcasts():
    t = traffic.shuffle(1000.0, n=8, k=2, shards=1)
    # Worker 0: its other device sends to the owner (1 memory message),
    # the owner sends the sum to it (1) and to 6 devices elsewhere.
    assert (t.mem_messages, t.mem_bytes) == (2, 2000)
    assert (t.net_messages, t.net_bytes) == (6, 6000)
    assert t.reduce_bytes == 7000


def test_two_level_runs_inner_per_worker_and_outer_across():
    grads = one_tensor(4 << 20)
    both = cost_model.traffic_of(
        spec("pscpu/xring"), grads, devices_per_worker=4, num_workers=8
    )
    inner = traffic.shuffle(float(4 << 20), 4, 4)
    outer = traffic.ring(float(4 << 20), 8, 1)
    assert both.net_messages == outer.net_messages == 14
    # The inner gather and broadcast, then 3 copies back.
    assert both.mem_messages == inner.mem_messages + 3 == 9


@pytest.mark.parametrize("name", cost_model.CONFIG_NAMES)
@pytest.mark.parametrize("workers, devices", [(1, 1), (1, 4), (3, 2)])
def test_every_class_is_priced_with_its_defaults(name, workers, devices):
    multi = name == "MultiWorkerAllReduce"
    kwargs = {"all_reduce_spec": "pscpu/xring"} if multi else {}
    if name == "CollectiveAllReduce":
        kwargs = {"num_workers": workers}
    seconds = cost_model.predict(
        (name, kwargs),
        [((1000,), "float32"), ((7, 3), "float64"), ((5,), "int32")],
        devices_per_worker=devices,
        num_workers=workers,
        constants=TRUE,
    )
    assert np.isfinite(seconds)
    assert seconds >= TRUE.step


def test_packing_reduces_messages():
    grads = [((256,), "float32")] * 100
    kwargs = dict(devices_per_worker=1, num_workers=16)
    unpacked = cost_model.traffic_of(spec("xring"), grads, **kwargs)
    packed = cost_model.traffic_of(spec("xring", num_packs=2), grads, **kwargs)
    assert unpacked.net_messages == 100 * 2 * 15
    assert packed.net_messages == 2 * 2 * 15
    assert packed.net_bytes == pytest.approx(unpacked.net_bytes)


def test_compression_halves_float32_wire_bytes_only():
    grads = [((1 << 20,), "float32"), ((1 << 20,), "int32")]
    kwargs = dict(devices_per_worker=1, num_workers=4)
    plain = cost_model.traffic_of(spec("xring"), grads, **kwargs)
    bf16 = cost_model.traffic_of(
        spec("xring", compression="bf16"), grads, **kwargs
    )
    per_tensor = plain.net_bytes / 2
    assert bf16.net_bytes == pytest.approx(per_tensor / 2 + per_tensor)
    assert bf16.ops > plain.ops and bf16.reduce_bytes > plain.reduce_bytes


def test_a_scaled_codec_pays_four_passes_more_than_a_cast():
    # 2^20 values across 2 workers, pscpu, one shard: worker 0 sends its
    # 4 MiB of float32 (8 MiB of float64), cast each way (2 passes) for
    # bf16 of float32; a scaled message adds its largest and smallest
    # value and a multiply each way (6 passes).
    kwargs = dict(devices_per_worker=1, num_workers=2)
    extra = {}
    for dtype, itemsize in (("float32", 4), ("float64", 8)):
        grads = [((1 << 20,), dtype)]
        plain = cost_model.traffic_of(spec("pscpu"), grads, **kwargs)
        assert plain.net_bytes == pytest.approx(itemsize << 20)
        for codec in ("bf16", "fp16"):
            t = cost_model.traffic_of(
                spec("pscpu", compression=codec), grads, **kwargs
            )
            assert t.net_bytes == pytest.approx(2 << 20)
            passes = (t.reduce_bytes - plain.reduce_bytes) / (itemsize << 20)
            extra[dtype, codec] = passes
    assert extra == {
        ("float32", "bf16"): pytest.approx(2),
        ("float32", "fp16"): pytest.approx(6),
        ("float64", "bf16"): pytest.approx(6),
        ("float64", "fp16"): pytest.approx(6),
    }
    # A collective group of 2 gathers both 16-bit messages: each member
    # encodes its pack once and decodes 2 messages, and sums 1 into the
    # other: 1 + 2 + 1 = 4 passes of the pack; scaled, 4 + 2 x 2 + 1 = 9.
    grads = [((1 << 20,), "float32")]
    gathered = {
        codec: cost_model.traffic_of(
            ("CollectiveAllReduce", {"compression": codec}), grads, **kwargs
        )
        for codec in ("bf16", "fp16")
    }
    more = gathered["fp16"].reduce_bytes - gathered["bf16"].reduce_bytes
    assert more == pytest.approx(5 * (4 << 20))


@pytest.mark.parametrize(
    "name, workers, k, compressed",
    [
        ("CollectiveAllReduce", 2, 1, True),
        ("CollectiveAllReduce", 3, 1, True),
        ("CollectiveAllReduce", 2, 2, False),  # a group of 4 members
        ("HierarchicalCollectiveAllReduce", 2, 4, True),  # 2 members
        ("HierarchicalCollectiveAllReduce", 4, 1, False),
    ],
)
def test_collectives_compress_by_gathering_groups_of_2_or_3(
    name, workers, k, compressed
):
    size = 1 << 22
    grads = [((size // 4,), "float32")]
    kwargs = dict(devices_per_worker=k, num_workers=workers)
    plain = cost_model.traffic_of((name, {}), grads, **kwargs)
    bf16 = cost_model.traffic_of(
        (name, {"compression": "bf16"}), grads, **kwargs
    )
    if not compressed:
        assert bf16 == plain
        return
    # One member per worker sends (p-1) messages of size/2 bytes around
    # the gather's ring, where the exact ring sends 2(p-1)/p * size.
    p = workers * k if name == "CollectiveAllReduce" else workers
    assert bf16.net_bytes == pytest.approx((p - 1) * size / 2)
    assert plain.net_bytes == pytest.approx(2 * (p - 1) / p * size)


def test_rechd_beats_ring_for_small_messages_at_large_p():
    small, large = one_tensor(4096), one_tensor(1 << 30)
    kwargs = dict(devices_per_worker=1, num_workers=1000, constants=TRUE)
    ring_small = cost_model.predict(spec("xring"), small, **kwargs)
    rechd_small = cost_model.predict(spec("rechd"), small, **kwargs)
    # Latency: 2 * 999 messages against 2 * 9 + 1.
    assert rechd_small < ring_small / 20
    # Bandwidth: at 1000 (not a power of two) the fold costs rechd n more
    # bytes each way, about 1.5x the ring's 2(p-1)/p n.
    ring_large = cost_model.predict(spec("xring"), large, **kwargs)
    rechd_large = cost_model.predict(spec("rechd"), large, **kwargs)
    assert ring_large < rechd_large < 2 * ring_large
    # The crossover where 2(p - 1 - log2 q - 1/2) alpha = n beta (roughly).
    crossover = 2 * (1000 - 1 - 9.5) * TRUE.alpha_net / TRUE.beta_net
    below = one_tensor(int(crossover / 4) // 4 * 4)
    above = one_tensor(int(crossover * 4) // 4 * 4)
    assert cost_model.predict(spec("rechd"), below, **kwargs) < (
        cost_model.predict(spec("xring"), below, **kwargs)
    )
    assert cost_model.predict(spec("rechd"), above, **kwargs) > (
        cost_model.predict(spec("xring"), above, **kwargs)
    )


SMALL = [((n,), "float32") for n in (10, 64, 256, 1000, 3)] * 40
LARGE = [((1024, 1024), "float32"), ((4096,), "float32")] * 4
SYNTHETIC_CONFIGS = [
    ("SpecAllReduce", {"all_reduce_spec": alg, **packing})
    for alg in ("xring", "rechd", "pscpu", "psgpu")
    for packing in ({}, {"num_packs": 1}, {"num_packs": 4})
] + [
    ("ReductionToOneDevice", {}),
    ("HierarchicalCopyAllReduce", {"num_packs": 0}),
]
MULTI_WORKER_CONFIGS = (
    [
        spec(alg, **packing)
        for alg in ("xring", "rechd", "pscpu", "pscpu/xring")
        for packing in ({}, {"num_packs": 1})
    ]
    + [
        ("CollectiveAllReduce", {"options": {"bytes_per_pack": size}})
        for size in (0, 4 << 20)
    ]
    + [("tf.MultiWorkerMirroredStrategy", {})]
)


@functools.cache
def _clean_measurements():
    rows = []
    for grads in (SMALL, LARGE):
        for config in SYNTHETIC_CONFIGS:
            for k in (2, 4, 8):
                rows.append((config, grads, k, 1))
        for config in MULTI_WORKER_CONFIGS:
            for workers, k in ((2, 1), (4, 1), (3, 2), (8, 2)):
                rows.append((config, grads, k, workers))
    return [
        cost_model.Measurement(
            config,
            grads,
            k,
            workers,
            cost_model.predict(
                config,
                grads,
                devices_per_worker=k,
                num_workers=workers,
                constants=TRUE,
            ),
        )
        for config, grads, k, workers in rows
    ]


def synthetic_measurements(noise, seed=0):
    """Times from TRUE, each times (1 + noise * a standard normal)."""
    rng = np.random.default_rng(seed)
    return [
        m._replace(seconds=m.seconds * (1 + noise * rng.standard_normal()))
        for m in _clean_measurements()
    ]


def test_fit_recovers_known_constants_exactly_without_noise():
    fitted = cost_model.fit(synthetic_measurements(noise=0.0))
    for name in cost_model.FIELDS:
        assert getattr(fitted, name) == pytest.approx(
            getattr(TRUE, name), rel=1e-6
        ), name


def test_fit_recovers_known_constants_within_a_few_percent_with_noise():
    rows = synthetic_measurements(noise=0.01, seed=1)
    fitted = cost_model.fit(rows)
    for name in cost_model.FIELDS:
        assert getattr(fitted, name) == pytest.approx(
            getattr(TRUE, name), rel=0.05
        ), name
    # And the fitted model predicts the rows within a few percent.
    errors = [
        cost_model.predict(
            m.config,
            m.gradients,
            devices_per_worker=m.devices_per_worker,
            num_workers=m.num_workers,
            constants=fitted,
        )
        / m.seconds
        - 1
        for m in rows
    ]
    assert np.median(np.abs(errors)) < 0.02


def test_fit_keeps_constants_non_negative():
    rows = synthetic_measurements(noise=0.3, seed=2)
    fitted = cost_model.fit(rows)
    assert all(getattr(fitted, name) >= 0 for name in cost_model.FIELDS)


def test_nnls_matches_an_unconstrained_solution_when_it_is_positive():
    rng = np.random.default_rng(3)
    a = rng.random((30, 4))
    x = np.array([1.0, 2.0, 0.5, 3.0])
    np.testing.assert_allclose(
        least_squares.nonnegative_least_squares(a, a @ x, relative=False),
        x,
        rtol=1e-9,
    )


GRADS = [((3, 4), "float32")]
SPEC = ("SpecAllReduce", {})
R1D = ("ReductionToOneDevice", {})
ALL_REDUCE = "AllReduceCrossDeviceOps"


@pytest.mark.parametrize(
    "config, kwargs, argument",
    [
        ("SpecAllReduce", {}, "config"),
        (("NoSuchOps", {}), {}, "config: unknown class 'NoSuchOps'"),
        (("SpecAllReduce", {"num_pack": 1}), {}, "config: SpecAllReduce"),
        (spec("xrign"), {}, "all_reduce_spec"),
        (("SpecAllReduce", {"compression": "int8"}), {}, "compression"),
        (("SpecAllReduce", {"num_packs": -1}), {}, "num_packs"),
        (
            ("SpecAllReduce", {"num_packs": 2, "agg_small_grads_max_bytes": 8}),
            {},
            "num_packs=2 and agg_small_grads_max_bytes=8",
        ),
        ((ALL_REDUCE, {"all_reduce_alg": "ring"}), {}, "all_reduce_alg"),
        (
            ("CollectiveAllReduce", {"options": {"bytes_per_pack": -1}}),
            {},
            "options.bytes_per_pack",
        ),
        (
            ("MultiWorkerAllReduce", {"worker_devices": ["/job:w/task:0"]}),
            {"num_workers": 2},
            "worker_devices",
        ),
        (SPEC, {"devices_per_worker": 0}, "devices_per_worker"),
        (SPEC, {"num_workers": 0}, "num_workers"),
        (R1D, {"gradients": [((2,), "float8")]}, "gradients[0]"),
        (R1D, {"gradients": [((-2,), "float32")]}, "gradients[0]"),
        (R1D, {"gradients": []}, "gradients"),
        (
            ("tf.HierarchicalCopyAllReduce", {"compression": "bf16"}),
            {},
            "config: tf.HierarchicalCopyAllReduce takes no argument",
        ),
    ],
)
def test_predict_names_the_bad_argument(config, kwargs, argument):
    call = {"devices_per_worker": 2, "gradients": GRADS} | kwargs
    gradients = call.pop("gradients")
    with pytest.raises((ValueError, TypeError), match=f"^{_escape(argument)}"):
        cost_model.predict(config, gradients, **call)


def _escape(text):
    return re.escape(text)


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("grads", [SMALL, LARGE], ids=["small", "large"])
def test_recommend_for_one_worker_builds(devices, grads):
    config, seconds = cost_model.recommend(
        grads, num_workers=1, devices_per_worker=devices
    )
    name, kwargs = config
    ops = getattr(tf_crossdevice, name)(**kwargs)
    assert ops is not None
    assert seconds == cost_model.predict(
        config, grads, devices_per_worker=devices
    )
    others = [
        cost_model.predict(c, grads, devices_per_worker=devices)
        for c in cost_model.candidates(1, devices)
    ]
    assert seconds == min(others)


@pytest.mark.parametrize("workers", [64, 1024])
@pytest.mark.parametrize("devices", [1, 8])
def test_recommend_for_large_clusters(workers, devices):
    config, seconds = cost_model.recommend(
        LARGE, num_workers=workers, devices_per_worker=devices
    )
    assert config[0] in (
        "MultiWorkerAllReduce",
        "CollectiveAllReduce",
        "HierarchicalCollectiveAllReduce",
    )
    assert seconds > 0
    if config[0] == "MultiWorkerAllReduce":
        workers_list = [f"/job:worker/task:{i}" for i in range(workers)]
        tf_crossdevice.MultiWorkerAllReduce(workers_list, 0, **config[1])


def _specs(configs):
    return [str(kwargs.get("all_reduce_spec")) for _, kwargs in configs]


def test_candidates_hold_nccl_on_gpus_only():
    assert not [s for s in _specs(cost_model.candidates(1, 4)) if "nccl" in s]
    gpu = cost_model.candidates(1, 4, device_type="GPU")
    # Every packing, none to four packs and aggregation.
    assert [k for n, k in gpu if k.get("all_reduce_spec") == "nccl"] == [
        {"all_reduce_spec": "nccl"},
        {"all_reduce_spec": "nccl", "num_packs": 1},
        {"all_reduce_spec": "nccl", "num_packs": 4},
        {
            "all_reduce_spec": "nccl",
            "agg_small_grads_max_bytes": 65536,
            "agg_small_grads_max_group": 1024,
        },
    ]
    two_level = set(_specs(cost_model.candidates(2, 2, device_type="GPU")))
    assert {"nccl/xring", "nccl/rechd", "nccl/pscpu"} <= two_level
    assert "nccl/xring" not in _specs(cost_model.candidates(2, 2))
    # One GPU per worker: NCCL would have nothing to reduce inside one.
    one_gpu = _specs(cost_model.candidates(2, 1, device_type="GPU"))
    assert not [s for s in one_gpu if "nccl" in s]


@pytest.mark.parametrize(
    "workers, devices, device_type",
    [(1, 4, "CPU"), (1, 4, "GPU"), (2, 1, "CPU"), (3, 2, "GPU")],
)
def test_every_candidate_is_priced_and_built(workers, devices, device_type):
    configs = cost_model.candidates(workers, devices, device_type=device_type)
    assert len({repr(c) for c in configs}) == len(configs)
    for name, kwargs in configs:
        assert (
            cost_model.predict(
                (name, kwargs),
                SMALL,
                devices_per_worker=devices,
                num_workers=workers,
            )
            > 0
        )
        if name == "MultiWorkerAllReduce":
            worker_list = [f"/job:worker/task:{i}" for i in range(workers)]
            tf_crossdevice.MultiWorkerAllReduce(worker_list, 0, **kwargs)
        elif workers == 1:
            getattr(tf_crossdevice, name)(**kwargs)


def test_across_workers_the_class_default_spec_comes_first():
    default = (
        inspect.signature(tf_crossdevice.MultiWorkerAllReduce)
        .parameters["all_reduce_spec"]
        .default
    )
    for devices in (1, 4):
        name, kwargs = cost_model.candidates(2, devices)[0]
        assert (name, kwargs) == (
            "MultiWorkerAllReduce",
            {"all_reduce_spec": default},
        )
