"""Tests of tensor packing: the pure plans and the TensorFlow packer."""

from __future__ import annotations

import collections
import itertools

import hypothesis
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import strategies as st

from tf_crossdevice import testing
from tf_crossdevice.packing import _pack as _packing
from tf_crossdevice.packing import _plan as packing

DTYPES = [
    tf.float16,
    tf.bfloat16,
    tf.float32,
    tf.float64,
    tf.int32,
    tf.int64,
    tf.complex64,
    tf.complex128,
]

SETTINGS = {
    "identity": dict(num_packs=0, agg_small_grads_max_bytes=0),
    "concat_1": dict(num_packs=1, agg_small_grads_max_bytes=0),
    "concat_3": dict(num_packs=3, agg_small_grads_max_bytes=0),
    "concat_1000": dict(num_packs=1000, agg_small_grads_max_bytes=0),
    "agg_16_bytes_group_2": dict(
        num_packs=0,
        agg_small_grads_max_bytes=16,
        agg_small_grads_max_group=2,
    ),
    "agg_all_group_100": dict(
        num_packs=0,
        agg_small_grads_max_bytes=10**6,
        agg_small_grads_max_group=100,
    ),
    "agg_group_1": dict(
        num_packs=0,
        agg_small_grads_max_bytes=10**6,
        agg_small_grads_max_group=1,
    ),
}


def _settings(name: str) -> dict[str, int]:
    return {"agg_small_grads_max_group": 10, **SETTINGS[name]}


def _plans(rows):
    return [(g.members, g.member_sizes, g.pack_sizes, g.concat) for g in rows]


# Plans --------------------------------------------------------------------


@pytest.mark.parametrize(
    "total, pieces, expected",
    [
        pytest.param(10, 4, (3, 3, 2, 2), id="uneven"),
        pytest.param(6, 3, (2, 2, 2), id="even"),
        pytest.param(7, 1, (7,), id="one_piece"),
        pytest.param(2, 5, (1, 1), id="more_pieces_than_elements"),
        pytest.param(0, 3, (), id="no_elements"),
    ],
)
def test_split_sizes(total, pieces, expected):
    assert packing.split_sizes(total, pieces) == expected


F32, F16, I32, F64 = "float32", "float16", "int32", "float64"


@pytest.mark.parametrize(
    "infos, num_packs, expected",
    [
        pytest.param(
            [(3, 4, F32), (4, 4, I32), (2, 4, F32), (5, 2, F16)],
            2,
            [
                ((0, 2), (3, 2), (3, 2), True),
                ((1,), (4,), (2, 2), True),
                ((3,), (5,), (3, 2), True),
            ],
            id="dtype_groups_in_first_use_order",
        ),
        pytest.param(
            [(2, 4, F32)], 5, [((0,), (2,), (1, 1), True)], id="packs_gt_elems"
        ),
        pytest.param(
            [(0, 4, F32), (0, 4, F32), (3, 4, I32)],
            2,
            [((0, 1), (0, 0), (), True), ((2,), (3,), (2, 1), True)],
            id="empty_dtype_yields_no_packs",
        ),
        pytest.param(
            [(0, 4, F32), (3, 4, F32), (0, 4, F32)],
            2,
            [((0, 1, 2), (0, 3, 0), (2, 1), True)],
            id="empty_members_inside_a_group",
        ),
        pytest.param([], 4, [], id="no_tensors"),
    ],
)
def test_concat_and_split_plan(infos, num_packs, expected):
    assert _plans(packing.concat_and_split_plan(infos, num_packs)) == expected


@pytest.mark.parametrize(
    "infos, max_bytes, max_group, expected",
    [
        pytest.param(
            [(7, 1, "int8"), (7, 1, "int8"), (8, 1, "int8")],
            7,
            4,
            [((0, 1), (7, 7), (14,), True), ((2,), (8,), (8,), False)],
            id="exactly_max_bytes_eligible_one_more_not",
        ),
        pytest.param(
            [(2, 4, F32), (2, 4, F32), (2, 8, F64), (1, 8, F64)],
            8,
            4,
            [
                ((0, 1), (2, 2), (4,), True),
                ((2,), (2,), (2,), False),
                ((3,), (1,), (1,), False),
            ],
            id="bytes_not_elements",
        ),
        pytest.param(
            [(1, 4, F32)] * 5,
            100,
            2,
            [
                ((0, 1), (1, 1), (2,), True),
                ((2, 3), (1, 1), (2,), True),
                ((4,), (1,), (1,), False),
            ],
            id="group_size_limit_single_left_alone",
        ),
        pytest.param(
            [(1, 4, F32)] * 3,
            100,
            1,
            [((i,), (1,), (1,), False) for i in range(3)],
            id="group_of_one",
        ),
        pytest.param(
            [
                (1, 4, F32),
                (1, 4, F32),
                (9, 4, F32),
                (1, 4, F32),
                (1, 2, F16),
                (1, 2, F16),
            ],
            8,
            4,
            [
                ((0, 1), (1, 1), (2,), True),
                ((2,), (9,), (9,), False),
                ((3,), (1,), (1,), False),
                ((4, 5), (1, 1), (2,), True),
            ],
            id="no_group_across_a_gap_or_a_dtype_change",
        ),
        pytest.param(
            [(0, 4, F32), (0, 4, F32)],
            1,
            4,
            [((0, 1), (0, 0), (0,), True)],
            id="zero_elements_are_small",
        ),
    ],
)
def test_small_tensor_plan(infos, max_bytes, max_group, expected):
    plan = packing.small_tensor_plan(infos, max_bytes, max_group)
    assert _plans(plan) == expected


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        pytest.param(
            dict(num_packs=0, agg_small_grads_max_bytes=0),
            packing.PackingScheme.IDENTITY,
            id="identity",
        ),
        pytest.param(
            dict(num_packs=2, agg_small_grads_max_bytes=0),
            packing.PackingScheme.CONCAT_AND_SPLIT,
            id="concat",
        ),
        pytest.param(
            dict(num_packs=0, agg_small_grads_max_bytes=1),
            packing.PackingScheme.AGGREGATE_SMALL,
            id="aggregate",
        ),
        pytest.param(
            dict(
                num_packs=3,
                agg_small_grads_max_bytes=0,
                agg_small_grads_max_group=0,
            ),
            packing.PackingScheme.CONCAT_AND_SPLIT,
            id="group_ignored_without_aggregation",
        ),
    ],
)
def test_packing_scheme(kwargs, expected):
    assert (
        packing.packing_scheme(**{"agg_small_grads_max_group": 4, **kwargs})
        is expected
    )


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        pytest.param(
            dict(num_packs=2, agg_small_grads_max_bytes=8),
            ValueError,
            "exclusive",
            id="both_schemes",
        ),
        pytest.param(
            dict(num_packs=-1),
            ValueError,
            r"num_packs: expected an int >= 0, got -1",
            id="negative_num_packs",
        ),
        pytest.param(
            dict(agg_small_grads_max_bytes=-5),
            ValueError,
            "agg_small_grads_max_bytes",
            id="negative_bytes",
        ),
        pytest.param(
            dict(agg_small_grads_max_bytes=8, agg_small_grads_max_group=0),
            ValueError,
            r"agg_small_grads_max_group: expected an int >= 1, got 0",
            id="empty_group",
        ),
        pytest.param(
            dict(num_packs=True), TypeError, "num_packs", id="bool_num_packs"
        ),
        pytest.param(
            dict(num_packs=2.0), TypeError, "num_packs", id="float_num_packs"
        ),
    ],
)
def test_packing_scheme_rejects(kwargs, error, match):
    args = dict(
        num_packs=0, agg_small_grads_max_bytes=0, agg_small_grads_max_group=4
    )
    args.update(kwargs)
    with pytest.raises(error, match=match):
        packing.packing_scheme(**args)


def test_plan_rejects_negative_size():
    with pytest.raises(ValueError, match=r"tensors\[1\].num_elements"):
        packing.concat_and_split_plan([(1, 4, F32), (-1, 4, F32)], 2)


# Plan properties ------------------------------------------------------------

ITEMSIZES = {"float16": 2, "float32": 4, "float64": 8, "int64": 8}

infos_strategy = st.lists(
    st.tuples(st.integers(0, 40), st.sampled_from(sorted(ITEMSIZES))).map(
        lambda t: packing.TensorInfo(t[0], ITEMSIZES[t[1]], t[1])
    ),
    max_size=12,
)


def _check_covers_every_element(infos, plan):
    """Each (tensor, element) lands in exactly one pack, in order."""
    assert sorted(i for g in plan for i in g.members) == list(range(len(infos)))
    seen = collections.Counter()
    for group in plan:
        assert list(group.members) == sorted(group.members)
        assert {infos[i].dtype_key for i in group.members} <= {
            infos[group.members[0]].dtype_key
        }
        assert group.member_sizes == tuple(
            infos[i].num_elements for i in group.members
        )
        elements = [
            (i, j) for i in group.members for j in range(infos[i].num_elements)
        ]
        assert sum(group.pack_sizes) == len(elements)
        bounds = np.cumsum((0,) + group.pack_sizes)
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            seen.update(elements[start:stop])
    expected = {(i, j) for i, info in enumerate(infos) for j in range(info[0])}
    assert set(seen) == expected
    assert all(count == 1 for count in seen.values())


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(infos=infos_strategy, num_packs=st.integers(1, 50))
def test_concat_and_split_plan_property(infos, num_packs):
    plan = packing.concat_and_split_plan(infos, num_packs)
    _check_covers_every_element(infos, plan)
    dtypes = [info.dtype_key for info in infos]
    assert [infos[g.members[0]].dtype_key for g in plan] == list(
        dict.fromkeys(dtypes)
    )
    for group in plan:
        total = sum(group.member_sizes)
        assert group.concat
        assert len(group.pack_sizes) == min(num_packs, total)
        if total:
            expected = [
                len(a)
                for a in np.array_split(np.arange(total), min(num_packs, total))
            ]
            assert list(group.pack_sizes) == expected


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    infos=infos_strategy,
    max_bytes=st.integers(1, 200),
    max_group=st.integers(1, 6),
)
def test_small_tensor_plan_property(infos, max_bytes, max_group):
    plan = packing.small_tensor_plan(infos, max_bytes, max_group)
    _check_covers_every_element(infos, plan)
    assert [g.members[0] for g in plan] == sorted(g.members[0] for g in plan)
    small = [n * size <= max_bytes for n, size, _ in infos]
    for group in plan:
        members = list(group.members)
        assert len(group.pack_sizes) == 1
        assert group.concat == (len(members) > 1)
        assert len(members) <= max_group
        # Consecutive positions, small and of one dtype.
        assert members == list(range(members[0], members[-1] + 1))
        if group.concat:
            assert all(small[i] for i in members)
            assert len({infos[i][2] for i in members}) == 1
    # Two neighbouring groups would have been one, unless the first is full
    # or they differ in size class or dtype.
    for before, after in itertools.pairwise(plan):
        last, first = before.members[-1], after.members[0]
        joinable = (
            small[last] and small[first] and infos[last][2] == infos[first][2]
        )
        assert not joinable or len(before.members) == max_group


# Packer -------------------------------------------------------------------


def _random_array(rng, shape, dtype):
    """Small integers: exact in every dtype, and so are sums of a few."""
    values = rng.integers(-8, 9, size=shape)
    if dtype.is_complex:
        values = values + 1j * rng.integers(-8, 9, size=shape)
    return values.astype(dtype.as_numpy_dtype)


SHAPES = [(2, 3), (), (0,), (4,), (1, 5, 2), (3, 0, 2), (7,), (1,), (2, 2)]


def _arrays(seed, shapes=SHAPES, dtypes=DTYPES):
    rng = np.random.default_rng(seed)
    return [
        _random_array(rng, shape, dtypes[i % len(dtypes)])
        for i, shape in enumerate(shapes)
    ]


def _round_trip_eager(arrays, settings):
    tensors = [tf.constant(a) for a in arrays]
    packer = _packing.make_packer(tensors, **settings)
    packs = packer.pack(tensors)
    return packs, packer.unpack(packs), packer.num_packs


def _round_trip_function(arrays, settings):
    num_packs = []

    @tf.function
    def round_trip(tensors):
        packer = _packing.make_packer(tensors, **settings)
        num_packs.append(packer.num_packs)
        packs = packer.pack(tensors)
        return packs, packer.unpack(packs)

    packs, out = round_trip([tf.constant(a) for a in arrays])
    return packs, out, num_packs[0]


def _round_trip_graph(arrays, settings):
    with tf.Graph().as_default():
        inputs = [
            tf.compat.v1.placeholder(tf.as_dtype(a.dtype), a.shape)
            for a in arrays
        ]
        packer = _packing.make_packer(inputs, **settings)
        packs = packer.pack(inputs)
        out = packer.unpack(packs)
        with tf.compat.v1.Session() as session:
            packs, out = session.run(
                (packs, out), feed_dict=dict(zip(inputs, arrays, strict=True))
            )
    return packs, out, packer.num_packs


MODES = {
    "eager": _round_trip_eager,
    "function": _round_trip_function,
    "graph": _round_trip_graph,
}


def _numpy(value):
    return (
        value if isinstance(value, np.ndarray | np.generic) else value.numpy()
    )


def _assert_same(actual, expected):
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        got = _numpy(got)
        assert got.dtype == want.dtype
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def _expected_packs(arrays, settings):
    """The packs, computed with numpy from the rules, not from the plan."""
    if settings["num_packs"]:
        by_dtype = {}
        for a in arrays:
            by_dtype.setdefault(a.dtype, []).append(a.ravel())
        packs = []
        for flats in by_dtype.values():
            joined = np.concatenate(flats)
            if joined.size:
                packs.extend(
                    np.array_split(
                        joined, min(settings["num_packs"], joined.size)
                    )
                )
        return packs
    max_bytes = settings["agg_small_grads_max_bytes"]
    if not max_bytes:
        return list(arrays)
    max_group = settings["agg_small_grads_max_group"]
    # TF 1's extract_ranges: consecutive small arrays of one dtype, cut
    # into runs of at most max_group.
    runs: list[list[int]] = []
    for i, a in enumerate(arrays):
        previous = arrays[i - 1] if i else None
        if (
            a.nbytes <= max_bytes
            and previous is not None
            and previous.nbytes <= max_bytes
            and previous.dtype == a.dtype
            and len(runs[-1]) < max_group
        ):
            runs[-1].append(i)
        else:
            runs.append([i])
    return [
        arrays[run[0]]
        if len(run) == 1
        else np.concatenate([arrays[i].ravel() for i in run])
        for run in runs
    ]


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_round_trip(mode, setting):
    settings = _settings(setting)
    arrays = _arrays(seed=0)
    packs, out, num_packs = MODES[mode](arrays, settings)
    _assert_same(out, arrays)
    expected_packs = _expected_packs(arrays, settings)
    _assert_same(packs, expected_packs)
    assert num_packs == len(expected_packs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_round_trip_each_dtype_alone(dtype):
    arrays = _arrays(1, shapes=[(3, 2), (5,), (), (0, 4)], dtypes=[dtype])
    packs, out, num_packs = _round_trip_eager(arrays, _settings("concat_3"))
    _assert_same(out, arrays)
    assert [tuple(p.shape) for p in packs] == [(4,), (4,), (4,)]
    assert num_packs == 3


def test_all_empty_dtype_yields_no_packs_and_round_trips():
    arrays = [
        np.zeros((0,), np.float32),
        np.zeros((2, 0), np.float32),
        np.arange(3, dtype=np.int32),
    ]
    for mode in MODES.values():
        packs, out, num_packs = mode(arrays, _settings("concat_3"))
        assert num_packs == 3
        _assert_same(packs, [np.array([i], np.int32) for i in range(3)])
        _assert_same(out, arrays)


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_sum_of_packs_unpacks_to_sum(mode, setting):
    settings = _settings(setting)
    per_device = [_arrays(seed) for seed in (1, 2, 3)]
    devices = testing.cpu_devices(3)
    expected = [sum(same) for same in zip(*per_device, strict=True)]

    def build(per_device_tensors):
        packers = []
        packs = []
        for device, tensors in zip(devices, per_device_tensors, strict=True):
            with tf.device(device):
                packers.append(_packing.make_packer(tensors, **settings))
                packs.append(packers[-1].pack(tensors))
        outputs = []
        for device, packer in zip(devices, packers, strict=True):
            # What an all-reduce leaves on each device: the sum of the packs.
            with tf.device(device):
                summed = [a + b + c for a, b, c in zip(*packs, strict=True)]
                outputs.append(packer.unpack(summed))
        return packs, outputs

    if mode == "eager":
        inputs = []
        for device, arrays in zip(devices, per_device, strict=True):
            with tf.device(device):
                inputs.append([tf.constant(a) for a in arrays])
        packs, outputs = build(inputs)
        for device, device_packs, out in zip(
            devices, packs, outputs, strict=True
        ):
            assert all(p.device == device for p in device_packs)
            assert all(t.device == device for t in out)
    else:
        with tf.Graph().as_default():
            inputs = [[tf.constant(a) for a in arrays] for arrays in per_device]
            _, outputs = build(inputs)
            with tf.compat.v1.Session() as session:
                outputs = session.run(outputs)
    for out in outputs:
        _assert_same(out, expected)


@pytest.mark.parametrize("setting", ["concat_1", "agg_all_group_100"])
def test_one_dimensional_tensors_trace_no_reshape(setting):
    # A reshape per tensor per device doubled the trace time of many small
    # gradients; 1-D tensors need none, other ranks still get theirs.
    arrays = _arrays(4, shapes=[(3,), (5,), (2, 2), (7,)], dtypes=[tf.float32])

    @tf.function(autograph=False)
    def round_trip(tensors):
        packer = _packing.make_packer(tensors, **_settings(setting))
        return packer.unpack(packer.pack(tensors))

    tensors = [tf.constant(a) for a in arrays]
    graph = round_trip.get_concrete_function(tensors).graph
    reshaped = [
        op.outputs[0].shape.as_list()
        for op in graph.get_operations()
        if op.type == "Reshape"
    ]
    assert sorted(reshaped) == [[2, 2], [4]]
    _assert_same(round_trip(tensors), arrays)


@pytest.mark.parametrize("count", [1, 2])
def test_one_dimensional_tensor_of_unknown_length_gets_the_planned_shape(count):
    # Planned from [4]: a [None] tensor still goes through a reshape, so the
    # packs and results have the planned static shape.
    packer = _packing.make_packer(
        [tf.ones([4])] * count, **_settings("concat_1")
    )
    shapes = []

    @tf.function(
        autograph=False,
        input_signature=[[tf.TensorSpec([None], tf.float32)] * count],
    )
    def round_trip(tensors):
        packs = packer.pack(tensors)
        out = packer.unpack(packs)
        shapes.append([t.shape.as_list() for t in packs + out])
        return out

    values = [np.arange(4, dtype=np.float32) + k for k in range(count)]
    _assert_same(round_trip([tf.constant(v) for v in values]), values)
    assert shapes == [[[4 * count]] + [[4]] * count]


def test_unknown_shape_passes_unpacked_with_identity():
    @tf.function(
        input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec(None)]
    )
    def round_trip(a, b):
        packer = _packing.make_packer([a, b], **_settings("identity"))
        return packer.unpack(packer.pack([a, b]))

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.float32(4.0)
    _assert_same(round_trip(a, b), [a, np.array(b)])


@pytest.mark.parametrize("setting", ["concat_3", "agg_16_bytes_group_2"])
def test_unknown_shape_rejected_when_packing(setting):
    errors = []

    @tf.function(input_signature=[tf.TensorSpec([2]), tf.TensorSpec([None, 3])])
    def pack(a, b):
        try:
            _packing.make_packer([a, b], **_settings(setting))
        except ValueError as e:
            errors.append(str(e))
        return a

    pack.get_concrete_function()
    assert len(errors) == 1
    assert "tensors[1]" in errors[0]
    assert "(None, 3)" in errors[0]
    assert "num_packs=0 and agg_small_grads_max_bytes=0" in errors[0]


@pytest.mark.parametrize(
    "tensors, match",
    [
        pytest.param([tf.ones([2])], "expected 2 tensors, got 1", id="count"),
        pytest.param(
            [tf.ones([2]), tf.ones([4])], r"tensors\[1\].*shape", id="shape"
        ),
        pytest.param(
            [tf.ones([2]), tf.ones([3], tf.float64)],
            r"tensors\[1\]: expected float32",
            id="dtype",
        ),
    ],
)
@pytest.mark.parametrize("setting", ["concat_3", "agg_all_group_100"])
def test_pack_rejects_mismatched_tensors(tensors, match, setting):
    packer = _packing.make_packer(
        [tf.ones([2]), tf.ones([3])], **_settings(setting)
    )
    with pytest.raises(ValueError, match=match):
        packer.pack(tensors)


def test_unpack_rejects_mismatched_packs():
    packer = _packing.make_packer(
        [tf.ones([2]), tf.ones([3])], **_settings("concat_3")
    )
    packs = packer.pack([tf.ones([2]), tf.ones([3])])
    with pytest.raises(ValueError, match="expected 3 tensors, got 2"):
        packer.unpack(packs[:2])
    with pytest.raises(ValueError, match=r"packs\[0\]: expected float32"):
        packer.unpack([tf.cast(packs[0], tf.float64)] + packs[1:])


# Packer properties --------------------------------------------------------

SMALL_DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.int32, tf.complex64]

settings_strategy = st.one_of(
    st.builds(
        lambda n: dict(
            num_packs=n,
            agg_small_grads_max_bytes=0,
            agg_small_grads_max_group=1,
        ),
        st.integers(1, 8),
    ),
    st.builds(
        lambda b, g: dict(
            num_packs=0,
            agg_small_grads_max_bytes=b,
            agg_small_grads_max_group=g,
        ),
        st.integers(1, 64),
        st.integers(1, 4),
    ),
    st.just(_settings("identity")),
)


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    shapes=st.lists(
        st.lists(st.integers(0, 3), max_size=3).map(tuple), max_size=6
    ),
    dtype_indices=st.lists(
        st.integers(0, len(SMALL_DTYPES) - 1), min_size=6, max_size=6
    ),
    settings=settings_strategy,
    seed=st.integers(0, 2**16),
)
def test_packer_property(shapes, dtype_indices, settings, seed):
    dtypes = [SMALL_DTYPES[i] for i in dtype_indices]
    rng = np.random.default_rng(seed)
    arrays = [
        [
            _random_array(rng, shape, dtype)
            for shape, dtype in zip(shapes, dtypes, strict=False)
        ]
        for _ in range(2)
    ]
    tensors = [[tf.constant(a) for a in device] for device in arrays]
    packer = _packing.make_packer(tensors[0], **settings)
    packs = [packer.pack(device) for device in tensors]
    assert len(packs[0]) == packer.num_packs
    _assert_same(packs[0], _expected_packs(arrays[0], settings))
    _assert_same(packer.unpack(packs[0]), arrays[0])
    summed = [a + b for a, b in zip(*packs, strict=True)]
    expected = [a + b for a, b in zip(*arrays, strict=True)]
    _assert_same(packer.unpack(summed), expected)
