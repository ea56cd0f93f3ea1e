"""The contract every all-reduce builder passes (see `algorithms/_protocol.py`).

A builder takes one tensor per device and the value's index in its batch and
returns the sums, the i-th on the i-th input's device. `BuilderContract`
checks that against numpy eagerly, in tf.function and in TF1 graphs, with
static and unknown shapes, scalars and empty tensors, on 1 to 8 devices, and
checks placement and argument validation. A test class subclasses it and
provides the fixture `make_builder`, a `shards -> AllReduceBuilder`
(normally `functools.partial(registry.build, name)`);
tests/algorithms/builders_test.py does so for every registered algorithm.

The matrix runs eagerly: tracing a tf.function for every case would cost
far more than the ops themselves, and the graph paths get their own smaller
tests. Its inputs are integers in [-4, 4], so every partial sum is an integer
of magnitude <= 32, exactly representable in every dtype: any summation
order gives the exact sum, and the matrix asserts exact equality.

Float tolerance, for inputs whose sums round: summing n values in any order
is off by at most (n - 1) * u * sum(|x_i|) elementwise (u = eps / 2, the
unit roundoff), so tests allow n * eps(dtype) * sum(|x_i|): relative to the
magnitudes about n * 1e-3 for float16, n * 8e-3 for bfloat16, n * 1.2e-7 for
float32 and n * 2.2e-16 for float64. Integers must be exact.
"""

from __future__ import annotations

import functools

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from tests import traffic_util
from tf_crossdevice import testing

DEVICE_COUNTS = (1, 2, 3, 4, 8)
SHARD_COUNTS = (1, 3)
DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64, tf.int32, tf.int64)
EPS = {
    tf.float16: 2.0**-10,
    tf.bfloat16: 2.0**-7,
    tf.float32: 2.0**-23,
    tf.float64: 2.0**-52,
    tf.complex64: 2.0**-23,
    tf.complex128: 2.0**-52,
}
# A scalar, empty tensors, 7 elements (padding for every shard count) and
# 1000 elements; `test_large_prime_size` adds 1000003.
SHAPES = ((), (0,), (7,), (10, 100), (2, 0, 3))
# Divisible by shards * n for n <= 8 and shards <= 3: no padding.
TRAFFIC_ELEMENTS = 5040


@functools.lru_cache(maxsize=1)  # Tests run n-major: one n cached at a time.
def matrix_cases(n):
    """[(shape, dtype, n arrays of that dtype, their exact int64 sum)]."""
    rng = np.random.default_rng(n)
    cases = []
    for shape in SHAPES:
        values = rng.integers(-4, 5, size=(n, *shape), dtype=np.int8)
        total = values.sum(axis=0, dtype=np.int64)
        for dtype in DTYPES:
            arrays = [v.astype(dtype.as_numpy_dtype) for v in values]
            cases.append((shape, dtype, arrays, total))
    return cases


def numpy_sum(per_device, dtype):
    """Exact-ish sum of `per_device` and the allowed error (see docstring)."""
    stacked = np.stack([np.asarray(x) for x in per_device])
    if dtype.is_integer:
        return stacked.astype(np.int64).sum(axis=0), None
    wide = stacked.astype(np.complex128 if dtype.is_complex else np.float64)
    bound = len(per_device) * EPS[dtype] * np.abs(wide).sum(axis=0)
    return wide.sum(axis=0), bound


def assert_close_to(got, expected, bound, what=""):
    """`got` equals `expected` (integers) or is within `bound` (floats)."""
    got = np.asarray(got)
    assert got.shape == expected.shape, what
    if bound is None:
        np.testing.assert_array_equal(got.astype(np.int64), expected, what)
        return
    error = np.abs(got.astype(expected.dtype) - expected)
    if not np.all(error <= bound):
        worst = np.argmax((error - bound).ravel())
        raise AssertionError(
            f"{what}: |got - numpy| exceeds n * eps * sum|x| at flat index "
            f"{worst}: got {got.ravel()[worst]}, numpy "
            f"{expected.ravel()[worst]}"
        )


def assert_sum_matches_numpy(got, per_device, dtype, what=""):
    """Checks `got` against numpy's sum of `per_device` (inputs as given)."""
    assert_close_to(got, *numpy_sum(per_device, dtype), what)


def integer_valued(rng, n, shape, dtype):
    """n arrays of small integers (sums exact in every dtype) as `dtype`."""
    values = rng.integers(-4, 5, size=(n, *shape))
    return [values[i].astype(dtype.as_numpy_dtype) for i in range(n)]


def place(devices, arrays):
    """One tensor per device: arrays[i] on devices[i] (eager or traced)."""
    placed = []
    for device, x in zip(devices, arrays, strict=True):
        with tf.device(device):
            placed.append(tf.identity(x))
    return placed


def traced_graph(all_reduce, devices, index=0):
    """The graph of `all_reduce` over TRAFFIC_ELEMENTS float32 zeros."""

    @tf.function(autograph=False)
    def reduce():
        tensors = []
        for device in devices:
            with tf.device(device):
                tensors.append(tf.zeros([TRAFFIC_ELEMENTS], tf.float32))
        return all_reduce(tensors, index)

    return reduce.get_concrete_function().graph


class BuilderContract:
    """Checks for `make_builder(shards)(tensors, index) -> list[tf.Tensor]`.

    Subclasses provide the fixture `make_builder`.
    """

    # n is the outer loop (bottom decorator) so matrix_cases(n) is reused.
    @pytest.mark.parametrize("shards", SHARD_COUNTS, ids="shards{}".format)
    @pytest.mark.parametrize("n", DEVICE_COUNTS, ids="n{}".format)
    def test_matches_numpy_for_all_shapes_and_dtypes(
        self, make_builder, n, shards
    ):
        devices = testing.cpu_devices(n)
        all_reduce = make_builder(shards)
        for index, (shape, dtype, arrays, total) in enumerate(matrix_cases(n)):
            what = f"shape {shape} {dtype.name}"
            summed = all_reduce(place(devices, arrays), index)
            assert [t.device for t in summed] == devices, what
            first = summed[0].numpy()
            assert first.dtype == dtype.as_numpy_dtype, what
            assert first.shape == shape, what
            # Every device must hold the very same bits (replicas in sync).
            for out in summed[1:]:
                assert out.numpy().tobytes() == first.tobytes(), what
            wide = np.int64 if dtype.is_integer else np.float64
            np.testing.assert_array_equal(first.astype(wide), total, what)

    def test_large_prime_size(self, make_builder):
        devices = testing.cpu_devices(3)
        arrays = integer_valued(
            np.random.default_rng(3), 3, (1000003,), tf.float32
        )
        for out in make_builder(2)(place(devices, arrays), 0):
            assert_sum_matches_numpy(out.numpy(), arrays, tf.float32)

    @pytest.mark.parametrize(
        "n, shards", [(3, 3), (8, 2)], ids=["n3-shards3", "n8-shards2"]
    )
    def test_tf_function_matches_numpy(self, make_builder, n, shards):
        devices = testing.cpu_devices(n)
        all_reduce = make_builder(shards)
        rng = np.random.default_rng(n)
        cases = [
            (dtype, integer_valued(rng, n, shape, dtype))
            for shape in ((), (7,), (10, 100))
            for dtype in (tf.bfloat16, tf.int64)
        ]
        placements = []

        @tf.function(autograph=False)
        def reduce_all(inputs):
            outputs = []
            for index, case in enumerate(inputs):
                summed = all_reduce(place(devices, case), index)
                placements.append([t.device for t in summed])
                outputs.append(summed)
            return outputs

        outputs = reduce_all([arrays for _, arrays in cases])
        assert placements == [devices] * len(cases)
        for (dtype, arrays), summed in zip(cases, outputs, strict=True):
            assert len(summed) == n
            for out in summed:
                assert out.dtype == dtype
                assert_sum_matches_numpy(out.numpy(), arrays, dtype)

    @pytest.mark.parametrize(
        "dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64]
    )
    def test_random_floats_within_tolerance(self, make_builder, dtype):
        n = 7
        rng = np.random.default_rng(7)
        arrays = [
            (rng.standard_normal(1001) * 10).astype(dtype.as_numpy_dtype)
            for _ in range(n)
        ]
        summed = make_builder(2)(place(testing.cpu_devices(n), arrays), 1)
        for out in summed:
            assert_sum_matches_numpy(out.numpy(), arrays, dtype, dtype.name)

    @pytest.mark.parametrize("dtype", [tf.complex64, tf.complex128])
    def test_complex(self, make_builder, dtype):
        rng = np.random.default_rng(3)
        arrays = [
            (rng.standard_normal(5) + 1j * rng.standard_normal(5)).astype(
                dtype.as_numpy_dtype
            )
            for _ in range(3)
        ]
        summed = make_builder(1)(place(testing.cpu_devices(3), arrays), 0)
        for out in summed:
            assert_sum_matches_numpy(out.numpy(), arrays, dtype, dtype.name)

    def test_one_device_is_a_copy(self, make_builder):
        (device,) = testing.cpu_devices(1)
        (x,) = place([device], [np.arange(6, dtype=np.int64).reshape(2, 3)])
        (out,) = make_builder(3)([x], 0)
        assert out.device == device
        np.testing.assert_array_equal(out.numpy(), x.numpy())

    def test_eager_places_output_i_on_input_i_device(self, make_builder):
        devices = testing.cpu_devices(4)[::-1]  # Not in device-index order.
        arrays = [np.full([3], i, np.float32) for i in range(4)]
        summed = make_builder(2)(place(devices, arrays), 5)
        assert [t.device for t in summed] == devices
        for out in summed:
            np.testing.assert_array_equal(out.numpy(), [6.0, 6.0, 6.0])

    @pytest.mark.parametrize("dtype", [tf.float32, tf.int64])
    def test_tf1_graph_and_session_with_short_device_names(
        self, make_builder, dtype
    ):
        n = 5
        devices = [f"/device:CPU:{i}" for i in range(n)]
        arrays = integer_valued(np.random.default_rng(5), n, (3, 11), dtype)
        graph = tf.Graph()
        with graph.as_default():
            summed = make_builder(2)(place(devices, arrays), 0)
            assert [t.device for t in summed] == devices
            with tf.compat.v1.Session(graph=graph) as session:
                values = session.run(summed)
        for value in values:
            assert_sum_matches_numpy(value, arrays, dtype, "graph mode")

    def test_tf1_graph_with_unknown_shape(self, make_builder):
        n = 3
        devices = [f"/device:CPU:{i}" for i in range(n)]
        arrays = integer_valued(np.random.default_rng(9), n, (4, 5), tf.int32)
        graph = tf.Graph()
        with graph.as_default():
            placeholders = []
            for device in devices:
                with tf.device(device):
                    placeholders.append(
                        tf.compat.v1.placeholder(tf.int32, [None, 5])
                    )
            summed = make_builder(3)(placeholders, 0)
            with tf.compat.v1.Session(graph=graph) as session:
                values = session.run(
                    summed,
                    feed_dict=dict(zip(placeholders, arrays, strict=True)),
                )
        for value in values:
            assert_sum_matches_numpy(value, arrays, tf.int32, "unknown shape")

    @pytest.mark.parametrize("static_shape", [True, False], ids=str)
    def test_places_every_op_on_an_input_device_of_another_worker(
        self, make_builder, static_shape
    ):
        # Built, not run: no cluster needed. An op with no device would be
        # placed by the client wherever it likes, costing extra transfers.
        devices = [
            f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(5)
        ]
        graph = tf.Graph()
        with graph.as_default():
            inputs = []
            for device in devices:
                with tf.device(device):
                    shape = [6, 7] if static_shape else [None, 7]
                    inputs.append(tf.compat.v1.placeholder(tf.float32, shape))
            summed = make_builder(2)(inputs, 0)
        assert [t.device for t in summed] == devices
        assert {op.device for op in graph.get_operations()} == set(devices)
        if static_shape:
            sent = traffic_util.bytes_sent_by_device(graph)
            assert set(sent) == set(devices)

    def test_tf_function_with_unknown_shape(self, make_builder):
        devices = testing.cpu_devices(6)
        all_reduce = make_builder(2)
        spec = tf.TensorSpec([None], tf.float64)

        @tf.function(input_signature=[[spec] * len(devices)], autograph=False)
        def reduce(xs):
            return all_reduce(place(devices, xs), 0)

        for length in (1, 13):
            arrays = integer_valued(
                np.random.default_rng(length), 6, (length,), tf.float64
            )
            for out in reduce([tf.constant(x) for x in arrays]):
                assert_sum_matches_numpy(out.numpy(), arrays, tf.float64)

    def test_property_exact_on_random_integers(self, make_builder):
        # Defined per call: hypothesis refuses one @given method inherited by
        # two test classes ("differing executors").
        @hypothesis.settings(max_examples=40, deadline=None)
        @hypothesis.given(
            n=st.integers(1, 8),
            shards=st.integers(1, 3),
            index=st.integers(0, 20),
            length=st.integers(1, 50),
            dtype=st.sampled_from([tf.int32, tf.int64]),
            seed=st.integers(0, 2**32 - 1),
        )
        def check(n, shards, index, length, dtype, seed):
            # Large values: a lost, doubled or misplaced chunk changes the sum.
            limit = 2**27 if dtype == tf.int32 else 2**59
            values = np.random.default_rng(seed).integers(
                -limit, limit, size=(n, length)
            )
            arrays = [v.astype(dtype.as_numpy_dtype) for v in values]
            summed = make_builder(shards)(
                place(testing.cpu_devices(n), arrays), index
            )
            expected = values.sum(axis=0)
            for out in summed:
                np.testing.assert_array_equal(out.numpy(), expected)

        check()

    @pytest.mark.parametrize(
        "shards", [0, -1, True, 2.0, "2"], ids=lambda s: f"shards_{s!r}"
    )
    def test_rejects_bad_shards_when_built(self, make_builder, shards):
        """Wrong type: TypeError; an int below 1: ValueError."""
        error = ValueError if type(shards) is int else TypeError
        with pytest.raises(error, match="^shards: expected an int >= 1"):
            make_builder(shards)

    @pytest.mark.parametrize(
        "tensors, error, match",
        [
            pytest.param("empty", ValueError, "tensors: .* empty", id="empty"),
            pytest.param(
                "numpy", TypeError, r"tensors\[1\].*ndarray", id="numpy"
            ),
            pytest.param(
                "dtypes", TypeError, r"tensors\[1\].*float64", id="dtypes"
            ),
            pytest.param(
                "shapes", ValueError, r"tensors\[1\].*shape", id="shapes"
            ),
            pytest.param("bool", TypeError, "dtype bool", id="bool_dtype"),
        ],
    )
    def test_rejects_bad_tensors(self, make_builder, tensors, error, match):
        x = tf.zeros([2], tf.float32)
        tensors = {
            "empty": [],
            "numpy": [x, np.zeros([2], np.float32)],
            "dtypes": [x, tf.zeros([2], tf.float64)],
            "shapes": [x, tf.zeros([3], tf.float32)],
            "bool": [tf.zeros([2], tf.bool)] * 2,
        }[tensors]
        with pytest.raises(error, match=match):
            make_builder(2)(tensors, 0)
