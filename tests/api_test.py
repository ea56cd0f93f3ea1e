"""The public API, pinned: each public module's `__all__`, nothing private.

A public module is one whose dotted name has no part starting with an
underscore. Changing what one exports is a change of the API: update
`PUBLIC_API` in the same change, on purpose.
"""

import importlib
import inspect
import pkgutil
import types
import warnings

import pytest
import tensorflow as tf

import tf_crossdevice

# Every public module of the installed package -> sorted(its __all__).
PUBLIC_API = {
    "tf_crossdevice": [
        "AllReduceCrossDeviceOps",
        "CollectiveAllReduce",
        "CollectiveCluster",
        "GradientAccumulator",
        "HierarchicalCollectiveAllReduce",
        "HierarchicalCopyAllReduce",
        "MultiWorkerAllReduce",
        "MultiWorkerMirroredStrategy",
        "NcclAllReduce",
        "ReductionToOneDevice",
        "SpecAllReduce",
        "autotune",
        "cost_model",
        "enable_collectives",
        "reporting_unreachable_peers",
        "select_cross_device_ops",
        "testing",
        "wait_for_peers",
    ],
    "tf_crossdevice.algorithms": [
        "AllReduceSpecTuple",
        "algorithm_names",
        "all_reduce_batch",
        "build",
        "check_algorithm",
        "describe_algorithms",
        "format_all_reduce_spec",
        "parse_all_reduce_spec",
        "select_range",
        "split_two_level",
        "sum_on_device",
    ],
    "tf_crossdevice.cluster": [
        "HEARTBEAT_VARIABLE",
        "HeartbeatWatch",
        "LocalCluster",
        "Progress",
        "WorkerReplicas",
        "WorkerUnreachableError",
        "end_heartbeats",
        "heartbeat",
        "hosts",
        "processes",
        "read_progress",
        "run_host_agent",
        "serve",
        "start_local_cluster",
    ],
    "tf_crossdevice.cluster.hosts": [
        "EmulatedHosts",
        "Host",
        "LinkBytes",
        "answering",
        "check_supported",
        "leftovers",
        "parse_rate",
        "remove_stale",
    ],
    "tf_crossdevice.cluster.processes": [
        "Child",
        "ChildError",
        "MARK",
        "PARENT_PID_ENV",
        "STOP_GRACE_SECONDS",
        "child_env",
        "commands",
        "exit_when_parent_goes",
        "free_ports",
        "reply",
        "start_module",
        "stop_all",
    ],
    "tf_crossdevice.collective": [
        "CollectiveAllReduce",
        "CollectiveCluster",
        "HierarchicalCollectiveAllReduce",
        "MultiWorkerMirroredStrategy",
        "enable_collectives",
        "reporting_unreachable_peers",
        "wait_for_peers",
    ],
    "tf_crossdevice.compat": [
        "AggregateSmallTensorPacker",
        "AllReduceCrossTowerOps",
        "AllReduceSpecTuple",
        "CollectiveAllReduce",
        "CollectiveHints",
        "ConcatAndSplitPacker",
        "CrossDeviceOps",
        "CrossTowerOps",
        "HierarchicalCopyAllReduce",
        "Mirrored",
        "MirroredStrategy",
        "MultiWorkerAllReduce",
        "NcclAllReduce",
        "PerDevice",
        "ReduceOp",
        "ReductionToOneDevice",
        "ReductionToOneDeviceCrossTowerOps",
        "check_destinations",
        "choose_the_best",
        "get_devices_from",
        "validate_destinations",
    ],
    "tf_crossdevice.compat.upgrade": [
        "FileUpgrade",
        "NEEDS_LIBCST",
        "PROG",
        "main",
        "python_files",
        "upgrade_code",
        "upgrade_file",
    ],
    "tf_crossdevice.compression": [
        "COMPRESSIONS",
        "PowerSGD",
        "SameWorker",
        "Wire",
        "WirePolicy",
        "check_compression",
        "check_wire",
        "compresses",
        "decode",
        "default_same_worker",
        "encode",
        "gather_compression_pays",
        "sum_tolerance",
    ],
    "tf_crossdevice.launch": [
        "RESTART_VARIABLE",
        "parse_num_workers",
        "run_local_job",
        "tf_config_envs",
    ],
    "tf_crossdevice.ops": [
        "AllReduceCrossDeviceOps",
        "CrossDeviceOpsAdapter",
        "HierarchicalCopyAllReduce",
        "InProcessReducer",
        "LinkMatrix",
        "Mirrored",
        "MultiWorkerAllReduce",
        "NcclAllReduce",
        "PerReplica",
        "ReductionToOneDevice",
        "SpecAllReduce",
        "check_link_matrix",
        "default_cross_device_ops",
        "dgx1_link_matrix",
        "resolve_destinations",
        "wire_of",
    ],
    "tf_crossdevice.packing": [
        "BatchAllReduce",
        "DEFAULT_BYTES_PER_PACK",
        "PackedAllReduce",
        "Packer",
        "PackingScheme",
        "check_packing",
        "collective_packs",
        "concat_and_split_plan",
        "flatten_pack",
        "make_packer",
        "packed_all_reduce",
        "packing_scheme",
        "plan_packs",
        "small_tensor_plan",
        "unflatten_pack",
    ],
    "tf_crossdevice.testing": [
        "cpu_devices",
        "per_replica",
        "request_cpu_devices",
    ],
    "tf_crossdevice.training": [
        "AverageOverExamples",
        "COLLECTIVE_OPS",
        "DiLoCo",
        "GradientAccumulator",
        "LocalSGD",
        "PreemptionWatcher",
        "STEP_EVENT",
        "StepProfile",
        "StepSummary",
        "compute_average_loss",
        "merge_traces",
        "profile_step",
        "summarize_trace",
        "write_trace",
    ],
    "tf_crossdevice.tuning": [
        "autotune",
        "cost_model",
        "measure",
        "select_cross_device_ops",
    ],
    "tf_crossdevice.tuning.cost_model": [
        "ALGORITHMS",
        "COMPRESSIBLE",
        "COMPRESSIONS",
        "CONFIG_NAMES",
        "Config",
        "Constants",
        "DEFAULT_CONSTANTS",
        "FIELDS",
        "Gradients",
        "ITEMSIZE",
        "LOOPBACK_FIELDS",
        "Measurement",
        "at_link_rate",
        "candidates",
        "constants_for_link",
        "features",
        "fit",
        "measured_counts",
        "ordering_constants",
        "predict",
        "recommend",
        "traffic_of",
    ],
    "tf_crossdevice.tuning.measure": [
        "Check",
        "Gradients",
        "Inputs",
        "Prepared",
        "Results",
        "Step",
        "TimeFn",
        "Timing",
        "all_reduce_body",
        "canonical",
        "first_line",
        "interleaved_rounds",
        "measure",
        "measure_cross_device_ops",
        "mismatch",
        "mismatch_beyond",
        "prepare",
        "read_on",
        "replica_seed",
        "reps_for",
        "sink",
        "time_calls",
        "timer",
    ],
}
# The folder faces: packages whose attributes are exactly their exports.
FACES = [
    "tf_crossdevice",
    "tf_crossdevice.algorithms",
    "tf_crossdevice.cluster",
    "tf_crossdevice.collective",
    "tf_crossdevice.compression",
    "tf_crossdevice.ops",
    "tf_crossdevice.packing",
    "tf_crossdevice.training",
    "tf_crossdevice.tuning",
]
# Public classes of the top level that are not CrossDeviceOps.
OTHER_CLASSES = {
    "MultiWorkerMirroredStrategy",
    "CollectiveCluster",
    "GradientAccumulator",
}


def _public_modules(package: types.ModuleType) -> set[str]:
    """`package` and every module below it with no part starting with `_`."""
    found = {package.__name__}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        name = f"{package.__name__}.{info.name}"
        if info.ispkg:
            found |= _public_modules(importlib.import_module(name))
        else:
            found.add(name)
    return found


def test_every_public_module_is_pinned():
    compat = importlib.import_module("tf_crossdevice.compat")
    found = _public_modules(tf_crossdevice) | _public_modules(compat)
    assert found == set(PUBLIC_API)


@pytest.mark.parametrize("name", sorted(PUBLIC_API))
def test_all_is_the_pinned_api(name):
    module = importlib.import_module(name)
    assert len(module.__all__) == len(set(module.__all__)), "duplicates"
    assert sorted(module.__all__) == PUBLIC_API[name]


@pytest.mark.parametrize("name", sorted(PUBLIC_API))
def test_a_star_import_gives_exactly_the_exports(name):
    module = importlib.import_module(name)
    namespace: dict = {}
    # compat's legacy names warn on first use; compat_test checks that.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        exec(f"from {name} import *", namespace)
        # exec adds __builtins__, and a warning __warningregistry__.
        imported = {k: v for k, v in namespace.items() if k[:2] != "__"}
        assert sorted(imported) == PUBLIC_API[name]
        for attribute, value in imported.items():
            assert value is getattr(module, attribute), attribute


@pytest.mark.parametrize("name", FACES)
def test_nothing_private_leaks_from_a_face(name):
    face = importlib.import_module(name)
    for attribute in dir(face):
        if attribute.startswith("_") or attribute in face.__all__:
            continue
        value = getattr(face, attribute)
        # Importing a public submodule binds it on its parent.
        assert isinstance(value, types.ModuleType), (
            f"{name}.{attribute} is not in __all__"
        )
        assert value.__name__ in PUBLIC_API, f"{value.__name__} leaks"


def test_every_class_is_a_cross_device_ops_with_a_docstring_example():
    for name in tf_crossdevice.__all__:
        value = getattr(tf_crossdevice, name)
        if inspect.isclass(value) and name not in OTHER_CLASSES:
            assert issubclass(value, tf.distribute.CrossDeviceOps), name
        if callable(value):
            assert ">>>" in (value.__doc__ or ""), f"{name} has no example"


def test_every_cross_device_ops_of_a_face_has_a_docstring_example():
    for name in ("tf_crossdevice.ops", "tf_crossdevice.collective"):
        face = importlib.import_module(name)
        for attribute in face.__all__:
            value = getattr(face, attribute)
            if inspect.isclass(value) and issubclass(
                value, tf.distribute.CrossDeviceOps
            ):
                assert ">>>" in (value.__doc__ or ""), f"{name}.{attribute}"
