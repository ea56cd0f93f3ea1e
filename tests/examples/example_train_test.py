"""examples/train.py's flags, their checks and its data, in-process.

Every validation message names its flag; each test sets flags as a user
would (absl flagsaver) and expects check_flags' ValidationError with that
message. The job's flags parser (train_flags.parse_flags) then exits with
status 1 and that message alone; examples_test.py runs one such command.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import itertools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver

EXAMPLES = os.path.join(
    os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ),
    "examples",
)
sys.path.insert(0, EXAMPLES)
import train_data  # noqa: E402
import train_flags  # noqa: E402

FLAGS = flags.FLAGS


@pytest.fixture(scope="module", autouse=True)
def job_flags():
    """The job's flags on absl's FLAGS for this module, removed after."""
    before = set(FLAGS)
    train_flags.define_flags(FLAGS)
    was_parsed = FLAGS.is_parsed()
    if not was_parsed:
        FLAGS.mark_as_parsed()
    yield
    for name in set(FLAGS) - before:
        delattr(FLAGS, name)
    if not was_parsed:
        FLAGS.unparse_flags()


@pytest.fixture(autouse=True)
def no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def rejected(message: str, **overrides) -> None:
    with (
        flagsaver.flagsaver(**overrides),
        pytest.raises(flags.ValidationError, match=message),
    ):
        train_flags.check_flags(FLAGS.flag_values_dict())


def test_the_defaults_are_the_main_job():
    assert FLAGS.mode == "collective"
    assert train_flags.class_of(FLAGS.flag_values_dict()) == (
        "HierarchicalCollectiveAllReduce"
    )
    assert train_flags.num_replicas(FLAGS.flag_values_dict())[0] == 4
    with flagsaver.flagsaver(mode="in_graph", loop="custom"):
        assert train_flags.class_of(FLAGS.flag_values_dict()) == (
            "MultiWorkerAllReduce"
        )


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"mode": "mirrored", "cross_device_ops": "CollectiveAllReduce"},
            r"--cross_device_ops: 'CollectiveAllReduce' is not a class of "
            r"--mode=mirrored; expected one of auto, ReductionToOneDevice",
        ),
        (
            {"cross_device_ops": "Ring"},
            r"--cross_device_ops: 'Ring' is not a class of --mode=collective",
        ),
        (
            {"mode": "in_graph", "loop": "fit"},
            r"--loop: --mode=in_graph trains with a custom loop",
        ),
        (
            {"mode": "mirrored", "job_name": "worker"},
            r"--job_name: 'worker' has no role in --mode=mirrored",
        ),
        (
            {"job_name": "controller"},
            r"--job_name: 'controller' has no role in --mode=collective; "
            r"expected one of worker, chief",
        ),
        (
            {
                "job_name": "worker",
                "worker_hosts": ["a:1"],
                "cluster_spec": '{"worker": ["a:1"]}',
            },
            r"--worker_hosts: give the cluster once",
        ),
        (
            {"job_name": "worker", "cluster_spec": "{worker"},
            r"--cluster_spec: not JSON",
        ),
        (
            {"job_name": "worker", "cluster_spec": '["a:1"]'},
            r"--cluster_spec: expected a JSON object",
        ),
        (
            {"worker_hosts": ["a:1", "b:1"]},
            r"--worker_hosts: a cluster of hosts needs --job_name",
        ),
        (
            {"mode": "mirrored", "cluster_spec": '{"worker": ["a:1"]}'},
            r"--cluster_spec: a cluster of hosts needs --job_name",
        ),
        (
            {"job_name": "worker", "task_index": 0},
            r"--job_name: a worker needs the cluster: --worker_hosts",
        ),
        (
            {"job_name": "worker", "worker_hosts": ["a:1", "b:1"]},
            r"--task_index: a worker needs its index",
        ),
        (
            {
                "job_name": "worker",
                "task_index": 2,
                "worker_hosts": ["a:1", "b:1"],
            },
            r"--task_index: 2 is not a task of job 'worker', which has 2 "
            r"task\(s\) in --worker_hosts",
        ),
        (
            {
                "job_name": "chief",
                "task_index": 0,
                "cluster_spec": '{"worker": ["a:1", "b:1"]}',
            },
            r"--task_index: 0 is not a task of job 'chief', which has 0",
        ),
        (
            {"mode": "in_graph", "job_name": "controller"},
            r"--job_name: the controller needs the workers",
        ),
        (
            {
                "mode": "mirrored",
                "cross_device_ops": "ReductionToOneDevice",
                "all_reduce_spec": "xring",
            },
            r"--all_reduce_spec: --cross_device_ops=ReductionToOneDevice "
            r"takes no spec",
        ),
        (
            {
                "mode": "mirrored",
                "cross_device_ops": "SpecAllReduce",
                "all_reduce_spec": "xrign",
            },
            r"--all_reduce_spec: all_reduce_spec 'xrign': unknown algorithm",
        ),
        (
            {
                "mode": "mirrored",
                "cross_device_ops": "AllReduceCrossDeviceOps",
                "all_reduce_spec": "pscpu:32k:xring",
            },
            r"--all_reduce_spec: AllReduceCrossDeviceOps takes one algorithm",
        ),
        (
            {
                "mode": "in_graph",
                "loop": "custom",
                "all_reduce_spec": "nccl/xring",
            },
            r"--all_reduce_spec: 'nccl/xring' runs NCCL, which needs GPUs",
        ),
        (
            {"mode": "mirrored", "cross_device_ops": "NcclAllReduce"},
            r"--cross_device_ops: NcclAllReduce needs GPUs",
        ),
        (
            {
                "mode": "mirrored",
                "cross_device_ops": "HierarchicalCopyAllReduce",
                "compression": "bf16",
            },
            r"--compression: --cross_device_ops=HierarchicalCopyAllReduce "
            r"does not compress",
        ),
        (
            {"mode": "mirrored", "compression": "powersgd"},
            r"--compression: powersgd compresses gradients between workers "
            r"with CollectiveAllReduce, HierarchicalCollectiveAllReduce, "
            r"MultiWorkerAllReduce in --mode=collective or in_graph; got "
            r"--mode=mirrored --cross_device_ops=auto",
        ),
        (
            {"batch_size": 30},
            r"--batch_size: 30 does not split over 4 replicas \(2 workers x "
            r"2 devices_per_worker\); use a multiple of 4",
        ),
        (
            {
                "batch_size": 32,
                "job_name": "worker",
                "task_index": 0,
                "worker_hosts": ["a:1", "b:1", "c:1"],
            },
            r"--batch_size: 32 does not split over 6 replicas \(3 workers",
        ),
        (
            {"mode": "mirrored", "devices_per_worker": 3},
            r"--batch_size: 64 does not split over 3 replicas \(3 "
            r"devices_per_worker\)",
        ),
        (
            {"accumulation_steps": 2},
            r"--accumulation_steps: 2 micro-batches per update need "
            r"--loop=custom; Keras's own gradient_accumulation_steps",
        ),
        (
            {"mode": "in_graph", "loop": "custom", "accumulation_steps": 2},
            r"--accumulation_steps: 2 micro-batches per update need a "
            r"strategy; --mode=in_graph does not accumulate",
        ),
        (
            {"timing_steps": 5},
            r"--timing_steps: compares the custom loop's step between "
            r"workers with the same step on one host alone; it needs "
            r"--mode=collective with --loop=custom, or --mode=in_graph, got "
            r"--mode=collective --loop=fit",
        ),
        (
            {"mode": "mirrored", "loop": "custom", "timing_steps": 5},
            r"--timing_steps: .* got --mode=mirrored --loop=custom",
        ),
        (
            {"loop": "custom", "accumulation_steps": 2, "timing_steps": 5},
            r"--timing_steps: times one all-reduce per step; with "
            r"--accumulation_steps=2 a step all-reduces once per 2 "
            r"micro-batches",
        ),
        (
            {"loop": "custom", "accumulation_steps": 3},
            r"--batch_size: 64 does not split into --accumulation_steps=3 "
            r"micro-batches over 4 replicas \(2 workers x 2 "
            r"devices_per_worker\); use a multiple of 12",
        ),
        (
            {"cross_device_ops": "TensorFlow"},
            r"--devices_per_worker: --cross_device_ops=TensorFlow is "
            r"tf.distribute.MultiWorkerMirroredStrategy, which has one "
            r"replica per worker on hosts without GPUs \(its CPU\); got 2",
        ),
        (
            {"cross_device_ops": "TensorFlow", "loop": "fit"},
            r"--loop: --cross_device_ops=TensorFlow trains with a custom "
            r"loop: Keras 3's model.fit fails under TensorFlow's own "
            r"MultiWorkerMirroredStrategy",
        ),
        (
            {
                "cross_device_ops": "TensorFlow",
                "devices_per_worker": 1,
                "compression": "bf16",
            },
            r"--compression: --cross_device_ops=TensorFlow does not compress",
        ),
        (
            {"link_rate": "fast"},
            r"--link_rate: expected a positive rate such as '1gbit'.*'fast'",
        ),
        (
            {"link_rate": "1gbit", "mode": "mirrored"},
            r"--link_rate: emulated hosts are for the workers the job starts",
        ),
        (
            {
                "link_rate": "1gbit",
                "job_name": "worker",
                "worker_hosts": "a:1,b:1",
                "task_index": 0,
            },
            r"--link_rate: emulated hosts are for the workers the job starts",
        ),
        (
            {"max_restarts": 1, "mode": "in_graph"},
            r"--max_restarts: restarts the workers the job starts itself: "
            r"--mode=collective without --job_name",
        ),
        (
            {
                "max_restarts": 2,
                "job_name": "worker",
                "worker_hosts": "a:1,b:1",
                "task_index": 0,
            },
            r"--max_restarts: .* python -m tf_crossdevice\.launch "
            r"--max_restarts=K",
        ),
        (
            {"stall_seconds": 60, "mode": "in_graph"},
            r"--stall_seconds: watches the workers the job starts itself: "
            r"--mode=collective without --job_name",
        ),
        (
            {"min_workers": 1, "max_restarts": 1},
            r"--min_workers: only an emulated host can drop out and a "
            r"restart run without it: with --link_rate and --max_restarts",
        ),
        (
            {"min_workers": 3, "max_restarts": 1, "link_rate": "1gbit"},
            r"--min_workers: 3 is more than --num_workers=2",
        ),
        (
            {
                "min_workers": 2,
                "num_workers": 3,
                "max_restarts": 1,
                "link_rate": "1gbit",
                "batch_size": 6,
            },
            r"--batch_size: 6 does not split over the 4 replicas of 2 "
            r"workers \(--min_workers=2\); use a multiple of every replica "
            r"count from 4 to 6",
        ),
        (
            {"rescale": "per_replica", "mode": "mirrored", "loop": "custom"},
            r"--rescale: a restart on fewer workers is for "
            r"--mode=collective; got --mode=mirrored",
        ),
        (
            {
                "rescale": "per_replica",
                "job_name": "worker",
                "worker_hosts": ["a:1", "b:1", "c:1"],
                "task_index": 0,
                "batch_size": 12,
            },
            r"--num_workers: with --rescale=per_replica, the full cluster's "
            r"worker count; this cluster has 3, more than 2",
        ),
        (
            {"sync": "diloco", "mode": "mirrored", "loop": "custom"},
            r"--sync=diloco: steps that reduce within a worker need our "
            r"strategy: --mode=collective with CollectiveAllReduce or "
            r"HierarchicalCollectiveAllReduce; got --mode=mirrored",
        ),
        (
            {
                "sync": "local_sgd",
                "cross_device_ops": "TensorFlow",
                "devices_per_worker": 1,
                "loop": "custom",
            },
            r"--sync=local_sgd: .* --cross_device_ops=TensorFlow",
        ),
        (
            {
                "sync": "diloco",
                "sync_period": 32,
                "log_every": 100,
                "steps": 320,
            },
            r"--log_every: 100 is not a multiple of --sync_period=32; "
            r"checkpoints and the end must fall on a sync",
        ),
        (
            {"sync": "diloco", "sync_period": 4, "log_every": 8, "steps": 18},
            r"--steps: 18 is not a multiple of --sync_period=4",
        ),
        (
            {
                "sync": "local_sgd",
                "sync_period": 4,
                "log_every": 8,
                "steps": 16,
                "sync_warmup_steps": 6,
            },
            r"--sync_warmup_steps: 6 is not a multiple of --sync_period=4",
        ),
        (
            {
                "sync": "local_sgd",
                "sync_period": 4,
                "log_every": 8,
                "steps": 16,
                "loop": "custom",
                "accumulation_steps": 2,
            },
            r"--accumulation_steps: not with --sync=local_sgd; leave it at "
            r"its default",
        ),
        (
            {"eval_every": 50, "log_every": 40},
            r"--eval_every: 50 must be a multiple of --log_every=40 \(it "
            r"scores at checkpoints\), in --mode=collective or mirrored",
        ),
        (
            {"lr_schedule": "cosine", "mode": "in_graph"},
            r"--lr_schedule=cosine: the in-graph step applies a constant "
            r"rate; use --mode=collective or mirrored",
        ),
        (
            {"uneven_data": 0.0},
            r"--uneven_data: 0 would leave the last worker no data; "
            r"expected a fraction in \(0, 1\]",
        ),
        (
            {"uneven_data": 0.5, "mode": "mirrored", "loop": "custom"},
            r"--uneven_data: gives the workers of --mode=collective "
            r"different amounts of data; got --mode=mirrored",
        ),
        (
            {"uneven_data": 0.5, "mode": "in_graph", "loop": "custom"},
            r"--uneven_data: .* got --mode=in_graph",
        ),
        (
            {
                "uneven_data": 0.5,
                "cross_device_ops": "TensorFlow",
                "devices_per_worker": 1,
            },
            r"--uneven_data: --cross_device_ops=TensorFlow is TensorFlow's "
            r"own strategy.*; expected one of HierarchicalCollectiveAllReduce, "
            r"CollectiveAllReduce$",
        ),
        (
            {"uneven_data": 0.5, "num_workers": 1},
            r"--uneven_data: needs 2 or more workers .*; this job has 1",
        ),
        (
            {"uneven_data": 0.5, "loop": "custom", "accumulation_steps": 2},
            r"--uneven_data: the loss of --accumulation_steps=2 .* expected "
            r"--accumulation_steps=1",
        ),
        (
            {"uneven_data": 0.5, "max_restarts": 1},
            r"--uneven_data: a restart resumes model\.fit, .* use "
            r"--loop=custom",
        ),
        (
            {"uneven_data": 0.5, "steps": 10, "log_every": 4},
            r"--uneven_data: with --loop=fit, model\.fit starts again at "
            r"step 8 \(--steps=10 is not a multiple of --log_every=4\), "
            r"after the last worker's data ends at step 5",
        ),
    ],
    ids=lambda x: (
        "-".join(f"{k}={v}" for k, v in x.items())[:60]
        if isinstance(x, dict)
        else None
    ),
)
def test_validation_names_the_flag(overrides, message):
    if "GPUs" in message and tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has GPUs: NCCL is allowed")
    rejected(message, **overrides)


def test_a_bad_combination_exits_with_its_rule_alone(capsys):
    """absl's multi-flag validators would put every flag's value they were
    given before the rule; the job's parser prints the rule alone."""
    with flagsaver.flagsaver(), pytest.raises(SystemExit) as exited:
        train_flags.parse_flags(["train.py", "--batch_size=30", "--steps=7"])
    assert exited.value.code == 1
    assert capsys.readouterr().err == (
        "FATAL Flags parsing error: --batch_size: 30 does not split over 4 "
        "replicas (2 workers x 2 devices_per_worker); use a multiple of 4\n"
        "Pass --helpshort or --helpfull to see help on flags.\n"
    )


def test_steps_need_not_be_a_multiple_of_log_every(capsys):
    with flagsaver.flagsaver():
        rest = train_flags.parse_flags(["train.py", "--steps=50"])
        assert (rest, FLAGS.steps, FLAGS.log_every) == (["train.py"], 50, 40)
        assert train_flags.loop_of(FLAGS.flag_values_dict()) == "fit"
    assert capsys.readouterr().err == ""


def test_epochs_set_the_steps_of_that_many_passes_over_the_data():
    import train

    with flagsaver.flagsaver(epochs=2):
        # 2 x 8192 examples in steps of --batch_size=64; not rounded to
        # whole progress lines (--log_every=40) any more.
        assert train.total_steps(FLAGS, 8192) == 256
        # A last partial batch is a step: 2 x 100 examples in 4 steps of 64.
        assert train.total_steps(FLAGS, 100) == 4
    assert train.total_steps(FLAGS, 8192) == 400  # --steps


def test_powersgd_takes_its_rank_and_start_step_from_the_flags():
    import train

    with flagsaver.flagsaver(
        compression="powersgd", powersgd_rank=2, powersgd_start_step=7
    ):
        compressor = train.compression_of(FLAGS)["compression"]
    assert (compressor.rank, compressor.start_step) == (2, 7)


def test_with_sync_the_steps_reduce_uncompressed_and_the_syncs_compress():
    import train

    with flagsaver.flagsaver(
        sync="diloco", compression="bf16",
        cross_device_ops="CollectiveAllReduce",
    ):  # fmt: skip
        steps = train.make_cross_device_ops(FLAGS, compress=False)
        syncs = train.make_cross_device_ops(FLAGS)
    assert (steps.compression, syncs.compression) == (None, "bf16")


def test_helpshort_lists_the_jobs_flags():
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "train.py"), "--helpshort"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    job = flags.FlagValues()
    train_flags.define_flags(job)
    listed = set(re.findall(r"^  --(\w+):", result.stdout, re.MULTILINE))
    assert listed >= set(job) and {"steps", "log_every", "mode"} <= listed, (
        result.stdout + result.stderr
    )
    assert "  --steps: Training steps (global batches)." in result.stdout


@pytest.mark.parametrize("module", ["train_flags", "train_loops"])
def test_the_flag_modules_examples_run(module):
    """pytest.ini leaves these modules' doctests out (collected under
    examples.*, they would define the job's flags twice): run here."""
    result = doctest.testmod(importlib.import_module(module))
    assert result.attempted > 0 and result.failed == 0, result


def test_task_index_is_checked_against_tf_config(monkeypatch):
    monkeypatch.setenv(
        "TF_CONFIG",
        json.dumps(
            {
                "cluster": {"worker": ["a:1", "b:1"]},
                "task": {"type": "worker", "index": 3},
            }
        ),
    )
    rejected(
        r"--task_index: 3 is not a task of job 'worker', which has 2 "
        r"task\(s\) in TF_CONFIG",
        job_name="worker",
    )


@pytest.mark.parametrize(
    "name, value, allowed",
    [
        (
            "compression",
            "int8",
            r"--compression=int8: .*<none\|bf16\|fp16\|powersgd>",
        ),
        ("mode", "ps", r"--mode=ps: .*<mirrored\|collective\|in_graph>"),
        (
            "implementation",
            "MPI",
            r"--implementation=MPI: .*<AUTO\|RING\|NCCL>",
        ),
    ],
)
def test_enum_flags_list_their_values(name, value, allowed):
    with pytest.raises(flags.IllegalFlagValueError, match=allowed):
        FLAGS[name].parse(value)


def test_accumulation_steps_is_at_least_1():
    assert FLAGS.accumulation_steps == 1
    with pytest.raises(
        flags.IllegalFlagValueError,
        match=r"--accumulation_steps=0: 0 is not a positive integer",
    ):
        FLAGS["accumulation_steps"].parse("0")


def test_accumulating_custom_loop_trains_as_the_plain_one(
    tmp_path, monkeypatch
):
    """--accumulation_steps=4 splits each global batch into 4 micro-batches
    and updates once per global batch: the same updates as 1 (in float)."""
    import train_loops
    import train_report

    import tf_crossdevice

    data = train_data.synthetic(4, 4, 256, 0)
    strategy = tf.distribute.MirroredStrategy(
        tf_crossdevice.testing.cpu_devices(2),
        cross_device_ops=tf_crossdevice.ReductionToOneDevice(),
    )

    def final(k: int) -> tuple[float, list[np.ndarray]]:
        config = train_loops.Config(
            loop="custom", model="dense", depth=1, width=8, steps=4,
            batch_size=16, learning_rate=0.1, log_every=2, seed=0,
            model_dir=str(tmp_path / f"k{k}"), timeout_seconds=60.0,
            accumulation_steps=k,
        )  # fmt: skip
        weights: list[list[np.ndarray]] = []
        monkeypatch.setattr(
            train_report, "weights_digest", lambda w: weights.append(w) or ""
        )
        summary = train_loops.train_with_strategy(
            strategy, config, data, is_chief=True, task=0
        )
        assert "trained 4 steps in this run" in summary
        assert "replica weights equal: yes" in summary
        loss = re.search(r"final loss: (\S+)", summary)
        assert loss, summary
        return float(loss.group(1)), weights[0]

    (plain_loss, plain), (loss, accumulated) = final(1), final(4)
    assert loss == pytest.approx(plain_loss, abs=2e-4)
    for a, b in zip(plain, accumulated, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_fit_trains_steps_that_are_not_a_multiple_of_log_every(
    tmp_path, monkeypatch, capsys
):
    """model.fit, 7 steps, a progress line every 3: lines at steps 3, 6 and
    7. A run of 2 steps, resumed in the same folder to 7 (a partial first
    epoch, then 3 to 6, then 7 alone), ends at the same weights."""
    import train_loops
    import train_report

    import tf_crossdevice

    data = train_data.synthetic(4, 4, 256, 0)
    strategy = tf.distribute.MirroredStrategy(
        tf_crossdevice.testing.cpu_devices(2),
        cross_device_ops=tf_crossdevice.ReductionToOneDevice(),
    )
    weights: list[list[np.ndarray]] = []
    monkeypatch.setattr(
        train_report, "weights_digest", lambda w: weights.append(w) or ""
    )

    def train(folder: str, steps: int) -> tuple[str, list[tuple[int, int]]]:
        config = train_loops.Config(
            loop="fit", model="dense", depth=1, width=8, steps=steps,
            batch_size=16, learning_rate=0.1, log_every=3, seed=0,
            model_dir=str(tmp_path / folder), timeout_seconds=60.0,
        )  # fmt: skip
        summary = train_loops.train_with_strategy(
            strategy, config, data, is_chief=True, task=0
        )
        out = capsys.readouterr().out
        lines = re.findall(r"^step +(\d+)/(\d+) ", out, re.MULTILINE)
        return summary + out, [(int(a), int(b)) for a, b in lines]

    whole, lines = train("whole", 7)
    assert "trained 7 steps in this run, from step 0" in whole
    assert lines == [(3, 7), (6, 7), (7, 7)]
    saved = re.findall(r"checkpoint saved at step (\d+)", whole)
    assert saved == ["3", "6", "7"]
    latest = tf.train.latest_checkpoint(str(tmp_path / "whole"))
    assert latest.endswith("ckpt-7")
    # The optimizer's step counter: 7 updates, not more.
    iterations = [
        tf.train.load_variable(latest, name)
        for name, shape in tf.train.list_variables(latest)
        if name.startswith("optimizer/0/") and shape == []
    ]
    assert iterations == [7]

    first, lines = train("resumed", 2)
    assert "trained 2 steps in this run, from step 0" in first
    assert lines == [(2, 2)]
    resumed, lines = train("resumed", 7)
    assert "resumed from step 2 " in resumed
    assert "trained 5 steps in this run, from step 2" in resumed
    assert lines == [(3, 7), (6, 7), (7, 7)]
    for a, b in zip(weights[0], weights[2], strict=True):
        np.testing.assert_array_equal(b, a)


def test_good_combinations_pass():
    for overrides in [
        {"mode": "mirrored", "cross_device_ops": "SpecAllReduce",
         "all_reduce_spec": "pscpu:32k:xring#2", "compression": "fp16"},
        {"mode": "in_graph", "loop": "custom", "job_name": "controller",
         "worker_hosts": ["a:1", "b:1"], "all_reduce_spec": "pscpu/pscpu#2"},
        {"job_name": "chief", "task_index": 0,
         "cluster_spec": '{"chief": ["a:1"], "worker": ["b:1"]}'},
        {"cross_device_ops": "CollectiveAllReduce", "compression": "bf16"},
        {"loop": "custom", "accumulation_steps": 4},
        {"mode": "mirrored", "loop": "custom", "accumulation_steps": 2},
        {"cross_device_ops": "TensorFlow", "devices_per_worker": 1},
        {"uneven_data": 1.0},
        {"uneven_data": 0.5, "loop": "custom", "max_restarts": 1},
        {"uneven_data": 0.9, "steps": 10, "log_every": 4},
        {"sync": "diloco", "sync_period": 4, "log_every": 8, "steps": 16,
         "sync_warmup_steps": 4, "compression": "powersgd",
         "cross_device_ops": "CollectiveAllReduce"},
        {"sync": "local_sgd", "sync_period": 5, "log_every": 5,
         "steps": 400, "loop": "fit"},
    ]:  # fmt: skip
        with flagsaver.flagsaver(**overrides):
            train_flags.check_flags(FLAGS.flag_values_dict())


@pytest.mark.parametrize(
    "num_gpus, workers_on_host, rank, num_workers, batch_size, want",
    [
        (0, 1, 0, 1, 64, ("CPU", 2, 0)),
        (0, 2, 1, 2, 64, ("CPU", 2, 0)),
        (1, 1, 0, 1, 64, ("GPU", 1, 0)),
        # One GPU cannot serve two workers: both use logical CPUs.
        (1, 2, 1, 2, 64, ("CPU", 2, 0)),
        (2, 2, 1, 2, 64, ("GPU", 1, 1)),
        (8, 1, 0, 1, 64, ("GPU", 8, 0)),
        (8, 2, 1, 2, 64, ("GPU", 4, 4)),
        (8, 2, 1, 4, 64, ("GPU", 4, 4)),
        # 6 GPUs do not split 64 examples evenly: 4 of them do.
        (6, 1, 0, 1, 64, ("GPU", 4, 0)),
        (3, 1, 0, 1, 30, ("GPU", 3, 0)),
        (3, 3, 2, 3, 64, ("GPU", 1, 2)),
    ],
)
def test_default_devices_per_worker_follow_the_gpus(
    num_gpus, workers_on_host, rank, num_workers, batch_size, want
):
    got = train_flags.resolve_local_devices(
        None,
        num_gpus,
        workers_on_host=workers_on_host,
        rank_on_host=rank,
        num_workers=num_workers,
        batch_size=batch_size,
    )
    assert (got.device_type, got.count, got.first_gpu) == want
    # A note says why GPUs were left unused, and only then.
    used = got.count * workers_on_host if got.device_type == "GPU" else 0
    assert bool(got.note) == (used < num_gpus), got.note


@pytest.mark.parametrize(
    "requested, num_gpus, workers_on_host, rank, want",
    [
        (3, 0, 2, 1, ("CPU", 3, 0)),
        (1, 1, 1, 0, ("GPU", 1, 0)),
        (2, 8, 2, 1, ("GPU", 2, 2)),
    ],
)
def test_explicit_devices_per_worker(
    requested, num_gpus, workers_on_host, rank, want
):
    got = train_flags.resolve_local_devices(
        requested, num_gpus, workers_on_host=workers_on_host, rank_on_host=rank
    )
    assert (got.device_type, got.count, got.first_gpu) == want


@pytest.mark.parametrize(
    "requested, num_gpus, workers_on_host, message",
    [
        (2, 1, 1, r"--devices_per_worker: 2 GPU\(s\), but this host has 1"),
        (
            2,
            2,
            2,
            r"--devices_per_worker: 2 GPU\(s\) for each of the 2 workers on "
            r"this host \(4 in all\), but this host has 2 GPU\(s\); leave "
            r"--devices_per_worker unset",
        ),
    ],
)
def test_more_gpus_than_the_host_has_name_the_flag(
    requested, num_gpus, workers_on_host, message
):
    with pytest.raises(flags.ValidationError, match=message):
        train_flags.resolve_local_devices(
            requested, num_gpus, workers_on_host=workers_on_host
        )


def test_resolve_local_devices_docstring_examples():
    import doctest

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(train_flags.resolve_local_devices):
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.parametrize(
    "overrides, want",
    [
        ({}, (2, 0)),  # the job's own local workers
        ({"mode": "mirrored"}, (1, 0)),
        (
            {
                "job_name": "worker",
                "task_index": 2,
                "worker_hosts": ["a:1", "b:1", "localhost:2", "127.0.0.1:3"],
            },
            (2, 0),
        ),
        (
            {
                "job_name": "worker",
                "task_index": 0,
                "cluster_spec": '{"chief": ["a:1"], "worker": ["a:2", "b:1"]}',
                "batch_size": 60,
            },
            (2, 1),
        ),
        (
            {
                "mode": "in_graph",
                "loop": "custom",
                "job_name": "controller",
                "worker_hosts": ["a:1", "a:2", "a:3", "b:1"],
            },
            (3, 0),
        ),
    ],
    ids=["local", "mirrored", "loopback", "chief_first", "controller"],
)
def test_host_share_counts_the_tasks_of_this_host(overrides, want):
    with flagsaver.flagsaver(**overrides):
        assert train_flags.host_share(FLAGS.flag_values_dict()) == want


def test_the_defaults_run_on_a_one_gpu_host(monkeypatch):
    """The main job's two local workers cannot share one GPU: logical CPUs;
    mirrored uses the GPU; asking for 2 GPUs names the flag."""
    monkeypatch.setattr(train_flags, "num_local_gpus", lambda: 1)
    values = FLAGS.flag_values_dict()
    train_flags.check_flags(values)
    devices = train_flags.local_devices_of(values)
    assert (devices.device_type, devices.count) == ("CPU", 2)
    assert "--num_workers" in devices.note
    with flagsaver.flagsaver(mode="mirrored"):
        values = FLAGS.flag_values_dict()
        train_flags.check_flags(values)
        assert train_flags.num_replicas(values) == (1, "1 devices_per_worker")
        assert train_flags.local_devices_of(values).device_type == "GPU"
    rejected(
        r"--devices_per_worker: 2 GPU\(s\), but this host has 1 GPU",
        mode="mirrored",
        devices_per_worker=2,
    )


def test_batch_indices_cover_each_epoch_once():
    rows = train_data.batch_indices(10, 4, seed=3, start=0, stop=5)
    stream = rows.ravel()
    assert sorted(stream[:10]) == list(range(10))
    assert sorted(stream[10:20]) == list(range(10))
    # A later start gives the same batches: a restart sees the same data.
    later = train_data.batch_indices(10, 4, seed=3, start=3, stop=5)
    np.testing.assert_array_equal(later, rows[3:5])


@pytest.mark.parametrize("micro_steps", [1, 2])
def test_each_worker_builds_only_its_replicas_examples(micro_steps):
    # 2 workers x 2 replicas, global batch 8: each micro-batch splits into
    # 4 replica slices in order; worker w yields slices 2w and 2w + 1 of
    # each micro-batch, and nothing else.
    def example(index):  # The label is the example's index.
        return tf.zeros([1, 1, 3]), tf.cast(index, tf.int32)

    data = train_data.Data(1, 2, 12, example, None, None, "")
    rows = train_data.batch_indices(12, 8, seed=1, start=2, stop=5)
    per = 2 // micro_steps
    for worker in (0, 1):
        context = tf.distribute.InputContext(2, worker, 4)
        labels = [
            y.numpy().tolist()
            for _, y in train_data.replica_dataset(
                data, 8, 1, 2, 5, context, micro_steps
            )
        ]
        expected = [
            rows[step][m * 8 // micro_steps :][g * per : (g + 1) * per]
            for step in range(3)
            for m in range(micro_steps)
            for g in (2 * worker, 2 * worker + 1)
        ]
        assert labels == [e.tolist() for e in expected]


def test_with_uneven_data_the_last_workers_batches_end_early():
    # 2 workers x 2 replicas, steps [2, 5): the last worker's data ends
    # before step 4, the other's does not; each has its replicas' slices.
    def example(index):  # The label is the example's index.
        return tf.zeros([1, 1, 3]), tf.cast(index, tf.int32)

    data = train_data.Data(1, 2, 12, example, None, None, "")
    rows = train_data.batch_indices(12, 8, seed=1, start=2, stop=5)
    for worker, steps in ((0, 3), (1, 2)):
        context = tf.distribute.InputContext(2, worker, 4)
        labels = [
            y.numpy().tolist()
            for _, y in train_data.replica_dataset(
                data, 8, 1, 2, 5, context, last_stop=4
            )
        ]
        assert labels == [
            rows[s][g * 2 : (g + 1) * 2].tolist()
            for s in range(steps)
            for g in (2 * worker, 2 * worker + 1)
        ]
    # Resumed after the last worker's data ended: it has none.
    last = tf.distribute.InputContext(2, 1, 4)
    dataset = train_data.replica_dataset(data, 8, 1, 4, 5, last, last_stop=4)
    assert list(dataset) == []


def test_the_jobs_batches_repeat_so_no_step_waits_for_a_has_data_check():
    """Over a finite dataset, TensorFlow's iterator between workers
    all-reduces whether every worker still has data before each step; the
    job's datasets repeat without end, and its loops take the steps they
    need. The steps come in order, then again from the first."""
    import train_loops

    import tf_crossdevice

    def example(index):  # The label is the example's index.
        return tf.zeros([1, 1, 3]), tf.cast(index, tf.int32)

    data = train_data.Data(1, 2, 12, example, None, None, "")
    rows = train_data.batch_indices(12, 8, seed=1, start=2, stop=5)
    strategy = tf.distribute.MirroredStrategy(
        tf_crossdevice.testing.cpu_devices(2),
        cross_device_ops=tf_crossdevice.ReductionToOneDevice(),
    )
    batches = train_loops._distributed(strategy, data, 8, 1, 2, 5)
    seen = [
        [r.numpy().tolist() for r in strategy.experimental_local_results(y)]
        for _, y in itertools.islice(batches, 5)
    ]
    want = [[rows[s][:4].tolist(), rows[s][4:].tolist()] for s in range(3)]
    assert seen == want + want[:2]


@pytest.mark.parametrize("table", [True, False])
def test_each_example_is_made_once_while_the_table_fits(table, monkeypatch):
    # 3 steps of 8 from 12 examples: 24 rows name each example twice. The
    # image holds its index and a count of the examples made before it.
    made = tf.Variable(0)

    def example(index):
        count = made.assign_add(1)
        image = tf.stack(
            [tf.cast(index, tf.float32), tf.cast(count, tf.float32), 0.0]
        )
        return tf.reshape(image, [1, 1, 3]), tf.cast(index, tf.int32)

    if not table:  # A 12-byte example no longer fits.
        monkeypatch.setattr(train_data, "_TABLE_BYTES", 11 * 12)
    data = train_data.Data(1, 2, 12, example, None, None, "")
    rows = train_data.batch_indices(12, 8, seed=1, start=0, stop=3)
    batches = list(train_data.dataset(data, 8, 1, 0, 3))
    for (x, y), want in zip(batches, rows, strict=True):
        np.testing.assert_array_equal(y.numpy(), want)
        np.testing.assert_array_equal(x.numpy()[:, 0, 0, 0], want)
    assert int(made.numpy()) == (12 if table else 24)
    counts = np.concatenate([x.numpy()[:, 0, 0, 1] for x, _ in batches])
    # From the table, an example's second use is the same image; made per
    # batch, it is made again (a later count).
    first, second = {}, {}
    for index, count in zip(rows.ravel(), counts, strict=True):
        (second if index in first else first)[index] = count
    assert (first == second) == table, (first, second)


def test_synthetic_batches_from_the_table_are_those_made_per_batch(
    monkeypatch,
):
    data = train_data.synthetic(8, 4, num_train=64, seed=0)
    # 6 steps of 16 from 64 examples: an epoch and a half.
    table = list(train_data.dataset(data, 16, 0, 0, 6))
    monkeypatch.setattr(train_data, "_TABLE_BYTES", 0)
    per_batch = list(train_data.dataset(data, 16, 0, 0, 6))
    assert len(table) == len(per_batch) == 6
    for (x, y), (x2, y2) in zip(table, per_batch, strict=True):
        np.testing.assert_array_equal(x.numpy(), x2.numpy())
        np.testing.assert_array_equal(y.numpy(), y2.numpy())


def test_eval_examples_sets_the_held_out_set():
    data = train_data.synthetic(8, 4, num_train=64, seed=0, eval_examples=300)
    assert data.eval_images.shape == (300, 8, 8, 3)
    # The first 300 of the default 1024: the same examples, the same labels.
    default = train_data.synthetic(8, 4, num_train=64, seed=0)
    np.testing.assert_array_equal(data.eval_labels, default.eval_labels[:300])


def test_the_cosine_schedule_falls_from_the_rate_to_0_at_the_last_step():
    import train_loops

    config = train_loops.Config(
        loop="custom", model="dense", depth=1, width=8, steps=4,
        batch_size=16, learning_rate=0.1, log_every=2, seed=0,
        model_dir="", timeout_seconds=60.0, lr_schedule="cosine",
    )  # fmt: skip
    schedule = train_loops._learning_rate(config)
    # 0.1 x (1 + cos(pi x step / 4)) / 2.
    want = [0.1, 0.0853553, 0.05, 0.0146447, 0.0]
    got = [float(schedule(step)) for step in range(5)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    constant = dataclasses.replace(config, lr_schedule="constant")
    assert train_loops._learning_rate(constant) == 0.1


def test_synthetic_labels_come_from_the_teacher_and_use_every_class():
    data = train_data.synthetic(8, 4, num_train=64, seed=0)
    counts = np.bincount(data.eval_labels, minlength=4)
    assert data.eval_images.shape == (1024, 8, 8, 3)
    assert counts.min() > 1024 / 4 / 3, counts
    x, y = data.example(tf.constant(5, tf.int64))
    x2, y2 = data.example(tf.constant(5, tf.int64))
    np.testing.assert_array_equal(x.numpy(), x2.numpy())
    assert int(y) == int(y2)


def test_tfrecords_and_image_folders_read_the_same_images(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(16, 4, 4, 3)).astype(np.uint8)
    labels = np.arange(16) % 2
    folder = tmp_path / "folder"
    records = tmp_path / "records"
    records.mkdir()
    with tf.io.TFRecordWriter(str(records / "train.tfrecord")) as writer:
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            png = tf.io.encode_png(image).numpy()
            (folder / f"c{label}").mkdir(parents=True, exist_ok=True)
            (folder / f"c{label}" / f"{i:02d}.png").write_bytes(png)
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "image": tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[png])
                        ),
                        "label": tf.train.Feature(
                            int64_list=tf.train.Int64List(value=[label])
                        ),
                    }
                )
            )
            writer.write(example.SerializeToString())
    for source in (folder, records):
        data = train_data.from_directory(str(source), 4, seed=0)
        assert data.num_classes == 2 and data.num_train == 14
        seen = {}
        for i in range(data.num_train):
            x, y = data.example(tf.constant(i, tf.int64))
            seen[np.asarray(x).tobytes()] = int(y)
        expected = {
            (
                images[i].astype(np.float32) / np.float32(127.5)
                - np.float32(1.0)
            ).tobytes(): labels[i]
            for i in range(16)
        }
        for key, label in seen.items():
            assert expected[key] == label
