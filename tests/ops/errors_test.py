"""Bad input raises ValueError or TypeError naming the argument."""

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing
from tf_crossdevice._core import tf_internal

SUM = tf.distribute.ReduceOp.SUM

CLASSES = {
    "reduction_to_one_device": tf_crossdevice.ReductionToOneDevice,
    "nccl": tf_crossdevice.NcclAllReduce,
    "hierarchical_copy": tf_crossdevice.HierarchicalCopyAllReduce,
    "all_reduce_packed": lambda: tf_crossdevice.AllReduceCrossDeviceOps(
        "hierarchical_copy", num_packs=2
    ),
}


def good_value():
    return testing.per_replica([tf.constant([1.0, 2.0])] * 2)


def value_of(*components):
    return testing.per_replica(list(components))


def sparse(rows, dtype=tf.float32):
    return tf.IndexedSlices(
        tf.ones([rows, 2], dtype), tf.range(rows, dtype=tf.int64), [5, 2]
    )


CASES = {
    "unknown_reduce_op": (
        lambda ops: ops.reduce("max", good_value(), None),
        ValueError,
        r"reduce_op: .*ReduceOp.SUM or .*MEAN, got 'max'",
    ),
    "reduce_op_none": (
        lambda ops: ops.reduce(None, good_value(), None),
        ValueError,
        "reduce_op",
    ),
    "options_wrong_type": (
        lambda ops: ops.reduce(SUM, good_value(), None, options={"a": 1}),
        TypeError,
        "options: expected None or .*CommunicationOptions",
    ),
    "value_is_a_list": (
        lambda ops: ops.reduce(SUM, [1.0, 2.0], None),
        TypeError,
        "per_replica_value.*expected a DistributedValues",
    ),
    "value_is_numpy": (
        lambda ops: ops.reduce(SUM, np.ones(3), None),
        TypeError,
        "per_replica_value",
    ),
    "empty_value_list": (
        lambda ops: ops.reduce(SUM, tf_internal.PerReplica(()), None),
        ValueError,
        "per_replica_value: has no per-replica values",
    ),
    "shapes_differ": (
        lambda ops: ops.reduce(SUM, value_of(tf.ones([2]), tf.ones([3])), None),
        ValueError,
        r"per_replica_value: replica 1 has shape \(3,\) but replica 0 has "
        r"\(2,\)",
    ),
    "dtypes_differ": (
        lambda ops: ops.reduce(
            SUM, value_of(tf.ones([2]), tf.ones([2], tf.float64)), None
        ),
        ValueError,
        "replica 1 has dtype float64 but replica 0 has float32",
    ),
    "sparse_row_shapes_differ": (
        lambda ops: ops.reduce(
            SUM,
            value_of(
                sparse(2),
                tf.IndexedSlices(tf.ones([1, 3]), tf.constant([0]), [5, 3]),
            ),
            None,
        ),
        ValueError,
        "replica 1 has shape IndexedSlices rows",
    ),
    "string_dtype": (
        lambda ops: ops.reduce(SUM, value_of(tf.constant(["a"])), None),
        TypeError,
        "dtype string cannot be summed",
    ),
    "bool_dtype": (
        lambda ops: ops.reduce(SUM, value_of(tf.constant([True])), None),
        TypeError,
        "dtype bool cannot be summed",
    ),
    "destination_does_not_exist": (
        lambda ops: ops.reduce(SUM, good_value(), "/cpu:42"),
        ValueError,
        "destinations: device .*CPU:42.* does not exist; this process has",
    ),
    "destination_gpu_on_cpu_machine": (
        lambda ops: ops.reduce(SUM, good_value(), ["/cpu:0", "/gpu:7"]),
        ValueError,
        "destinations: device .*GPU:7.* does not exist",
    ),
    "destination_unparsable": (
        lambda ops: ops.reduce(SUM, good_value(), "/nonsense:0:1"),
        ValueError,
        "destinations: '/nonsense:0:1' is not a device string",
    ),
    "destination_empty_list": (
        lambda ops: ops.reduce(SUM, good_value(), []),
        ValueError,
        "destinations: expected at least one device string, got none",
    ),
    "destination_list_with_int": (
        lambda ops: ops.reduce(SUM, good_value(), ["/cpu:0", 1]),
        TypeError,
        r"destinations\[1\]: expected a device string",
    ),
    "destination_wrong_type": (
        lambda ops: ops.reduce(SUM, good_value(), 3),
        TypeError,
        "destinations: expected None, a DistributedValues",
    ),
    "batch_not_a_list": (
        lambda ops: ops.batch_reduce(SUM, good_value()),
        TypeError,
        "value_destination_pairs: expected a list",
    ),
    "batch_pair_not_a_pair": (
        lambda ops: ops.batch_reduce(SUM, [good_value()]),
        TypeError,
        r"value_destination_pairs\[0\]: expected a \(value, destinations\)",
    ),
    "batch_names_the_bad_pair": (
        lambda ops: ops.batch_reduce(
            SUM,
            [
                (good_value(), None),
                (value_of(tf.ones([2]), tf.ones([4])), None),
            ],
        ),
        ValueError,
        r"value_destination_pairs\[1\]: replica 1 has shape",
    ),
    "gather_axis_out_of_range": (
        lambda ops: ops.gather(good_value(), None, axis=1),
        ValueError,
        "axis: 1 is out of range for values of rank 1",
    ),
    "gather_sparse_axis_1": (
        lambda ops: ops.gather(value_of(sparse(2), sparse(1)), None, axis=1),
        ValueError,
        "axis: IndexedSlices can only be gathered along axis 0",
    ),
    "gather_axis_not_int": (
        lambda ops: ops.gather(good_value(), None, axis="0"),
        TypeError,
        "axis: expected an int",
    ),
    "broadcast_a_list": (
        lambda ops: ops.broadcast([1.0], "/cpu:0"),
        TypeError,
        "tensor: expected",
    ),
    "broadcast_to_missing_device": (
        lambda ops: ops.broadcast(tf.constant(1.0), "/cpu:9"),
        ValueError,
        "destinations: device .*CPU:9",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_bad_input_is_named(cls, case):
    call, error, message = CASES[case]
    ops = CLASSES[cls]()
    with pytest.raises(error, match=message):
        call(ops)


def test_empty_batch_is_an_empty_result():
    for make in CLASSES.values():
        assert make().batch_reduce(SUM, []) == []


COMPRESSING = [
    "SpecAllReduce",
    "MultiWorkerAllReduce",
    "CollectiveAllReduce",
    "HierarchicalCollectiveAllReduce",
]


@pytest.mark.parametrize("keyword", ["compression", "codec", "wire"])
@pytest.mark.parametrize(
    "cls",
    [
        tf_crossdevice.ReductionToOneDevice,
        tf_crossdevice.AllReduceCrossDeviceOps,
        tf_crossdevice.NcclAllReduce,
        tf_crossdevice.HierarchicalCopyAllReduce,
    ],
    ids=lambda cls: cls.__name__,
)
def test_a_codec_for_a_class_that_cannot_compress_names_those_that_can(
    cls, keyword
):
    with pytest.raises(TypeError) as info:
        cls(**{keyword: "fp16"})
    assert str(info.value) == (
        f"{keyword}: {cls.__name__} sends values as they are and takes no "
        f"{keyword}= (got 'fp16'); the classes that compress take "
        "compression=: SpecAllReduce, MultiWorkerAllReduce, "
        "CollectiveAllReduce, HierarchicalCollectiveAllReduce"
    )


def test_the_classes_named_as_compressing_are_those_that_compress():
    """Every public CrossDeviceOps class takes compression='bf16' exactly
    when the message of the others names it."""
    args = {"MultiWorkerAllReduce": (["/job:worker/task:0"], 0)}
    takes = []
    for name in tf_crossdevice.__all__:
        cls = getattr(tf_crossdevice, name)
        if not (
            isinstance(cls, type)
            and issubclass(cls, tf.distribute.CrossDeviceOps)
        ):
            continue
        try:
            ops = cls(*args.get(name, ()), compression="bf16")
        except TypeError as e:
            assert str(e) == (
                f"compression: {name} sends values as they are and takes no "
                "compression= (got 'bf16'); the classes that compress take "
                f"compression=: {', '.join(COMPRESSING)}"
            )
        else:
            assert ops.compression == "bf16"
            takes.append(name)
    assert sorted(takes) == sorted(COMPRESSING)
