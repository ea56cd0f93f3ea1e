"""The migration command: each rewrite, its report, and the command line.

Snippets go in as source and come out as exact source; the command runs
in-process on files in tmp_path.
"""

from __future__ import annotations

import doctest
import pathlib
import sys
import textwrap

import pytest

from tf_crossdevice.cluster import processes
from tf_crossdevice.compat import _calls, _report, _rewrite, _syntax, upgrade

# The compat package's folder: compat/ in a checkout, tf_crossdevice/compat/
# under Bazel.
COMPAT = pathlib.Path(upgrade.__file__).resolve().parent


def code(text):
    return textwrap.dedent(text).lstrip("\n")


def rewritten(source):
    return upgrade.upgrade_code(code(source)).code


def report(source, path="m.py"):
    result = upgrade.upgrade_code(code(source))
    return [finding.report_line(path) for finding in result.findings]


# (legacy source, upgraded source), one case per rewrite.
CASES = {
    # Where the legacy names come from.
    "contrib_module": (
        """
        from tensorflow.contrib import distribute

        ops = distribute.AllReduceCrossTowerOps("hierarchical_copy")
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.AllReduceCrossDeviceOps("hierarchical_copy")
        """,
    ),
    "contrib_module_imported_as": (
        """
        import tensorflow.contrib.distribute as D

        ops = D.ReductionToOneDeviceCrossTowerOps()
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.ReductionToOneDevice()
        """,
    ),
    "tf_contrib_path": (
        """
        import tensorflow as tf

        base = tf.contrib.distribute.CrossTowerOps
        """,
        """
        import tensorflow as tf

        base = tf.distribute.CrossDeviceOps
        """,
    ),
    "cross_tower_ops_module": (
        """
        from tensorflow.contrib.distribute.python import cross_tower_ops as ctl

        ops = ctl.MultiWorkerAllReduce(["/job:worker/task:0"], 2)
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.MultiWorkerAllReduce(["/job:worker/task:0"], 2)
        """,
    ),
    "cross_tower_ops_names": (
        """
        from tensorflow.contrib.distribute.python.cross_tower_ops import (
            AllReduceCrossTowerOps,
            CrossTowerOps,
        )

        new = AllReduceCrossTowerOps
        base = CrossTowerOps
        """,
        """
        import tensorflow as tf
        import tf_crossdevice

        new = tf_crossdevice.AllReduceCrossDeviceOps
        base = tf.distribute.CrossDeviceOps
        """,
    ),
    "compat_module": (
        """
        from tf_crossdevice import compat

        ops = compat.ReductionToOneDeviceCrossTowerOps()
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.ReductionToOneDevice()
        """,
    ),
    "compat_module_imported_as": (
        """
        import tf_crossdevice.compat as C

        ops = C.CollectiveAllReduce(1, 0)
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.CollectiveAllReduce(1, 0)
        """,
    ),
    "compat_name_imported_as": (
        """
        from tf_crossdevice.compat import NcclAllReduce as Nccl

        ops = Nccl(num_packs=2)
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.NcclAllReduce(num_packs=2)
        """,
    ),
    "compat_dotted_path": (
        """
        import tf_crossdevice.compat

        ops = tf_crossdevice.compat.HierarchicalCopyAllReduce()
        """,
        """
        import tf_crossdevice

        ops = tf_crossdevice.HierarchicalCopyAllReduce()
        """,
    ),
    "v1_names": (
        """
        import tensorflow as tf

        base = tf.compat.v1.distribute.CrossDeviceOps
        op = tf.compat.v1.distribute.ReduceOp.MEAN
        """,
        """
        import tensorflow as tf

        base = tf.distribute.CrossDeviceOps
        op = tf.distribute.ReduceOp.MEAN
        """,
    ),
    "collective_hints_tf_2_2": (
        """
        import tensorflow as tf

        hints = tf.distribute.experimental.CollectiveHints(1024, 5.0)
        """,
        """
        import tensorflow as tf

        hints = tf.distribute.experimental.CommunicationOptions(1024, 5.0)
        """,
    ),
    "collective_hints_compat": (
        """
        from tf_crossdevice import compat

        hints = compat.CollectiveHints(1024)
        """,
        """
        import tensorflow as tf

        hints = tf.distribute.experimental.CommunicationOptions(1024)
        """,
    ),
    # Calls that change shape.
    "spec_tuple_positional": (
        """
        from tf_crossdevice import compat

        spec = [compat.AllReduceSpecTuple("pscpu", 1, 1024), ("xring", 2, -1)]
        """,
        """
        spec = [("pscpu", 1, 1024), ("xring", 2, -1)]
        """,
    ),
    "spec_tuple_keywords": (
        """
        from tf_crossdevice.compat import AllReduceSpecTuple

        spec = AllReduceSpecTuple(limit=-1, alg="nccl", shards=1)
        """,
        """
        spec = ("nccl", 1, -1)
        """,
    ),
    "spec_tuple_multiline": (
        """
        from tf_crossdevice.compat import AllReduceSpecTuple

        spec = AllReduceSpecTuple(
            "pscpu/pscpu",  # within each worker, then across
            2,
            -1,
        )
        """,
        """
        spec = (
            "pscpu/pscpu",  # within each worker, then across
            2,
            -1,
        )
        """,
    ),
    "choose_the_best": (
        """
        from tensorflow.contrib import distribute

        a = distribute.choose_the_best(devices)
        b = distribute.choose_the_best(devices, session_config=None)
        c = distribute.choose_the_best(devices, config)
        """,
        """
        import tf_crossdevice

        a = tf_crossdevice.select_cross_device_ops(devices)
        b = tf_crossdevice.select_cross_device_ops(devices)
        c = tf_crossdevice.select_cross_device_ops(devices)
        """,
    ),
    "mirrored_strategy_devices": (
        """
        from tensorflow.contrib import distribute

        strategy = distribute.MirroredStrategy(
            devices=["/cpu:0", "/cpu:1"],
            cross_tower_ops=distribute.AllReduceCrossTowerOps("xring"),
        )
        """,
        """
        import tensorflow as tf
        import tf_crossdevice

        strategy = tf.distribute.MirroredStrategy(
            devices=["/cpu:0", "/cpu:1"],
            cross_device_ops=tf_crossdevice.AllReduceCrossDeviceOps("xring"),
        )
        """,
    ),
    "mirrored_strategy_num_gpus": (
        """
        from tf_crossdevice import compat

        two = compat.MirroredStrategy(
            num_gpus=2, cross_tower_ops=ops
        )
        none = compat.MirroredStrategy(num_gpus=0)
        some = compat.MirroredStrategy(
            num_gpus=n
        )
        """,
        """
        import tensorflow as tf

        two = tf.distribute.MirroredStrategy(
            devices=["/gpu:0", "/gpu:1"], cross_device_ops=ops
        )
        none = tf.distribute.MirroredStrategy(devices=["/cpu:0"])
        some = tf.distribute.MirroredStrategy(
            devices=[f"/gpu:{i}" for i in range(n)] or ["/cpu:0"]
        )
        """,
    ),
    "mirrored_strategy_positional": (
        """
        from tf_crossdevice import compat

        a = compat.MirroredStrategy(devices, None, ops)
        b = compat.MirroredStrategy(None, 1)
        c = compat.MirroredStrategy()
        """,
        """
        import tensorflow as tf

        a = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
        b = tf.distribute.MirroredStrategy(devices=["/gpu:0"])
        c = tf.distribute.MirroredStrategy()
        """,
    ),
    "mirrored_strategy_keyword_by_hand": (
        """
        from tf_crossdevice import compat

        s = compat.MirroredStrategy(num_gpus=2, prefetch_on_device=True)
        """,
        """
        from tf_crossdevice import compat

        s = compat.MirroredStrategy(num_gpus=2, prefetch_on_device=True)
        """,
    ),
    # contrib's between-graph strategy: the package's strategy with TF 1's
    # collective, on TF 1's devices (0 GPUs, the default: the CPU).
    "collective_strategy_tf_contrib_path": (
        """
        import tensorflow as tf

        strategy = tf.contrib.distribute.CollectiveAllReduceStrategy(
            num_gpus_per_worker=2
        )
        """,
        """
        import tensorflow as tf
        import tf_crossdevice

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
            local_devices=["/gpu:0", "/gpu:1"]
        )
        """,
    ),
    "collective_strategy_imported_name": (
        """
        from tensorflow.contrib.distribute import CollectiveAllReduceStrategy

        strategy = CollectiveAllReduceStrategy()
        """,
        """
        import tf_crossdevice

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(cross_device_ops=tf_crossdevice.CollectiveAllReduce(), local_devices=["/cpu:0"])
        """,  # noqa: E501 (the rewrite keeps the call on its line)
    ),
    "collective_strategy_module_imported_as": (
        """
        from tensorflow.contrib import distribute as tcd

        strategy = tcd.CollectiveAllReduceStrategy(
            num_gpus_per_worker=4,  # every GPU of a DGX-1 half
        )
        """,
        """
        import tf_crossdevice

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
            local_devices=["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"],  # every GPU of a DGX-1 half
        )
        """,  # noqa: E501 (the comment stays on its argument's line)
    ),
    "collective_strategy_module_path": (
        """
        from tensorflow.contrib.distribute.python import (
            collective_all_reduce_strategy as cars,
        )

        strategy = cars.CollectiveAllReduceStrategy(num_gpus_per_worker=0)
        """,
        """
        import tf_crossdevice

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(cross_device_ops=tf_crossdevice.CollectiveAllReduce(), local_devices=["/cpu:0"])
        """,  # noqa: E501 (the rewrite keeps the call on its line)
    ),
    "collective_strategy_positional": (
        """
        import tensorflow as tf

        strategy = tf.contrib.distribute.CollectiveAllReduceStrategy(
            2, tf.distribute.experimental.CollectiveCommunication.NCCL
        )
        """,
        """
        import tensorflow as tf
        import tf_crossdevice

        strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
            local_devices=["/gpu:0", "/gpu:1"], communication_options=tf.distribute.experimental.CommunicationOptions(implementation=tf.distribute.experimental.CollectiveCommunication.NCCL)
        )
        """,  # noqa: E501 (the arguments stay on their line)
    ),
    "collective_strategy_keywords": (
        """
        import tensorflow as tf

        ring = tf.distribute.experimental.CollectiveCommunication.RING
        a = tf.contrib.distribute.CollectiveAllReduceStrategy(
            communication=ring,
            num_gpus_per_worker=gpus,
        )
        b = tf.contrib.distribute.CollectiveAllReduceStrategy(
            communication=ring
        )
        """,
        """
        import tensorflow as tf
        import tf_crossdevice

        ring = tf.distribute.experimental.CollectiveCommunication.RING
        a = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring),
            local_devices=[f"/gpu:{i}" for i in range(gpus)] or ["/cpu:0"],
        )
        b = tf_crossdevice.MultiWorkerMirroredStrategy(
            cross_device_ops=tf_crossdevice.CollectiveAllReduce(),
            local_devices=["/cpu:0"],
            communication_options=tf.distribute.experimental.CommunicationOptions(implementation=ring)
        )
        """,  # noqa: E501 (the arguments stay on their lines)
    ),
    "collective_strategy_reference": (
        """
        import tensorflow as tf

        if isinstance(s, tf.contrib.distribute.CollectiveAllReduceStrategy):
            workers = s.extended._num_workers
        """,
        """
        import tensorflow as tf
        import tf_crossdevice

        if isinstance(s, tf_crossdevice.MultiWorkerMirroredStrategy):
            workers = s.extended._num_workers
        """,
    ),
    # TensorFlow 2's own strategies, TF 2's private module included.
    "tensorflow_2_strategies_stay": (
        """
        import tensorflow as tf
        from tensorflow.python.distribute import collective_all_reduce_strategy

        nccl = tf.distribute.experimental.CollectiveCommunication.NCCL
        a = tf.distribute.MultiWorkerMirroredStrategy()
        b = tf.distribute.experimental.MultiWorkerMirroredStrategy(nccl)
        c = tf.distribute.experimental.MultiWorkerMirroredStrategy(
            communication=nccl
        )
        d = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()
        e = tf.distribute.MirroredStrategy(["/gpu:0", "/gpu:1"])
        f = collective_all_reduce_strategy.CollectiveAllReduceStrategy()
        """,
        """
        import tensorflow as tf
        from tensorflow.python.distribute import collective_all_reduce_strategy

        nccl = tf.distribute.experimental.CollectiveCommunication.NCCL
        a = tf.distribute.MultiWorkerMirroredStrategy()
        b = tf.distribute.experimental.MultiWorkerMirroredStrategy(nccl)
        c = tf.distribute.experimental.MultiWorkerMirroredStrategy(
            communication=nccl
        )
        d = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()
        e = tf.distribute.MirroredStrategy(["/gpu:0", "/gpu:1"])
        f = collective_all_reduce_strategy.CollectiveAllReduceStrategy()
        """,
    ),
    # Keywords and reduce ops of the CrossDeviceOps methods.
    "method_keywords": (
        """
        import tensorflow as tf

        ops.reduce(aggregation=op, per_device_value=v, destinations=d)
        ops.batch_reduce(method_string=op, value_destination_pairs=pairs)
        ops.reduce(op, v, d, experimental_hints=hints)
        ops.broadcast(t, d, experimental_hints=hints)
        strategy.extended.reduce_to(op, v, d, experimental_hints=hints)
        strategy.extended.batch_reduce_to(op, pairs, experimental_hints=hints)
        """,
        """
        import tensorflow as tf

        ops.reduce(reduce_op=op, per_replica_value=v, destinations=d)
        ops.batch_reduce(reduce_op=op, value_destination_pairs=pairs)
        ops.reduce(op, v, d, options=hints)
        ops.broadcast(t, d, options=hints)
        strategy.extended.reduce_to(op, v, d, options=hints)
        strategy.extended.batch_reduce_to(op, pairs, options=hints)
        """,
    ),
    "aggregation_constants": (
        """
        import tensorflow as tf
        from tensorflow import VariableAggregation

        ops.reduce(tf.VariableAggregation.SUM, v, d)
        ops.batch_reduce(aggregation=tf.compat.v1.VariableAggregation.MEAN)
        strategy.extended.reduce_to(VariableAggregation.SUM, v, d)
        strategy.extended.batch_reduce_to(
            reduce_op="Mean", value_destination_pairs=p
        )
        ops.reduce("sum", v, d)
        """,
        """
        import tensorflow as tf
        from tensorflow import VariableAggregation

        ops.reduce(tf.distribute.ReduceOp.SUM, v, d)
        ops.batch_reduce(reduce_op=tf.distribute.ReduceOp.MEAN)
        strategy.extended.reduce_to(tf.distribute.ReduceOp.SUM, v, d)
        strategy.extended.batch_reduce_to(
            reduce_op="Mean", value_destination_pairs=p
        )
        ops.reduce("sum", v, d)
        """,
    ),
    "variable_aggregation_elsewhere_stays": (
        """
        import tensorflow as tf

        w = tf.Variable(0.0, aggregation=tf.VariableAggregation.MEAN)
        ops.broadcast(tf.VariableAggregation.SUM, d)
        ops.reduce(tf.VariableAggregation.ONLY_FIRST_REPLICA, v, d)
        functools.reduce(add, values, "sum")
        """,
        """
        import tensorflow as tf

        w = tf.Variable(0.0, aggregation=tf.VariableAggregation.MEAN)
        ops.broadcast(tf.VariableAggregation.SUM, d)
        ops.reduce(tf.VariableAggregation.ONLY_FIRST_REPLICA, v, d)
        functools.reduce(add, values, "sum")
        """,
    ),
    # Names the command leaves to a person.
    "not_renamed_compat_stays": (
        """
        from tf_crossdevice import compat

        value = compat.PerDevice({"/cpu:0": x})
        """,
        """
        from tf_crossdevice import compat

        value = compat.PerDevice({"/cpu:0": x})
        """,
    ),
    "not_renamed_contrib_becomes_compat": (
        """
        from tensorflow.contrib.distribute.python import cross_tower_ops

        cross_tower_ops.check_destinations(d)
        """,
        """
        import tf_crossdevice.compat

        tf_crossdevice.compat.check_destinations(d)
        """,
    ),
    "other_contrib_stays": (
        """
        import tensorflow as tf

        layer = tf.contrib.layers.fully_connected(x, 3)
        """,
        """
        import tensorflow as tf

        layer = tf.contrib.layers.fully_connected(x, 3)
        """,
    ),
    # Imports.
    "tensorflow_under_another_alias": (
        """
        import tensorflow as tfx

        op = tfx.compat.v1.distribute.ReduceOp.SUM
        """,
        """
        import tensorflow as tfx
        import tensorflow as tf

        op = tf.distribute.ReduceOp.SUM
        """,
    ),
    "tf_is_compat_v1": (
        """
        import tensorflow.compat.v1 as tf
        from tf_crossdevice import compat

        ops = compat.ReductionToOneDeviceCrossTowerOps()
        total = ops.reduce(tf.VariableAggregation.SUM, v, d)
        same = tf.distribute.ReduceOp.SUM
        """,
        """
        import tensorflow.compat.v1 as tf
        import tensorflow
        import tf_crossdevice

        ops = tf_crossdevice.ReductionToOneDevice()
        total = ops.reduce(tensorflow.distribute.ReduceOp.SUM, v, d)
        same = tf.distribute.ReduceOp.SUM
        """,
    ),
    "snippet_without_imports": (
        '''
        """A snippet."""

        ops = tf.contrib.distribute.CrossTowerOps
        ''',
        '''
        """A snippet."""
        import tensorflow as tf

        ops = tf.distribute.CrossDeviceOps
        ''',
    ),
    "imports_kept_in_use_and_comments_moved": (
        """
        import os  # stays
        # contrib's cross-device classes.
        from tf_crossdevice.compat import AllReduceCrossTowerOps, PerDevice
        from tensorflow.contrib import distribute
        # The rest.
        import numpy as np

        ops = AllReduceCrossTowerOps()  # the default, NCCL
        value = PerDevice({})
        """,
        """
        import os  # stays
        # contrib's cross-device classes.
        from tf_crossdevice.compat import PerDevice
        # The rest.
        import numpy as np
        import tf_crossdevice

        ops = tf_crossdevice.AllReduceCrossDeviceOps()  # the default, NCCL
        value = PerDevice({})
        """,
    ),
    "import_in_a_function": (
        """
        import tensorflow as tf


        def make_ops():
            # Lazily.
            from tensorflow.contrib import distribute as D

            return D.AllReduceCrossTowerOps(
                "xring",  # a ring
                num_packs=2,
            )
        """,
        """
        import tensorflow as tf
        import tf_crossdevice


        def make_ops():
            # Lazily.

            return tf_crossdevice.AllReduceCrossDeviceOps(
                "xring",  # a ring
                num_packs=2,
            )
        """,
    ),
    "tensorflow_imported_where_it_is_used": (
        """
        def total(ops, value):
            import tensorflow as tf

            return ops.reduce(tf.VariableAggregation.SUM, value, None)
        """,
        """
        def total(ops, value):
            import tensorflow as tf

            return ops.reduce(tf.distribute.ReduceOp.SUM, value, None)
        """,
    ),
    # TensorFlow 2 takes the strings too: they are not legacy.
    "reduce_op_strings_stay": (
        """
        def total(self, value):
            tf = self.tf
            return self.ops.reduce("sum", value, None)
        """,
        """
        def total(self, value):
            tf = self.tf
            return self.ops.reduce("sum", value, None)
        """,
    ),
    "nothing_legacy": (
        """
        import tensorflow as tf

        total = strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
        """,
        """
        import tensorflow as tf

        total = strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None)
        """,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewrite(name):
    source, expected = CASES[name]
    assert rewritten(source) == code(expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_rewriting_the_result_changes_nothing(name):
    _, expected = CASES[name]
    again = upgrade.upgrade_code(code(expected))
    assert again.code == code(expected)
    assert again.count(_report.Kind.CHANGED) == 0


def test_report_lines_name_each_change_and_what_was_left():
    source = """
        import tensorflow as tf
        from tensorflow.contrib import distribute

        strategy = distribute.MirroredStrategy(
            num_gpus=2,
            cross_tower_ops=distribute.AllReduceCrossTowerOps("nccl"),
        )
        best = distribute.choose_the_best(devices, session_config=config)
        spec = distribute.AllReduceSpecTuple("pscpu", 1, -1)
        value = distribute.PerDevice({})
        total = ops.reduce(tf.VariableAggregation.NONE, per_device_value=value)
        tf.contrib.layers.fully_connected(x, 3)
        """
    assert report(source, "train.py") == [
        "train.py:2: changed from tensorflow.contrib import distribute -> "
        "(removed, no uses left)",
        "train.py:2: changed (no import) -> import tf_crossdevice.compat",
        "train.py:4: changed distribute.MirroredStrategy -> "
        "tf.distribute.MirroredStrategy",
        'train.py:5: changed num_gpus=2 -> devices=["/gpu:0", "/gpu:1"]',
        "train.py:6: changed cross_tower_ops= -> cross_device_ops=",
        "train.py:6: changed distribute.AllReduceCrossTowerOps -> "
        "tf_crossdevice.AllReduceCrossDeviceOps",
        "train.py:8: changed distribute.choose_the_best -> "
        "tf_crossdevice.select_cross_device_ops",
        "train.py:8: not converted: session_config=config (session_config "
        "is ignored: TensorFlow 2 reads device links without a Session)",
        'train.py:9: changed distribute.AllReduceSpecTuple("pscpu", 1, -1) '
        '-> ("pscpu", 1, -1)',
        "train.py:10: changed distribute.PerDevice -> "
        "tf_crossdevice.compat.PerDevice",
        "train.py:10: not converted: tf_crossdevice.compat.PerDevice "
        "(tf.distribute values: strategy.run results, or "
        "strategy.experimental_distribute_values_from_function)",
        "train.py:11: not converted: tf.VariableAggregation.NONE "
        "(VariableAggregation.NONE says the values must not be combined, so "
        "there is nothing to reduce)",
        "train.py:11: changed per_device_value= -> per_replica_value=",
        "train.py:12: not converted: tf.contrib.layers.fully_connected (not a "
        "cross-device name; see tf_upgrade_v2)",
    ]


def test_strategy_keywords_without_a_counterpart_are_reported():
    source = """
        from tf_crossdevice import compat

        s = compat.MirroredStrategy(num_gpus=2, num_gpus_per_worker=2,
                                    auto_shard_dataset=True)
        """
    lines = report(source)
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "m.py:3: not converted: compat.MirroredStrategy(num_gpus=2, "
    )
    assert "num_gpus_per_worker=: TF 1 replicated in-graph" in lines[0]
    assert "auto_shard_dataset=: set tf.data.Options()" in lines[0]


LOCAL_DEVICES_WHY = (
    "local_devices= is how the strategy takes a worker's devices; TF 1's 0 "
    "meant the CPU, where the strategy's default, like its collective's "
    "num_gpus_per_worker=0, is every GPU"
)


def test_collective_strategy_report_says_why_devices_become_a_list():
    source = """
        import tensorflow as tf
        from tensorflow.contrib.distribute import CollectiveAllReduceStrategy

        a = CollectiveAllReduceStrategy()
        b = tf.contrib.distribute.CollectiveAllReduceStrategy(
            2, communication=tf.distribute.experimental.CollectiveCommunication.RING
        )
        """  # noqa: E501 (TF 1's spelling, on one line)
    assert report(source, "train.py") == [
        "train.py:2: changed from tensorflow.contrib.distribute import "
        "CollectiveAllReduceStrategy -> (removed, no uses left)",
        "train.py:2: changed (no import) -> import tf_crossdevice",
        "train.py:4: changed CollectiveAllReduceStrategy -> "
        "tf_crossdevice.MultiWorkerMirroredStrategy",
        "train.py:4: changed (no argument) -> "
        "cross_device_ops=tf_crossdevice.CollectiveAllReduce() "
        "(the collective TF 1's strategy always used)",
        "train.py:4: changed (default num_gpus_per_worker=0) -> "
        f'local_devices=["/cpu:0"] ({LOCAL_DEVICES_WHY})',
        "train.py:5: changed tf.contrib.distribute.CollectiveAllReduceStrategy "
        "-> tf_crossdevice.MultiWorkerMirroredStrategy",
        "train.py:5: changed (no argument) -> "
        "cross_device_ops=tf_crossdevice.CollectiveAllReduce() "
        "(the collective TF 1's strategy always used)",
        "train.py:6: changed num_gpus_per_worker=2 -> "
        f'local_devices=["/gpu:0", "/gpu:1"] ({LOCAL_DEVICES_WHY})',
        "train.py:6: changed "
        "communication=tf.distribute.experimental.CollectiveCommunication.RING "
        "-> communication_options=tf.distribute.experimental."
        "CommunicationOptions(impleme...",
    ]


def test_a_collective_strategy_name_used_other_than_called_is_reported():
    # Called through another name, the strategy would get TF 1's arguments;
    # a class check is exact.
    source = """
        import tensorflow as tf

        make = tf.contrib.distribute.CollectiveAllReduceStrategy
        same = issubclass(k, tf.contrib.distribute.CollectiveAllReduceStrategy)
        """
    assert rewritten(source) == code(
        """
        import tensorflow as tf
        import tf_crossdevice

        make = tf_crossdevice.MultiWorkerMirroredStrategy
        same = issubclass(k, tf_crossdevice.MultiWorkerMirroredStrategy)
        """
    )
    lines = report(source)
    assert lines[1:] == [
        "m.py:3: changed tf.contrib.distribute.CollectiveAllReduceStrategy "
        "-> tf_crossdevice.MultiWorkerMirroredStrategy",
        "m.py:3: not converted: tf_crossdevice.MultiWorkerMirroredStrategy "
        "(a call through it takes tf_crossdevice.CollectiveAllReduce() as "
        "cross_device_ops=, the devices as local_devices= where TF 1 took "
        "num_gpus_per_worker= (0, its default, meant the CPU; this "
        "strategy's default is every GPU), and "
        "tf.distribute.experimental.CommunicationOptions(implementation=...) "
        "as communication_options= where TF 1 took communication=)",
        "m.py:4: changed tf.contrib.distribute.CollectiveAllReduceStrategy "
        "-> tf_crossdevice.MultiWorkerMirroredStrategy",
    ]


COLLECTIVE_STRATEGY_PARAMETERS = "TF 1 took num_gpus_per_worker, communication"


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (
            "S(num_gpus_per_worker=2, cross_tower_ops=ops)",
            "unknown keyword cross_tower_ops= of CollectiveAllReduceStrategy; "
            f"{COLLECTIVE_STRATEGY_PARAMETERS}",
        ),
        (
            "S(cross_device_ops=ops)",
            "unknown keyword cross_device_ops= of CollectiveAllReduceStrategy; "
            f"{COLLECTIVE_STRATEGY_PARAMETERS}",
        ),
        (
            "S(2, num_gpus_per_worker=2)",
            "num_gpus_per_worker= given twice; "
            f"{COLLECTIVE_STRATEGY_PARAMETERS}",
        ),
        (
            "S(2, ring, ops)",
            "3 positional arguments to CollectiveAllReduceStrategy; "
            f"{COLLECTIVE_STRATEGY_PARAMETERS}",
        ),
        (
            "S(**options)",
            "starred arguments: the command cannot tell which hold "
            "num_gpus_per_worker and communication",
        ),
    ],
    ids=["cross_tower_ops", "cross_device_ops", "twice", "too_many", "star"],
)
def test_collective_strategy_calls_tf1_could_not_run_stay_as_they_were(
    call, why
):
    source = (
        "from tensorflow.contrib.distribute import "
        f"CollectiveAllReduceStrategy as S\n\nstrategy = {call}\n"
    )
    assert rewritten(source) == source
    assert report(source) == [f"m.py:3: not converted: {call} ({why})"]


def test_tensorflow_2_strategies_are_not_reported():
    source, _ = CASES["tensorflow_2_strategies_stay"]
    assert report(source) == []


# Code from the field: what the command converts, and what it leaves
# exactly as it was.
FIELD = code(
    """
    import tensorflow as tf
    from tensorflow.contrib.distribute.python import cross_tower_ops as cross_tower_ops_lib

    ops = cross_tower_ops_lib.AllReduceCrossTowerOps('nccl', 16, 0, 0)
    fork = cross_tower_ops_lib.AllReduceCrossTowerOps('xring', num_packs=2, my_fork_option=True)
    strategy = tf.contrib.distribute.MirroredStrategy(num_gpus=2, cross_tower_ops=ops)
    config = tf.estimator.RunConfig(train_distribute=strategy)
    mw = tf.contrib.distribute.MirroredStrategy(
        num_gpus_per_worker=2,
        cross_device_ops=tf.contrib.distribute.MultiWorkerAllReduce(["/job:worker/task:0"], 2))
    """  # noqa: E501 (the field's lines, as they were)
)
ALL_REDUCE_PARAMETERS = (
    "TF 1 took all_reduce_alg, num_packs, agg_small_grads_max_bytes, "
    "agg_small_grads_max_group"
)
NO_ESTIMATOR = (
    "tf.estimator was removed in TensorFlow 2.16; train with Keras "
    "model.fit or a custom loop under the strategy"
)


def test_field_code_report():
    result = upgrade.upgrade_code(FIELD)
    assert [f.report_line("train.py") for f in result.findings] == [
        "train.py:2: changed (no import) -> import tf_crossdevice",
        "train.py:4: changed cross_tower_ops_lib.AllReduceCrossTowerOps -> "
        "tf_crossdevice.AllReduceCrossDeviceOps",
        "train.py:5: not converted: cross_tower_ops_lib."
        "AllReduceCrossTowerOps('xring', num_packs=2, my_fork_opti... "
        "(unknown keyword my_fork_option= of AllReduceCrossTowerOps; "
        f"{ALL_REDUCE_PARAMETERS})",
        "train.py:6: changed tf.contrib.distribute.MirroredStrategy -> "
        "tf.distribute.MirroredStrategy",
        'train.py:6: changed num_gpus=2 -> devices=["/gpu:0", "/gpu:1"]',
        "train.py:6: changed cross_tower_ops= -> cross_device_ops=",
        "train.py:7: not converted: tf.estimator.RunConfig("
        f"train_distribute=strategy) ({NO_ESTIMATOR})",
        "train.py:8: not converted: tf.contrib.distribute.MirroredStrategy("
        "num_gpus_per_worker=2, cross_device_op... (num_gpus_per_worker=: "
        "TF 1 replicated in-graph over every worker's GPUs once given a "
        "cluster, which TF 2.21's MirroredStrategy refuses; run "
        "tf_crossdevice.MultiWorkerMirroredStrategy (or "
        "tf.distribute.MultiWorkerMirroredStrategy) on each worker, or pass "
        "num_gpus= on one machine)",
    ]


def test_field_code_unconverted_calls_stay_byte_for_byte():
    old = FIELD.splitlines(keepends=True)
    new = upgrade.upgrade_code(FIELD).code.splitlines(keepends=True)
    # One import added after line 2; the legacy import stays: the fork's
    # call and the multi-worker strategy still use it.
    assert new[:2] == old[:2]
    assert new[2] == "import tf_crossdevice\n"
    assert (
        new[3:]
        == [
            old[2],
            "ops = tf_crossdevice.AllReduceCrossDeviceOps('nccl', 16, 0, 0)\n",
            old[4],  # The fork's keyword.
            "strategy = tf.distribute.MirroredStrategy("
            'devices=["/gpu:0", "/gpu:1"], cross_device_ops=ops)\n',
            *old[6:],  # tf.estimator; the multi-worker strategy, arguments too.
        ]
    )


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (
            'compat.AllReduceCrossTowerOps("xring", fork=1)',
            f"unknown keyword fork= of AllReduceCrossTowerOps; "
            f"{ALL_REDUCE_PARAMETERS}",
        ),
        (
            "ctl.AllReduceCrossTowerOps(*args, fork=1)",
            f"unknown keyword fork= of AllReduceCrossTowerOps; "
            f"{ALL_REDUCE_PARAMETERS}",
        ),
        (
            'ctl.AllReduceCrossTowerOps("xring", all_reduce_alg="nccl")',
            f"all_reduce_alg= given twice; {ALL_REDUCE_PARAMETERS}",
        ),
        (
            "ctl.MultiWorkerAllReduce(workers, 2, spec, 0, 0, 10, 3)",
            "7 positional arguments to MultiWorkerAllReduce; TF 1 took "
            "worker_devices, num_gpus_per_worker, all_reduce_spec, num_packs, "
            "agg_small_grads_max_bytes, agg_small_grads_max_group",
        ),
        (
            "ctl.CrossTowerOps(x)",
            "1 positional arguments to CrossTowerOps; TF 1 took no arguments",
        ),
    ],
    ids=["compat_keyword", "after_star", "twice", "too_many", "base_class"],
)
def test_constructor_calls_tf1_could_not_run_stay_as_they_were(call, why):
    if call.startswith("compat."):
        imports = "from tf_crossdevice import compat"
    else:
        imports = "from tensorflow.contrib.distribute.python import " + (
            "cross_tower_ops as ctl"
        )
    source = f"{imports}\n\nops = {call}\n"
    assert rewritten(source) == source
    assert report(source) == [f"m.py:3: not converted: {call} ({why})"]


def test_constructor_calls_with_star_arguments_are_renamed():
    source = """
        from tensorflow.contrib.distribute.python import cross_tower_ops as ctl

        ops = ctl.AllReduceCrossTowerOps(*args, **kwargs)
        """
    assert rewritten(source) == code(
        """
        import tf_crossdevice

        ops = tf_crossdevice.AllReduceCrossDeviceOps(*args, **kwargs)
        """
    )


def test_estimator_uses_are_reported_once_per_outermost_call():
    source = """
        import tensorflow as tf
        from tensorflow import estimator as est

        est.Estimator(fn, config=est.RunConfig(
            train_distribute=tf.contrib.distribute.MirroredStrategy(num_gpus=0)))
        base = tf.compat.v1.estimator.Estimator
        """
    assert report(source) == [
        "m.py:4: not converted: est.Estimator(fn, config=est.RunConfig("
        "train_distribute=tf.contrib.distribute... "
        f"({NO_ESTIMATOR})",
        "m.py:5: changed tf.contrib.distribute.MirroredStrategy -> "
        "tf.distribute.MirroredStrategy",
        'm.py:5: changed num_gpus=0 -> devices=["/cpu:0"]',
        f"m.py:6: not converted: tf.compat.v1.estimator.Estimator "
        f"({NO_ESTIMATOR})",
    ]


def test_reported_not_reductions_and_renamed_keyword_clash():
    source = """
        import tensorflow as tf

        ops.reduce(tf.compat.v1.VariableAggregation.ONLY_FIRST_TOWER, v, d)
        ops.reduce(aggregation=a, reduce_op=b, per_replica_value=v)
        """
    assert report(source) == [
        "m.py:3: not converted: tf.compat.v1.VariableAggregation."
        "ONLY_FIRST_TOWER (no ReduceOp takes the first replica's value; "
        "broadcast it instead: ops.broadcast(value.values[0], destinations))",
        "m.py:4: not converted: aggregation= (reduce_op= is passed too)",
    ]


def test_not_renamed_compat_names_are_reported_and_kept():
    source = """
        from tf_crossdevice.compat import ConcatAndSplitPacker

        packer = ConcatAndSplitPacker(2)
        """
    assert report(source) == [
        "m.py:3: not converted: ConcatAndSplitPacker (the num_packs argument "
        "of tf_crossdevice.AllReduceCrossDeviceOps)"
    ]


def test_a_star_import_of_a_legacy_module_is_reported():
    source = """
        from tensorflow.contrib.distribute import *

        ops = AllReduceCrossTowerOps()
        """
    assert rewritten(source) == code(source)
    assert report(source) == [
        "m.py:1: not converted: from tensorflow.contrib.distribute import * "
        "(import the names it uses by name, then upgrade again)"
    ]


def test_an_unparsable_module_raises_with_its_line():
    with pytest.raises(_report.ParseError) as raised:
        upgrade.upgrade_code("x = 1\ndef f(:\n    pass\n")
    assert raised.value.line == 2
    assert "invalid syntax" in raised.value.message


# The command line, in-process.

LEGACY = code(
    """
    import tensorflow as tf
    from tf_crossdevice import compat as distribute

    # Four replicas on this machine's CPU.
    ops = distribute.AllReduceCrossTowerOps(
        "hierarchical_copy",  # TF 1's default
        num_packs=2,
    )
    total = ops.reduce(tf.VariableAggregation.SUM, per_device_value=value)
    """
)
UPGRADED = code(
    """
    import tensorflow as tf
    import tf_crossdevice

    # Four replicas on this machine's CPU.
    ops = tf_crossdevice.AllReduceCrossDeviceOps(
        "hierarchical_copy",  # TF 1's default
        num_packs=2,
    )
    total = ops.reduce(tf.distribute.ReduceOp.SUM, per_replica_value=value)
    """
)


def run(argv, capsys):
    status = upgrade.main([str(arg) for arg in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_prints_diff_and_report_and_writes_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(LEGACY)
    status, out, _ = run([path], capsys)
    assert status == 0
    assert path.read_text() == LEGACY
    assert out == (
        f"--- a/{path}\n"
        f"+++ b/{path}\n"
        "@@ -1,9 +1,9 @@\n"
        " import tensorflow as tf\n"
        "-from tf_crossdevice import compat as distribute\n"
        "+import tf_crossdevice\n"
        " \n"
        " # Four replicas on this machine's CPU.\n"
        "-ops = distribute.AllReduceCrossTowerOps(\n"
        "+ops = tf_crossdevice.AllReduceCrossDeviceOps(\n"
        '     "hierarchical_copy",  # TF 1\'s default\n'
        "     num_packs=2,\n"
        " )\n"
        "-total = ops.reduce(tf.VariableAggregation.SUM, "
        "per_device_value=value)\n"
        "+total = ops.reduce(tf.distribute.ReduceOp.SUM, "
        "per_replica_value=value)\n"
        f"{path}:2: changed from tf_crossdevice import compat as distribute "
        "-> (removed, no uses left)\n"
        f"{path}:2: changed (no import) -> import tf_crossdevice\n"
        f"{path}:5: changed distribute.AllReduceCrossTowerOps -> "
        "tf_crossdevice.AllReduceCrossDeviceOps\n"
        f"{path}:9: changed tf.VariableAggregation.SUM -> "
        "tf.distribute.ReduceOp.SUM\n"
        f"{path}:9: changed per_device_value= -> per_replica_value=\n"
        "1 files scanned, 1 files changed, 5 changes, 0 not converted, "
        "0 unparsable\n"
    )


def test_in_place_writes_and_a_second_run_changes_nothing(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(LEGACY)
    status, _, _ = run([path, "--in_place"], capsys)
    assert status == 0
    assert path.read_text() == UPGRADED
    status, out, _ = run([path, "--in_place"], capsys)
    assert status == 0
    assert out == (
        "1 files scanned, 0 files changed, 0 changes, 0 not converted, "
        "0 unparsable\n"
    )
    assert path.read_text() == UPGRADED


def test_in_place_keeps_the_encoding_and_line_endings(tmp_path, capsys):
    path = tmp_path / "latin.py"
    source = (
        "# -*- coding: latin-1 -*-\r\n"
        "from tf_crossdevice import compat\r\n"
        'name = "caf\xe9"\r\n'
        "ops = compat.ReductionToOneDeviceCrossTowerOps()\r\n"
    )
    path.write_bytes(source.encode("latin-1"))
    status, _, _ = run(["--in_place", path], capsys)
    assert status == 0
    assert path.read_bytes() == (
        "# -*- coding: latin-1 -*-\r\n"
        "import tf_crossdevice\r\n"
        'name = "caf\xe9"\r\n'
        "ops = tf_crossdevice.ReductionToOneDevice()\r\n"
    ).encode("latin-1")


def test_unparsable_files_are_reported_and_the_run_goes_on(tmp_path, capsys):
    (tmp_path / "a_syntax.py").write_text("x = 1\ndef f(:\n    pass\n")
    (tmp_path / "b_encoding.py").write_bytes(b'x = 1\ny = "\xff"\n')
    (tmp_path / "c_good.py").write_text(LEGACY)
    status, out, _ = run([tmp_path, "--in_place"], capsys)
    assert status == 1
    assert (tmp_path / "c_good.py").read_text() == UPGRADED
    lines = out.splitlines()
    assert f"{tmp_path}/a_syntax.py:2: cannot parse: invalid syntax" in lines
    assert any(
        line.startswith(f"{tmp_path}/b_encoding.py:2: cannot parse: not utf-8")
        for line in lines
    ), lines
    assert lines[-1] == (
        "3 files scanned, 1 files changed, 5 changes, 0 not converted, "
        "2 unparsable"
    )


def test_folders_are_walked_sorted_and_tool_folders_skipped(tmp_path, capsys):
    for name in [
        "b.py",
        "a/z.py",
        "a/y.txt",
        ".venv/lib/x.py",
        ".git/x.py",
        "__pycache__/x.py",
        "bazel-out/x.py",
        "a/bazel-bin/x.py",
    ]:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(LEGACY)
    status, out, _ = run([tmp_path], capsys)
    assert status == 0
    assert [line for line in out.splitlines() if line.startswith("+++")] == [
        f"+++ b/{tmp_path}/a/z.py",
        f"+++ b/{tmp_path}/b.py",
    ]
    assert out.splitlines()[-1].startswith("2 files scanned, 2 files changed")


def test_a_missing_path_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "a.py").write_text(LEGACY)
    missing = tmp_path / "missing.py"
    status, out, err = run([tmp_path / "a.py", missing, "--in_place"], capsys)
    assert status == 2
    assert f"{missing}: no such file or directory" in err
    assert out == ""
    assert (tmp_path / "a.py").read_text() == LEGACY


def test_no_path_is_a_usage_error(capsys):
    status, _, err = run([], capsys)
    assert status == 2
    assert "PATH" in err


def test_without_libcst_the_command_says_how_to_install_it(
    tmp_path, capsys, monkeypatch
):
    (tmp_path / "a.py").write_text(LEGACY)
    monkeypatch.setitem(sys.modules, "libcst", None)  # import libcst fails.
    status, out, err = run([tmp_path / "a.py"], capsys)
    assert status == 2
    assert out == ""
    assert err == (
        "python -m tf_crossdevice.compat.upgrade needs libcst: "
        "pip install libcst (from a checkout of tf_crossdevice: "
        "pip install -e '.[upgrade]')\n"
    )


def test_the_rewriting_modules_import_no_tensorflow():
    # Loaded as a package of their own: tf_crossdevice/__init__.py and
    # compat/__init__.py import TensorFlow, the command's modules must not.
    script = (
        "import sys, types\n"
        "package = types.ModuleType('upgrade_only')\n"
        f"package.__path__ = [{str(COMPAT)!r}]\n"
        "sys.modules['upgrade_only'] = package\n"
        "from upgrade_only import _names, _rewrite, upgrade\n"
        "result = upgrade.upgrade_code("
        "'from tf_crossdevice import compat\\n"
        "compat.CrossTowerOps\\n')\n"
        "print(result.code.splitlines()[-1])\n"
        "print(sorted(m for m in sys.modules if m.startswith('tensorflow')))\n"
    )
    with processes.Child([sys.executable, "-c", script]) as child:
        assert child.read_all(timeout=120) == [
            "tf.distribute.CrossDeviceOps",
            "[]",
        ]


@pytest.mark.parametrize(
    "module",
    [_calls, _report, _rewrite, _syntax, upgrade],
    ids=lambda m: m.__name__,
)
def test_docstring_examples(module):
    results = doctest.testmod(module)
    assert results.attempted > 0
    assert results.failed == 0
