"""The benchmark's PowerSGD entries: their names, the check of their first
step (applied sum plus every replica's error equals numpy's sum, and the
result is numpy's sum projected onto as many columns as the rank, without
a PowerSGD of numpy's), and the bytes they should send.

Message sizes are worked out by hand: a 4608 x 512 matrix (ResNet-50's
3x3x512x512 kernel) at rank 4 sends P (4608 x 4) and Q (512 x 4), 20,480
values where float32 sends 2,359,296.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import (
    candidates,
    records,
    roofline,
    sessions,
    targets,
    workloads,
)
from tf_crossdevice.compression import PowerSGD
from tf_crossdevice.tuning import measure

MIB = 2**20


def test_powersgd_runs_in_graph_and_with_our_collective_at_rank_4():
    every = candidates.multi_worker_candidates(workloads.resnet50())
    every += candidates.strategy_candidates()
    names = [c.name for c in every if "powersgd" in c.name]
    assert names == [
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) num_packs=1 "
        "compression=powersgd rank=4",
        "ours CollectiveAllReduce compression=powersgd rank=4",
    ]
    built = candidates.compression_of(
        next(c for c in every if "powersgd" in c.name).kwargs
    )
    assert isinstance(built, PowerSGD)
    assert (built.rank, built.start_step) == (4, 0)
    assert candidates.compression_of({"compression": "bf16"}) == "bf16"


def test_powersgd_bytes_by_hand():
    # 3x3x512x512 -> (4608, 512): (4608 + 512) * 4 values; (512,) whole;
    # (10, 10) is under the 4096-element threshold: whole; (1, 3) would
    # send (1 + 3) * 1 = 4 values for 3: whole.
    shapes = [(3, 3, 512, 512), (512,), (10, 10), (1, 3)]
    want = 4 * ((4608 + 512) * 4 + 512 + 100 + 3)
    assert roofline.powersgd_bytes(shapes, 4) == want
    # Rank 1 of the big kernel: 5120 values.
    assert roofline.powersgd_bytes(shapes[:1], 1) == 4 * 5120
    # (4096, 8) at rank 4 would send (4096 + 8) * 4 = 16416 values for
    # 32768: fewer, but not half as many; whole at the default rate 2.
    assert roofline.powersgd_bytes([(4096, 8)], 4) == 4 * 32768
    assert PowerSGD(rank=4).elements_sent((4096, 8)) == 32768
    assert roofline.powersgd_bytes([(4096, 8)], 4, min_rate=1) == 4 * 16416
    at_1 = PowerSGD(rank=4, min_compression_rate=1)
    assert at_1.elements_sent((4096, 8)) == 16416


@pytest.mark.parametrize(("rank", "fewer"), [(1, 157), (4, 62), (8, 35)])
def test_resnet50_sends_what_the_paper_promises(rank, fewer):
    # ResNet-50's 97.6 MiB of gradients against its PowerSGD messages.
    w = workloads.resnet50()
    assert w.num_bytes == 25_583_592 * 4
    got = roofline.powersgd_bytes(w.shapes, rank)
    assert round(w.num_bytes / got) == fewer
    if rank == 4:
        assert got / MIB == pytest.approx(1.57, abs=0.005)


@pytest.mark.parametrize("rank", [1, 4, 8])
def test_the_bytes_model_agrees_with_what_the_compressor_sends(rank):
    # Written apart on purpose; here both rules meet on real models.
    compressor = PowerSGD(rank=rank)
    for w in (workloads.resnet50(), workloads.bert_base()):
        sent = sum(compressor.elements_sent(s) for s in w.shapes)
        assert roofline.powersgd_bytes(w.shapes, rank) == 4 * sent


def test_the_bytes_model_of_a_powersgd_entry_is_its_all_reduces():
    name = (
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) num_packs=1 "
        "compression=powersgd rank=4"
    )
    w = workloads.resnet50()
    group = records.Group.of("multi_worker", w, 2, link_rate="1gbit")
    r = records.entry_of(name, "ours", None, [0.1])
    s = roofline.powersgd_bytes(w.shapes, 4)
    # pscpu with 2 shards on 2 hosts: each host sends half to the other
    # and its half's sum back: S per host.
    assert targets.bytes_model(group, r) == pytest.approx([s, s])
    group4 = records.Group.of("multi_worker", w, 4, link_rate="1gbit")
    ring = records.entry_of(
        "ours CollectiveAllReduce compression=powersgd rank=4",
        "ours",
        None,
        [1],
    )
    assert targets.bytes_model(group4, ring) == pytest.approx([1.5 * s] * 4)


def test_workloads_by_the_name_a_record_keeps():
    assert (
        workloads.named("resnet50[:3]").shapes
        == (workloads.resnet50().shapes[:3])
    )
    assert workloads.named("bert_base") == workloads.bert_base()
    assert workloads.named("sweep_64B").shapes == ((16,),)
    with pytest.raises(ValueError, match="no workload 'resnet51'"):
        workloads.named("resnet51")


def _first_step(replicas=3, shapes=((64, 48), (48,))):
    """Inputs of `replicas` replicas (all on this CPU), and one PowerSGD
    step of them, summed by adding the replicas' values."""
    inputs = measure.Inputs(
        [(s, "float32") for s in shapes], ["/cpu:0"] * replicas, seed=3
    )
    compressor = PowerSGD(rank=2, min_compression_size=0)

    def add(batch):
        return [[tf.add_n(list(v))] * len(v) for v in batch]

    per_value = [list(v.values) for v in inputs.values()]
    sums = compressor.sum(per_value, add)
    results = [[t.numpy() for t in s] for s in sums]
    devices = [["/cpu:0"] * replicas for _ in shapes]
    ops = types.SimpleNamespace(compression=compressor)
    return inputs, ops, results, devices


POWERSGD = candidates.Candidate(
    "ours MultiWorkerAllReduce xring compression=powersgd rank=2",
    "ours",
    "ours_multi_worker",
    {"all_reduce_spec": "xring", "compression": "powersgd", "powersgd_rank": 2},
)


def test_powersgd_first_step_checks_out_and_each_fault_is_named():
    inputs, ops, results, devices = _first_step()
    check = sessions.check_of(POWERSGD, inputs, 3, ops, sessions._errors_here)
    assert check(results, devices) is None
    # The rank-2 result alone is not the sum.
    matrix = results[0][0]
    assert np.abs(matrix - inputs.expected[0]).max() > 1.0

    # One replica's error forgotten: applied + errors misses it.
    def first_two(errors):
        return sessions._errors_here(errors[:2])

    partial = sessions.check_of(POWERSGD, inputs, 3, ops, first_two)
    assert "applied + errors" in partial(results, devices)
    # A replica that applies something else.
    other = [list(r) for r in results]
    other[0][2] = other[0][2] + 1.0
    assert "replica 2 got another result" in check(other, devices)
    # The vector is summed exactly: off by one is wrong.
    off = [list(r) for r in results]
    off[1] = [v + 1.0 for v in off[1]]
    assert "summed exactly" in check(off, devices)
    # The exact sum where the compressor compressed: nothing was compressed
    # (it also fails applied + errors, the errors being non-zero).
    exact = [[inputs.expected[0]] * 3, results[1]]
    assert check(exact, devices) is not None


def test_powersgd_check_finds_an_uncompressed_result_with_no_error():
    inputs, ops, _, devices = _first_step()
    exact = [[e] * 3 for e in inputs.expected]

    def no_errors(errors):
        return np.zeros(errors[0].shape, np.float64)

    check = sessions.check_of(POWERSGD, inputs, 3, ops, no_errors)
    assert "nothing compressed" in check(exact, devices)


def test_powersgd_check_rejects_zeros_with_the_sum_kept_as_error():
    # Applied + errors holds (0 + W = W) and the result is not the sum, yet
    # nothing was sent: rank 0, where rank 2 was due.
    inputs, ops, results, devices = _first_step()
    want = inputs.expected[0].astype(np.float64)
    zeros = [[np.zeros_like(inputs.expected[0])] * 3, results[1]]
    check = sessions.check_of(POWERSGD, inputs, 3, ops, lambda errors: want)
    assert check(zeros, devices) == (
        "value 0 replica 0: rank below 2: singular value 2 is 0"
    )


def test_powersgd_check_rejects_a_result_that_is_not_a_projection():
    inputs, ops, results, devices = _first_step()
    want = inputs.expected[0].astype(np.float64)
    rng = np.random.default_rng(4)
    fakes = {
        # Of rank 2 in the real result's column space, but twice it.
        "doubled": 2 * results[0][0],
        # Random integers, of full rank.
        "random": rng.integers(-50, 51, want.shape).astype(np.float32),
    }
    for name, fake in fakes.items():
        check = sessions.check_of(
            POWERSGD, inputs, 3, ops, lambda errors, f=fake: want - f
        )
        problem = check([[fake] * 3, results[1]], devices)
        assert problem.startswith(
            "value 0 replica 0: not numpy's sum projected onto 2 columns: "
        ), (name, problem)


def test_powersgd_check_takes_any_projection_of_the_sum():
    # numpy's own rank-2 projection (onto the sum's top two left singular
    # vectors) with errors keeping the rest: what a first step may return.
    inputs, ops, results, devices = _first_step()
    want = inputs.expected[0].astype(np.float64)
    u = np.linalg.svd(want)[0][:, :2]
    projected = u @ (u.T @ want)
    check = sessions.check_of(
        POWERSGD, inputs, 3, ops, lambda errors: want - projected
    )
    fake = [[projected.astype(np.float32)] * 3, results[1]]
    assert check(fake, devices) is None


def test_powersgd_target_against_the_fastest_uncompressed_of_any_family():
    from tests.benchmarks.benchmark_hosts_test import S, _wire_group

    plain, tiny = [S] * 2, [S / 62] * 2
    group = _wire_group(
        2,
        [
            ("TF MWMS RING", "tf", None, 900, plain),
            ("ours CollectiveAllReduce", "ours", None, 1000, plain),
            (
                "ours CollectiveAllReduce compression=bf16",
                "ours",
                None,
                450,
                None,
            ),
            (
                "ours CollectiveAllReduce compression=powersgd rank=4",
                "ours",
                None,
                200,
                tiny,
            ),
        ],
    )
    by_name = {t.name.rsplit(": ", 1)[1]: t for t in targets.evaluate([group])}
    target = by_name["PowerSGD vs the fastest uncompressed"]
    # TF's ring, 900 ms, is the fastest uncompressed; bf16 does not count.
    assert target.measured == pytest.approx(4.5)
    assert target.threshold == 5.0 and not target.met
    assert "TF MWMS RING 900.000 ms" in target.note
    names = targets.references(group)
    assert "ours CollectiveAllReduce compression=powersgd rank=4" in names
    assert "TF MWMS RING" in names
