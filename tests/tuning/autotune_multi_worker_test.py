"""autotune across 2 real worker processes: in-graph MultiWorkerAllReduce.

The client (tests/autotune_client.py) runs in its own process, since it
connects to the cluster; the cluster and client are stopped when the test
ends, also on failure.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests import autotune_client
from tf_crossdevice.cluster import _local as cluster
from tf_crossdevice.cluster import processes as _processes

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
GRADIENTS = [[[3, 4], "float32"], [[50], "float32"], [[5], "int64"]]


def test_autotune_across_two_workers_sums_like_numpy(tmp_path):
    with cluster.start_local_cluster(2, cpus_per_worker=2) as workers:
        job = {
            "cluster": workers.cluster_spec.as_dict(),
            "gradients": GRADIENTS,
            "budget_seconds": 4,
            "replicas_per_worker": 2,
            "cache_dir": str(tmp_path),
        }
        with _processes.start_module(
            "tests.autotune_client", name="autotune client", cwd=ROOT
        ) as client:
            client.send(job)
            reply = client.receive(timeout=300)
            assert client.wait(timeout=60) == 0, client.stderr_text(3000)
    assert reply["class"] == "MultiWorkerAllReduce"
    assert reply["config"][0] == "MultiWorkerAllReduce"
    assert reply["workers"] == [
        "/job:worker/replica:0/task:0",
        "/job:worker/replica:0/task:1",
    ]
    timed = [m for m in reply["measurements"] if m[2] is not None]
    assert timed and all(verified for _, verified, _, _ in timed)
    assert reply["second_from_cache"]
    devices = [
        f"/job:worker/replica:0/task:{t}/device:CPU:{i}"
        for t in (0, 1)
        for i in (0, 1)
    ]
    inputs = autotune_client.make_inputs(GRADIENTS, 4)
    for k, per_replica in enumerate(inputs):
        want = np.sum(per_replica, axis=0)
        assert reply["devices"][k] == devices
        for got in reply["results"][k]:
            np.testing.assert_array_equal(np.asarray(got, want.dtype), want)
