"""Every public class prints the constructor call that builds it again."""

from __future__ import annotations

import inspect
import warnings

import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import compat
from tf_crossdevice._core import reprs

OPTIONS = tf.distribute.experimental.CommunicationOptions
RING = tf.distribute.experimental.CommunicationImplementation.RING
SPEC = tf.train.ClusterSpec({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]})


def legacy(name):
    """compat's class `name`, without its deprecation warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(compat, name)


# Per public class: an object built with arguments off their defaults, and
# its configuration as the object reports it (to compare a rebuilt one).
EXAMPLES = {
    "AllReduceCrossDeviceOps": (
        lambda: tf_crossdevice.AllReduceCrossDeviceOps(
            "xring", num_packs=0, agg_small_grads_max_bytes=1024
        ),
        lambda x: (x._num_packs, x._agg_small_grads_max_bytes),
    ),
    "CollectiveAllReduce": (
        lambda: tf_crossdevice.CollectiveAllReduce(
            2,
            all_reduce_merge_scope=4,
            options=OPTIONS(bytes_per_pack=4194304, implementation=RING),
            compression="bf16",
        ),
        lambda x: (
            x.reducer.num_workers,
            x.reducer.constructor_options.bytes_per_pack,
            x.reducer.constructor_options.implementation,
            x.compression,
        ),
    ),
    "CollectiveCluster": (
        lambda: tf_crossdevice.CollectiveCluster(SPEC, "worker", 1, 2),
        lambda x: x,
    ),
    "HierarchicalCollectiveAllReduce": (
        lambda: tf_crossdevice.HierarchicalCollectiveAllReduce(
            tf_crossdevice.NcclAllReduce(num_packs=2), compression="fp16"
        ),
        lambda x: (x.compression, x.reducer.step.local_ops._num_packs),
    ),
    "HierarchicalCopyAllReduce": (
        lambda: tf_crossdevice.HierarchicalCopyAllReduce(num_packs=8),
        lambda x: x._num_packs,
    ),
    "MultiWorkerAllReduce": (
        lambda: tf_crossdevice.MultiWorkerAllReduce(
            ["/job:worker/task:0", "/job:worker/task:1"], 0, "xring#2"
        ),
        lambda x: (x.worker_devices, x.all_reduce_spec),
    ),
    "MultiWorkerMirroredStrategy": (
        lambda: tf_crossdevice.MultiWorkerMirroredStrategy(
            local_devices=["/cpu:0", "/cpu:1"]
        ),
        lambda x: x.extended.worker_devices,
    ),
    "NcclAllReduce": (
        lambda: tf_crossdevice.NcclAllReduce(num_packs=0),
        lambda x: x._num_packs,
    ),
    "ReductionToOneDevice": (
        lambda: tf_crossdevice.ReductionToOneDevice("/cpu:1"),
        lambda x: x._reduce_to_device,
    ),
    "SpecAllReduce": (
        lambda: tf_crossdevice.SpecAllReduce(
            [("pscpu", 1, 1024), ("xring", 2, -1)], 4, compression="bf16"
        ),
        lambda x: (x.all_reduce_spec, x._num_packs, x.compression),
    ),
}

PUBLIC_CLASSES = [
    name
    for name in tf_crossdevice.__all__
    if inspect.isclass(getattr(tf_crossdevice, name))
]

# Its variables are objects, not values: the repr names them but cannot
# make them again (test_a_gradient_accumulator_names_its_variables).
NOT_EVALUABLE = {"GradientAccumulator"}


@pytest.mark.parametrize(
    "make, expected",
    [
        (
            tf_crossdevice.HierarchicalCopyAllReduce,
            "HierarchicalCopyAllReduce()",
        ),
        (
            lambda: tf_crossdevice.HierarchicalCopyAllReduce(8),
            "HierarchicalCopyAllReduce(num_packs=8)",
        ),
        (
            lambda: tf_crossdevice.ReductionToOneDevice("/cpu:1"),
            "ReductionToOneDevice(reduce_to_device='/cpu:1')",
        ),
        (
            lambda: tf_crossdevice.SpecAllReduce("pscpu:32k:xring#2", 1),
            "SpecAllReduce(all_reduce_spec='pscpu:32k:xring#2', num_packs=1)",
        ),
        (
            lambda: tf_crossdevice.CollectiveAllReduce(
                options=OPTIONS(bytes_per_pack=4194304)
            ),
            "CollectiveAllReduce(options=tf.distribute.experimental."
            "CommunicationOptions(bytes_per_pack=4194304))",
        ),
        (
            lambda: tf_crossdevice.MultiWorkerAllReduce(
                ["/job:worker/task:0"], 1, compression="bf16"
            ),
            "MultiWorkerAllReduce(worker_devices=['/job:worker/task:0'], "
            "num_gpus_per_worker=1, compression='bf16')",
        ),
        (
            lambda: tf_crossdevice.HierarchicalCollectiveAllReduce(
                tf_crossdevice.ReductionToOneDevice()
            ),
            "HierarchicalCollectiveAllReduce("
            "local_cross_device_ops=ReductionToOneDevice())",
        ),
        (
            lambda: tf_crossdevice.CollectiveCluster(SPEC, "worker", 0, 2),
            "CollectiveCluster(cluster_spec=tf.train.ClusterSpec({'worker': "
            "['127.0.0.1:2222', '127.0.0.1:2223']}), task_type='worker', "
            "task_id=0, num_workers=2)",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_the_repr_is_the_call_without_its_defaults(make, expected):
    assert repr(make()) == expected


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_evaluating_the_repr_builds_the_same_configuration(name):
    if name in NOT_EVALUABLE:
        pytest.skip(f"{name}: see NOT_EVALUABLE")
    assert name in EXAMPLES, f"add an example of {name} to EXAMPLES"
    make, config = EXAMPLES[name]
    original = make()
    namespace = {
        "tf": tf,
        **{n: getattr(tf_crossdevice, n) for n in PUBLIC_CLASSES},
    }
    rebuilt = eval(repr(original), namespace)  # noqa: S307 - the test's point.
    assert type(rebuilt) is type(original)
    assert config(rebuilt) == config(original)
    assert repr(rebuilt) == repr(original)


def test_a_gradient_accumulator_names_its_variables():
    w = tf.Variable([0.0, 1.0], name="w")
    accumulator = tf_crossdevice.GradientAccumulator([w], steps=2)
    assert repr(accumulator) == (
        "GradientAccumulator(variables=[<tf.Variable 'w:0' shape=(2,) "
        "dtype=float32>], steps=2)"
    )


def test_what_selection_returns_prints_as_its_public_call():
    ops = tf_crossdevice.select_cross_device_ops(["/cpu:0", "/cpu:1"])
    assert repr(ops) == (
        "SpecAllReduce(all_reduce_spec='pscpu', "
        "agg_small_grads_max_bytes=65536, agg_small_grads_max_group=1024)"
    )


def test_a_copy_keeps_the_call():
    ops = tf_crossdevice.CollectiveAllReduce(3)
    bound = ops.with_reducer(ops.reducer)
    assert repr(bound) == "CollectiveAllReduce(num_workers=3)"


LEGACY = {
    "AllReduceCrossTowerOps": ("('xring', num_packs=2)", (2,)),
    "CollectiveAllReduce": ("(2, 1)", None),
    "CrossDeviceOps": ("()", None),
    "CrossTowerOps": ("()", None),
    "HierarchicalCopyAllReduce": ("(num_packs=4)", (4,)),
    "MultiWorkerAllReduce": ("(['/job:worker/task:0'], 0, 'pscpu')", None),
    "NcclAllReduce": ("(3)", (3,)),
    "ReductionToOneDevice": ("()", None),
    "ReductionToOneDeviceCrossTowerOps": ("(reduce_to_device='/cpu:1')", None),
    "ConcatAndSplitPacker": ("(num_packs=2)", None),
    "AggregateSmallTensorPacker": ("(agg_small_grads_max_group=4)", None),
}
LEGACY_REPRS = {
    "AllReduceCrossTowerOps": "AllReduceCrossTowerOps(all_reduce_alg='xring', "
    "num_packs=2)",
    "CollectiveAllReduce": "CollectiveAllReduce(num_workers=2, "
    "num_gpus_per_worker=1)",
    "MultiWorkerAllReduce": "MultiWorkerAllReduce(worker_devices="
    "['/job:worker/task:0'], num_gpus_per_worker=0, all_reduce_spec='pscpu')",
    "NcclAllReduce": "NcclAllReduce(num_packs=3)",
    "ConcatAndSplitPacker": "ConcatAndSplitPacker(num_packs=2)",
    "AggregateSmallTensorPacker": "AggregateSmallTensorPacker("
    "agg_small_grads_max_group=4)",
}


def legacy_classes():
    return sorted(
        name
        for name in compat.__all__
        if inspect.isclass(legacy(name))
        and (
            issubclass(legacy(name), tf.distribute.CrossDeviceOps)
            or name.endswith("Packer")
        )
    )


def test_every_legacy_class_has_an_example():
    assert legacy_classes() == sorted(LEGACY)


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_legacy_classes_print_their_legacy_call(name):
    call, packs = LEGACY[name]
    namespace = {n: legacy(n) for n in legacy_classes()}
    original = eval(name + call, namespace)  # noqa: S307 - the test's point.
    text = repr(original)
    assert text == LEGACY_REPRS.get(name, name + call)
    rebuilt = eval(text, namespace)  # noqa: S307
    assert type(rebuilt) is type(original) and repr(rebuilt) == text
    if packs is not None:
        assert (rebuilt._num_packs,) == packs


def test_values_of_tensorflow_print_as_tf_calls():
    assert reprs.value_repr(OPTIONS(timeout_seconds=2.5)) == (
        "tf.distribute.experimental.CommunicationOptions(timeout_seconds=2.5)"
    )
    assert reprs.value_repr(("xring", [RING])) == (
        "('xring', [tf.distribute.experimental.CommunicationImplementation."
        "RING])"
    )
    assert reprs.value_repr(("pscpu",)) == "('pscpu',)"
