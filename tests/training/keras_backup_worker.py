"""One worker of a Keras `model.fit` job with `BackupAndRestore`.

Run by backup_and_restore_test.py as each worker of a 2-worker job (its
`TF_CONFIG` from `tf_crossdevice.launch.tf_config_envs`):

    python keras_backup_worker.py BACKUP_DIR OUT_DIR [PAUSE_EPOCH]

It trains a small dense model under `tf_crossdevice.MultiWorkerMirroredStrategy`
(2 logical CPU devices per worker) for `EPOCHS` epochs of the same batches,
backing up into BACKUP_DIR/task_i, prints "epoch e begins" for each epoch it
runs, and the chief writes the weights before training to
OUT_DIR/initial.npz and the final ones to OUT_DIR/weights.npz. With
PAUSE_EPOCH, every worker prints "paused in epoch e" after the third batch
of that epoch and waits there (for the test to kill a worker mid-epoch).
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

EPOCHS = 5
BATCHES_PER_EPOCH = 6
GLOBAL_BATCH = 8
LR = 0.05


def examples() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCHES_PER_EPOCH * GLOBAL_BATCH, 6))
    y = x @ rng.normal(size=(6, 2)) + 0.1
    return x.astype(np.float32), y.astype(np.float32)


def data() -> tf.data.Dataset:
    """The same batches in every epoch: a restart sees the same data."""
    return tf.data.Dataset.from_tensor_slices(examples()).batch(GLOBAL_BATCH)


def main(backup_dir: str, out_dir: str, pause_epoch: int | None) -> int:
    import keras

    import tf_crossdevice

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2
    )
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=60
        ),
        local_devices=["/cpu:0", "/cpu:1"],
    )
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(4), keras.layers.Dense(2)]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(LR, momentum=0.9),
            loss="mse",
            jit_compile=False,
        )

    if task == 0:
        np.savez(os.path.join(out_dir, "initial.npz"), *model.get_weights())

    class Announce(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch
            print(f"epoch {epoch} begins", flush=True)

        def on_train_batch_end(self, batch, logs=None):
            if self.epoch == pause_epoch and batch == 2:
                print(f"paused in epoch {pause_epoch}", flush=True)
                time.sleep(600)

    announce = Announce()
    model.fit(
        data(),
        epochs=EPOCHS,
        callbacks=[
            # Each worker its own folder: Keras 3 writes the backup from
            # every worker, and two workers on one file system would write
            # one file at once.
            keras.callbacks.BackupAndRestore(
                os.path.join(backup_dir, f"task_{task}")
            ),
            announce,
        ],
        verbose=0,
    )
    if task == 0:
        np.savez(os.path.join(out_dir, "weights.npz"), *model.get_weights())
        print("weights written", flush=True)
    return 0


if __name__ == "__main__":
    pause = int(sys.argv[3]) if len(sys.argv) > 3 else None
    sys.exit(main(sys.argv[1], sys.argv[2], pause))
