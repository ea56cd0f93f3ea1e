"""Wire compression of the collective classes, in a 2-worker cluster.

Two worker processes (tests/collective_compression_worker.py) build
`tf_crossdevice.MultiWorkerMirroredStrategy` with CollectiveAllReduce and
HierarchicalCollectiveAllReduce and `compression="bf16"` / `"fp16"`,
all-reduce values of every dtype (SUM and MEAN) in replica context, and
train a Keras classifier with and without bf16. The expected values are
computed here with numpy from the same inputs:

- float32/float64 within the codec's documented rounding: each replica's
  value is rounded once to 16 bits (u * |x| + a * m + t, u = 2**-8 for
  bf16 and 2**-11 for fp16, whose power-of-two scale keeps 1e5 and 1e-6 in
  range), then summed in its own dtype: the error is at most the sum of
  those bounds over the replicas plus the sum's own rounding; inf and nan
  stay;
- int32, int64, float16 exact;
- every replica of every worker gets the same bits;
- a group of 4 members (2 workers x 2 local devices, CollectiveAllReduce)
  reduces uncompressed, and the workers log it;
- the classifier trained with bf16 reaches the accuracy of the one
  trained without, within 0.02.

The workers are stopped when the results are in, also on failure.

In the test process itself (8 logical CPUs, one worker): the ops the
compressed launch traces for groups of 2 and 3 members (one float16
all-gather of half the bytes, plus fp16's 4-byte scale), the group-size
rule against the byte counts, one worker reducing exactly (nothing
crosses a worker boundary) and the constructors' check of `compression`.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import collective_compression_worker as worker
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.launch import tf_config_envs

pytestmark = pytest.mark.slow

TIMEOUT = 150  # Seconds for one reply, on a loaded machine.
UNIT_ROUNDOFF = {"bf16": 2.0**-8, "fp16": 2.0**-11}
# The sum's own rounding in float32 and float64 (a few additions).
SUM_ROUNDOFF = {"float32": 4 * 2.0**-24, "float64": 4 * 2.0**-53}
SUM_ROUNDOFF_OF = {
    n: SUM_ROUNDOFF[d] for n, d in worker.DTYPES.items() if d in SUM_ROUNDOFF
}
COMPRESSED = [c for c in worker.CASES if c[0] != "flat2-bf16"]
NAMES = list(worker.DTYPES)


@pytest.fixture(scope="module")
def cluster() -> dict:
    """Every worker's replies: {"cases": {name: [per task]}, "train": ...}."""
    children: list[_processes.Child] = []
    try:
        for task, env in enumerate(tf_config_envs(worker.NUM_WORKERS)):
            children.append(
                _processes.start_module(
                    "tests.collective_compression_worker",
                    name=f"worker {task}",
                    env=env,
                    cwd=worker._ROOT,
                )
            )
        cases: dict[str, list[dict]] = {}
        for name, *_ in worker.CASES:
            cases[name] = []
            for child in children:
                reply = child.receive(timeout=TIMEOUT)
                assert reply["case"] == name, reply
                cases[name].append(reply)
        train: dict[str | None, list[list]] = {}
        for compression in worker.TRAIN_COMPRESSIONS:
            replies = [child.receive(timeout=TIMEOUT) for child in children]
            assert all(r["train"] == compression for r in replies)
            train[compression] = [r["weights"] for r in replies]
        # Every reply is in: stop_all ends the workers without waiting
        # for TensorFlow's slow exit.
        return {
            "cases": cases,
            "train": train,
            "stderr": [child.stderr_text() for child in children],
        }
    finally:
        _processes.stop_all(children)


def inputs(replicas: int) -> dict[str, list[np.ndarray]]:
    """name -> every global replica's value."""
    per_replica = [worker.values(g) for g in range(replicas)]
    return {n: [v[n] for v in per_replica] for n in NAMES}


def results(replies: list[dict], key: str) -> list[list[np.ndarray]]:
    """[replica of any worker][value], after checking that they all agree."""
    everyone = [
        [np.asarray(v) for v in replica]
        for reply in replies
        for replica in reply[key]
    ]
    for i, replica in enumerate(everyone[1:], start=1):
        for got, first in zip(replica, everyone[0], strict=True):
            np.testing.assert_array_equal(
                got, first, err_msg=f"{key}: replica {i} differs from 0"
            )
    return everyone


def codec_bound(parts: list[np.ndarray], compression: str) -> np.ndarray:
    """The documented bound of one transfer, summed over the replicas.

    u * |x| + a * m + t per replica's value x (m: its largest finite
    magnitude, t: the dtype's smallest normal), u + 2**-23 for float64.
    """
    dtype = parts[0].dtype
    u = UNIT_ROUNDOFF[compression] + (2.0**-23 if dtype == np.float64 else 0)
    a = 2.0**-39 if compression == "fp16" or dtype == np.float64 else 0.0
    tiny = float(np.finfo(dtype).tiny)
    bound = np.zeros(parts[0].size)
    for x in parts:
        x = np.abs(np.asarray(x, np.float64)).ravel()
        m = np.max(x[np.isfinite(x)], initial=0.0)
        bound += u * x + a * m + tiny
    return bound


def assert_within_codec_bound(
    got: np.ndarray, parts: list[np.ndarray], compression: str, name: str
) -> None:
    dtype = parts[0].dtype.name
    exact = np.sum(np.array(parts, np.float64), axis=0).ravel()
    magnitude = np.sum(np.abs(np.array(parts, np.float64)), axis=0).ravel()
    bound = codec_bound(parts, compression) + SUM_ROUNDOFF[dtype] * magnitude
    finite = np.isfinite(exact)
    error = np.abs(got[finite] - exact[finite])
    assert np.all(error <= bound[finite]), (
        f"{name}: error {np.max(error - bound[finite])} beyond the bound"
    )
    np.testing.assert_array_equal(got[~finite], exact[~finite], err_msg=name)


@pytest.mark.parametrize(
    "name, kind, local, compression", COMPRESSED, ids=[c[0] for c in COMPRESSED]
)
def test_sums_within_codec_bound_and_exact_for_other_dtypes(
    cluster, name, kind, local, compression
):
    replicas = worker.NUM_WORKERS * local
    parts = inputs(replicas)
    got = results(cluster["cases"][name], "sums")[0]
    for n, value in zip(NAMES, got, strict=True):
        exact = np.sum(np.array(parts[n], np.float64), axis=0).ravel()
        if n in ("f32", "f64", "special"):
            assert_within_codec_bound(value, parts[n], compression, n)
        else:
            np.testing.assert_array_equal(value, exact, err_msg=n)
    # Compressed indeed: float32 sums are off by more than float32 rounding.
    exact = np.sum(np.array(parts["f32"], np.float64), axis=0)
    assert not np.allclose(got[0], exact, rtol=1e-6, atol=0)
    special = got[NAMES.index("special")]
    assert special[0] == np.inf and np.isnan(special[1])


@pytest.mark.parametrize(
    "name, kind, local, compression", COMPRESSED, ids=[c[0] for c in COMPRESSED]
)
def test_mean_divides_the_compressed_sum_by_every_replica(
    cluster, name, kind, local, compression
):
    replicas = worker.NUM_WORKERS * local
    parts = inputs(replicas)
    got = results(cluster["cases"][name], "means")[0]
    for n, value in zip(worker.MEAN_NAMES, got, strict=True):
        assert_within_codec_bound(
            value * replicas, parts[n], compression, f"mean of {n}"
        )


def test_group_of_four_reduces_uncompressed_and_says_so(cluster):
    parts = inputs(worker.NUM_WORKERS * 2)
    got = results(cluster["cases"]["flat2-bf16"], "sums")[0]
    # Within float32's (float64's) own rounding of the sum, far below bf16's.
    for n, value in zip(NAMES, got, strict=True):
        array = np.array(parts[n], np.float64)
        exact = np.sum(array, axis=0).ravel()
        if n in SUM_ROUNDOFF_OF:
            bound = SUM_ROUNDOFF_OF[n] * np.sum(np.abs(array), axis=0).ravel()
            finite = np.isfinite(exact)
            error = np.abs(value[finite] - exact[finite])
            assert np.all(error <= bound[finite]), n
            np.testing.assert_array_equal(value[~finite], exact[~finite])
        else:
            np.testing.assert_array_equal(value, exact, err_msg=n)
    for task, stderr in enumerate(cluster["stderr"]):
        assert "compression is off for a group of 4 members" in stderr, task


def test_training_with_bf16_reaches_the_uncompressed_accuracy(cluster):
    x, y = worker.classification_data()

    def accuracy(weights: list) -> float:
        return float(np.mean((worker.predict(weights, x) > 0.5) == y))

    plain, bf16 = (cluster["train"][c] for c in worker.TRAIN_COMPRESSIONS)
    # Both workers hold the same weights.
    for a, b in zip(plain[0], plain[1], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(bf16[0], bf16[1], strict=True):
        np.testing.assert_array_equal(a, b)
    start = worker.initial_weights()
    assert accuracy(start) < 0.8
    assert accuracy(plain[0]) >= 0.9
    assert abs(accuracy(bf16[0]) - accuracy(plain[0])) <= 0.02
    # Not the same run twice: bf16 moved the weights differently.
    assert not np.array_equal(plain[0][0], bf16[0][0])


# ---- In one process: the ops traced, the group-size rule --------------


def collectives_of(graph) -> list[tuple[str, str, int]]:
    """(op type, input dtype, input bytes) of each collective on CPU:0."""
    return [
        (
            op.type,
            op.inputs[0].dtype.name,
            op.inputs[0].shape.num_elements() * op.inputs[0].dtype.size,
        )
        for op in graph.get_operations()
        if op.type.startswith("Collective") and op.device.endswith("CPU:0")
    ]


@pytest.mark.parametrize("compression", ["bf16", "fp16"])
@pytest.mark.parametrize("members", [2, 3])
def test_compressed_all_reduce_gathers_half_the_bytes(compression, members):
    """The group's launch code on local devices (as it runs on members of
    different workers): one float16 all-gather of half the bytes, plus
    fp16's float32 scale; the sum within the codec's bound."""
    import tensorflow as tf

    from tf_crossdevice.collective import _group as collective_group
    from tf_crossdevice.collective import _reducer as collective_base

    rng = np.random.default_rng(members)
    # Beyond half's range: fp16's scale must keep them finite.
    parts = [
        (rng.normal(size=40) * 1e6 * (g + 1)).astype(np.float32)
        for g in range(members)
    ]
    devices = [
        f"/job:localhost/replica:0/task:0/device:CPU:{i}"
        for i in range(members)
    ]
    group = collective_group.Group(
        collective_base.shared_collective_keys(), devices, members, "test"
    )
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=60
    )

    @tf.function
    def run(*tensors):
        out = []
        for i, t in enumerate(tensors):
            with tf.device(devices[i]):
                out.append(
                    group.all_reduce_compressed(
                        i, tf.identity(t), compression, options
                    )
                )
        return out

    tensors = [tf.constant(p) for p in parts]
    graph = run.get_concrete_function(*tensors).graph
    scale = 4 if compression == "fp16" else 0
    assert collectives_of(graph) == [
        ("CollectiveGatherV2", "float16", 80 + scale)
    ]
    got = [t.numpy() for t in run(*tensors)]
    for g in got[1:]:
        np.testing.assert_array_equal(g, got[0])
    exact = np.sum(np.array(parts, np.float64), axis=0)
    bound = codec_bound(parts, compression) + SUM_ROUNDOFF["float32"] * (
        np.sum(np.abs(np.array(parts, np.float64)), axis=0)
    )
    assert np.all(np.abs(got[0] - exact) <= bound)
    assert not np.allclose(got[0], exact, rtol=1e-6, atol=0)


def test_gather_pays_for_2_and_3_members_only():
    from tf_crossdevice.compression import gather_compression_pays

    # Bytes per member: gather (p-1)/2 * S, ring 2(p-1)/p * S.
    for p in range(2, 9):
        fewer = (p - 1) / 2 < 2 * (p - 1) / p
        assert gather_compression_pays(p) == fewer, p


def test_one_worker_reduces_exactly_whatever_the_compression():
    import tensorflow as tf

    import tf_crossdevice
    from tf_crossdevice import testing

    rng = np.random.default_rng(3)
    parts = [(rng.normal(size=40) * 1e6).astype(np.float32) for _ in range(3)]
    names = [f"/cpu:{i}" for i in range(3)]
    ops = tf_crossdevice.CollectiveAllReduce(compression="bf16")

    @tf.function
    def run(*tensors):
        value = testing.per_replica(list(tensors), names)
        return ops.reduce("sum", value, names).values[0]

    tensors = [tf.constant(p) for p in parts]
    graph = run.get_concrete_function(*tensors).graph
    assert collectives_of(graph) == [("CollectiveReduceV2", "float32", 160)]
    array = np.array(parts, np.float64)
    bound = SUM_ROUNDOFF["float32"] * np.sum(np.abs(array), axis=0)
    assert np.all(np.abs(run(*tensors).numpy() - array.sum(axis=0)) <= bound)


@pytest.mark.parametrize(
    "cls", ["CollectiveAllReduce", "HierarchicalCollectiveAllReduce"]
)
def test_unknown_compression_is_refused_by_name(cls):
    import tf_crossdevice

    make = getattr(tf_crossdevice, cls)
    with pytest.raises(ValueError, match=r"compression: .*'fp8'.*'bf16'"):
        make(compression="fp8")
    assert make(compression="bf16").compression == "bf16"
    assert make().compression is None
