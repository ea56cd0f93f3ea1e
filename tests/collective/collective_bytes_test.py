"""Bytes that cross worker boundaries: flat versus hierarchical collectives.

Two worker processes (tests/collective_worker.py, trace mode) with k = 2
logical CPUs each build `tf_crossdevice.MultiWorkerMirroredStrategy` with
CollectiveAllReduce ("flat") and then HierarchicalCollectiveAllReduce
("hier"), trace a `strategy.run` step whose replicas all-reduce tensors of S
bytes in all, and send back every collective op of the traced graph: its
type, device, group size and group key (the ops' Const inputs) and the
bytes of its input. The test then counts, per worker (W = 2 workers):

(a) bytes handed to collectives whose group spans workers (group size
    larger than this worker's members of the group): flat k*S (each local
    device enters the one group of k*W members), hierarchical S (only the
    first device enters the group of W members): exactly k-fold fewer.
(b) the modelled ring traffic across worker boundaries. TensorFlow's ring
    orders a group's members worker by worker (a worker's devices in
    order); in a ring all-reduce of n members each member sends
    2(n-1)/n of its bytes to the next one, and only the last member of each
    worker sends to another worker. Over the cluster: flat
    W * 2(kW-1)/(kW) * S, hierarchical W * 2(W-1)/W * S.

So the hierarchical variant hands k times fewer bytes to cross-worker
collectives, but the ring's bytes on the wire between workers shrink only
by (kW-1)/(k(W-1)): 1.5x at W = k = 2, not k (the flat ring's intra-worker
hops carry the rest, and the hierarchical variant adds a local reduce and
copy). The k-fold saving is in (a), and in the number of ring hops.
S is computed here with numpy from the shapes and dtypes the workers use,
and the closed forms by plain arithmetic.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from tests import collective_worker as worker

pytestmark = pytest.mark.slow

TIMEOUT = 150  # Seconds for a worker's whole run, on a loaded machine.
W = 2
K = worker.LOCAL_DEVICES
KINDS = ["flat", "hier"]


@pytest.fixture(scope="module")
def traces() -> dict[str, list[dict]]:
    """traces[kind][task]: that worker's collective ops and sums."""
    return worker.replies("trace", KINDS, W, TIMEOUT)


def total_bytes() -> int:
    """S: the bytes one replica all-reduces."""
    return sum(
        np.zeros(shape, dtype).nbytes for shape, dtype in worker.BYTES_SHAPES
    )


def device_index(device: str) -> int:
    return int(device.rsplit(":", 1)[1])


def spanning_ops(ops: list[dict]) -> list[dict]:
    """The ops whose group has members on other workers, each with its
    number of local members and whether it is the worker's last one."""
    local: dict[int, set[int]] = {}
    for op in ops:
        local.setdefault(op["group_key"], set()).add(device_index(op["device"]))
    out = []
    for op in ops:
        members = local[op["group_key"]]
        assert op["group_size"] % len(members) == 0, op
        if op["group_size"] > len(members):
            last = device_index(op["device"]) == max(members)
            out.append({**op, "local_members": len(members), "last": last})
    return out


def cross_worker_input_bytes(ops: list[dict]) -> int:
    return sum(op["bytes"] for op in spanning_ops(ops))


def ring_bytes_across_workers(ops: list[dict]) -> Fraction:
    """One worker's modelled ring sends to another worker."""
    return sum(
        (
            Fraction(2 * (op["group_size"] - 1), op["group_size"]) * op["bytes"]
            for op in spanning_ops(ops)
            if op["last"]
        ),
        Fraction(0),
    )


def test_the_traced_collectives_are_the_ones_that_run(traces):
    replicas = W * K
    want = [
        sum(worker.bytes_values(r)[k] for r in range(replicas))
        for k in range(len(worker.BYTES_SHAPES))
    ]
    for kind in KINDS:
        for task, trace in enumerate(traces[kind]):
            assert all(
                op["type"] in ("CollectiveReduceV2", "CollectiveGatherV2")
                for op in trace["ops"]
            )
            assert {f"task:{task}" in op["device"] for op in trace["ops"]} == {
                True
            }
            assert len(trace["sums"]) == K
            for replica_sums in trace["sums"]:
                for got, expected in zip(replica_sums, want, strict=True):
                    np.testing.assert_array_equal(got, np.ravel(expected))


def test_group_sizes_reflect_the_workers(traces):
    for task in range(W):
        flat = traces["flat"][task]["ops"]
        hier = traces["hier"][task]["ops"]
        assert {op["group_size"] for op in flat} == {K * W}
        assert {device_index(op["device"]) for op in flat} == set(range(K))
        assert {op["group_size"] for op in hier} == {W}
        assert {device_index(op["device"]) for op in hier} == {0}


def test_hierarchical_hands_k_fold_fewer_bytes_to_cross_worker_groups(
    traces,
):
    s = total_bytes()
    for task in range(W):
        flat = cross_worker_input_bytes(traces["flat"][task]["ops"])
        hier = cross_worker_input_bytes(traces["hier"][task]["ops"])
        assert flat == K * s
        assert hier == s
        assert flat == K * hier


def test_ring_bytes_across_workers_match_the_closed_forms(traces):
    s = total_bytes()
    flat = sum(ring_bytes_across_workers(t["ops"]) for t in traces["flat"])
    hier = sum(ring_bytes_across_workers(t["ops"]) for t in traces["hier"])
    assert flat == W * Fraction(2 * (K * W - 1), K * W) * s
    assert hier == W * Fraction(2 * (W - 1), W) * s
    # The wire saving: (kW-1)/(k(W-1)), 3/2 at W = k = 2; not k.
    assert flat / hier == Fraction(K * W - 1, K * (W - 1))
    assert flat / hier == Fraction(3, 2)
