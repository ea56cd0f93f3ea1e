"""The session processes: build, check and time entries on command.

- "in_graph": replicas on this process's logical CPU devices (one group
  per process: its memory high-water mark and any crash stay there), or,
  given a cluster spec, on `tf_crossdevice.cluster` workers that it drives
  in one graph (MultiWorkerAllReduce, TF's ReductionToOneDevice);
- "mwms": one of p `MultiWorkerMirroredStrategy` processes (TF_CONFIG set
  by the parent) running its collective all-reduce between-graph;
- "ours_mwms": one of p `tf_crossdevice.MultiWorkerMirroredStrategy`
  processes with k local logical CPU devices (k replicas per worker),
  running our CollectiveAllReduce or HierarchicalCollectiveAllReduce.

With k local devices per worker, replica r = task * k + i holds replica r's
values (`measure.Inputs`) and every result is their sum over all p * k
replicas. TensorFlow's strategy has one CPU replica per worker: its worker
holds the sum of the k values our worker's devices hold (what one device
computing the worker's whole batch would hold), summed once when loaded,
so both reduce the same global data to the same result, checked the same
way, and both send one workload of bytes per worker between workers.

Commands (JSON lines, `tf_crossdevice.cluster.processes`): the setup, then
load a workload, prepare an entry (build, check against numpy, warm up), time n
calls of it, unload. Started by `groups.Sessions` as
`python -m benchmarks.sessions --role=in_graph|mwms|ours_mwms`.
"""

from __future__ import annotations

import dataclasses
import json
import resource
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from absl import app, flags

import tf_crossdevice
from benchmarks import candidates as candidates_lib
from benchmarks import roofline
from tf_crossdevice import cluster, testing
from tf_crossdevice import compression as compression_lib
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.tuning import measure

INPUTS_BASELINE = "baseline: inputs only"
FLAT_BASELINE = "baseline: flat buffers only"
IDLE_BASELINE = "baseline: two workers, no transfer"
MWMS_BASELINE = "baseline: inputs only (MWMS)"
OURS_MWMS_BASELINE = "baseline: inputs only (our strategy)"
ROOFLINE_ADD_N = "roofline: tf.add_n"
ROOFLINE_ADD_N_PER_CORE = "roofline: tf.add_n per core"
ROOFLINE_NUMPY = "roofline: numpy"
ROOFLINE_NUMPY_PER_CORE = "roofline: numpy per core"
ROOFLINE_GRPC = "roofline: TF gRPC copy worker 0 -> 1"
# The same copy of the same elements in 16 bits (bfloat16, cast beforehand):
# with ROOFLINE_GRPC, what halving the bytes can save on the wire at most.
GRPC_BF16_BOUND = "bound: TF gRPC copy worker 0 -> 1 in bfloat16"
PACK_UNPACK_BOUND = "bound: pack + unpack on each device, no transfer or sum"
# pscpu's messages without the library: each tensor summed on the first
# worker and the sum copied back, one message per tensor each way; then the
# same on values held in bfloat16 (cast beforehand, so no cast is timed).
# Their ratio is the most a 16-bit codec can gain with those messages here.
SUM_COPY_BOUND = "bound: sum on worker 0 and copy back, per tensor"
SUM_COPY_BF16_BOUND = (
    "bound: sum on worker 0 and copy back, per tensor, in bfloat16"
)
AUTOTUNE = "autotune"  # the entry's name: "autotune (60 s budget)"
Built = tuple[Callable[[], Any], Callable[[], "str | None"]]


def _step(body: Callable[[], measure.Results], check: Any) -> Built:
    step = measure.Step(body)
    return step.timed, lambda: step.verify(check) if check else None


def check_of(
    candidate: candidates_lib.Candidate,
    inputs: measure.Inputs,
    num_workers: int,
    ops: Any = None,
    errors_sum: ErrorsSum | None = None,
) -> measure.Check:
    """The check of a candidate's results (`measure.Inputs.check_for`):
    numpy's sum exactly, or within its codec's rounding with compression
    across `num_workers` workers; with PowerSGD, `powersgd_check` of the
    compressor of `ops` (the candidate built)."""
    compression = candidate.kwargs.get("compression")
    if compression == candidates_lib.POWERSGD:
        assert errors_sum is not None
        return powersgd_check(inputs, ops.compression, errors_sum)
    return inputs.check_for(compression, num_workers)


# Sums one compressed tensor's errors (one variable per replica held here)
# over every replica of the reduction.
ErrorsSum = Callable[[Sequence[tf.Variable]], np.ndarray]


def _errors_here(errors: Sequence[tf.Variable]) -> np.ndarray:
    """Every replica's error is held here: numpy's sum of them."""
    return np.sum([np.asarray(e.value(), np.float64) for e in errors], 0)


def powersgd_check(
    inputs: measure.Inputs, compressor: Any, errors_sum: ErrorsSum
) -> measure.Check:
    """The check of a PowerSGD all-reduce's first step, from zero error.

    No numpy PowerSGD is needed. Every replica gets the same result, on its
    device; where the compressor did not compress, numpy's sum exactly.
    Where it compressed an n×m matrix (r = min(n, m, rank)), the first step
    returns P^ P^ᵀ W, W numpy's sum and P^ an orthonormal n×r matrix, and
    each replica keeps as error what its share of that left out. So:

    - the result plus every replica's error is W (see
      `tf_crossdevice.compression.PowerSGD`), and the result alone is not
      (a rank-limited approximation of random integers);
    - the result is W projected onto an r-dimensional column space: its
      r-th singular value is clearly non-zero (its rank is r) and it equals
      U Uᵀ W, U its top r left singular vectors. Sending zeros and keeping
      everything as error, or any matrix but such a projection, passes
      the first point but not this one.

    Each within float32 rounding of the products: 1e-5 of the replicas'
    absolute values there, plus 1e-5.
    """

    def check(results: measure.Results, devices: list[list[str]]) -> str | None:
        def problem(k: int, d: int, got: np.ndarray) -> str | None:
            if not np.array_equal(got, np.asarray(results[k][0])):
                return f"replica {d} got another result than replica 0"
            if d > 0:
                return None
            shape, want = inputs.shapes[k], inputs.expected[k]
            if not compressor.compresses(shape, inputs.dtypes[k]):
                wrong = measure.mismatch(got, want)
                return f"summed exactly: {wrong}" if wrong else None
            tolerance = 1e-5 * (inputs.magnitudes[k] + 1)
            state = compressor.state(k)
            errors = errors_sum(state.errors).reshape(shape)
            wrong = measure.mismatch_beyond(
                got.astype(np.float64) + errors,
                want.astype(np.float64),
                tolerance,
            )
            if wrong:
                return f"applied + errors: {wrong}"
            if measure.mismatch_beyond(got, want, tolerance) is None:
                return "numpy's sum exactly; nothing compressed"
            n_m = state.matrix_shape
            return _projection_problem(
                got.reshape(n_m),
                want.reshape(n_m),
                state.rank,
                tolerance.reshape(n_m),
            )

        return inputs.compare_each(results, devices, problem)

    return check


def _projection_problem(
    got: np.ndarray, want: np.ndarray, rank: int, tolerance: np.ndarray
) -> str | None:
    """None if the matrix `got` is `want` projected onto a column space of
    `rank` dimensions: its `rank`-th singular value is above the norm of
    `tolerance` (the rounding allowed over the whole matrix), and `got`
    equals U Uᵀ `want` within `tolerance`, element by element, U the top
    `rank` left singular vectors of `got`.

    >>> w = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    >>> tolerance = np.full(w.shape, 1e-9)
    >>> onto_e1 = np.array([[3.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    >>> _projection_problem(onto_e1, w, 1, tolerance) is None
    True
    >>> _projection_problem(np.zeros((3, 2)), w, 1, tolerance)
    'rank below 1: singular value 1 is 0'
    >>> _projection_problem(2 * w, w, 2, tolerance)
    "not numpy's sum projected onto 2 columns: 2 of 6 elements differ from \
numpy by more than the tolerance (largest difference 3)"
    """
    result = got.astype(np.float64)
    # The SVD of the result through its range: a matrix of rank r has its
    # columns in the span of r + 4 random combinations of them, so the
    # SVD of its projection onto that span gives its singular values and
    # vectors, for a few products. A full SVD costs n·m·min(n, m): for an
    # embedding matrix, far more than the step it checks.
    mix = np.random.default_rng(0).standard_normal((result.shape[1], rank + 4))
    basis, _ = np.linalg.qr(result @ mix)
    u, singular, _ = np.linalg.svd(basis.T @ result, full_matrices=False)
    if not singular[rank - 1] > np.linalg.norm(tolerance):
        return (
            f"rank below {rank}: singular value {rank} is "
            f"{singular[rank - 1]:g}"
        )
    top = basis @ u[:, :rank]
    wrong = measure.mismatch_beyond(
        result, top @ (top.T @ want.astype(np.float64)), tolerance
    )
    if wrong:
        return f"not numpy's sum projected onto {rank} columns: {wrong}"
    return None


class Session:
    """What a child holds between commands: its inputs and built entries.

    A subclass sets `devices` (its replicas' devices) and, when other
    processes hold the other replicas, `first_replica` and `total_replicas`.
    """

    first_replica: int = 0
    total_replicas: int | None = None
    task: int = 0

    def __init__(self, setup: dict[str, Any]):
        self.seed, self.warmup = setup["seed"], setup["warmup"]
        self.devices: list[str] = []
        self.inputs: measure.Inputs | None = None
        self.calls: dict[str, Callable[[], Any]] = {}
        self.closers: list[Callable[[], None]] = []
        # Entries chosen by a search: name -> (seconds it took, its choice,
        # its steps).
        self.searches: dict[str, tuple[float, str, tuple[str, ...]]] = {}

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        cmd = command["cmd"]
        if cmd in ("load", "unload"):
            for close in self.closers:
                close()
            self.calls, self.closers, self.inputs = {}, [], None
            if cmd == "load":
                self.inputs = self.load(
                    [(tuple(s), "float32") for s in command["shapes"]],
                    command.get("local_devices", 1),
                )
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            return {"peak_rss_bytes": peak}
        if cmd == "prepare":
            name, candidate = command["name"], command["candidate"]
            prepared, call = measure.prepare(
                lambda: self.build(name, candidate),
                self.warmup,
                command["verifies"],
            )
            if call is not None:
                self.calls[name] = call
            if name in self.searches:
                seconds, chosen, steps = self.searches.pop(name)
                prepared = dataclasses.replace(
                    prepared,
                    build_seconds=prepared.build_seconds - seconds,
                    search_seconds=seconds,
                    chosen=chosen,
                    search=steps,
                )
            return dataclasses.asdict(prepared)
        if cmd == "time":
            call = self.calls[command["name"]]
            return {"seconds": measure.time_calls(call, command["reps"])}
        raise ValueError(f"command: unknown {cmd!r}")

    def load(self, gradients: Any, local_devices: int) -> measure.Inputs:
        """This process's replicas' inputs (`local_devices`: per worker)."""
        del local_devices  # one replica per device here
        return measure.Inputs(
            gradients,
            self.devices,
            self.seed,
            self.first_replica,
            self.total_replicas,
        )

    def build(self, name: str, candidate: dict[str, Any] | None) -> Built:
        raise NotImplementedError


class InGraph(Session):
    """Replicas on local logical CPU devices, or on workers of a cluster."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        self.cores = setup.get("cores", 1)
        self.autotune_budget = setup.get("autotune_budget_seconds", 60.0)
        # One replica per worker across a cluster; else one process.
        self.num_workers = len(setup.get("cluster", {}).get("worker", [0]))
        if "cluster" in setup:
            self.devices = cluster.WorkerReplicas(
                setup["cluster"], replicas_per_worker=1
            ).devices
        else:
            testing.request_cpu_devices(setup["num_devices"])
            self.devices = testing.cpu_devices(setup["num_devices"])

    def build(self, name: str, candidate: dict[str, Any] | None) -> Built:
        inputs = self.inputs
        assert inputs is not None
        (expected,) = inputs.expected_flats.values()

        def flat_check(results: measure.Results, _: Any) -> str | None:
            got = np.concatenate([np.asarray(t) for t in results[0]])
            return measure.mismatch(got, expected)

        if candidate is not None:
            c = candidates_lib.Candidate(**candidate)
            ops = candidates_lib.build(c, inputs.devices)
            return _step(
                measure.all_reduce_body(ops, inputs),
                check_of(c, inputs, self.num_workers, ops, _errors_here),
            )
        if name.startswith(AUTOTUNE):
            return self._autotune(name, inputs)
        if name == INPUTS_BASELINE:
            body = lambda: [list(v.values) for v in inputs.values()]  # noqa: E731
            return _step(body, inputs.check_inputs)
        if name == FLAT_BASELINE:
            return _step(lambda: [inputs.flats()], None)
        if name == IDLE_BASELINE:
            return _step(lambda: [inputs.flats()[:2]], None)
        if name == PACK_UNPACK_BOUND:
            return _step(lambda: _pack_unpack(inputs), inputs.check_inputs)
        if name in (ROOFLINE_ADD_N, ROOFLINE_ADD_N_PER_CORE):
            pieces = self.cores if name == ROOFLINE_ADD_N_PER_CORE else 1
            return _step(lambda: _add_n(inputs, pieces), flat_check)
        if name == ROOFLINE_GRPC:
            flat = next(iter(inputs.variables[0].values()))
            return _copy_step(flat, inputs.devices[1])
        if name == GRPC_BF16_BOUND:
            with tf.device(inputs.devices[0]):
                wire = tf.Variable(
                    tf.cast(inputs.flats()[0], tf.bfloat16), trainable=False
                )
            return _copy_step(wire, inputs.devices[1])
        if name in (SUM_COPY_BOUND, SUM_COPY_BF16_BOUND):
            wire = "bf16" if name == SUM_COPY_BF16_BOUND else None
            return _sum_copy_step(inputs, wire, self.num_workers)
        if name in (ROOFLINE_NUMPY, ROOFLINE_NUMPY_PER_CORE):
            arrays = [next(iter(v.values())).numpy() for v in inputs.variables]
            threads = self.cores if name == ROOFLINE_NUMPY_PER_CORE else 1
            summer = roofline.NumpySum(arrays, threads)
            self.closers.append(summer.close)

            def check() -> str | None:
                summer()
                return measure.mismatch(summer.out, expected)

            return summer, check
        raise ValueError(f"entry: unknown {name!r}")

    def _autotune(self, name: str, inputs: measure.Inputs) -> Built:
        """autotune on the group's gradients and devices (a fresh cache:
        it measures), then its choice as an entry."""
        gradients = list(zip(inputs.shapes, inputs.dtypes, strict=True))
        start = time.monotonic()
        with tempfile.TemporaryDirectory() as cache:
            ops = tf_crossdevice.autotune(
                gradients,
                inputs.devices,
                budget_seconds=self.autotune_budget,
                cache_dir=cache,
            )
        result = ops.autotune_result
        # Its choice by the name of the same candidate here, if there is one.
        chosen = candidates_lib.name_of(result.config) or result.label
        self.searches[name] = (
            time.monotonic() - start,
            chosen,
            result.search_log(),
        )
        return _step(
            measure.all_reduce_body(ops, inputs),
            inputs.check_for(
                result.config[1].get("compression"), self.num_workers
            ),
        )


def _copy_step(variable: tf.Variable, device: str) -> Built:
    """A copy of `variable` onto `device` (TF's gRPC across workers),
    checked to arrive bit for bit."""
    sent = variable.numpy()

    def copy() -> measure.Results:
        with tf.device(device):
            return [[tf.identity(variable)]]

    return _step(copy, lambda r, _: measure.mismatch(np.asarray(r[0][0]), sent))


def _sum_copy_step(
    inputs: measure.Inputs, wire: str | None, num_workers: int
) -> Built:
    """Every device's tensors, copied now into variables of their own (the
    float ones cast to bfloat16 when `wire`), and a step that sums each on
    the first device and copies the sum to every other: one message per
    tensor each way, no packing and no codec (a bfloat16 sum is taken in
    bfloat16). Checked against numpy like a candidate with `wire`
    compression."""
    held = []
    for d, device in enumerate(inputs.devices):
        with tf.device(device):
            held.append(
                [
                    tf.Variable(
                        tf.cast(t, tf.bfloat16)
                        if compression_lib.compresses(t.dtype, wire)
                        else t,
                        trainable=False,
                    )
                    for t in inputs.tensors(d)
                ]
            )

    def body() -> measure.Results:
        out = []
        for k in range(len(inputs.shapes)):
            reads = [
                measure.read_on(variables[k], device)
                for device, variables in zip(inputs.devices, held, strict=True)
            ]
            with tf.device(inputs.devices[0]):
                total = tf.add_n(reads)
            sums = [total]
            for device in inputs.devices[1:]:
                with tf.device(device):
                    sums.append(tf.identity(total))
            out.append(sums)
        return out

    check = inputs.check_for(wire, num_workers)

    def in_own_dtypes(
        results: measure.Results, devices: list[list[str]]
    ) -> str | None:
        # Back to each gradient's dtype in numpy, outside the timed step.
        own = [
            [np.asarray(v).astype(dtype.as_numpy_dtype) for v in per_device]
            for per_device, dtype in zip(results, inputs.dtypes, strict=True)
        ]
        return check(own, devices)

    return _step(body, in_own_dtypes)


def _add_n(inputs: measure.Inputs, pieces: int) -> measure.Results:
    """n-way sum of the flat buffers, piece c on device c (mod n)."""
    flats = inputs.flats()
    sizes = roofline.aligned_pieces(flats[0].shape[0], pieces, 16)
    split = []
    for flat, device in zip(flats, inputs.devices, strict=True):
        with tf.device(device):
            split.append(tf.split(flat, sizes) if len(sizes) > 1 else [flat])
    sums = []
    for c in range(len(sizes)):
        with tf.device(inputs.devices[c % len(inputs.devices)]):
            sums.append(tf.add_n([s[c] for s in split]))
    return [sums]


def _pack_unpack(inputs: measure.Inputs) -> measure.Results:
    """Each device concatenates its tensors and splits them back: the
    packing work of every packing algorithm, without transfer or sum."""
    per_device = []
    for i, device in enumerate(inputs.devices):
        tensors = inputs.tensors(i)
        with tf.device(device):
            packed = tf.concat([tf.reshape(t, [-1]) for t in tensors], 0)
            pieces = tf.split(packed, [t.shape.num_elements() for t in tensors])
            per_device.append(
                list(map(tf.reshape, pieces, [t.shape for t in tensors]))
            )
    return [list(column) for column in zip(*per_device, strict=True)]


class Mwms(Session):
    """One of p MultiWorkerMirroredStrategy processes (replica = task)."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        self.strategy = tf.distribute.MultiWorkerMirroredStrategy()
        resolver = self.strategy.cluster_resolver
        self.devices = list(self.strategy.extended.worker_devices[:1])
        self.first_replica = self.task = resolver.task_id
        self.total_replicas = len(resolver.cluster_spec().as_dict()["worker"])

    def load(self, gradients: Any, local_devices: int) -> measure.Inputs:
        """One replica holding the sum of the `local_devices` replicas that
        our strategy's worker holds (see the module's docstring)."""
        if local_devices == 1:
            return super().load(gradients, 1)
        assert self.total_replicas is not None
        inputs = measure.Inputs(
            gradients,
            self.devices * local_devices,
            self.seed,
            self.task * local_devices,
            self.total_replicas * local_devices,
        )
        with tf.device(self.devices[0]):
            summed = {
                dtype: tf.Variable(
                    tf.add_n([v[dtype] for v in inputs.variables]),
                    trainable=False,
                )
                for dtype in inputs.layout
            }
        inputs.devices, inputs.variables = inputs.devices[:1], [summed]
        return inputs

    def build(self, name: str, candidate: dict[str, Any] | None) -> Built:
        inputs = self.inputs
        assert inputs is not None
        run = self.strategy.run
        if name == MWMS_BASELINE:
            body = lambda: [[t] for t in run(lambda: inputs.tensors(0))]  # noqa: E731
            return _step(body, inputs.check_inputs)
        assert candidate is not None
        kinds = tf.distribute.experimental.CommunicationImplementation
        kwargs = dict(candidate["kwargs"])
        kind = kinds[kwargs.pop("implementation", "AUTO")]
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=kind, **kwargs
        )

        def replica_fn() -> list[Any]:
            context = tf.distribute.get_replica_context()
            return context.all_reduce(
                tf.distribute.ReduceOp.SUM, inputs.tensors(0), options=options
            )

        return _step(lambda: [[t] for t in run(replica_fn)], inputs.check)


class OursMwms(Session):
    """One of p tf_crossdevice.MultiWorkerMirroredStrategy processes with
    `local_devices` logical CPU devices (replica = task * k + device)."""

    def __init__(self, setup: dict[str, Any]):
        super().__init__(setup)
        self.local_devices = setup["local_devices"]
        testing.request_cpu_devices(self.local_devices)
        self.strategies: dict[str, tuple[Any, Any]] = {}
        strategy, _ = self.strategy(  # peers are up
            {"cross_device_ops": STRATEGY_OPS[0], "bytes_per_pack": 0}
        )
        resolver = strategy.cluster_resolver
        self.num_workers = len(resolver.cluster_spec().as_dict()["worker"])
        self.devices = list(strategy.extended.worker_devices)
        self.first_replica = resolver.task_id * self.local_devices
        self.total_replicas = self.num_workers * self.local_devices

    def strategy(self, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """Our strategy for a candidate's `kwargs` (its class's name,
        `bytes_per_pack` and compression) and its cross-device ops, built
        once per setting (every worker builds them in the same order)."""
        key = json.dumps(kwargs, sort_keys=True)
        if key not in self.strategies:
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=kwargs["bytes_per_pack"]
            )
            ops_class = getattr(tf_crossdevice, kwargs["cross_device_ops"])
            ops = ops_class(compression=candidates_lib.compression_of(kwargs))
            strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
                cross_device_ops=ops,
                communication_options=options,
                local_devices=[f"/cpu:{i}" for i in range(self.local_devices)],
            )
            self.strategies[key] = strategy, ops
        return self.strategies[key]

    def build(self, name: str, candidate: dict[str, Any] | None) -> Built:
        inputs = self.inputs
        assert inputs is not None
        if name == OURS_MWMS_BASELINE:

            def inputs_body() -> measure.Results:
                return [list(v.values) for v in inputs.values()]

            return _step(inputs_body, inputs.check_inputs)
        assert candidate is not None
        c = candidates_lib.Candidate(**candidate)
        strategy, ops = self.strategy(c.kwargs)

        def body() -> measure.Results:
            values = [(v, v) for v in inputs.values()]
            reduced = strategy.extended.batch_reduce_to(
                tf.distribute.ReduceOp.SUM, values
            )
            return [
                list(strategy.experimental_local_results(r)) for r in reduced
            ]

        def errors_sum(errors: Sequence[tf.Variable]) -> np.ndarray:
            # Exact: the collective compresses batch reductions only.
            first = self.first_replica

            def error_of(context: Any) -> tf.Tensor:
                return errors[context.replica_id_in_sync_group - first].value()

            per_replica = strategy.experimental_distribute_values_from_function(
                error_of
            )
            total = strategy.reduce(
                tf.distribute.ReduceOp.SUM, per_replica, axis=None
            )
            return np.asarray(total, np.float64)

        return _step(
            body, check_of(c, inputs, self.num_workers, ops, errors_sum)
        )


STRATEGY_OPS = candidates_lib.STRATEGY_OPS
ROLES: dict[str, type[Session]] = {
    "in_graph": InGraph,
    "mwms": Mwms,
    "ours_mwms": OursMwms,
}


def main(argv: list[str]) -> int:
    """Answers the parent's commands until it closes stdin or goes away.

    The first command is the setup; the session answers every later one.
    An exception becomes an {"error": ...} answer.
    """
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    _processes.exit_when_parent_goes()
    role, commands = flags.FLAGS.role, _processes.commands()
    setup = next(commands, None)
    if setup is None:  # The parent closed stdin before the setup.
        return 0
    try:
        session = ROLES[role](setup)
    except Exception as e:  # noqa: BLE001 - sent to the parent.
        _processes.reply({"error": f"{role} setup: {type(e).__name__}: {e}"})
        return 1
    _processes.reply({"ready": True})
    for command in commands:
        try:
            answer = session.handle(command)
        except Exception as e:  # noqa: BLE001 - sent to the parent.
            error = f"{type(e).__name__}: {measure.first_line(str(e))}"
            answer = {"error": error}
        _processes.reply(answer)
    return 0


if __name__ == "__main__":
    flags.DEFINE_enum("role", None, list(ROLES), "What to hold.", required=True)
    app.run(main)
