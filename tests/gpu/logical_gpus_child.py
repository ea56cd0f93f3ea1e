"""One child of gpu_logical_gpus_test.py: GPU:0 split into N logical GPUs.

    python -m tests.gpu.logical_gpus_child N      # from the repository root

TensorFlow fixes its devices when it initialises, so each device count needs
a process of its own. The child splits GPU:0 into N logical GPUs and
answers (`processes.reply`) first with what it has:

    {"devices": [...], "links": {device: [ids]},
     "selected": "NcclAllReduce(num_packs=1)"}

("selected": `tf_crossdevice.select_cross_device_ops` of the N devices,
from the links TensorFlow reports between them), then once per entry of
`CHECKS`, in order, with {"check": name, "problem": None or what went
wrong}: the contract's all-reduce case (`gpu_util.all_reduce_problem`) on
all N GPUs, then {"done": true}. The entries that may take NCCL come last,
so that a crash there (NCCL refuses two ranks on one GPU) loses no other.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import tensorflow as tf

import tf_crossdevice
from tests.gpu import gpu_util
from tf_crossdevice._core import tf_internal
from tf_crossdevice.cluster import processes

SELECTED = "select_cross_device_ops"
RING = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING
)
CHECKS: dict[str, Callable[[], tf.distribute.CrossDeviceOps] | None] = {
    "HierarchicalCopyAllReduce": tf_crossdevice.HierarchicalCopyAllReduce,
    "HierarchicalCopyAllReduce(num_packs=0)": (
        lambda: tf_crossdevice.HierarchicalCopyAllReduce(num_packs=0)
    ),
    "ReductionToOneDevice": tf_crossdevice.ReductionToOneDevice,
    "SpecAllReduce(psgpu)": lambda: tf_crossdevice.SpecAllReduce("psgpu"),
    "CollectiveAllReduce(RING)": (
        lambda: tf_crossdevice.CollectiveAllReduce(options=RING)
    ),
    # Logical GPUs of one GPU are not distinct GPUs: NCCL cannot run there
    # and NcclAllReduce has to sum on one device instead.
    "NcclAllReduce": tf_crossdevice.NcclAllReduce,
    SELECTED: None,  # what select_cross_device_ops returned
}


def main(n: int) -> None:
    gpu_util.split_gpu(n)
    devices = gpu_util.gpu_names(n)
    selected = tf_crossdevice.select_cross_device_ops(devices)
    processes.reply(
        {
            "devices": devices,
            "links": tf_internal.local_gpu_links(),
            "selected": gpu_util.describe_ops(selected),
        }
    )
    for name, make in CHECKS.items():
        problem = gpu_util.all_reduce_problem(make or (lambda: selected), n)
        processes.reply({"check": name, "problem": problem})
    processes.reply({"done": True})


if __name__ == "__main__":
    processes.exit_when_parent_goes()
    main(int(sys.argv[1]))
