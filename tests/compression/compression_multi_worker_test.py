"""Wire compression across real worker processes on 127.0.0.1.

MultiWorkerAllReduce over 2 workers ('pscpu/pscpu' with 2 shards, and
'xring') with bf16 and fp16: the sums are checked against numpy within the
bound of the README's "Wire compression" section, and the tensors that cross
workers in the traced graph are counted: compressed, they are 16-bit and
their bytes halve. The client runs in its own process (connecting changes
process-wide TensorFlow state): this file, run as a module.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from tf_crossdevice.cluster import _local as cluster
from tf_crossdevice.cluster import processes as _processes

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SPECS = {"pscpu_pscpu": ["pscpu/pscpu", 2, -1], "xring": "xring"}
# Roundings on a value's way (README): 2 for pscpu-style, p + 1 for xring.
ROUNDINGS = {"pscpu_pscpu": 2, "xring": 3}
CODECS = (None, "bf16", "fp16")
U = {"bf16": 2.0**-8, "fp16": 2.0**-11}
SHAPES = ((1000,), (3, 7))
DTYPES = ("float32", "float64", "int64")


def make_inputs(seed, num_replicas):
    """inputs[k][r]: value k on replica r; magnitudes spread over 1e-3..1e3."""
    rng = np.random.default_rng(seed)
    inputs = []
    for dtype in DTYPES:
        for shape in SHAPES:
            if dtype == "int64":
                arrays = [
                    rng.integers(-(2**40), 2**40, shape)
                    for _ in range(num_replicas)
                ]
            else:
                arrays = [
                    rng.normal(size=shape) * 10.0 ** rng.integers(-3, 4, shape)
                    for _ in range(num_replicas)
                ]
            inputs.append([a.astype(dtype) for a in arrays])
    return inputs


def cross_worker_tensors(graph):
    """[(dtype name, bytes)] of each tensor a worker sends another."""
    from tests import traffic_util

    sent = []
    seen = set()
    for op in graph.get_operations():
        if not op.device:
            continue
        dst = tf.DeviceSpec.from_string(op.device).task
        for t in op.inputs:
            if not t.op.device or (t.name, dst) in seen:
                continue
            if tf.DeviceSpec.from_string(t.op.device).task != dst:
                seen.add((t.name, dst))
                size = t.shape.num_elements()
                sent.append((t.dtype.name, size * t.dtype.size))
    assert traffic_util.cross_device_bytes(graph)  # Static shapes throughout.
    return sent


def run_client(job):
    """Client side: one reply per case."""
    import tf_crossdevice
    from tf_crossdevice.cluster import _in_graph as multi_worker

    replicas = multi_worker.WorkerReplicas(job["cluster"])
    inputs = make_inputs(0, replicas.num_replicas)
    for case in job["cases"]:
        spec = case["spec"]
        ops = tf_crossdevice.MultiWorkerAllReduce(
            replicas.worker_devices,
            0,
            tuple(spec) if isinstance(spec, list) else spec,
            compression=case["codec"],
        )

        @tf.function(autograph=False)
        def step(ops=ops):
            values = [
                replicas.per_replica(lambda r, a=arrays: tf.constant(a[r]))
                for arrays in inputs
            ]
            reduced = ops.batch_reduce("sum", [(v, None) for v in values])
            return [list(r.values) for r in reduced]

        graph = step.get_concrete_function().graph
        out = replicas.run(step, timeout_seconds=120)
        _processes.reply(
            {
                "name": case["name"],
                "results": [[c.numpy().tolist() for c in r] for r in out],
                "dtypes": [[c.dtype.name for c in r] for r in out],
                "crossing": cross_worker_tensors(graph),
            }
        )


@pytest.fixture(scope="module")
def results():
    cases = [
        {"name": f"{spec_name}-{codec}", "spec": spec, "codec": codec}
        for spec_name, spec in SPECS.items()
        for codec in CODECS
    ]
    with cluster.start_local_cluster(2) as c:
        job = {"cluster": c.cluster_spec.as_dict(), "cases": cases}
        with _processes.start_module(
            "tests.compression.compression_multi_worker_test",
            name="client",
            cwd=ROOT,
        ) as client:
            client.send(job)
            lines = [client.receive(timeout=300) for _ in cases]
            assert client.wait(timeout=60) == 0, client.stderr_text(3000)
    return {line["name"]: line for line in lines}


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("spec_name", list(SPECS))
def test_sums_equal_numpy_within_the_documented_bound(
    results, spec_name, codec
):
    got = results[f"{spec_name}-{codec}"]
    inputs = make_inputs(0, 2)
    for k, arrays in enumerate(inputs):
        dtype = arrays[0].dtype
        want = np.sum(np.asarray(arrays, np.float64), axis=0)
        assert got["dtypes"][k] == [dtype.name] * 2
        values = [np.asarray(r, np.float64) for r in got["results"][k]]
        np.testing.assert_array_equal(values[0], values[1])  # Same bits.
        if dtype.kind == "i":
            np.testing.assert_array_equal(values[0], want)
            continue
        eps = np.finfo(dtype).eps
        u = U.get(codec, 0.0) + (2.0**-23 if dtype == np.float64 else 0)
        rounds = ROUNDINGS[spec_name]
        magnitude = np.sum(np.abs(np.asarray(arrays, np.float64)), axis=0)
        bound = ((1 + u) ** rounds - 1 + 2 * eps) * magnitude
        bound += rounds * 2.0**-38 * magnitude.max() if codec else 0
        assert np.all(np.abs(values[0] - want) <= bound), (spec_name, k)
        if codec:  # The rounding really happened.
            assert np.abs(values[0] - want).max() > 1e-6 * np.abs(want).max()


@pytest.mark.parametrize("codec", ["bf16", "fp16"])
@pytest.mark.parametrize("spec_name", list(SPECS))
def test_bytes_crossing_workers_halve_and_are_16_bit(results, spec_name, codec):
    plain = results[f"{spec_name}-None"]["crossing"]
    compressed = results[f"{spec_name}-{codec}"]["crossing"]
    wire = {"bf16": "bfloat16", "fp16": "float16"}[codec]
    plain_float = sum(b for d, b in plain if d.startswith("float"))
    plain_int = sum(b for d, b in plain if d == "int64")
    assert plain_float > 0 and plain_int > 0
    assert {d for d, _ in compressed} <= {wire, "float32", "int64"}
    # Every float32/float64 payload is 16-bit now; fp16 adds 4-byte scales,
    # bf16 of float64 too. Halving float32 and quartering float64 bytes:
    sizes = dict.fromkeys(("float32", "float64"), 0)
    for d, b in plain:
        if d in sizes:
            sizes[d] += b
    want = sizes["float32"] // 2 + sizes["float64"] // 4
    got_16 = sum(b for d, b in compressed if d == wire)
    scales = [b for d, b in compressed if d == "float32"]
    assert got_16 == want
    assert all(b == 4 for b in scales)
    assert sum(b for d, b in compressed if d == "int64") == plain_int


if __name__ == "__main__":
    _processes.exit_when_parent_goes()
    tf.get_logger().setLevel("ERROR")
    run_client(next(_processes.commands()))
