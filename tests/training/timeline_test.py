"""A step's timeline: Chrome trace events of one profiled step.

The summary's numbers are checked against intervals worked out by hand;
the XSpace conversion against a hand-built XSpace (its times in
picoseconds from the profile's start); the trace files by writing,
merging and reading them back; the interface counters against a fake
/sys/class/net. One real step of a 2-replica
`tf_crossdevice.MultiWorkerMirroredStrategy` shows both replicas'
CollectiveReduceV2 and the forward and backward MatMuls, all inside the
step's wall-clock window.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import training
from tf_crossdevice.training import _timeline

STEP = training.STEP_EVENT


def x(name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": ts,
            "dur": dur, "args": args}  # fmt: skip


def process(pid, name):
    return {"ph": "M", "name": "process_name", "pid": pid,
            "args": {"name": name}}  # fmt: skip


# Worker 1: a 1000 µs step from t=100. Its collectives, on two threads:
# [50, 150) starts before the step (clipped to [100, 150): 50 µs);
# [200, 400) and [300, 500) overlap (one interval [200, 500): 300 µs);
# [450, 460) lies inside it (nothing more); [1050, 1200) ends after the
# step (clipped to [1050, 1100): 50 µs); [1200, 1300) lies after it
# (not counted). Union: 50 + 300 + 50 = 400 µs of 1000: 0.4.
# The MatMul, _Send, _Recv and AddN beside them are not collectives.
# Worker 2: a 200 µs step from t=0 with no collective op: 0, 0 ops.
EVENTS = [
    process(1, "worker 1"),
    x(STEP, 100, 1000),
    x("CollectiveReduceV2", 50, 100, tid=2),
    x("CollectiveReduceV2", 200, 200, tid=2),
    x("CollectiveGatherV2", 300, 200, tid=3),
    x("CollectiveBcastSendV2", 450, 10, tid=2),
    x("CollectiveBcastRecvV2", 1050, 150, tid=3),
    x("CollectiveReduceV2", 1200, 100, tid=2),
    x("_MklMatMul", 100, 1000, tid=4),
    x("_Send", 100, 1000, tid=4),
    x("_Recv", 100, 1000, tid=4),
    x("AddN", 100, 1000, tid=4),
    process(2, "worker 2"),
    x(STEP, 0, 200, pid=2),
    x("AddN", 0, 200, pid=2),
    # A process without a step (another tool's) has no summary.
    x("CollectiveReduceV2", 0, 10, pid=3),
]


def test_summary_counts_the_union_of_collectives_within_the_step():
    first, second = training.summarize_trace(EVENTS)
    assert (first.pid, first.process_name) == (1, "worker 1")
    assert first.step_us == 1000
    assert first.all_reduce_us == pytest.approx(400)
    assert first.all_reduce_share == pytest.approx(0.4)
    # Overlapping the step: all but the one after it.
    assert first.collective_ops == 5
    assert (second.pid, second.step_us) == (2, 200)
    assert (second.all_reduce_us, second.collective_ops) == (0, 0)
    assert second.all_reduce_share == 0


@pytest.mark.parametrize(
    "spans, union",
    [
        ([], 0),
        ([(0, 10)], 10),
        ([(0, 10), (10, 20)], 20),  # touching
        ([(0, 30), (5, 10)], 30),  # nested
        ([(5, 10), (0, 3), (2, 6)], 10),  # unsorted, chained
        ([(0, 4), (6, 8)], 6),  # apart
    ],
)
def test_union_of_intervals(spans, union):
    events = [x(STEP, 0, 100)] + [
        x("CollectiveReduceV2", a, b - a) for a, b in spans
    ]
    (summary,) = training.summarize_trace(events)
    assert summary.all_reduce_us == union
    assert summary.all_reduce_share == union / 100


def test_two_steps_in_one_process_are_refused():
    with pytest.raises(ValueError, match=r"process 1 has more than one"):
        training.summarize_trace([x(STEP, 0, 10), x(STEP, 20, 10)])


def test_collectives_are_the_collective_op_types_only():
    assert {"CollectiveReduceV2", "CollectiveGatherV2"} <= (
        training.COLLECTIVE_OPS
    )
    assert not {"_Send", "_Recv", "AddN", "Identity"} & training.COLLECTIVE_OPS


def test_merged_workers_keep_their_times_under_their_index(tmp_path):
    one = [process(4321, "host pid 4321"), x(STEP, 100, 1000, pid=4321),
           x("CollectiveReduceV2", 200, 300, pid=4321)]  # fmt: skip
    two = [process(99, "host pid 99"), x(STEP, 150, 500, pid=99),
           x("CollectiveReduceV2", 150, 100, pid=99)]  # fmt: skip
    paths = {0: str(tmp_path / "a.json"), 1: str(tmp_path / "b.json")}
    training.write_trace(paths[0], one, {"sent_bytes": 7})
    training.write_trace(paths[1], two)
    with open(paths[0]) as f:
        written = json.load(f)
    assert written == {
        "traceEvents": one,
        "displayTimeUnit": "ms",
        "otherData": {"sent_bytes": 7},
    }
    out = str(tmp_path / "merged.json")
    merged = training.merge_traces(paths, out)
    with open(out) as f:
        assert json.load(f) == merged
    assert merged["otherData"] == {"workers": {"0": {"sent_bytes": 7}, "1": {}}}
    names = {
        e["pid"]: e["args"]["name"]
        for e in merged["traceEvents"]
        if e["name"] == "process_name"
    }
    assert names == {0: "worker 0", 1: "worker 1"}
    summaries = training.summarize_trace(merged["traceEvents"])
    assert [(s.pid, s.process_name, s.step_us, s.all_reduce_share)
            for s in summaries] == [
        (0, "worker 0", 1000, 0.3), (1, "worker 1", 500, 0.2)
    ]  # fmt: skip
    # No partial file left beside them.
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b.json", "merged.json"]


def test_xspace_events_are_placed_on_the_wall_clock():
    # The profile starts at 1_000_000_000 ns; the line 2_000 ns later. An
    # op at 3_500_000 ps (3.5 µs) into the line, 1_250_000 ps long: ts
    # (1e9 + 2e3) ns + 3.5 µs = 1_000_005.5 µs, dur 1.25 µs.
    from tensorflow.tsl.profiler.protobuf import xplane_pb2 as pb2

    space = pb2.XSpace(hostnames=["host"])
    env = space.planes.add(name="Task Environment")
    env.stat_metadata[1].name = "profile_start_time"
    env.stats.add(metadata_id=1, uint64_value=1_000_000_000)
    cpu = space.planes.add(name="/host:CPU")
    cpu.event_metadata[1].name = "grad/MatMul:MatMul"
    cpu.event_metadata[1].display_name = "MatMul"
    cpu.event_metadata[2].name = "ThreadpoolListener::Record"
    cpu.stat_metadata[1].name = "group_key"
    cpu.stat_metadata[2].name = "_c"  # a link between events: left out
    line = cpu.lines.add(name="tf_Compute/7", timestamp_ns=2_000)
    op = line.events.add(metadata_id=1, offset_ps=3_500_000,
                         duration_ps=1_250_000)  # fmt: skip
    op.stats.add(metadata_id=1, int64_value=5)
    op.stats.add(metadata_id=2, int64_value=9)
    line.events.add(metadata_id=2, offset_ps=4_000_000, duration_ps=0)
    events = _timeline._xspace_events(space, 12, "worker 3")
    assert events == [
        {"ph": "M", "name": "process_name", "pid": 12,
         "args": {"name": "worker 3"}},
        {"ph": "M", "name": "process_sort_index", "pid": 12,
         "args": {"sort_index": 12}},
        {"ph": "M", "name": "thread_name", "pid": 12, "tid": 1,
         "args": {"name": "/host:CPU tf_Compute/7"}},
        {"ph": "X", "cat": "op", "name": "MatMul", "pid": 12, "tid": 1,
         "ts": 1_000_005.5, "dur": 1.25,
         "args": {"group_key": 5, "node": "grad/MatMul"}},
    ]  # fmt: skip


def test_sent_bytes_leave_out_loopback_and_bridge_ports(tmp_path):
    def interface(name, kind, tx, port=False):
        folder = tmp_path / name
        (folder / "statistics").mkdir(parents=True)
        (folder / "type").write_text(f"{kind}\n")
        (folder / "statistics" / "tx_bytes").write_text(f"{tx}\n")
        if port:
            (folder / "brport").mkdir()

    interface("lo", 772, 1000)
    interface("eth0", 1, 100)
    interface("br0", 1, 20)  # The bridge's own interface: this host's.
    interface("veth0", 1, 5000, port=True)  # Forwarded: other hosts'.
    assert _timeline.sent_bytes(str(tmp_path)) == 120
    assert _timeline.sent_bytes(str(tmp_path / "none")) is None


def test_profile_rates_its_sent_bytes_over_its_wall_time():
    profile = training.StepProfile(start_us=0, end_us=250_000, sent_bytes=50)
    assert profile.wall_seconds == 0.25
    assert profile.sent_bytes_per_second == 200
    assert training.StepProfile(end_us=1).sent_bytes_per_second is None


def test_a_profiled_step_shows_both_replicas_reduce_and_matmuls(tmp_path):
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        local_devices=tf_crossdevice.testing.cpu_devices(2)
    )
    with strategy.scope():
        w = tf.Variable(np.ones([16, 8], np.float32))
    x_ = tf.constant(np.arange(128, dtype=np.float32).reshape(8, 16) / 128)

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(tf.square(tf.matmul(x_, w)))
            grad = tf.distribute.get_replica_context().all_reduce(
                "sum", tape.gradient(loss, w)
            )
            w.assign_sub(1e-4 * grad)
            return loss

        return strategy.reduce("sum", strategy.run(replica), axis=None)

    step()  # Traces the function outside the profile.
    keep = str(tmp_path / "plugins" / "profile" / "run")
    with training.profile_step("worker 0", profile_dir=keep) as profile:
        step().numpy()
    assert os.listdir(keep) and all(
        f.endswith(".xplane.pb") for f in os.listdir(keep)
    )
    ops = [e for e in profile.events if e["ph"] == "X" and e["cat"] == "op"]
    for e in ops:
        assert profile.start_us <= e["ts"], e
        assert e["ts"] + e["dur"] <= profile.end_us, e
    reduces = [e for e in ops if e["name"] == "CollectiveReduceV2"]
    by_key: dict[int, set[str]] = {}
    for e in reduces:
        by_key.setdefault(e["args"]["instance_key"], set()).add(
            e["args"]["node"]
        )
    # The gradient's all-reduce: one op per replica, of one instance.
    assert any(len(nodes) == 2 for nodes in by_key.values()), by_key
    matmuls = {e["args"]["node"] for e in ops if "MatMul" in e["name"]}
    forward = {n for n in matmuls if not n.startswith("gradient_tape")}
    backward = {n for n in matmuls if "gradient_tape" in n}
    # Each replica's forward and backward (replica 1's under "replica_1").
    assert len(forward) == 2 and len(backward) == 2, matmuls
    assert any("replica_1" in n for n in forward), forward
    assert any("replica_1" in n for n in backward), backward
    (summary,) = training.summarize_trace(profile.events)
    assert summary.step_us == pytest.approx(profile.end_us - profile.start_us)
    assert summary.collective_ops >= 2
    assert 0 < summary.all_reduce_share <= 1


def test_two_profiles_keep_one_folder_as_two_hosts(tmp_path):
    """Workers of one machine keep their steps in one TensorBoard run, a
    host each, under the names they give (TensorFlow would name both files
    after the machine, the second overwriting the first)."""
    keep = str(tmp_path / "plugins" / "profile" / "step3")
    sizes = {}
    for host, n in (("worker0", 8), ("worker1", 64)):
        with training.profile_step(host, profile_dir=keep, profile_host=host):
            tf.reduce_sum(tf.ones([n, n])).numpy()
        sizes[host] = os.path.getsize(os.path.join(keep, f"{host}.xplane.pb"))
    assert sorted(os.listdir(keep)) == [
        "worker0.xplane.pb",
        "worker1.xplane.pb",
    ]
    assert all(size > 0 for size in sizes.values()), sizes
