"""`python -m benchmarks --suite=hosts`: the presets it applies and the
candidates it keeps (nothing is run)."""

from __future__ import annotations

from absl import flags

from benchmarks import __main__ as main
from benchmarks import candidates, targets, training, workloads

FLAGS = flags.FLAGS


def _every_candidate():
    found = [
        c
        for p in (2, 3, 4)
        for c in candidates.multi_worker_candidates(
            workloads.resnet50(), num_workers=p, pack_sizes=[2 << 20, 4 << 20]
        )
    ]
    found += candidates.strategy_candidates(pack_sizes=[2 << 20, 4 << 20])
    return list({c.name: c for c in found}.values())


def test_the_suite_keeps_every_entry_its_targets_name():
    every = _every_candidate()
    candidates.check_patterns(every, main._SUITE_CANDIDATES)
    kept = {c.name for c in candidates.select(every, main._SUITE_CANDIDATES)}
    # The defaults and the references the targets compare them with.
    assert {
        targets.FLAT,
        targets.FLAT_4MIB,
        targets.HIERARCHICAL,
        targets.DEFAULT_PACK_NAME,
        "TF MWMS RING bytes_per_pack=4MiB",
        "ours CollectiveAllReduce compression=bf16",
        "ours MultiWorkerAllReduce ('pscpu/pscpu', 2, -1) compression=bf16",
    } <= kept
    # One PowerSGD per kind; no other codec than bf16; no 32 MiB packs.
    assert sum("powersgd" in n for n in kept) == 2
    assert not any("fp16" in n or "32MiB" in n for n in kept)


def test_the_suite_presets():
    main.define_flags()
    assert "hosts" in FLAGS["suite"].parser.enum_values
    preset = main.SUITES["hosts"]
    assert preset["emulated_hosts"] == ["2", "3", "4"]
    assert preset["training_hosts"] == ["2", "4"]
    assert preset["local_devices"] == ["1", "2"]
    assert preset["pack_sizes_kib"] == ["2048", "4096"]
    assert all(name in FLAGS for name in preset)
    # Every job a training target reads runs in the training group.
    assert set(targets.TRAINING_DEFAULTS) <= set(training.JOBS)
