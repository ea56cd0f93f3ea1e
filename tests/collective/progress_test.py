"""Progress marks name the collective a step waits in: in one process, a
2-member all-reduce whose second member comes late is in flight (its
counter odd, its description in the report's sentence) until the second
member joins; the sums are numpy's; steps traced outside `marking()`
carry no marks."""

from __future__ import annotations

import threading
import time

import numpy as np
import tensorflow as tf

from tf_crossdevice import testing
from tf_crossdevice._core import tf_internal
from tf_crossdevice.collective import _progress

GROUP_KEY = 9301  # Keys of this test's own: no other test uses them.
INSTANCE_KEY = 9302


def member(device: str, value: float, marked: bool):
    """A tf.function: one member's all-reduce of [value] * 4 on `device`."""

    @tf.function
    def step():
        with tf.device(device):
            return _progress.launch(
                device,
                tf_internal.collective_ops().all_reduce_v2,
                tf.fill([4], value),
                group_size=2,
                group_key=GROUP_KEY,
                instance_key=INSTANCE_KEY,
                name="test_all_reduce",
            )

    if not marked:
        return step
    with _progress.marking():
        step.get_concrete_function()  # Traced here: marked.
    return step


def test_a_late_member_leaves_the_first_in_flight_until_it_joins():
    first_device, second_device = testing.cpu_devices(2)
    first = member(first_device, 1.0, marked=True)
    second = member(second_device, 2.0, marked=False)
    assert _progress.describe_in_flight() == ""
    results = {}
    thread = threading.Thread(target=lambda: results.update(a=first()))
    thread.start()
    deadline = time.monotonic() + 30
    while not _progress.in_flight():
        assert time.monotonic() < deadline, "the mark never showed"
        time.sleep(0.05)
    time.sleep(0.3)
    ((mark, total),) = _progress.in_flight()
    assert (mark.index, total, mark.device) == (1, 1, first_device)
    assert _progress.describe_in_flight() == (
        "It waits in collective 1 of 1 on its device: all-reduce "
        f"'test_all_reduce' of float32[4] (16 B) on {first_device}."
    )
    assert thread.is_alive()  # Still waiting for the second member.
    np.testing.assert_array_equal(second().numpy(), [3.0] * 4)
    thread.join(30)
    np.testing.assert_array_equal(results["a"].numpy(), [3.0] * 4)
    assert _progress.in_flight() == []
    assert int(mark.counter.read_value()) == 2  # In, then out.


def test_steps_traced_outside_marking_carry_no_marks():
    before = len(_progress._marks)

    @tf.function
    def step():
        return _progress.launch("/cpu:0", tf.identity, tf.ones([2]))

    np.testing.assert_array_equal(step().numpy(), [1.0, 1.0])
    assert len(_progress._marks) == before
    graph = step.get_concrete_function().graph
    assert not [op for op in graph.get_operations() if "AssignAdd" in op.type]
