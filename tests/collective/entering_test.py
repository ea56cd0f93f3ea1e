"""Watched by a launcher, each collective records its entry in the worker's
heartbeat file (tf_crossdevice.collective._entering): the records run, and
a collective of several local devices still completes."""

import numpy as np
import tensorflow as tf

import tf_crossdevice
from tf_crossdevice._core import heartbeat

DEVICES = tf_crossdevice.testing.cpu_devices(2)


def test_watched_collectives_of_two_devices_complete_and_are_recorded(
    watched_heartbeat,
):
    path = watched_heartbeat
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=tf_crossdevice.CollectiveAllReduce(
            options=tf.distribute.experimental.CommunicationOptions(
                timeout_seconds=20
            )
        ),
        local_devices=DEVICES,
    )

    def replica():
        ctx = tf.distribute.get_replica_context()
        return tf.fill([3], tf.cast(ctx.replica_id_in_sync_group, tf.float32))

    @tf.function
    def gather():
        # Two all-gathers per device (the rows, then the padded values): a
        # device's second record waits for its first all-gather, which
        # waits for the other device's first record.
        return strategy.gather(strategy.run(replica), axis=0)

    before = heartbeat.read_progress(str(path)).entered
    np.testing.assert_array_equal(gather(), [0, 0, 0, 1, 1, 1])
    progress = heartbeat.read_progress(str(path))
    assert progress.entered - before == 4
    assert progress.collective.startswith(
        "all_gather in CollectiveAllReduce, instance key "
    )
