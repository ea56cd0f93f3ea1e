"""The legacy names, what replaces each, and what changed on purpose.

One table serves the compat layer (where each name lives, and its
deprecation warning) and the migration command (what it rewrites, and what
it reports it cannot). Pure data: importing it starts no TensorFlow.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Legacy:
    """One legacy name of `tf_crossdevice.compat`.

    Attributes:
        name: the old name.
        replacement: what to write instead, as code (a dotted name), or a
            description when no single name replaces it.
        change: how the replacement behaves differently, on purpose ("" when
            it does not).
        rename: True when the migration command rewrites the name to
            `replacement` (plus the keyword and constant rewrites below);
            False when it leaves the name and reports it.
        home: what `tf_crossdevice.compat.<name>` gives, as `module.attribute`
            of the compat package (`_ops.collective_hints`); "" for a
            CONTRIB_ONLY name, which compat does not carry.
    """

    name: str
    replacement: str
    change: str = ""
    rename: bool = True
    home: str = dataclasses.field(kw_only=True)


_REDUCE_CHANGE = (
    "reduce and batch_reduce take a tf.distribute.ReduceOp as reduce_op "
    "(not a tf.VariableAggregation as aggregation) and the value as "
    "per_replica_value (not per_device_value); a single destination gives "
    "a tensor rather than a Mirrored value"
)

LEGACY: dict[str, Legacy] = {
    legacy.name: legacy
    for legacy in (
        # tf.contrib.distribute (TF 1.10-1.12, cross_tower_ops.py).
        Legacy(
            "CrossTowerOps",
            "tf.distribute.CrossDeviceOps",
            _REDUCE_CHANGE,
            home="_ops.CrossTowerOps",
        ),
        Legacy(
            "ReductionToOneDeviceCrossTowerOps",
            "tf_crossdevice.ReductionToOneDevice",
            _REDUCE_CHANGE,
            home="_ops.ReductionToOneDeviceCrossTowerOps",
        ),
        Legacy(
            "AllReduceCrossTowerOps",
            "tf_crossdevice.AllReduceCrossDeviceOps",
            _REDUCE_CHANGE,
            home="_ops.AllReduceCrossTowerOps",
        ),
        Legacy(
            "MultiWorkerAllReduce",
            "tf_crossdevice.MultiWorkerAllReduce",
            _REDUCE_CHANGE,
            home="_ops.MultiWorkerAllReduce",
        ),
        Legacy(
            "CollectiveAllReduce",
            "tf_crossdevice.CollectiveAllReduce",
            _REDUCE_CHANGE + "; between workers it runs under "
            "tf_crossdevice.MultiWorkerMirroredStrategy",
            home="_ops.CollectiveAllReduce",
        ),
        Legacy(
            "AllReduceSpecTuple",
            "a plain (alg, shards, limit) tuple",
            "all_reduce_spec takes plain tuples; the named tuple is gone",
            home="_ops.AllReduceSpecTuple",
        ),
        Legacy(
            "ConcatAndSplitPacker",
            "the num_packs argument of tf_crossdevice.AllReduceCrossDeviceOps",
            "the CrossDeviceOps classes pack for you; there is no public "
            "packer object",
            rename=False,
            home="_packers.ConcatAndSplitPacker",
        ),
        Legacy(
            "AggregateSmallTensorPacker",
            "the agg_small_grads_max_bytes and agg_small_grads_max_group "
            "arguments of tf_crossdevice.AllReduceCrossDeviceOps",
            "the CrossDeviceOps classes pack for you; there is no public "
            "packer object",
            rename=False,
            home="_packers.AggregateSmallTensorPacker",
        ),
        Legacy(
            "choose_the_best",
            "tf_crossdevice.select_cross_device_ops",
            "session_config is ignored: TensorFlow 2 reads device links "
            "without a Session",
            home="_ops.choose_the_best",
        ),
        Legacy(
            "check_destinations",
            "nothing: tf.distribute.CrossDeviceOps methods check their "
            "destinations",
            rename=False,
            home="_values.check_destinations",
        ),
        Legacy(
            "validate_destinations",
            "nothing: tf.distribute.CrossDeviceOps methods check their "
            "destinations",
            rename=False,
            home="_values.validate_destinations",
        ),
        Legacy(
            "get_devices_from",
            "the .devices of a distributed value, or the device strings "
            "themselves",
            rename=False,
            home="_values.get_devices_from",
        ),
        Legacy(
            "PerDevice",
            "tf.distribute values: strategy.run results, or "
            "strategy.experimental_distribute_values_from_function",
            "TensorFlow 2's PerReplica is built by a strategy, not from a "
            "{device: value} dict",
            rename=False,
            home="_values.per_device",
        ),
        Legacy(
            "Mirrored",
            "tf.distribute values: the results of CrossDeviceOps.reduce "
            "and broadcast",
            "TensorFlow 2's Mirrored is built by a strategy, not from a "
            "{device: value} dict, and has no get(device) or devices: read "
            ".values",
            rename=False,
            home="_values.Mirrored",
        ),
        Legacy(
            "MirroredStrategy",
            "tf.distribute.MirroredStrategy",
            "devices= replaces num_gpus=, and cross_device_ops= replaces "
            "cross_tower_ops=",
            home="_ops.mirrored_strategy",
        ),
        # tf.compat.v1.distribute and TF 2.2-2.3's experimental names.
        Legacy(
            "CrossDeviceOps",
            "tf.distribute.CrossDeviceOps",
            "options= replaces TF 2.2's experimental_hints=",
            home="_ops.CrossDeviceOps",
        ),
        Legacy(
            "ReductionToOneDevice",
            "tf_crossdevice.ReductionToOneDevice",
            "options= replaces TF 2.2's experimental_hints=",
            home="_ops.ReductionToOneDevice",
        ),
        Legacy(
            "NcclAllReduce",
            "tf_crossdevice.NcclAllReduce",
            "options= replaces TF 2.2's experimental_hints=",
            home="_ops.NcclAllReduce",
        ),
        Legacy(
            "HierarchicalCopyAllReduce",
            "tf_crossdevice.HierarchicalCopyAllReduce",
            "options= replaces TF 2.2's experimental_hints=",
            home="_ops.HierarchicalCopyAllReduce",
        ),
        Legacy("ReduceOp", "tf.distribute.ReduceOp", home="_ops.ReduceOp"),
        Legacy(
            "CollectiveHints",
            "tf.distribute.experimental.CommunicationOptions",
            "it also takes implementation= (RING, NCCL or AUTO)",
            home="_ops.collective_hints",
        ),
    )
}

# Old keyword -> new keyword, in CrossDeviceOps methods and the strategy.
KEYWORDS: dict[str, str] = {
    "aggregation": "reduce_op",
    "method_string": "reduce_op",
    "per_device_value": "per_replica_value",
    "experimental_hints": "options",
    "cross_tower_ops": "cross_device_ops",
}

# tf.VariableAggregation member -> the ReduceOp that replaces it as a reduce
# op, or why none does.
AGGREGATIONS: dict[str, str] = {
    "SUM": "tf.distribute.ReduceOp.SUM",
    "MEAN": "tf.distribute.ReduceOp.MEAN",
}
NOT_REDUCTIONS: dict[str, str] = {
    "ONLY_FIRST_REPLICA": (
        "no ReduceOp takes the first replica's value; broadcast it instead: "
        "ops.broadcast(value.values[0], destinations)"
    ),
    "ONLY_FIRST_TOWER": (
        "no ReduceOp takes the first replica's value; broadcast it instead: "
        "ops.broadcast(value.values[0], destinations)"
    ),
    "NONE": (
        "VariableAggregation.NONE says the values must not be combined, so "
        "there is nothing to reduce"
    ),
}


def warning_text(name: str) -> str:
    """The deprecation message for legacy name `name`.

    >>> print(warning_text("CollectiveHints"))
    tf_crossdevice.compat.CollectiveHints is deprecated; use \
tf.distribute.experimental.CommunicationOptions instead (it also takes \
implementation= (RING, NCCL or AUTO)).
    """
    legacy = LEGACY[name]
    text = (
        f"tf_crossdevice.compat.{name} is deprecated; use "
        f"{legacy.replacement} instead"
    )
    if legacy.change:
        text += f" ({legacy.change})"
    return text + "."


# Where the migration command finds the legacy names.

# Modules whose attributes are LEGACY names: TF 1's contrib package and the
# contrib modules 2018 code imported from directly, and this compat layer.
LEGACY_MODULES: tuple[str, ...] = (
    "tensorflow.contrib.distribute",
    "tensorflow.contrib.distribute.python.cross_tower_ops",
    "tensorflow.contrib.distribute.python.mirrored_strategy",
    "tensorflow.contrib.distribute.python.values",
    "tf_crossdevice.compat",
)

# TensorFlow 2 names that are LEGACY names too (qualified name -> LEGACY
# key): TF 1's v1 aliases and TF 2.2-2.3's experimental hints.
TF_LEGACY_NAMES: dict[str, str] = {
    "tensorflow.compat.v1.distribute.CrossDeviceOps": "CrossDeviceOps",
    "tensorflow.compat.v1.distribute.ReduceOp": "ReduceOp",
    "tensorflow.distribute.experimental.CollectiveHints": "CollectiveHints",
}

# Names of tf.contrib.distribute that the migration command rewrites but
# tf_crossdevice.compat does not carry (qualified name -> Legacy, its `home`
# empty): code naming them runs only once upgraded. TF 1.12-1.15's
# between-graph CollectiveAllReduceStrategy(num_gpus_per_worker=0) (later
# versions added communication=) always reduced with CollectiveAllReduce, on
# num_gpus_per_worker GPUs, or the CPU for 0; this package's strategy takes
# that collective as cross_device_ops= and the devices as local_devices=.
_COLLECTIVE_STRATEGY = Legacy(
    "CollectiveAllReduceStrategy",
    "tf_crossdevice.MultiWorkerMirroredStrategy",
    "a call through it takes tf_crossdevice.CollectiveAllReduce() as "
    "cross_device_ops=, the devices as local_devices= where TF 1 took "
    "num_gpus_per_worker= (0, its default, meant the CPU; this strategy's "
    "default is every GPU), and "
    "tf.distribute.experimental.CommunicationOptions(implementation=...) as "
    "communication_options= where TF 1 took communication=",
    home="",
)
CONTRIB_ONLY: dict[str, Legacy] = {
    "tensorflow.contrib.distribute.CollectiveAllReduceStrategy": (
        _COLLECTIVE_STRATEGY
    ),
    "tensorflow.contrib.distribute.python.collective_all_reduce_strategy."
    "CollectiveAllReduceStrategy": _COLLECTIVE_STRATEGY,
}

# The enums whose members AGGREGATIONS and NOT_REDUCTIONS name.
VARIABLE_AGGREGATION_ENUMS: tuple[str, ...] = (
    "tensorflow.VariableAggregation",
    "tensorflow.compat.v1.VariableAggregation",
)

# Methods whose first argument is the reduce op (a VariableAggregation in
# TF 1), and the methods whose keywords KEYWORDS renames: those of
# CrossDeviceOps and the strategy's extended, plus TF 2.2's
# ReplicaContext.all_reduce, which took experimental_hints=.
REDUCE_METHODS: frozenset[str] = frozenset(
    {"reduce", "batch_reduce", "reduce_to", "batch_reduce_to"}
)
KEYWORD_METHODS: frozenset[str] = REDUCE_METHODS | {"broadcast", "all_reduce"}

# Keywords of contrib's MirroredStrategy that tf.distribute.MirroredStrategy
# has no counterpart for: the migration command leaves such a call as it is.
STRATEGY_KEYWORDS_BY_HAND: dict[str, str] = {
    "num_gpus_per_worker": (
        "TF 1 replicated in-graph over every worker's GPUs once given a "
        "cluster, which TF 2.21's MirroredStrategy refuses; run "
        "tf_crossdevice.MultiWorkerMirroredStrategy (or "
        "tf.distribute.MultiWorkerMirroredStrategy) on each worker, or pass "
        "num_gpus= on one machine"
    ),
    "prefetch_on_device": (
        "strategy.experimental_distribute_dataset prefetches to the devices"
    ),
    "auto_shard_dataset": (
        "set tf.data.Options().experimental_distribute.auto_shard_policy "
        "on the dataset instead"
    ),
}

# The constructor parameters, in order, of the legacy CrossDeviceOps classes
# the migration command renames (TF 1's cross_tower_ops and tf.compat.v1's):
# the replacements take the same ones. A call with any other argument is
# left as it is and reported (a fork's keyword would fail at run time).
CONSTRUCTOR_PARAMETERS: dict[str, tuple[str, ...]] = {
    "CrossTowerOps": (),
    "CrossDeviceOps": (),
    "ReductionToOneDeviceCrossTowerOps": (
        "reduce_to_device",
        "accumulation_fn",
    ),
    "ReductionToOneDevice": ("reduce_to_device", "accumulation_fn"),
    "AllReduceCrossTowerOps": (
        "all_reduce_alg",
        "num_packs",
        "agg_small_grads_max_bytes",
        "agg_small_grads_max_group",
    ),
    "MultiWorkerAllReduce": (
        "worker_devices",
        "num_gpus_per_worker",
        "all_reduce_spec",
        "num_packs",
        "agg_small_grads_max_bytes",
        "agg_small_grads_max_group",
    ),
    "CollectiveAllReduce": (
        "num_workers",
        "num_gpus_per_worker",
        "all_reduce_merge_scope",
        "collective_keys",
    ),
    "NcclAllReduce": ("num_packs",),
    "HierarchicalCopyAllReduce": ("num_packs",),
}

# Modules TensorFlow 2.21 no longer has, with what to do instead: the
# migration command reports each use (qualified name prefix -> why).
_NO_ESTIMATOR = (
    "tf.estimator was removed in TensorFlow 2.16; train with Keras "
    "model.fit or a custom loop under the strategy"
)
REMOVED_MODULES: dict[str, str] = {
    "tensorflow.estimator": _NO_ESTIMATOR,
    "tensorflow.compat.v1.estimator": _NO_ESTIMATOR,
    "tensorflow_estimator": _NO_ESTIMATOR,
}
