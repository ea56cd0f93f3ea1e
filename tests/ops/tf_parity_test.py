"""Where TensorFlow's own tests pin a behaviour, ours matches.

Each test reproduces one difference that running TensorFlow's cross-device
test suites (TF 1.12 contrib, TF 2.3, tf_cnn_benchmarks) against this
package found, and where TF 2.21 still ships the class, runs TensorFlow's
built-in side by side. The contract (tests/contract.py) holds every class
to the same rules on logical CPU devices.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

import tf_crossdevice
from tf_crossdevice import compat, testing
from tf_crossdevice._core import tf_internal

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN
TF1_MEAN = tf.compat.v1.VariableAggregation.MEAN
TF1_SUM = tf.compat.v1.VariableAggregation.SUM


def _legacy(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(compat, name)


# 1. TF 1's aggregation enum ------------------------------------------------


def test_tf1_aggregation_enum_is_a_different_class_that_tensorflow_accepts():
    assert tf.compat.v1.VariableAggregation is not tf.VariableAggregation
    assert tf.distribute.ReduceOp.from_variable_aggregation(TF1_MEAN) == MEAN


@pytest.mark.parametrize(
    "aggregation, want",
    [
        (TF1_MEAN, 2.0),
        (TF1_SUM, 4.0),
        (tf.VariableAggregation.MEAN, 2.0),
    ],
    ids=["v1-mean", "v1-sum", "v2-mean"],
)
def test_legacy_classes_take_tf1_aggregation(aggregation, want):
    value = testing.per_replica([tf.constant(1.0), tf.constant(3.0)])
    one_device = _legacy("ReductionToOneDeviceCrossTowerOps")()
    all_reduce = _legacy("AllReduceCrossTowerOps")("hierarchical_copy")
    # The legacy names keep TF 1's contract: a Mirrored even for one
    # destination, read with get(device).
    got = one_device.reduce(aggregation, value, "/cpu:0")
    assert float(got.get("/cpu:0")) == want
    (batched,) = all_reduce.batch_reduce(aggregation, [(value, value)])
    assert [float(v) for v in batched.values] == [want, want]
    keyword = one_device.reduce(
        aggregation=aggregation, per_device_value=value, destinations="/cpu:0"
    )
    assert float(keyword.get("/cpu:0")) == want


def test_tf1_aggregation_that_is_no_reduction_names_the_allowed_ones():
    ops = _legacy("ReductionToOneDeviceCrossTowerOps")()
    value = testing.per_replica([tf.constant(1.0), tf.constant(3.0)])
    with pytest.raises(ValueError, match="reduce_op: .*nothing to reduce.*SUM"):
        ops.reduce(tf.VariableAggregation.NONE, value, "/cpu:0")
    # ONLY_FIRST_TOWER meant the first replica's value.
    first = ops.reduce(
        tf.compat.v1.VariableAggregation.ONLY_FIRST_TOWER, value, "/cpu:0"
    )
    assert float(first.get("/cpu:0")) == 1.0


# 2. One destination: the plain tensor -------------------------------------


def _all_ops():
    return [
        tf_crossdevice.ReductionToOneDevice(),
        tf_crossdevice.HierarchicalCopyAllReduce(num_packs=1),
        tf_crossdevice.NcclAllReduce(num_packs=0),
        tf_crossdevice.SpecAllReduce("pscpu/pscpu#2"),
        tf_crossdevice.MultiWorkerAllReduce(
            ["/job:localhost/replica:0/task:0"], 0, "xring"
        ),
    ]


@pytest.mark.parametrize("ops", _all_ops(), ids=lambda o: type(o).__name__)
def test_strategy_to_one_device_gives_what_tensorflow_gives(ops):
    """batch_reduce_to and broadcast_to reach our ops; reduce_to does not.

    TF 2.21's MirroredStrategy.reduce_to bypasses custom ops when a
    destination is a CPU (README, "Where MirroredStrategy calls you"); the
    spy pins that, so this test notices if TensorFlow starts calling us.
    """
    devices = testing.cpu_devices(2)
    called = []
    for method in ("reduce", "batch_reduce", "broadcast"):
        original = getattr(ops, method)

        def spy(*args, _method=method, _original=original, **kwargs):
            called.append(_method)
            return _original(*args, **kwargs)

        setattr(ops, method, spy)
    results = {}
    for name, cross_device_ops in [
        ("tf", tf.distribute.ReductionToOneDevice()),
        ("ours", ops),
    ]:
        strategy = tf.distribute.MirroredStrategy(
            devices, cross_device_ops=cross_device_ops
        )
        value = strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(float(ctx.replica_id_in_sync_group + 1))
        )
        extended = strategy.extended
        results[name] = [
            *extended.batch_reduce_to(SUM, [(value, devices[1])]),
            extended.broadcast_to(tf.constant(5.0), devices[1]),
        ]
        if name == "ours":
            assert called == ["batch_reduce", "broadcast"], called
            assert float(extended.reduce_to(SUM, value, devices[1])) == 3.0
            assert called == ["batch_reduce", "broadcast"], "TF called us"
    for ours, theirs in zip(results["ours"], results["tf"], strict=True):
        assert type(ours) is type(theirs)
        assert ours.device == theirs.device
        assert float(ours) == float(theirs)
    assert [float(r) for r in results["ours"]] == [3.0, 5.0]


@pytest.mark.parametrize("ops", _all_ops(), ids=lambda o: type(o).__name__)
def test_direct_calls_to_one_device_give_what_tensorflow_gives(ops):
    value = testing.per_replica([tf.constant([1.0]), tf.constant([3.0])])
    builtin = tf.distribute.ReductionToOneDevice()
    for cross_device_ops in (ops, builtin):
        reduced = cross_device_ops.reduce(SUM, value, "/cpu:0")
        broadcast = cross_device_ops.broadcast(tf.constant(2.0), "/cpu:0")
        gathered = cross_device_ops._gather(value, "/cpu:0", 0)
        assert isinstance(reduced, tf.Tensor), type(reduced)
        assert isinstance(broadcast, tf.Tensor), type(broadcast)
        assert isinstance(gathered, tf.Tensor), type(gathered)
        np.testing.assert_array_equal(reduced.numpy(), [4.0])
        np.testing.assert_array_equal(gathered.numpy(), [1.0, 3.0])
        assert float(broadcast) == 2.0
        # Two destinations: a Mirrored value, as before.
        both = cross_device_ops.reduce(SUM, value, value)
        assert isinstance(both, tf_internal.Mirrored)


# 3. Destination strings resolve in the enclosing device scope --------------


@pytest.mark.parametrize(
    "ops",
    [
        *_all_ops()[:-1],  # MultiWorkerAllReduce: with the two workers.
        tf_crossdevice.MultiWorkerAllReduce(
            ["/job:worker/task:0", "/job:worker/task:1"], 0, "pscpu/pscpu#2"
        ),
    ],
    ids=lambda o: type(o).__name__,
)
def test_destination_string_takes_the_worker_of_the_device_scope(ops):
    """'/cpu:0' inside tf.device('/job:worker/task:1') is task 1's CPU."""
    want = "/job:worker/replica:0/task:1/device:CPU:0"
    with tf.Graph().as_default(), tf.device("/job:worker/task:1"):
        t = tf.constant(1.0)
        ours = ops.broadcast(t, "/cpu:0")
        theirs = tf.distribute.ReductionToOneDevice().broadcast(t, "/cpu:0")
        pair = tf_internal.PerReplica(
            (
                tf.identity(t),
                _on("/job:worker/task:0/device:CPU:0", t),
            )
        )
        reduced = ops.reduce(SUM, pair, "/cpu:0")
    assert theirs.device == want
    assert ours.device == want
    assert reduced.device == want


def _on(device, t):
    with tf.device(device):
        return tf.identity(t)


def test_job_less_devices_reach_two_level_specs_and_multi_worker():
    """TF's graph-mode device names ('/replica:0/task:0/...') are local."""
    job_less = [f"/replica:0/task:0/device:CPU:{i}" for i in range(4)]
    every_spec = [
        tf_crossdevice.SpecAllReduce(spec)
        for spec in ("nccl/xring", "nccl/rechd", "nccl/pscpu", "pscpu/pscpu")
    ]
    multi_worker = tf_crossdevice.MultiWorkerAllReduce(
        ["/job:localhost/replica:0/task:0"], 0
    )
    with tf.Graph().as_default() as graph:
        components = []
        for i, device in enumerate(job_less):
            with tf.device(device):
                components.append(tf.constant([float(i + 1)]))
        assert components[0].device == job_less[0]
        value = tf_internal.PerReplica(tuple(components))
        results = [
            ops.reduce(SUM, value, None) for ops in [*every_spec, multi_worker]
        ]
        with tf.compat.v1.Session(graph=graph) as session:
            out = session.run([list(r.values) for r in results])
    for per_device in out:
        np.testing.assert_array_equal(per_device, [[10.0]] * 4)


# 4. Reference-typed tensors (TF 1 graphs) ----------------------------------


@pytest.mark.parametrize(
    "ops",
    [
        tf_crossdevice.SpecAllReduce("xring"),
        tf_crossdevice.MultiWorkerAllReduce(
            ["/job:localhost/replica:0/task:0"], 0, "xring"
        ),
        tf.distribute.ReductionToOneDevice(),  # TensorFlow's, for reference.
    ],
    ids=lambda o: type(o).__name__,
)
def test_reference_typed_tensors_are_reduced_by_their_base_dtype(ops):
    devices = testing.cpu_devices(2)
    with tf.Graph().as_default() as graph:
        refs = []
        for i, device in enumerate(devices):
            with tf.device(device):
                variable = tf.compat.v1.Variable(
                    [float(i), 1.0], use_resource=False
                )
                refs.append(tf.compat.v1.assign_add(variable, [1.0, 1.0]))
        assert refs[0].dtype == tf.float32._as_ref
        value = tf_internal.PerReplica(tuple(refs))
        # The value's own devices: the all-reduce path, where xring failed.
        reduced = ops.reduce(SUM, value, value)
        (batched,) = ops.batch_reduce(MEAN, [(value, value)])
        assert reduced.values[0].dtype == tf.float32
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            out = session.run([list(reduced.values), list(batched.values)])
    # The variables hold [0, 1] and [1, 1]; assign_add adds 1 to each.
    np.testing.assert_array_equal(out[0], [[3.0, 4.0], [3.0, 4.0]])
    np.testing.assert_array_equal(out[1], [[1.5, 2.0], [1.5, 2.0]])


# 5. The T suffix of tf_cnn_benchmarks' spec grammar ------------------------


def test_spec_takes_terabyte_limits():
    ops = tf_crossdevice.SpecAllReduce("pscpu:1T:xring")
    assert [(r.alg, r.limit) for r in ops.all_reduce_spec] == [
        ("pscpu", 1024**4),
        ("xring", -1),
    ]
    value = testing.per_replica([tf.constant([1.0]), tf.constant([2.0])])
    np.testing.assert_array_equal(
        [v.numpy() for v in ops.reduce(SUM, value).values], [[3.0], [3.0]]
    )


# 6. Legacy GPU jobs run on CPUs, with one warning ---------------------------


def test_gpu_worker_spec_on_cpu_values_runs_and_warns_once(monkeypatch):
    warned = []
    monkeypatch.setattr(
        absl_logging, "warning", lambda msg, *args: warned.append(msg % args)
    )
    ops = tf_crossdevice.MultiWorkerAllReduce(
        ["/job:localhost/replica:0/task:0"], 2, ("pscpu/pscpu", 2, -1)
    )
    value = testing.per_replica([tf.constant([1.0, 2.0]), tf.constant([3.0])])
    with pytest.raises(ValueError, match="replica 1 has shape"):
        ops.reduce(MEAN, value)  # Shapes still checked before anything else.
    value = testing.per_replica(
        [tf.constant([1.0, 2.0]), tf.constant([3.0, 4])]
    )
    for _ in range(3):
        reduced = ops.reduce(MEAN, value)
        np.testing.assert_array_equal(
            [v.numpy() for v in reduced.values], [[2.0, 3.0]] * 2
        )
    (summed,) = ops.batch_reduce(SUM, [(value, value)])
    np.testing.assert_array_equal(
        [v.numpy() for v in summed.values], [[4.0, 6.0]] * 2
    )
    assert len(warned) == 1, warned
    assert "num_gpus_per_worker=2" in warned[0]
    assert "GPUs" in warned[0] and "on a CPU" in warned[0]


def test_gpu_values_reduced_to_the_worker_cpu_do_not_warn(monkeypatch):
    """TF 1 kept variables on the worker's CPU: only values' devices count."""
    warned = []
    monkeypatch.setattr(
        absl_logging, "warning", lambda msg, *args: warned.append(msg % args)
    )
    ops = tf_crossdevice.MultiWorkerAllReduce(["/job:worker/task:0"], 2)
    with tf.Graph().as_default():  # Built, not run: there is no worker.
        gpus = []
        for i in range(2):
            with tf.device(f"/job:worker/task:0/device:GPU:{i}"):
                gpus.append(tf.constant([1.0]))
        value = tf_internal.PerReplica(tuple(gpus))
        reduced = ops.reduce(SUM, value, "/job:worker/task:0/device:CPU:0")
        assert reduced.device == "/job:worker/replica:0/task:0/device:CPU:0"
    assert warned == []
