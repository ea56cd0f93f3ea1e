"""MultiWorkerAllReduce passes the contract on the local process's devices.

Its workers here are the local process ('/job:localhost/replica:0/task:0'),
so the two-level spec reduces inside it and then across one device; the
runs across real worker processes are in multi_worker_test.py.
"""

from __future__ import annotations

import tf_crossdevice
from tests import contract


class TestMultiWorkerAllReduceOnTheLocalWorker(contract.CrossDeviceOpsContract):
    def make_ops(self):
        return tf_crossdevice.MultiWorkerAllReduce(
            ["/job:localhost/replica:0/task:0"], 0, "pscpu/pscpu#2"
        )
