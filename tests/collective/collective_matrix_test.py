"""The collective classes in real clusters of worker processes, against numpy.

The matrix: 2 workers on 127.0.0.1 x 1 local device, and 3 workers x 2
(an even and an odd worker count, one device and several; the two other
corners run no code path these two miss, and every cluster is a set of
worker processes the suite waits for);
CollectiveAllReduce ("flat") and HierarchicalCollectiveAllReduce ("hier")
under tf_crossdevice.MultiWorkerMirroredStrategy; dense values and
IndexedSlices (row counts that differ between replicas, so workers pad);
SUM and MEAN; bytes_per_pack 0, below one tensor and above them all; the
AUTO, RING and NCCL implementations (NCCL falls back to RING on CPUs;
every one with every pack size in the 2-worker cluster, NCCL in the other);
extended.reduce_to, strategy.reduce, extended.batch_reduce_to,
replica-context all_reduce, strategy.gather and replica-context all_gather
(along axes 0 and 1, sizes that differ between replicas); and the two call
shapes of TF 2.2's CollectiveHints documentation.

Each cluster is launched once (a module-scoped fixture per config): its
workers, tests/collective_matrix_worker.py, run every case of
`worker.cases()` for both variants and reply with every local replica's
result. The tests build the expected values with numpy from the same input
functions and check every replica of every worker. The collectives have a
60 s timeout, so a bug gives an error rather than a hang, and every worker
is stopped when its cluster's results are in, also on failure.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from tests import collective_matrix_worker as worker
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.launch import tf_config_envs

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Seconds for a cluster to start and run every case (a loaded machine).
CLUSTER_TIMEOUT = 240
# (workers, local devices, implementations). On CPUs every implementation
# runs RING (NCCL after a warning), so the larger cluster runs NCCL alone,
# the fallback, and the smaller one every implementation with every pack.
CONFIGS = [(2, 1, worker.IMPLEMENTATIONS), (3, 2, ("NCCL",))]
PER_WORKER = {
    "strategy_reduce",
    "strategy_gather",
    "strategy_gather_sparse",
    "hints_strategy_reduce",
}

pytestmark = pytest.mark.slow


class Cluster:
    """One config's results: `results[variant][task][case]`."""

    def __init__(
        self, num_workers: int, local: int, implementations: tuple[str, ...]
    ) -> None:
        self.num_workers = num_workers
        self.local = local
        self.cases = worker.cases(implementations)
        self.results: dict[str, list[dict[str, Any]]] = {}
        self.stderr: list[str] = []

    @property
    def replicas(self) -> int:
        return self.num_workers * self.local


def launch(
    num_workers: int, local: int, implementations: tuple[str, ...]
) -> Cluster:
    cluster = Cluster(num_workers, local, implementations)
    children: list[_processes.Child] = []
    try:
        for task, env in enumerate(tf_config_envs(num_workers)):
            children.append(
                _processes.start_module(
                    "tests.collective_matrix_worker",
                    str(local),
                    ",".join(implementations),
                    name=f"worker {task} of {num_workers}x{local}",
                    env=env,
                    cwd=ROOT,
                )
            )
        for variant in worker.VARIANTS:
            cluster.results[variant] = []
            for task, child in enumerate(children):
                answer = child.receive(timeout=CLUSTER_TIMEOUT)
                assert (answer["variant"], answer["task"]) == (variant, task)
                cluster.results[variant].append(answer["results"])
        cluster.stderr = [child.stderr_text() for child in children]
    finally:
        _processes.stop_all(children)
    return cluster


@pytest.fixture(
    scope="module",
    params=CONFIGS,
    ids=[f"{w}workers-{k}dev" for w, k, _ in CONFIGS],
)
def cluster(request) -> Cluster:
    return launch(*request.param)


# ---- Expected values, with numpy alone ------------------------------------


def densify(values: Any, indices: Any, dense_shape: Any) -> np.ndarray:
    out = np.zeros(dense_shape, np.float64)
    np.add.at(out, np.asarray(indices, np.int64), np.asarray(values))
    return out


def sparse_dense(g: int, salt: int) -> np.ndarray:
    values, indices = worker.sparse(g, salt)
    return densify(values, indices, worker.SPARSE_SHAPE)


def reduced(op: str, parts: list[np.ndarray]) -> np.ndarray:
    total = np.sum([np.asarray(p, np.float64) for p in parts], axis=0)
    return total / len(parts) if op == "MEAN" else total


def batch_expected(op: str, salt: int, replicas: int) -> list[np.ndarray]:
    """Expected [a, sparse (dense), b, c] of `worker.batch`."""
    return [
        reduced(op, [worker.dense(g, "a", salt) for g in range(replicas)]),
        reduced(op, [sparse_dense(g, salt) for g in range(replicas)]),
        reduced(op, [worker.dense(g, "b", salt) for g in range(replicas)]),
        reduced(op, [worker.dense(g, "c", salt) for g in range(replicas)]),
    ]


def as_dense(result: Any) -> np.ndarray:
    """A worker's result as an array; IndexedSlices are densified."""
    if isinstance(result, dict):
        return densify(
            result["values"], result["indices"], result["dense_shape"]
        )
    return np.asarray(result)


def expected(case: dict[str, Any], cluster: Cluster) -> Any:
    """What every result of `case` must equal (a list for batches)."""
    kind, salt, n = case["kind"], case["salt"], cluster.replicas
    op = case.get("op", "SUM")
    if kind == "reduce_to":
        if case["value"] == "dense":
            return reduced(op, [worker.dense(g, "a", salt) for g in range(n)])
        return reduced(op, [sparse_dense(g, salt) for g in range(n)])
    if kind == "strategy_reduce":
        if case["axis"] is None:
            return reduced(op, [worker.dense(g, "c", salt) for g in range(n)])
        rows = np.concatenate([worker.ragged(g, 0, salt) for g in range(n)])
        return rows.mean(axis=0) if op == "MEAN" else rows.sum(axis=0)
    if kind in ("batch_reduce", "all_reduce", "hints_all_reduce"):
        return batch_expected(op, salt, n)
    if kind == "hints_strategy_reduce":
        return reduced(op, [worker.dense(g, "b", salt) for g in range(n)])
    if kind in ("strategy_gather", "all_gather"):
        axis = case["axis"]
        parts = [worker.ragged(g, axis, salt) for g in range(n)]
        return np.concatenate(parts, axis=axis)
    if kind == "strategy_gather_sparse":
        # Replica g's rows, indices shifted by the rows of those before it.
        return np.concatenate([sparse_dense(g, salt) for g in range(n)])
    raise AssertionError(f"no expectation for {kind}")


def check(cluster: Cluster, variant: str, kinds: set[str]) -> None:
    """Every case of `kinds`, on every replica of every worker.

    Reports every mismatch (where, then the first few in full).
    """
    selected = [c for c in cluster.cases if c["kind"] in kinds]
    assert selected
    mismatches: list[tuple[str, str]] = []
    for case in selected:
        want = expected(case, cluster)
        # strategy.reduce and strategy.gather give one result per worker.
        count = 1 if case["kind"] in PER_WORKER else cluster.local
        for task, results in enumerate(cluster.results[variant]):
            got = results[case["name"]]
            assert len(got) == count, (case["name"], task)
            for replica, result in enumerate(got):
                where = f"{case['name']}, worker {task}, replica {replica}"
                if not isinstance(want, list):
                    result, want_each = [result], [want]
                else:
                    want_each = want
                    assert len(result) == len(want), where
                for i, (r, w) in enumerate(zip(result, want_each, strict=True)):
                    name = f"{where}, value {i}"
                    try:
                        np.testing.assert_allclose(
                            as_dense(r), w, rtol=1e-6, err_msg=name
                        )
                    except (AssertionError, IndexError, ValueError) as e:
                        mismatches.append((name, str(e).strip()))
    assert not mismatches, "\n".join(
        [f"{len(mismatches)} mismatches:", *(m[0] for m in mismatches)]
        + [m[1] for m in mismatches[:3]]
    )


# ---- The tests ------------------------------------------------------------

variants = pytest.mark.parametrize("variant", worker.VARIANTS)


@variants
def test_reduce_to_every_replica(cluster, variant):
    check(cluster, variant, {"reduce_to"})


@variants
def test_strategy_reduce(cluster, variant):
    check(cluster, variant, {"strategy_reduce"})


@variants
def test_batch_reduce_every_implementation_and_pack_size(cluster, variant):
    check(cluster, variant, {"batch_reduce"})


@variants
def test_replica_context_all_reduce(cluster, variant):
    check(cluster, variant, {"all_reduce"})


@variants
def test_gather_ragged_along_axes_0_and_1(cluster, variant):
    check(cluster, variant, {"strategy_gather", "all_gather"})


@variants
def test_gather_indexed_slices(cluster, variant):
    check(cluster, variant, {"strategy_gather_sparse"})


@variants
def test_collective_hints_call_shapes(cluster, variant):
    check(cluster, variant, {"hints_all_reduce", "hints_strategy_reduce"})


def test_nccl_falls_back_to_ring_on_cpu(cluster):
    for task, stderr in enumerate(cluster.stderr):
        assert "implementation=NCCL needs GPUs" in stderr, f"worker {task}"
