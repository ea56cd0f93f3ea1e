"""One worker of collective_matrix_test's clusters: runs every case, replies.

Run as `python -m tests.collective_matrix_worker LOCAL_DEVICES
IMPLEMENTATIONS` (comma-separated) from the repository root with
`TF_CONFIG` set (collective_matrix_test starts W of them through
`tf_crossdevice.cluster.processes`). The process splits its CPU into
LOCAL_DEVICES logical devices, then for each variant ("flat":
CollectiveAllReduce, "hier": HierarchicalCollectiveAllReduce) builds a
`tf_crossdevice.MultiWorkerMirroredStrategy` and runs every case of
`cases(IMPLEMENTATIONS)` in that order (every worker runs the same
program, so their collectives meet). It replies once per variant:

    {"variant": V, "task": T, "results": {CASE: [RESULT, ...]}}

with one RESULT per local replica (per worker for `strategy.reduce` and
`strategy.gather`, which return one value per worker): a dense result as
nested lists, an IndexedSlices as {"values", "indices", "dense_shape"}, a
structure as a list of those. A failing case ends the process with its
traceback on stderr.

The inputs are the numpy functions below, of the global replica id `g`
(worker * LOCAL_DEVICES + local index) and a per-case salt; the test builds
its expected values from the same functions with numpy alone.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

VARIANTS = ("flat", "hier")
OPS = ("SUM", "MEAN")
IMPLEMENTATIONS = ("AUTO", "RING", "NCCL")
# Dense values of the batches: 24, 20 and 32 bytes of float32.
DENSE_SHAPES = {"a": (3, 2), "b": (5,), "c": (2, 2, 2)}
# bytes_per_pack: 0 (our choice), below one tensor, above them all.
PACK_SIZES = {"pack0": 0, "packsmall": 8, "packlarge": 1 << 20}
SPARSE_SHAPE = (6, 2)
TIMEOUT_SECONDS = 60


def dense(g: int, name: str, salt: int) -> np.ndarray:
    """Replica g's dense value `name` in the case with this salt."""
    shape = DENSE_SHAPES[name]
    scale = sorted(DENSE_SHAPES).index(name) + 1
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return (base * scale + 100 * g + salt).astype(np.float32)


def sparse(g: int, salt: int) -> tuple[np.ndarray, np.ndarray]:
    """Replica g's IndexedSlices (values, indices) of SPARSE_SHAPE.

    Replicas hold 1, 2 or 3 rows (so workers pad to each other), indices
    may repeat across replicas.
    """
    rows = 1 + g % 3
    indices = np.array(
        [(g + 2 * j) % SPARSE_SHAPE[0] for j in range(rows)], np.int64
    )
    values = np.arange(rows * SPARSE_SHAPE[1], dtype=np.float32).reshape(
        rows, SPARSE_SHAPE[1]
    )
    return (values + 100 * g + salt + 1).astype(np.float32), indices


def ragged(g: int, axis: int, salt: int) -> np.ndarray:
    """Replica g's value to gather along `axis`: 1-3 entries along it."""
    size = 1 + (g + axis) % 3
    shape = (size, 3) if axis == 0 else (2, size)
    base = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return (base + 100 * g + salt).astype(np.float32)


def cases(implementations: Sequence[str]) -> list[dict[str, Any]]:
    """Every case, in the order each worker runs them, with each of
    `implementations` (of IMPLEMENTATIONS) in the batch cases.

    Keys: name, kind, salt, and per kind: op, implementation, pack (a key
    of PACK_SIZES), axis.
    """
    out: list[dict[str, Any]] = []

    def add(kind: str, **spec: Any) -> None:
        name = "-".join([kind, *(str(v) for v in spec.values())])
        out.append({"name": name, "kind": kind, "salt": len(out), **spec})

    for op in OPS:
        # extended.reduce_to onto every local replica, dense and sparse.
        add("reduce_to", op=op, value="dense")
        add("reduce_to", op=op, value="sparse")
        # strategy.reduce, whole values and along axis 0 (ragged rows).
        add("strategy_reduce", op=op, axis=None)
        add("strategy_reduce", op=op, axis=0)
    # Every implementation with every pack size, for both; the op
    # alternates so that each (op, implementation) and (op, pack size) pair
    # comes up in each, and every triple in one of the two.
    for (i, implementation), (j, pack) in itertools.product(
        enumerate(implementations), enumerate(PACK_SIZES)
    ):
        for shift, kind in enumerate(("batch_reduce", "all_reduce")):
            op = OPS[(i + j + shift) % 2]
            add(kind, op=op, implementation=implementation, pack=pack)
    for axis in (0, 1):
        add("strategy_gather", axis=axis)
        add("all_gather", axis=axis)
    add("strategy_gather_sparse", axis=0)
    # TF 2.2's CollectiveHints documentation's two call shapes.
    add("hints_all_reduce", op="SUM", pack="packsmall")
    add("hints_strategy_reduce", op="SUM", pack="packsmall")
    return out


# ---- The worker (TensorFlow from here on) ----------------------------------


def _encode(value: Any) -> Any:
    import tensorflow as tf

    if isinstance(value, tf.IndexedSlices):
        return {
            "values": value.values.numpy().tolist(),
            "indices": value.indices.numpy().tolist(),
            "dense_shape": value.dense_shape.numpy().tolist(),
        }
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    return np.asarray(value).tolist()


class _Runner:
    def __init__(self, strategy: Any, task: int, local: int) -> None:
        import tensorflow as tf

        self.tf = tf
        self.strategy = strategy
        self.task = task
        self.local = local
        self.devices = strategy.extended.worker_devices

    def options(self, case: dict[str, Any]) -> Any:
        tf = self.tf
        return tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=PACK_SIZES[case.get("pack", "pack0")],
            timeout_seconds=TIMEOUT_SECONDS,
            implementation=getattr(
                tf.distribute.experimental.CommunicationImplementation,
                case.get("implementation", "AUTO"),
            ),
        )

    def per_replica(self, make: Any) -> Any:
        """make(g) on each local replica, on its device.

        A list-valued `make` gives a list of PerReplica values.
        """
        tf = self.tf

        def value_fn(context: Any) -> Any:
            g = context.replica_id_in_sync_group
            assert g // self.local == self.task, (g, self.task)
            with tf.device(self.devices[g % self.local]):
                return make(g)

        return self.strategy.experimental_distribute_values_from_function(
            value_fn
        )

    def slices(self, g: int, salt: int) -> Any:
        tf = self.tf
        values, indices = sparse(g, salt)
        return tf.IndexedSlices(
            tf.constant(values),
            tf.constant(indices),
            tf.constant(SPARSE_SHAPE, tf.int64),
        )

    def batch(self, salt: int) -> list[Any]:
        """[a, sparse, b, c]: dense values around a sparse one."""
        tf = self.tf
        return self.per_replica(
            lambda g: [
                tf.constant(dense(g, "a", salt)),
                self.slices(g, salt),
                tf.constant(dense(g, "b", salt)),
                tf.constant(dense(g, "c", salt)),
            ]
        )

    def local_results(self, value: Any) -> list[Any]:
        """Each local replica's `value` (a structure: a list per replica)."""
        local = self.strategy.experimental_local_results
        if isinstance(value, (list, tuple)):
            return [
                [_encode(v) for v in replica]
                for replica in zip(*map(local, value), strict=True)
            ]
        return [_encode(v) for v in local(value)]

    def run(self, case: dict[str, Any]) -> list[Any]:
        tf = self.tf
        strategy = self.strategy
        kind, salt = case["kind"], case["salt"]
        op = getattr(tf.distribute.ReduceOp, case.get("op", "SUM"))
        if kind == "reduce_to":
            if case["value"] == "dense":
                value = self.per_replica(
                    lambda g: tf.constant(dense(g, "a", salt))
                )
            else:
                value = self.per_replica(lambda g: self.slices(g, salt))
            return self.local_results(
                strategy.extended.reduce_to(
                    op, value, value, options=self.options(case)
                )
            )
        if kind == "strategy_reduce":
            axis = case["axis"]
            value = self.per_replica(
                lambda g: tf.constant(
                    ragged(g, 0, salt) if axis == 0 else dense(g, "c", salt)
                )
            )
            return [_encode(strategy.reduce(op, value, axis=axis))]
        if kind == "batch_reduce":
            results = strategy.extended.batch_reduce_to(
                op, [(v, v) for v in self.batch(salt)], self.options(case)
            )
            return self.local_results(results)
        if kind == "all_reduce":
            return self.local_results(
                self.all_reduce(op, self.options(case), salt)
            )
        if kind == "hints_all_reduce":
            # get_replica_context().all_reduce("sum", grads, options=hints)
            hints = self.hints(case)
            return self.local_results(self.all_reduce("sum", hints, salt))
        if kind == "hints_strategy_reduce":
            # strategy.reduce("sum", v, axis=None, options=hints)
            hints = self.hints(case)
            value = self.per_replica(lambda g: tf.constant(dense(g, "b", salt)))
            return [
                _encode(strategy.reduce("sum", value, axis=None, options=hints))
            ]
        if kind == "strategy_gather":
            axis = case["axis"]
            value = self.per_replica(
                lambda g: tf.constant(ragged(g, axis, salt))
            )
            return [_encode(strategy.gather(value, axis=axis))]
        if kind == "strategy_gather_sparse":
            value = self.per_replica(lambda g: self.slices(g, salt))
            return [_encode(strategy.gather(value, axis=0))]
        if kind == "all_gather":
            axis = case["axis"]
            options = self.options(case)
            value = self.per_replica(
                lambda g: tf.constant(ragged(g, axis, salt))
            )

            @tf.function
            def gather_step(v: Any) -> Any:
                context = tf.distribute.get_replica_context()
                return context.all_gather(v, axis, options=options)

            return self.local_results(strategy.run(gather_step, args=(value,)))
        raise ValueError(f"unknown case kind {kind!r}")

    def hints(self, case: dict[str, Any]) -> Any:
        from tf_crossdevice.compat import CollectiveHints

        return CollectiveHints(
            bytes_per_pack=PACK_SIZES[case["pack"]],
            timeout_seconds=TIMEOUT_SECONDS,
        )

    def all_reduce(self, op: Any, options: Any, salt: int) -> Any:
        """Replica-context all_reduce of `batch(salt)` in a tf.function."""
        tf = self.tf

        @tf.function
        def step(grads: Any) -> Any:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(op, grads, options=options)

        return self.strategy.run(step, args=(self.batch(salt),))


def main(argv: list[str]) -> None:
    local = int(argv[1])
    implementations = argv[2].split(",")
    import json
    import os

    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * local
    )
    from tf_crossdevice.cluster import processes
    from tf_crossdevice.collective._all_reduce import CollectiveAllReduce
    from tf_crossdevice.collective._hierarchical import (
        HierarchicalCollectiveAllReduce,
    )
    from tf_crossdevice.collective._strategy import MultiWorkerMirroredStrategy

    processes.exit_when_parent_goes(watch_stdin=True)
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    for variant in VARIANTS:
        ops = (
            CollectiveAllReduce()
            if variant == "flat"
            else HierarchicalCollectiveAllReduce()
        )
        strategy = MultiWorkerMirroredStrategy(
            cross_device_ops=ops,
            communication_options=tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=TIMEOUT_SECONDS
            ),
            local_devices=[f"/cpu:{i}" for i in range(local)],
        )
        runner = _Runner(strategy, task, local)
        results = {
            case["name"]: runner.run(case) for case in cases(implementations)
        }
        processes.reply({"variant": variant, "task": task, "results": results})


if __name__ == "__main__":
    main(sys.argv)
