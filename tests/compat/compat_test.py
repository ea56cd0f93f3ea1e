"""Legacy code through tf_crossdevice.compat: names, warnings, arguments.

The tests call the classes the old way (contrib names, VariableAggregation,
per_device_value=, destinations None) in eager mode, in a tf.function and in
a TF 1 graph, and check the numbers against numpy.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice import testing

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAMES = importlib.import_module("tf_crossdevice.compat._names")

# Every legacy name and a word its warning must contain: the replacement.
REPLACEMENTS = {
    "CrossTowerOps": "tf.distribute.CrossDeviceOps",
    "ReductionToOneDeviceCrossTowerOps": "tf_crossdevice.ReductionToOneDevice",
    "AllReduceCrossTowerOps": "tf_crossdevice.AllReduceCrossDeviceOps",
    "MultiWorkerAllReduce": "tf_crossdevice.MultiWorkerAllReduce",
    "CollectiveAllReduce": "tf_crossdevice.CollectiveAllReduce",
    "AllReduceSpecTuple": "(alg, shards, limit) tuple",
    "ConcatAndSplitPacker": "num_packs",
    "AggregateSmallTensorPacker": "agg_small_grads_max_bytes",
    "choose_the_best": "tf_crossdevice.select_cross_device_ops",
    "check_destinations": "CrossDeviceOps",
    "validate_destinations": "CrossDeviceOps",
    "get_devices_from": ".devices",
    "PerDevice": "experimental_distribute_values_from_function",
    "Mirrored": "CrossDeviceOps.reduce",
    "MirroredStrategy": "tf.distribute.MirroredStrategy",
    "CrossDeviceOps": "tf.distribute.CrossDeviceOps",
    "ReductionToOneDevice": "tf_crossdevice.ReductionToOneDevice",
    "NcclAllReduce": "tf_crossdevice.NcclAllReduce",
    "HierarchicalCopyAllReduce": "tf_crossdevice.HierarchicalCopyAllReduce",
    "ReduceOp": "tf.distribute.ReduceOp",
    "CollectiveHints": "tf.distribute.experimental.CommunicationOptions",
}


def compat():
    return importlib.import_module("tf_crossdevice.compat")


def legacy(name):
    """compat's `name`, without its warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return getattr(compat(), name)


@pytest.fixture(autouse=True)
def _quiet():
    """Legacy calls warn; these tests look at the numbers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


# ---- Names and warnings ----------------------------------------------------


def test_compat_is_the_top_level_folder_of_this_checkout():
    # Unresolved paths: Bazel's runfiles link to a copy (BUILD's genrule).
    here = pathlib.Path(os.path.abspath(__file__)).parents[2]
    path = pathlib.Path(os.path.abspath(compat().__file__))
    assert here in path.parents, (
        f"tf_crossdevice.compat comes from {path}, not this checkout; "
        "reinstall it here: pip install -e ."
    )


def test_all_names_every_legacy_name():
    assert sorted(compat().__all__) == sorted(REPLACEMENTS)


def test_type_checkers_see_each_name_from_its_home():
    # compat imports its names for type checkers only (at run time they come
    # from __getattr__, which warns): the same names, from _names.LEGACY's
    # homes.
    tree = ast.parse(pathlib.Path(compat().__file__).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.asname or alias.name: f"{node.module}.{alias.name}"
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == {name: legacy.home for name, legacy in NAMES.LEGACY.items()}


@pytest.mark.usefixtures("forget_warnings")
@pytest.mark.parametrize("name", sorted(REPLACEMENTS))
def test_each_name_warns_once_naming_its_replacement(name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = getattr(compat(), name)
        again = getattr(compat(), name)
    assert first is again
    assert [w.category for w in caught] == [DeprecationWarning]
    message = str(caught[0].message)
    assert f"tf_crossdevice.compat.{name} is deprecated" in message
    assert REPLACEMENTS[name] in message
    assert caught[0].filename == __file__  # the line that asked for it


@pytest.mark.usefixtures("forget_warnings")
def test_a_warning_filter_silences_them():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings(
            "ignore", category=DeprecationWarning, module=__name__
        )
        compat().AllReduceCrossTowerOps()
    assert caught == []


def test_a_script_sees_one_warning_at_its_import_line():
    script = (
        "import warnings\n"
        "from tf_crossdevice.compat import ReductionToOneDeviceCrossTowerOps\n"
        "from tf_crossdevice import compat\n"
        "compat.ReductionToOneDeviceCrossTowerOps()\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stderr
    lines = [
        line for line in shown.splitlines() if "DeprecationWarning" in line
    ]
    assert len(lines) == 1, shown
    assert lines[0].startswith("<string>:2: DeprecationWarning"), lines
    silenced = subprocess.run(
        [sys.executable, "-W", "ignore::DeprecationWarning", "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stderr
    assert "DeprecationWarning" not in silenced


def test_unknown_name_is_an_attribute_error_listing_the_names():
    with pytest.raises(AttributeError, match="NoSuchOps.*CrossTowerOps"):
        compat().NoSuchOps  # noqa: B018


def test_legacy_classes_are_the_new_ones():
    pairs = [
        (
            "ReductionToOneDeviceCrossTowerOps",
            tf_crossdevice.ReductionToOneDevice,
        ),
        ("ReductionToOneDevice", tf_crossdevice.ReductionToOneDevice),
        ("AllReduceCrossTowerOps", tf_crossdevice.AllReduceCrossDeviceOps),
        ("NcclAllReduce", tf_crossdevice.NcclAllReduce),
        ("HierarchicalCopyAllReduce", tf_crossdevice.HierarchicalCopyAllReduce),
        ("MultiWorkerAllReduce", tf_crossdevice.MultiWorkerAllReduce),
        ("CollectiveAllReduce", tf_crossdevice.CollectiveAllReduce),
    ]
    for name, new in pairs:
        cls = legacy(name)
        assert issubclass(cls, new), name
        assert issubclass(cls, legacy("CrossTowerOps")), name
        assert issubclass(cls, legacy("CrossDeviceOps")), name
    # TF 1's base keeps TF 1's value contract; tf.compat.v1's keeps TF 2's.
    assert issubclass(legacy("CrossTowerOps"), legacy("CrossDeviceOps"))
    assert legacy("CrossTowerOps") is not legacy("CrossDeviceOps")
    assert legacy("ReduceOp") is tf.distribute.ReduceOp


@pytest.mark.parametrize("name", sorted(NAMES.CONSTRUCTOR_PARAMETERS))
def test_constructors_take_the_parameters_the_command_checks(name):
    # The migration command renames a call only when it passes these, by
    # position or keyword: the class under LegacyArguments (the new one)
    # must take them in the same order.
    mixin = importlib.import_module("tf_crossdevice.compat._arguments")
    mro = legacy(name).__mro__
    init = next(
        base.__dict__["__init__"]
        for base in mro[mro.index(mixin.LegacyArguments) + 1 :]
        if "__init__" in base.__dict__
    )
    positional = [
        parameter.name
        for parameter in inspect.signature(init).parameters.values()
        if parameter.kind is parameter.POSITIONAL_OR_KEYWORD
    ]
    assert tuple(positional[1:]) == NAMES.CONSTRUCTOR_PARAMETERS[name]


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda c: c.AllReduceCrossTowerOps(
                "xring", num_packs=2, my_fork_option=True
            ),
            r"^AllReduceCrossTowerOps: unknown keyword my_fork_option=True; "
            r"it takes all_reduce_alg, num_packs, agg_small_grads_max_bytes, "
            r"agg_small_grads_max_group$",
        ),
        (
            lambda c: c.AllReduceCrossTowerOps("xring", 1, 0, 10, 5),
            r"^AllReduceCrossTowerOps: too many positional arguments; it "
            r"takes all_reduce_alg, ",
        ),
        (
            lambda c: c.NcclAllReduce(2, num_packs=3),
            r"^NcclAllReduce: multiple values for argument 'num_packs'; it "
            r"takes num_packs$",
        ),
        (
            lambda c: c.CrossTowerOps(fork=1),
            r"^CrossTowerOps: unknown keyword fork=1; it takes no arguments$",
        ),
    ],
    ids=["unknown_keyword", "too_many", "twice", "base_class"],
)
def test_constructor_errors_name_the_argument_and_the_parameters(call, match):
    with pytest.raises(TypeError, match=match):
        call(compat())


def test_compat_doctests():
    failed = 0
    for module in (
        "",
        "._names",
        "._arguments",
        "._ops",
        "._values",
        "._packers",
    ):
        failed += doctest.testmod(
            importlib.import_module(f"tf_crossdevice.compat{module}"),
            extraglobs={"tf": tf, "np": np, "tf_crossdevice": tf_crossdevice},
            optionflags=doctest.ELLIPSIS,
        ).failed
    assert failed == 0


# ---- reduce, batch_reduce and broadcast, the TF 1 way ----------------------

A = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
B = np.array([[5.0, -6.0], [7.0, 0.5]], np.float32)

# Legacy reduce op -> what it means, in numpy.
AGGREGATIONS = [
    (tf.VariableAggregation.SUM, lambda a, b: a + b),
    (tf.VariableAggregation.MEAN, lambda a, b: (a + b) / 2),
    (tf.compat.v1.VariableAggregation.MEAN, lambda a, b: (a + b) / 2),
    (tf.VariableAggregation.ONLY_FIRST_REPLICA, lambda a, b: a),
    (tf.compat.v1.VariableAggregation.ONLY_FIRST_TOWER, lambda a, b: a),
    ("Sum", lambda a, b: a + b),
    ("MEAN", lambda a, b: (a + b) / 2),
    (tf.distribute.ReduceOp.SUM, lambda a, b: a + b),
]

CLASSES = {
    "ReductionToOneDeviceCrossTowerOps": (),
    "AllReduceCrossTowerOps": ("hierarchical_copy",),
    "MultiWorkerAllReduce": (["/job:localhost/replica:0/task:0"], 0, "pscpu"),
}


def make_ops(name):
    return legacy(name)(*CLASSES[name])


def cpu(i):
    return testing.cpu_devices(4)[i]


# Destinations the old way -> the devices the result must land on.
DESTINATIONS = {
    "none": (lambda value: None, [0, 1]),
    "mirrored": (
        lambda value: legacy("Mirrored")(
            {cpu(2): tf.constant(0.0), cpu(3): tf.constant(0.0)}
        ),
        [2, 3],
    ),
    "another_device": (lambda value: "/cpu:3", [3]),
    "string": (lambda value: "/job:localhost/replica:0/task:0/cpu:0", [0]),
    "list_of_strings": (lambda value: ["/cpu:1", "/cpu:2"], [1, 2]),
}


def run(mode, build):
    """Builds `build()` (a list of tensors) in `mode` and runs it.

    Returns:
        (each tensor's CPU device index, its value).
    """
    devices = []

    def body():
        tensors = build()
        # (A TF 1 graph's canonical names may lack the job: compare indices.)
        devices[:] = [
            tf.DeviceSpec.from_string(t.device).device_index for t in tensors
        ]
        return tensors

    if mode == "eager":
        values = [t.numpy() for t in body()]
    elif mode == "function":
        values = [t.numpy() for t in tf.function(body, autograph=False)()]
    else:
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            values = session.run(body())
    return devices, values


def tensors_of(result):
    """A reduce result's tensors: itself (one destination) or its values."""
    if isinstance(result, (tf.Tensor, tf.IndexedSlices)):
        return [result]
    return list(result.values)


def per_device_value(a=A, b=B):
    return legacy("PerDevice")({cpu(0): tf.constant(a), cpu(1): tf.constant(b)})


MODES = ["eager", "function", "graph"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("destinations", sorted(DESTINATIONS))
@pytest.mark.parametrize("aggregation, expected", AGGREGATIONS)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_reduce_the_tf1_way(name, aggregation, expected, destinations, mode):
    make_destinations, want_devices = DESTINATIONS[destinations]

    def build():
        value = per_device_value()
        return tensors_of(
            make_ops(name).reduce(
                aggregation=aggregation,
                per_device_value=value,
                destinations=make_destinations(value),
            )
        )

    devices, values = run(mode, build)
    assert sorted(devices) == want_devices
    for value in values:
        np.testing.assert_allclose(value, expected(A, B), rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_batch_reduce_the_tf1_way(name, mode):
    c = np.arange(6, dtype=np.float32).reshape(3, 2)

    def build():
        first, second = per_device_value(), per_device_value(c, 2 * c)
        results = make_ops(name).batch_reduce(
            tf.VariableAggregation.MEAN,
            [(first, None), (second, ["/cpu:2", "/cpu:3"])],
        )
        return tensors_of(results[0]) + tensors_of(results[1])

    devices, values = run(mode, build)
    assert devices == [0, 1, 2, 3]
    for value in values[:2]:
        np.testing.assert_allclose(value, (A + B) / 2, rtol=1e-6)
    for value in values[2:]:
        np.testing.assert_allclose(value, 1.5 * c, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "destinations", ["mirrored", "another_device", "list_of_strings"]
)
@pytest.mark.parametrize("name", sorted(CLASSES))
def test_broadcast_the_tf1_way(name, destinations, mode):
    make_destinations, want_devices = DESTINATIONS[destinations]

    def build():
        with tf.device(cpu(0)):
            tensor = tf.constant(A)
        return tensors_of(
            make_ops(name).broadcast(tensor, make_destinations(tensor))
        )

    devices, values = run(mode, build)
    assert sorted(devices) == want_devices
    for value in values:
        np.testing.assert_allclose(value, A)


@pytest.mark.parametrize(
    "call",
    [
        lambda ops, v: ops.reduce(tf.VariableAggregation.SUM, v, None),
        lambda ops, v: ops.reduce(reduce_op="sum", per_replica_value=v),
        lambda ops, v: ops.reduce(method_string="sum", per_device_value=v),
        lambda ops, v: ops.reduce(
            tf.distribute.ReduceOp.SUM,
            v,
            v,
            experimental_hints=legacy("CollectiveHints")(bytes_per_pack=8),
        ),
        lambda ops, v: ops.batch_reduce(
            aggregation=tf.VariableAggregation.SUM,
            value_destination_pairs=[(v, v)],
        )[0],
    ],
    ids=["positional", "reduce_op", "method_string", "hints", "batch"],
)
def test_every_spelling_of_the_arguments(call):
    result = call(
        make_ops("ReductionToOneDeviceCrossTowerOps"), per_device_value()
    )
    for value in tensors_of(result):
        np.testing.assert_allclose(value.numpy(), A + B, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"aggregation": tf.VariableAggregation.NONE},
            ValueError,
            "aggregation|reduce_op.*NONE.*nothing to reduce",
        ),
        ({"aggregation": "max"}, ValueError, "reduce_op: expected .*got 'max'"),
        (
            {"aggregation": "sum", "reduce_op": "sum"},
            TypeError,
            "reduce_op and aggregation",
        ),
    ],
)
def test_errors_say_what_to_pass(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_ops("AllReduceCrossTowerOps").reduce(
            per_device_value=per_device_value(), **kwargs
        )


@pytest.mark.usefixtures("forget_warnings")
def test_legacy_keywords_warn_once_each():
    ops = make_ops("ReductionToOneDeviceCrossTowerOps")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            ops.reduce(
                aggregation=tf.VariableAggregation.SUM,
                per_device_value=per_device_value(),
            )
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 3, messages
    assert "aggregation= is deprecated; use reduce_op=" in messages[0]
    assert (
        "per_device_value= is deprecated; use per_replica_value="
        in (messages[1])
    )
    assert "tf.VariableAggregation.SUM as a reduce op" in messages[2]
    assert "tf.distribute.ReduceOp.SUM" in messages[2]
    assert {w.filename for w in caught} == {__file__}


# ---- The rest of the names ------------------------------------------------


def test_mirrored_strategy_takes_cross_tower_ops():
    ops = make_ops("AllReduceCrossTowerOps")
    strategy = legacy("MirroredStrategy")(
        devices=testing.cpu_devices(2), cross_tower_ops=ops
    )
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.extended._cross_device_ops is ops  # noqa: SLF001

    @tf.function
    def step():
        ctx = tf.distribute.get_replica_context()
        value = tf.cast(ctx.replica_id_in_sync_group, tf.float32) + 1.0
        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value * [1.0, 2.0])

    for got in strategy.experimental_local_results(strategy.run(step)):
        np.testing.assert_allclose(got, [3.0, 6.0])


def test_mirrored_strategy_num_gpus_zero_is_the_cpu():
    strategy = legacy("MirroredStrategy")(num_gpus=0)
    assert strategy.extended.worker_devices == (
        "/job:localhost/replica:0/task:0/device:CPU:0",
    )
    with pytest.raises(ValueError, match="num_gpus: give devices or num_gpus"):
        legacy("MirroredStrategy")(devices=["/cpu:0"], num_gpus=1)


def test_choose_the_best_matches_select():
    devices = testing.cpu_devices(4)
    assert type(
        legacy("choose_the_best")(devices, session_config=None)
    ) is type(tf_crossdevice.select_cross_device_ops(devices))


def test_collective_hints_become_communication_options():
    options = legacy("CollectiveHints")(1024, 5.0)
    assert options.bytes_per_pack == 1024
    assert options.timeout_seconds == 5.0


def test_spec_tuple_drives_multi_worker_all_reduce():
    spec = legacy("AllReduceSpecTuple")
    ops = legacy("MultiWorkerAllReduce")(
        ["/job:localhost/replica:0/task:0"],
        0,
        [spec("pscpu", 1, 16), spec("xring", 2, -1)],
    )
    small = per_device_value(A[0], B[0])  # 8 bytes: pscpu
    result = ops.batch_reduce(
        "sum", [(small, None), (per_device_value(), None)]
    )
    for value in result[0].values:
        np.testing.assert_allclose(value.numpy(), A[0] + B[0])
    for value in result[1].values:
        np.testing.assert_allclose(value.numpy(), A + B)


@pytest.mark.parametrize(
    "packer, args, want_packs",
    [
        ("ConcatAndSplitPacker", (2,), 2),
        ("AggregateSmallTensorPacker", (16, 4), 2),
    ],
)
def test_packers_round_trip_sums(packer, args, want_packs):
    shapes = [[2, 3], [3], [1], [4, 1]]
    rng = np.random.default_rng(0)
    grads = [
        [rng.normal(size=s).astype(np.float32) for s in shapes]
        for _ in range(2)
    ]
    grouped = [
        [(tf.constant(g), f"var{i}") for i, g in enumerate(device)]
        for device in grads
    ]
    p = legacy(packer)(*args)
    packed = p.pack(grouped)
    assert len(packed[0]) == want_packs
    summed = [
        tf.add_n(list(same))
        for same in zip(*[[t for t, _ in d] for d in packed], strict=True)
    ]
    unpacked = p.unpack([[(t, None) for t in summed]] * 2)
    expected = [a + b for a, b in zip(*grads, strict=True)]
    for device in unpacked:
        for i, ((got, var), want) in enumerate(
            zip(device, expected, strict=True)
        ):
            assert var == f"var{i}"
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_destination_helpers():
    check, validate, get = (
        legacy("check_destinations"),
        legacy("validate_destinations"),
        legacy("get_devices_from"),
    )
    assert check("/cpu:0") and not check([]) and not check("")
    with pytest.raises(ValueError, match="destinations: expected at least one"):
        validate([])
    with pytest.raises(
        ValueError, match="destinations: expected a distributed"
    ):
        validate(3)
    assert get(["/cpu:1", "/cpu:0"]) == [cpu(1), cpu(0)]
    assert get(per_device_value()) == [cpu(0), cpu(1)]


@pytest.mark.parametrize("num_packs", [0, -1, 1.5, True])
def test_concat_and_split_packer_refuses_fewer_than_one_pack(num_packs):
    # TF 1's ConcatAndSplitPacker raised here; num_packs=0 means "no packing"
    # only on the CrossDeviceOps classes.
    with pytest.raises(ValueError, match=r"^num_packs: expected an integer"):
        legacy("ConcatAndSplitPacker")(num_packs)


# ---- TF 1's value contract: a Mirrored for every destination count ---------

# The names that keep TF 1's contract, and the TF 2 names that keep TF 2's.
TF1_NAMES = {
    "ReductionToOneDeviceCrossTowerOps": (),
    "AllReduceCrossTowerOps": ("hierarchical_copy",),
    "MultiWorkerAllReduce": (["/job:localhost/replica:0/task:0"], 0, "pscpu"),
    "CollectiveAllReduce": (),
}
TF2_NAMES = {
    "ReductionToOneDevice": (),
    "HierarchicalCopyAllReduce": (),
    "CrossDeviceOps": None,
}


class TF1Sum:
    """A TF 1 CrossTowerOps subclass: only TF 1's `_reduce` hook."""

    def _reduce(self, reduce_op, per_replica_value, destinations):
        return tf_crossdevice.ReductionToOneDevice().reduce(
            reduce_op, per_replica_value, destinations
        )


def tf1_subclass(base):
    return type(f"Legacy{base}", (TF1Sum, legacy(base)), {})()


def make_any(name):
    if name in ("CrossTowerOps", "CrossDeviceOps"):
        return tf1_subclass(name)
    return legacy(name)(*{**TF1_NAMES, **TF2_NAMES}[name])


def one_and_three():
    """The issue's value: 1.0 on CPU 0, 3.0 on CPU 1."""
    return testing.per_replica([tf.constant(1.0), tf.constant(3.0)])


def assert_tf1_mirrored(result, want_devices, want):
    assert isinstance(result, legacy("Mirrored")), type(result)
    # Still TF 2's Mirrored for TF 2 code.
    assert isinstance(result, tf.distribute.DistributedValues)
    assert type(result).__mro__[1].__name__ == "Mirrored"
    assert result.devices == tuple(cpu(i) for i in want_devices)
    assert len(result.values) == len(want_devices)
    local = tf.distribute.get_strategy().experimental_local_results(result)
    assert len(local) == 1 and local[0] is result
    for i in want_devices:
        got = result.get(cpu(i))
        assert got.device == cpu(i)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
        assert result.on_device(f"/cpu:{i}")
    assert not result.on_device("/cpu:7")


@pytest.mark.parametrize("name", [*sorted(TF1_NAMES), "CrossTowerOps"])
def test_the_issue_example(name):
    ops = make_any(name)
    value = one_and_three()
    mean = ops.reduce(tf.compat.v1.VariableAggregation.MEAN, value, cpu(0))
    assert_tf1_mirrored(mean, [0], 2.0)
    total = ops.reduce(tf.VariableAggregation.SUM, value, several(0, 1))
    assert_tf1_mirrored(total, [0, 1], 4.0)
    assert float(total.get(cpu(1))) == 4.0


def several(*indices):
    """Several destinations, as every class here takes them (TF 2's base
    CrossDeviceOps refuses a list of strings)."""
    return legacy("Mirrored")({cpu(i): tf.constant(0.0) for i in indices})


@pytest.mark.parametrize("name", [*sorted(TF1_NAMES), "CrossTowerOps"])
def test_tf1_names_give_mirrored_for_every_call(name):
    ops = make_any(name)
    a, b = per_device_value(), per_device_value(B, A)
    # reduce: one destination (a string), several (a list), None.
    assert_tf1_mirrored(ops.reduce("sum", a, "/cpu:2"), [2], A + B)
    assert_tf1_mirrored(ops.reduce("mean", a, None), [0, 1], (A + B) / 2)
    assert_tf1_mirrored(
        ops.reduce(tf.VariableAggregation.ONLY_FIRST_REPLICA, a, "/cpu:3"),
        [3],
        A,
    )
    # batch_reduce: a list of them, one and several destinations.
    results = ops.batch_reduce(
        tf.VariableAggregation.SUM, [(a, "/cpu:1"), (b, several(0, 3))]
    )
    assert isinstance(results, list) and len(results) == 2
    assert_tf1_mirrored(results[0], [1], A + B)
    assert_tf1_mirrored(results[1], [0, 3], A + B)
    # broadcast: one and several destinations.
    with tf.device(cpu(0)):
        tensor = tf.constant(A)
    assert_tf1_mirrored(ops.broadcast(tensor, "/cpu:1"), [1], A)
    assert_tf1_mirrored(ops.broadcast(tensor, several(1, 2)), [1, 2], A)


@pytest.mark.parametrize("name", sorted(TF2_NAMES))
def test_tf2_names_keep_tf2_results(name):
    ops = make_any(name)
    value = one_and_three()
    one = ops.reduce("mean", value, "/cpu:0")
    assert isinstance(one, tf.Tensor), type(one)
    assert float(one) == 2.0
    assert isinstance(ops.broadcast(tf.constant(2.0), "/cpu:1"), tf.Tensor)
    (batched,) = ops.batch_reduce("sum", [(value, "/cpu:1")])
    assert isinstance(batched, tf.Tensor)
    total = ops.reduce("sum", value, several(0, 1))
    assert not isinstance(total, legacy("Mirrored"))
    assert isinstance(total, tf.distribute.DistributedValues)


def test_get_without_a_device_is_the_current_device():
    total = make_any("ReductionToOneDeviceCrossTowerOps").reduce(
        "sum", one_and_three(), ["/cpu:1", "/cpu:0"]
    )
    assert total.devices == (cpu(1), cpu(0))
    # No scope: the host's first CPU, as TF 1's device_util.current.
    assert total.get() is total.values[1]
    for i in (0, 1):
        with tf.device(f"/cpu:{i}"):
            assert total.get() is total.get(cpu(i))
            assert total.get().device == cpu(i)
    # Any spelling of the device, and a DeviceSpec.
    assert total.get("/device:CPU:1") is total.values[0]
    assert (
        total.get(tf.DeviceSpec(device_type="CPU", device_index=1))
        is (total.values[0])
    )


def test_get_of_another_device_names_the_argument_and_the_devices():
    total = make_any("AllReduceCrossTowerOps").reduce(
        "sum", one_and_three(), None
    )
    with pytest.raises(
        ValueError,
        match=r"^device: '/cpu:2' \(.*CPU:2\) is not a device of this "
        r"Mirrored value; expected one of .*CPU:0, .*CPU:1$",
    ):
        total.get("/cpu:2")
    with (
        tf.device("/cpu:3"),
        pytest.raises(
            ValueError, match=r"^device: None \(the current device, .*CPU:3\)"
        ),
    ):
        total.get()
    with pytest.raises(TypeError, match="^device: expected None, a device"):
        total.get(3)
    with pytest.raises(ValueError, match="^device: 'nonsense'"):
        total.get("nonsense")


def test_get_in_a_strategys_cross_replica_context_falls_back_to_the_first():
    # TF 1's Mirrored: cross-replica, off its devices, the first value.
    total = make_any("ReductionToOneDeviceCrossTowerOps").reduce(
        "sum", one_and_three(), ["/cpu:1", "/cpu:2"]
    )
    strategy = tf.distribute.MirroredStrategy(testing.cpu_devices(2))
    with strategy.scope(), tf.device("/cpu:3"):
        assert total.get() is total.values[0]
        with tf.device("/cpu:2"):
            assert total.get() is total.values[1]


@pytest.mark.parametrize("name", sorted(TF1_NAMES))
def test_tf1_results_inside_tf_function(name):
    @tf.function(autograph=False)
    def step():
        ops = make_any(name)
        value = one_and_three()
        mean = ops.reduce(tf.VariableAggregation.MEAN, value, "/cpu:2")
        total = ops.batch_reduce("sum", [(value, ["/cpu:0", "/cpu:1"])])[0]
        copied = ops.broadcast(tf.constant(5.0), "/cpu:3")
        with tf.device("/cpu:1"):
            here = total.get()
        assert mean.devices == (cpu(2),)
        assert total.devices == (cpu(0), cpu(1))
        assert copied.devices == (cpu(3),)
        return mean.get("/cpu:2"), total.get(), here, copied.get(cpu(3))

    got = [float(t) for t in step()]
    assert got == [2.0, 4.0, 4.0, 5.0]


def test_tf1_results_in_a_tf1_graph():
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        ops = make_any("ReductionToOneDeviceCrossTowerOps")
        total = ops.reduce("sum", one_and_three(), "/cpu:1")
        assert len(total.devices) == 1
        assert total.devices[0].endswith("/device:CPU:1")
        # The graph's names may lack the job; any spelling finds the value.
        fetched = [total.get(cpu(1)), total.get("/cpu:1")]
        with tf.device("/cpu:1"):
            fetched.append(total.get())
        assert session.run(fetched) == [4.0, 4.0, 4.0]


def test_mirrored_from_a_dict_is_tf1s():
    value = legacy("Mirrored")({"/cpu:1": tf.constant(2.0), "/cpu:0": A})
    assert value.devices == (cpu(1), cpu(0))
    np.testing.assert_allclose(value.get("/cpu:0").numpy(), A)
    assert float(value.get("/cpu:1")) == 2.0
