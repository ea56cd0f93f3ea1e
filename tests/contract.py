"""The contract every tf_crossdevice CrossDeviceOps passes.

A test file subclasses `CrossDeviceOpsContract`, names itself `Test...`, and
implements `make_ops`. Every case checks numbers against numpy on every
destination device, for float16, bfloat16, float32, float64 and int64, in
eager mode, inside tf.function and in a TF 1 graph run by a Session.

Inputs are small random integers, so sums are exact in every dtype; MEAN
divides, so half-precision results get a tolerance. The matrix tests run a
pairwise cover of their factors (`pairwise`) except in the reference class.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import pytest
import tensorflow as tf

from tf_crossdevice import testing
from tf_crossdevice._core import tf_internal

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN

DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int64)
MODES = ("eager", "function", "graph")
DESTINATION_KINDS = (
    "none",
    "same_distributed_values",
    "other_distributed_values",
    "device_string",
    "device_list",
)
REDUCE_OPS = {"sum": SUM, "mean": MEAN}
DENSE_SHAPE = (10, 3)  # Every value, dense or sparse, has this dense shape.
NUM_DEVICES = 3  # Odd on purpose: it catches schedules that assume pairs.

RTOL = {
    tf.float16: 2e-3,
    tf.bfloat16: 1e-2,
    tf.float32: 1e-6,
    tf.float64: 1e-12,
    tf.int64: 0,
}


# The factors of the contract's matrix tests, each value with its id. A class
# runs `pairwise(...)` of them: every pair of values of any two factors in
# some case (16 of the 120 reduce cases). `EXHAUSTIVE = True` runs their
# whole product: the reference class, TensorFlow's ReductionToOneDevice,
# does, so that a case the cover leaves out still runs somewhere.
FACTORS = {
    "batched": ((False, "reduce"), (True, "batch")),
    "op_name": tuple((name, name) for name in sorted(REDUCE_OPS)),
    "kind": tuple((kind, kind) for kind in DESTINATION_KINDS),
    "sparse": ((False, "dense"), (True, "sparse")),
    "mode": tuple((mode, mode) for mode in MODES),
}
MATRIX_TESTS = {
    "test_reduce": ("batched", "op_name", "kind", "sparse", "mode"),
    "test_gather": ("kind", "sparse", "mode"),
}


def pairwise(factors: list[tuple]) -> list[tuple]:
    """Rows of the product of `factors` (each a tuple of values) in which
    every pair of values of any two factors appears at least once.

    Greedy and deterministic: each next row is the first of the product
    that covers the most pairs not yet covered.

    >>> rows = pairwise([(0, 1), ("a", "b", "c"), (True, False)])
    >>> len(rows), rows[0]
    (6, (0, 'a', True))
    """
    product = list(itertools.product(*factors))

    def pairs(row: tuple) -> set:
        return {
            (i, row[i], j, row[j])
            for i, j in itertools.combinations(range(len(row)), 2)
        }

    uncovered = set().union(*map(pairs, product))
    rows = []
    while uncovered:
        best = max(product, key=lambda row: len(pairs(row) & uncovered))
        rows.append(best)
        uncovered -= pairs(best)
    return rows


def matrix_cases(names: tuple[str, ...], exhaustive: bool):
    """`pytest.param`s of the factors `names`: their product, or pairwise."""
    factors = [FACTORS[name] for name in names]
    chosen = (itertools.product if exhaustive else _pairwise_star)(*factors)
    return [
        pytest.param(*(v for v, _ in row), id="-".join(i for _, i in row))
        for row in chosen
    ]


def _pairwise_star(*factors):
    return pairwise(list(factors))


def count_batch_reduce_calls(ops) -> list:
    """Wraps `ops.batch_reduce`; the returned list grows by one per call."""
    calls: list = []
    original = ops.batch_reduce

    def counting(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    ops.batch_reduce = counting
    return calls


def canonical(device: str) -> str:
    return tf_internal.canonicalize_device(device)


def device_names(n: int, first: int = 0) -> list[str]:
    return testing.cpu_devices(first + n)[first:]


def random_replicas(seed: int, num_devices: int, sparse: bool):
    """Per replica: a dense array, or (rows, indices) of an IndexedSlices."""
    rng = np.random.default_rng(seed)
    replicas = []
    for r in range(num_devices):
        if sparse:
            k = 2 + r  # Replicas hold different numbers of rows.
            indices = rng.integers(0, DENSE_SHAPE[0], size=k)
            rows = rng.integers(-8, 9, size=(k, DENSE_SHAPE[1]))
            replicas.append((rows, indices))
        else:
            replicas.append(rng.integers(-8, 9, size=DENSE_SHAPE))
    return replicas


def densify(replica, sparse: bool) -> np.ndarray:
    if not sparse:
        return np.asarray(replica, np.float64)
    rows, indices = replica
    dense = np.zeros(DENSE_SHAPE, np.float64)
    np.add.at(dense, indices, rows)
    return dense


def make_component(replica, dtype, sparse: bool, device: str):
    with tf.device(device):
        if sparse:
            rows, indices = replica
            return tf.IndexedSlices(
                tf.constant(rows, dtype),
                tf.constant(indices, tf.int64),
                tf.constant(DENSE_SHAPE, tf.int64),
            )
        return tf.constant(replica, dtype)


def make_value(replicas, dtype, sparse, devices):
    components = [
        make_component(r, dtype, sparse, d)
        for r, d in zip(replicas, devices, strict=True)
    ]
    return tf_internal.PerReplica(tuple(components))


def destinations_of(kind: str, value_devices: list[str]):
    """(destinations argument builder, expected device list)."""
    n = len(value_devices)
    if kind == "none":
        return (lambda: None), value_devices
    if kind == "same_distributed_values":

        def same():
            return tf_internal.Mirrored(
                tuple(_zeros_on(d) for d in value_devices)
            )

        return same, value_devices
    if kind == "other_distributed_values":
        others = device_names(2, first=n)

        def other():
            return tf_internal.Mirrored(tuple(_zeros_on(d) for d in others))

        return other, others
    if kind == "device_string":
        last = testing.cpu_devices(8)[-1]
        short = "/device:CPU:" + last.rsplit(":", 1)[1]
        return (lambda: short), [last]
    if kind == "device_list":
        chosen = [testing.cpu_devices(8)[6], value_devices[0]]
        short = ["/cpu:" + d.rsplit(":", 1)[1] for d in chosen]
        return (lambda: short), chosen
    raise AssertionError(kind)


def _zeros_on(device):
    with tf.device(device):
        return tf.zeros([1])


def to_numpy(component) -> np.ndarray:
    """A result component (eager, or a Session's fetched value) as dense."""
    if hasattr(component, "indices"):  # IndexedSlices or a Session's value.
        values = np.asarray(_as_array(component.values), np.float64)
        indices = np.asarray(_as_array(component.indices))
        dense_shape = tuple(np.asarray(_as_array(component.dense_shape)))
        dense = np.zeros(dense_shape, np.float64)
        np.add.at(dense, indices, values)
        return dense
    return np.asarray(_as_array(component), np.float64)


def _as_array(x):
    return x.numpy() if hasattr(x, "numpy") else x


def per_destination(result) -> list:
    """A result's per-destination values, held to TensorFlow's regroup rule.

    One destination gives the plain tensor (or IndexedSlices), several a
    Mirrored value, as TensorFlow's own CrossDeviceOps return them.
    """
    if isinstance(result, tf_internal.DistributedValues):
        assert isinstance(result, tf_internal.Mirrored), type(result)
        assert len(result.values) > 1, (
            "one destination must give the plain value, as TensorFlow's "
            "regroup does, not a one-component Mirrored"
        )
        return list(result.values)
    assert isinstance(result, (tf.Tensor, tf.IndexedSlices)), type(result)
    return [result]


def run(mode: str, build, scope: str | None = None):
    """Runs `build()` (which returns a list of results) in `mode`.

    `scope`: a device every mode runs under (`tf.device`), around the
    function call in "function" mode.

    Returns (per value: list of (device, numpy array, dtype)).
    """
    if mode == "graph":
        with tf.Graph().as_default() as graph:
            with _device_scope(scope):
                results = build()
            fetches = [per_destination(r) for r in results]
            meta = [[(c.device, c.dtype) for c in f] for f in fetches]
            with tf.compat.v1.Session(graph=graph) as session:
                out = session.run(fetches)
        return [
            [(d, to_numpy(c), dt) for (d, dt), c in zip(m, o, strict=True)]
            for m, o in zip(meta, out, strict=True)
        ]
    with _device_scope(scope):
        return _run_eagerly(mode, build)


def _device_scope(device: str | None):
    return tf.device(device) if device else contextlib.nullcontext()


def _run_eagerly(mode: str, build):
    if mode == "eager":
        results = build()
        return [
            [(c.device, to_numpy(c), c.dtype) for c in per_destination(r)]
            for r in results
        ]
    if mode == "function":
        seen = []

        @tf.function
        def fn():
            results = build()
            seen.extend(
                [(c.device, c.dtype) for c in per_destination(r)]
                for r in results
            )
            return [per_destination(r) for r in results]

        out = fn()
        return [
            [(d, to_numpy(c), dt) for (d, dt), c in zip(s, o, strict=True)]
            for s, o in zip(seen, out, strict=True)
        ]
    raise AssertionError(mode)


def expected_dtype(dtype, reduce_op):
    if reduce_op == MEAN and dtype.is_integer:
        return tf.float64
    return dtype


def check(result, expected, devices, dtype, reduce_op, what=""):
    assert len(result) == len(devices), (what, result, devices)
    for (device, array, out_dtype), want in zip(result, devices, strict=True):
        # canonicalize('') is CPU:0, so an unplaced result must fail here.
        assert device, (what, "unplaced result")
        assert canonical(device) == canonical(want), (what, device, want)
        assert out_dtype == expected_dtype(dtype, reduce_op), (what, out_dtype)
        rtol = RTOL[expected_dtype(dtype, reduce_op)]
        np.testing.assert_allclose(
            array,
            expected,
            rtol=rtol,
            atol=rtol,
            err_msg=f"{what} {dtype.name}",
        )


class CrossDeviceOpsContract:
    """Subclass as `Test<Name>` and implement `make_ops`.

    The matrix tests (`MATRIX_TESTS`) run on a pairwise cover of their
    factors, or on their whole product with `EXHAUSTIVE = True`;
    `DEVICE_COUNTS` sets the device counts of the every-count test, which
    runs every count in a tf.function and 1 and 2 devices in every mode
    (the matrix tests run every mode on NUM_DEVICES devices).
    """

    EXHAUSTIVE = False
    DEVICE_COUNTS = (1, 2, 3, 4, 8)

    def make_ops(self) -> tf.distribute.CrossDeviceOps:
        raise NotImplementedError

    def pytest_generate_tests(self, metafunc):
        names = MATRIX_TESTS.get(metafunc.function.__name__)
        if names is not None:
            metafunc.parametrize(
                ",".join(names), matrix_cases(names, self.EXHAUSTIVE)
            )
        if metafunc.function.__name__ == "test_all_reduce_every_device_count":
            metafunc.parametrize(
                "num_devices, mode",
                [(n, "function") for n in self.DEVICE_COUNTS]
                + [(n, m) for n in (1, 2) for m in MODES if m != "function"],
            )

    def test_reduce(self, batched, op_name, kind, sparse, mode):
        reduce_op = REDUCE_OPS[op_name]
        ops = self.make_ops()
        value_devices = device_names(NUM_DEVICES)
        make_destinations, want_devices = destinations_of(kind, value_devices)
        cases = [
            (dtype, random_replicas(seed, NUM_DEVICES, sparse))
            for seed, dtype in enumerate(DTYPES)
        ]

        def build():
            values = [
                make_value(replicas, dtype, sparse, value_devices)
                for dtype, replicas in cases
            ]
            if batched:
                pairs = [(v, make_destinations()) for v in values]
                return ops.batch_reduce(reduce_op, pairs)
            return [
                ops.reduce(reduce_op, v, make_destinations()) for v in values
            ]

        results = run(mode, build)
        for (dtype, replicas), result in zip(cases, results, strict=True):
            total = sum(densify(r, sparse) for r in replicas)
            if reduce_op == MEAN:
                total = total / NUM_DEVICES
            check(result, total, want_devices, dtype, reduce_op, kind)

    @pytest.mark.parametrize("mode", MODES)
    @pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
    @pytest.mark.parametrize("kind", DESTINATION_KINDS)
    def test_broadcast(self, kind, sparse, mode):
        ops = self.make_ops()
        source = device_names(1, first=2)
        make_destinations, want_devices = destinations_of(kind, source)
        cases = [
            (dtype, random_replicas(seed, 1, sparse)[0])
            for seed, dtype in enumerate(DTYPES)
        ]

        def build():
            return [
                ops.broadcast(
                    make_component(r, dtype, sparse, source[0]),
                    make_destinations(),
                )
                for dtype, r in cases
            ]

        results = run(mode, build)
        for (dtype, replica), result in zip(cases, results, strict=True):
            check(result, densify(replica, sparse), want_devices, dtype, SUM)

    def test_gather(self, kind, sparse, mode):
        ops = self.make_ops()
        value_devices = device_names(NUM_DEVICES)
        make_destinations, want_devices = destinations_of(kind, value_devices)
        # Three values, each along its own axis (dense) and of its own
        # dtype: the axis decides where the values meet, the dtype only
        # what they hold. The dtypes rotate with the case, so that the
        # pairwise cover gathers every dtype dense and sparse, in every mode
        # and to every kind of destination.
        axes = [0] if sparse else [0, 1, -1]
        first = DESTINATION_KINDS.index(kind) + 3 * MODES.index(mode)
        cases = [
            (
                DTYPES[(first + seed) % len(DTYPES)],
                axes[seed % len(axes)],
                random_replicas(seed, NUM_DEVICES, sparse),
            )
            for seed in range(3)
        ]

        def build():
            return [
                ops._gather(
                    make_value(replicas, dtype, sparse, value_devices),
                    make_destinations(),
                    axis,
                )
                for dtype, axis, replicas in cases
            ]

        results = run(mode, build)
        for (dtype, axis, replicas), result in zip(cases, results, strict=True):
            want = np.concatenate(
                [densify(r, sparse) for r in replicas], axis=axis
            )
            check(result, want, want_devices, dtype, SUM, f"axis {axis}")

    def test_all_reduce_every_device_count(self, num_devices, mode):
        """Values on their own devices: the all-reduce path, SUM and MEAN."""
        ops = self.make_ops()
        devices = device_names(num_devices)
        cases = [
            (
                reduce_op,
                dtype,
                sparse,
                random_replicas(seed, num_devices, sparse),
            )
            for seed, (reduce_op, dtype, sparse) in enumerate(
                itertools.product((SUM, MEAN), DTYPES, (False, True))
            )
        ]

        def build():
            out = []
            for reduce_op in (SUM, MEAN):
                pairs = [
                    (make_value(replicas, dtype, sparse, devices), None)
                    for op, dtype, sparse, replicas in cases
                    if op == reduce_op
                ]
                out.extend(ops.batch_reduce(reduce_op, pairs))
            return out

        results = run(mode, build)
        ordered = [c for op in (SUM, MEAN) for c in cases if c[0] == op]
        for (reduce_op, dtype, sparse, replicas), result in zip(
            ordered, results, strict=True
        ):
            total = sum(densify(r, sparse) for r in replicas)
            if reduce_op == MEAN:
                total = total / num_devices
            # One replica in place is returned as is, so its MEAN keeps the
            # dtype (TensorFlow's shortcut; see the one-replica test).
            kept = SUM if num_devices == 1 else reduce_op
            check(result, total, devices, dtype, kept, f"n={num_devices}")

    def test_many_tensors_of_mixed_shapes(self):
        """A gradient-like batch: many shapes, scalars, one big tensor."""
        ops = self.make_ops()
        devices = device_names(4)
        rng = np.random.default_rng(7)
        shapes = [(), (1,), (7,), (3, 5), (2, 3, 4), (1000,), (65, 33)]
        replicas = [
            [rng.integers(-8, 9, size=s) for _ in devices] for s in shapes * 3
        ]

        pairs = [
            (make_value(r, tf.float32, False, devices), None) for r in replicas
        ]
        results = ops.batch_reduce(SUM, pairs)
        for r, result in zip(replicas, results, strict=True):
            for component, device in zip(
                per_destination(result), devices, strict=True
            ):
                assert canonical(component.device) == device
                np.testing.assert_array_equal(component.numpy(), sum(r))

    def test_reduce_of_a_plain_tensor(self):
        """A non-distributed tensor is one replica's value."""
        ops = self.make_ops()
        with tf.device(device_names(1)[0]):
            t = tf.constant([1.5, 2.5])
        destination = device_names(1, first=5)[0]
        result = ops.reduce(MEAN, t, destination)
        assert isinstance(result, tf.Tensor), type(result)  # One destination.
        assert canonical(result.device) == destination
        np.testing.assert_array_equal(result.numpy(), [1.5, 2.5])

    def test_mirrored_strategy_calls_it(self):
        """MirroredStrategy's all_reduce really goes through this object."""
        ops = self.make_ops()
        calls = count_batch_reduce_calls(ops)
        devices = device_names(4)
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)

        @tf.function
        def step():
            ctx = tf.distribute.get_replica_context()
            x = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
            return ctx.all_reduce(MEAN, [x * tf.ones([3]), x * x])

        result = strategy.run(step)
        assert len(calls) == 1, calls
        for vector in strategy.experimental_local_results(result[0]):
            np.testing.assert_allclose(vector.numpy(), [2.5] * 3)
        for square in strategy.experimental_local_results(result[1]):
            np.testing.assert_allclose(square.numpy(), 7.5)

    def test_values_captured_by_a_function(self):
        """Captured eager values have device '' inside the function."""
        ops = self.make_ops()
        arrays = [np.full([4], i + 1.0, np.float32) for i in range(3)]
        value = testing.per_replica([tf.constant(a) for a in arrays])

        @tf.function
        def fn():
            summed = ops.batch_reduce(SUM, [(value, value), (value, None)])
            return [per_destination(r) for r in summed]

        for result in fn():
            for component in result:
                np.testing.assert_array_equal(component.numpy(), [6.0] * 4)

    @pytest.mark.parametrize("mode", MODES)
    def test_variables_as_values_keep_their_devices(self, mode):
        ops = self.make_ops()
        devices = device_names(3)

        def make_variables():
            variables = []
            for i, d in enumerate(devices):
                with tf.device(d):
                    variables.append(tf.Variable([float(i + 1)] * 2))
            return tf_internal.PerReplica(tuple(variables))

        if mode == "graph":
            with tf.Graph().as_default() as graph:
                value = make_variables()
                reduced = per_destination(ops.reduce(SUM, value, None))
                placed = [c.device for c in reduced]
                with tf.compat.v1.Session(graph=graph) as session:
                    session.run(tf.compat.v1.global_variables_initializer())
                    out = session.run(reduced)
            result = [
                (d, np.asarray(o), tf.float32)
                for d, o in zip(placed, out, strict=True)
            ]
        else:
            value = make_variables()  # Created eagerly, read in the function.
            result = run(mode, lambda: [ops.reduce(SUM, value, None)])[0]
        check(result, [6.0, 6.0], devices, tf.float32, SUM, "variables")

    @pytest.mark.parametrize("mode", MODES)
    def test_sparse_indices_int32_and_mixed(self, mode):
        ops = self.make_ops()
        devices = device_names(3)
        index_dtypes = [tf.int32, tf.int64, tf.int32]

        def build():
            out = []
            for dtypes in ([tf.int32] * 3, index_dtypes):
                components = []
                for r, (d, index_dtype) in enumerate(
                    zip(devices, dtypes, strict=True)
                ):
                    with tf.device(d):
                        components.append(
                            tf.IndexedSlices(
                                tf.fill([2, 3], float(r + 1)),
                                tf.constant([r, 4], index_dtype),
                                tf.constant(DENSE_SHAPE, index_dtype),
                            )
                        )
                value = tf_internal.PerReplica(tuple(components))
                out.append(ops.reduce(SUM, value, None))
                out.append(ops._gather(value, None, 0))
            return out

        results = run(mode, build)
        summed = np.zeros(DENSE_SHAPE)
        gathered = np.zeros((3 * DENSE_SHAPE[0], DENSE_SHAPE[1]))
        for r in range(3):
            summed[[r, 4]] += r + 1
            gathered[[r * DENSE_SHAPE[0] + r, r * DENSE_SHAPE[0] + 4]] += r + 1
        for result, want in zip(results, [summed, gathered] * 2, strict=True):
            check(result, want, devices, tf.float32, SUM, "indices")

    @pytest.mark.parametrize("mode", MODES)
    def test_gather_of_replicas_that_differ_along_the_axis(self, mode):
        """An uneven last batch: replicas differ along the gather axis."""
        ops = self.make_ops()
        devices = device_names(3)
        dense = [np.full((r + 1, 2), r, np.float32) for r in range(3)]
        rows = [3, 2, 4]  # Dense first dimensions of the sparse replicas.

        def build():
            values = []
            sparse = []
            for r, d in enumerate(devices):
                with tf.device(d):
                    values.append(tf.constant(dense[r]))
                    sparse.append(
                        tf.IndexedSlices(
                            tf.fill([1, 2], float(r + 1)),
                            tf.constant([rows[r] - 1], tf.int64),
                            tf.constant([rows[r], 2], tf.int64),
                        )
                    )
            return [
                ops._gather(tf_internal.PerReplica(tuple(values)), None, 0),
                ops._gather(tf_internal.PerReplica(tuple(sparse)), None, 0),
            ]

        dense_result, sparse_result = run(mode, build)
        check(dense_result, np.concatenate(dense), devices, tf.float32, SUM)
        want = np.zeros((sum(rows), 2))
        for r in range(3):
            want[sum(rows[:r]) + rows[r] - 1] = r + 1
        check(sparse_result, want, devices, tf.float32, SUM, "sparse")

    def test_unknown_static_shapes_are_reduced(self):
        ops = self.make_ops()
        devices = device_names(3)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def fn(x):
            components = []
            for i, d in enumerate(devices):
                with tf.device(d):
                    components.append(x * (i + 1))
            value = tf_internal.PerReplica(tuple(components))
            fixed = testing.per_replica([tf.ones([3])] * 3, devices)
            summed = ops.batch_reduce(SUM, [(value, None), (fixed, None)])
            return [per_destination(r) for r in summed]

        unknown, known = fn(tf.constant([1.0, 2.0]))
        for t in unknown:
            np.testing.assert_allclose(t.numpy(), [6.0, 12.0])
        for t in known:
            np.testing.assert_allclose(t.numpy(), [3.0] * 3)

    @pytest.mark.parametrize("op_name", sorted(REDUCE_OPS))
    def test_mirrored_strategy_all_reduce_of_one_shared_tensor(self, op_name):
        """Every replica passes the same tensor: TF hands it over alone."""
        ops = self.make_ops()
        devices = device_names(3)
        strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
        with tf.device(devices[0]):
            shared = tf.constant([1.0, 2.0])

        @tf.function
        def step():
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(REDUCE_OPS[op_name], shared)

        # TensorFlow's own ops return the tensor itself for SUM and MEAN.
        for v in strategy.experimental_local_results(strategy.run(step)):
            np.testing.assert_allclose(v.numpy(), [1.0, 2.0])

    # ---- TensorFlow parity ---------------------------------------------

    @pytest.mark.parametrize("mode", MODES)
    def test_one_destination_gives_the_plain_value(self, mode):
        """reduce, batch_reduce, broadcast and gather to one device.

        `run` holds every result to TensorFlow's regroup rule (see
        `per_destination`); here each call also matches TensorFlow's own
        ReductionToOneDevice side by side.
        """
        ops = self.make_ops()
        devices = device_names(NUM_DEVICES)
        destination = testing.cpu_devices(8)[7]
        dense = random_replicas(0, NUM_DEVICES, False)
        sparse = random_replicas(1, NUM_DEVICES, True)

        def calls(cross_device_ops):
            value = make_value(dense, tf.float32, False, devices)
            slices = make_value(sparse, tf.float32, True, devices)
            return [
                cross_device_ops.reduce(SUM, value, destination),
                *cross_device_ops.batch_reduce(
                    MEAN, [(value, destination), (slices, destination)]
                ),
                cross_device_ops.broadcast(value.values[1], destination),
                cross_device_ops._gather(value, destination, 0),
            ]

        results = run(mode, lambda: calls(ops))
        total = sum(densify(r, False) for r in dense)
        wants = [
            total,
            total / NUM_DEVICES,
            sum(densify(r, True) for r in sparse) / NUM_DEVICES,
            densify(dense[1], False),
            np.concatenate([densify(r, False) for r in dense]),
        ]
        for result, want in zip(results, wants, strict=True):
            check(result, want, [destination], tf.float32, SUM)
        if mode == "eager":
            ours = calls(ops)
            theirs = calls(tf.distribute.ReductionToOneDevice())
            for a, b in zip(ours, theirs, strict=True):
                assert type(a) is type(b), (type(a), type(b))

    @pytest.mark.parametrize("mode", MODES)
    def test_destination_strings_complete_from_the_device_scope(self, mode):
        """A partial destination string takes the rest from `tf.device`."""
        ops = self.make_ops()
        devices = device_names(NUM_DEVICES)
        scope = testing.cpu_devices(8)[5]
        partial = "/job:localhost/replica:0/task:0"  # The device: scope's.
        dense = random_replicas(2, NUM_DEVICES, False)

        def build():
            value = make_value(dense, tf.float32, False, devices)
            return [
                ops.reduce(SUM, value, partial),
                ops.batch_reduce(SUM, [(value, [partial, devices[0]])])[0],
                ops.broadcast(value.values[1], partial),
                ops._gather(value, partial, 0),
            ]

        results = run(mode, build, scope=scope)
        total = sum(densify(r, False) for r in dense)
        check(results[0], total, [scope], tf.float32, SUM)
        check(results[1], total, [scope, devices[0]], tf.float32, SUM)
        check(results[2], densify(dense[1], False), [scope], tf.float32, SUM)
        gathered = np.concatenate([densify(r, False) for r in dense])
        check(results[3], gathered, [scope], tf.float32, SUM)
        if mode == "eager":  # TensorFlow's own class resolves the same way.
            with tf.device(scope):
                theirs = tf.distribute.ReductionToOneDevice().reduce(
                    SUM, make_value(dense, tf.float32, False, devices), partial
                )
            assert canonical(theirs.device) == canonical(scope)

    @pytest.mark.parametrize("mode", MODES)
    def test_job_less_device_strings(self, mode):
        """Graph-mode TensorFlow names devices '/replica:0/task:0/...'."""
        ops = self.make_ops()
        job_less = [
            f"/replica:0/task:0/device:CPU:{i}" for i in range(NUM_DEVICES)
        ]
        other = "/replica:0/task:0/device:CPU:7"
        dense = random_replicas(3, NUM_DEVICES, False)
        sparse = random_replicas(4, NUM_DEVICES, True)

        def build():
            value = make_value(dense, tf.float32, False, job_less)
            slices = make_value(sparse, tf.float32, True, job_less)
            return [
                ops.reduce(MEAN, value, None),
                *ops.batch_reduce(SUM, [(value, value), (slices, None)]),
                ops.reduce(SUM, value, [job_less[1], other]),
                ops.broadcast(value.values[0], job_less),
                ops._gather(value, other, 0),
            ]

        results = run(mode, build)
        total = sum(densify(r, False) for r in dense)
        local = [canonical(d) for d in job_less]
        check(results[0], total / NUM_DEVICES, local, tf.float32, MEAN)
        check(results[1], total, local, tf.float32, SUM)
        check(
            results[2],
            sum(densify(r, True) for r in sparse),
            local,
            tf.float32,
            SUM,
        )
        check(results[3], total, [local[1], canonical(other)], tf.float32, SUM)
        check(results[4], densify(dense[0], False), local, tf.float32, SUM)
        gathered = np.concatenate([densify(r, False) for r in dense])
        check(results[5], gathered, [canonical(other)], tf.float32, SUM)

    def test_reference_typed_values(self):
        """TF 1 graphs: `assign_add` on a RefVariable gives float32_ref."""
        ops = self.make_ops()
        devices = device_names(NUM_DEVICES)
        with tf.Graph().as_default() as graph:
            refs = []
            for i, d in enumerate(devices):
                with tf.device(d):
                    variable = tf.compat.v1.Variable(
                        [float(i + 1)] * 2, use_resource=False
                    )
                    refs.append(tf.compat.v1.assign_add(variable, [1.0, 1.0]))
            assert refs[0].dtype == tf.float32._as_ref
            value = tf_internal.PerReplica(tuple(refs))
            results = [
                ops.reduce(SUM, value, None),
                ops.batch_reduce(MEAN, [(value, value)])[0],
                ops.reduce(SUM, value, devices[0]),
            ]
            fetches = [per_destination(r) for r in results]
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                out = session.run(fetches)
        # Each variable is i + 1, plus the 1 assign_add adds: 2, 3 and 4.
        for got, want in zip(out, [9.0, 3.0, 9.0], strict=True):
            for component in got:
                np.testing.assert_array_equal(component, [want, want])
        for fetched in fetches:
            assert all(c.dtype == tf.float32 for c in fetched)

    @pytest.mark.parametrize("op_name", sorted(REDUCE_OPS))
    @pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.float32])
    def test_one_replica_in_place_is_returned_as_is(self, dtype, op_name):
        """TensorFlow's shortcut: one replica's mean is its value, any dtype."""
        ops = self.make_ops()
        device = device_names(1, first=2)[0]
        with tf.device(device):
            value = tf_internal.PerReplica((tf.constant([3, 4], dtype),))
        reduce_op = REDUCE_OPS[op_name]
        theirs = tf.distribute.ReductionToOneDevice().reduce(
            reduce_op, value, value
        )
        for ours in (
            ops.reduce(reduce_op, value, value),
            *ops.batch_reduce(reduce_op, [(value, value)]),
        ):
            assert isinstance(ours, tf.Tensor), type(ours)
            assert ours.dtype == theirs.dtype == dtype
            assert canonical(ours.device) == canonical(device)
            np.testing.assert_array_equal(ours.numpy(), [3, 4])
