"""How many collectives a batch of many small values becomes, by default.

The new name packs by size (`tf_crossdevice.packing.DEFAULT_BYTES_PER_PACK`,
measured fastest between hosts); TF 1's name keeps TF 1's default of 32
values per collective; `all_reduce_merge_scope` given to the new name
groups by count as TF 1 did. Counted in the traced graph of one
`batch_reduce` on two local devices (one collective group).
"""

from __future__ import annotations

import pytest
import tensorflow as tf

import tf_crossdevice
import tf_crossdevice.compat
from tf_crossdevice.packing import DEFAULT_BYTES_PER_PACK

DEVICES = tf_crossdevice.testing.cpu_devices(2)
# 40 values of 4 KiB: one default pack, two merge scopes of 32.
VALUES = 40


def collectives_per_device(ops, count=VALUES, elements=1024) -> int:
    def pair(k):
        value = tf_crossdevice.testing.per_replica(
            [tf.fill([elements], float(k + d)) for d in range(len(DEVICES))],
            DEVICES,
        )
        return value, value

    @tf.function
    def step():
        return ops.batch_reduce("sum", [pair(k) for k in range(count)])

    graph = step.get_concrete_function().graph
    ops_found = [
        op for op in graph.get_operations() if op.type == "CollectiveReduceV2"
    ]
    assert len(ops_found) % len(DEVICES) == 0
    return len(ops_found) // len(DEVICES)


@pytest.mark.filterwarnings("ignore:tf_crossdevice.compat:DeprecationWarning")
@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: tf_crossdevice.CollectiveAllReduce(), 1),
        (lambda: tf_crossdevice.compat.CollectiveAllReduce(), 2),
        (
            lambda: tf_crossdevice.CollectiveAllReduce(
                all_reduce_merge_scope=32
            ),
            2,
        ),
        (
            lambda: tf_crossdevice.CollectiveAllReduce(
                all_reduce_merge_scope=8
            ),
            5,
        ),
    ],
    ids=["default", "tf1_name", "merge_scope_32", "merge_scope_8"],
)
def test_collectives_per_device(make, expected):
    assert collectives_per_device(make()) == expected


def test_default_packs_close_past_the_default_size():
    # Five values of 3/4 of the default size: a pack closes once it holds
    # more than the default, so after two values (1.5x): 2 + 2 + 1.
    elements = DEFAULT_BYTES_PER_PACK * 3 // 4 // 4
    ops = tf_crossdevice.CollectiveAllReduce()
    assert collectives_per_device(ops, count=5, elements=elements) == 3
