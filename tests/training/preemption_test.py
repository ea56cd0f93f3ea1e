"""PreemptionWatcher in one process: the flag, check_every, the handlers.

The agreement between workers (a SIGTERM to one worker of two stops both at
one step) is checked with real workers by
tests/examples/examples_test.py's preempted collective job.
"""

from __future__ import annotations

import signal
import threading

import pytest
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice.training import PreemptionWatcher


def test_a_signal_stops_at_the_next_agreement():
    with PreemptionWatcher(check_every=3) as watcher:
        signal.raise_signal(signal.SIGTERM)
        assert watcher.received
        # Calls 1 and 2 do not agree; call 3 does, and later calls say so.
        assert [watcher.should_stop() for _ in range(5)] == [
            False, False, True, True, True,
        ]  # fmt: skip


def test_one_worker_strategy_stops_on_its_own_flag():
    strategy = tf.distribute.MirroredStrategy(
        tf_crossdevice.testing.cpu_devices(2),
        cross_device_ops=tf_crossdevice.ReductionToOneDevice(),
    )
    with PreemptionWatcher(strategy) as watcher:
        assert not any(watcher.should_stop() for _ in range(4))
        assert not watcher.received
        signal.raise_signal(signal.SIGTERM)
        assert watcher.should_stop()


def test_close_puts_the_previous_handlers_back():
    seen = []
    before = signal.signal(signal.SIGUSR1, lambda *_: seen.append(1))
    try:
        mine = signal.getsignal(signal.SIGUSR1)
        with PreemptionWatcher(signals=[signal.SIGUSR1]) as watcher:
            signal.raise_signal(signal.SIGUSR1)
            assert watcher.should_stop() and not seen
        assert signal.getsignal(signal.SIGUSR1) is mine
        watcher.close()  # Again: nothing to do.
        signal.raise_signal(signal.SIGUSR1)
        assert seen == [1]
    finally:
        signal.signal(signal.SIGUSR1, before)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"check_every": 0}, ValueError, r"check_every"),
        ({"check_every": 1.5}, TypeError, r"check_every"),
        ({"signals": []}, ValueError, r"signals: empty"),
        (
            {"signals": [signal.SIGTERM, 12345]},
            ValueError,
            r"signals\[1\]: 12345 is not a signal; expected e\.g\. "
            r"signal\.SIGTERM",
        ),
        (
            {"workers": ["/job:worker/replica:0/task:0"]},
            TypeError,
            r"workers: expected None or a tf_crossdevice\.cluster\."
            r"WorkerReplicas",
        ),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        PreemptionWatcher(**kwargs)


def test_outside_the_main_thread_is_refused():
    errors = []

    def create():
        try:
            PreemptionWatcher()
        except ValueError as e:
            errors.append(str(e))

    thread = threading.Thread(target=create)
    thread.start()
    thread.join()
    assert errors and "main thread" in errors[0]
