"""A worker of periodic_sync_test's jobs (started by it, not pytest).

    python -m tests.periodic_sync_worker COMMAND FOLDER

Each worker of the 2-worker job (`TF_CONFIG` from the test) gives itself
`LOCAL_DEVICES` logical CPUs and trains, under
`tf_crossdevice.MultiWorkerMirroredStrategy`, a linear model without bias
(`INITIAL_KERNEL`) on the mean squared error with Keras SGD with momentum,
for `STEPS` steps wrapped by `tf_crossdevice.training.LocalSGD` or `DiLoCo`
(`WARMUP_STEPS` synchronous steps, then a sync every `PERIOD` steps).
Global replica g (worker g // LOCAL_DEVICES) trains at step s on
`batch(s, g)`; each worker's targets come from its own true kernel, so two
workers left alone drift apart. Commands:

- cases: for each of `KINDS` x `MODES` ("loop": a custom loop whose step,
  `strategy.run` of a replica step with `tf.nn.compute_average_loss`, is
  wrapped by `helper.wrap`; "fit": Keras `model.fit` with "mse" and
  `callbacks=[helper.callback()]`) replies
  {"kind", "mode", "kernels": [per step: [per local replica]],
  "steps_done"}. The DiLoCo loop also checkpoints at the sync after
  `CHECKPOINT_STEP` steps into FOLDER (see `loop`): the uninterrupted run.
- preempted: the DiLoCo loop again, checkpointing into FOLDER, replies
  after `PREEMPTED_AFTER` steps (mid-period) and exits at once.
- restored: restores the DiLoCo loop from FOLDER's checkpoint, replays the
  steps after it on the same data and replies
  {"restored_steps_done", "kernels": [per replayed step: [...]]}.

The data and constants live here without TensorFlow, so that the test
computes its numpy reference from the same numbers.
"""

from __future__ import annotations

import os
import sys

import numpy as np

NUM_WORKERS = 2
LOCAL_DEVICES = 2
REPLICAS = NUM_WORKERS * LOCAL_DEVICES
BATCH = 4  # Examples of each replica in each step.
FEATURES = 3
LEARNING_RATE = 0.1
MOMENTUM = 0.5  # The inner optimizer's: its state is each worker's own.
WARMUP_STEPS = 1
PERIOD = 2
STEPS = WARMUP_STEPS + 2 * PERIOD  # Syncs after steps 3 and 5.
CHECKPOINT_STEP = 3  # The first sync.
PREEMPTED_AFTER = 4  # Mid-period.
KINDS = ("local_sgd", "diloco")
MODES = ("loop", "fit")
INITIAL_KERNEL = np.array([[0.5], [-0.25], [1.0]], np.float32)
# Far apart, so that the workers' local steps pull their weights apart.
TRUE_KERNELS = (
    np.array([[1.0], [2.0], [-1.0]], np.float32),
    np.array([[-2.0], [0.5], [1.5]], np.float32),
)
TIMEOUT_SECONDS = 30.0


def worker_of(replica: int) -> int:
    return replica // LOCAL_DEVICES


def batch(step: int, replica: int) -> tuple[np.ndarray, np.ndarray]:
    """Global replica `replica`'s (x, y) at `step` (0-based)."""
    rng = np.random.default_rng(1000 * step + replica)
    x = rng.normal(size=(BATCH, FEATURES)).astype(np.float32)
    noise = 0.1 * rng.normal(size=(BATCH, 1))
    y = x @ TRUE_KERNELS[worker_of(replica)] + noise
    return x, y.astype(np.float32)


# ---- Everything below runs in the worker only ------------------------------


def main(argv: list[str]) -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    import tf_crossdevice

    tf_crossdevice.testing.request_cpu_devices(LOCAL_DEVICES)
    command, folder = argv
    if command == "cases":
        for kind in KINDS:
            for mode in MODES:
                if mode == "fit":
                    kernels, steps_done = fit(kind)
                else:
                    # The DiLoCo loop is also the uninterrupted run.
                    checkpoint = folder if kind == "diloco" else None
                    kernels, steps_done = loop(kind, checkpoint)
                processes.reply(
                    {
                        "kind": kind,
                        "mode": mode,
                        "kernels": kernels,
                        "steps_done": steps_done,
                    }
                )
        return 0
    if command == "preempted":
        kernels, _ = loop("diloco", folder, stop_after=PREEMPTED_AFTER)
        processes.reply({"kernels": kernels})
        # Preempted mid-period: no checkpoint since the last sync, no
        # clean-up.
        os._exit(0)
    if command == "restored":
        kernels, restored = loop("diloco", folder, restore=True)
        processes.reply({"kernels": kernels, "restored_steps_done": restored})
        return 0
    raise ValueError(f"COMMAND: unknown {command!r}")


def make_strategy():
    import tensorflow as tf

    import tf_crossdevice

    return tf_crossdevice.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=TIMEOUT_SECONDS
        ),
        local_devices=[f"/cpu:{i}" for i in range(LOCAL_DEVICES)],
    )


def build_model():
    import keras

    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(
                1,
                use_bias=False,
                kernel_initializer=keras.initializers.Constant(INITIAL_KERNEL),
            ),
        ]
    )


def inner_optimizer():
    import keras

    return keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)


def make_helper(kind: str, variables):
    import tf_crossdevice

    helper = {
        "local_sgd": tf_crossdevice.training.LocalSGD,
        "diloco": tf_crossdevice.training.DiLoCo,
    }[kind]
    return helper(variables, period=PERIOD, warmup_steps=WARMUP_STEPS)


def local_kernels(strategy, model) -> list[list[list[float]]]:
    """The kernel on each of this worker's replicas."""
    kernel = model.layers[0].kernel
    return [
        np.asarray(v).tolist()
        for v in strategy.experimental_local_results(kernel.value)
    ]


def loop(
    kind: str,
    folder: str | None,
    stop_after: int = STEPS,
    restore: bool = False,
) -> tuple[list, int]:
    """A custom loop; returns the kernels after each step it ran and the
    steps done (restore: the steps done that it restored).

    With `folder`, the chief writes `tf.train.Checkpoint(model, sync=
    helper)` to FOLDER/shared and every worker its inner optimizer to
    FOLDER/inner_TASK, at the sync after `CHECKPOINT_STEP` steps;
    `restore` reads them and runs the steps after it."""
    import keras
    import tensorflow as tf

    strategy = make_strategy()
    task = strategy.cluster_resolver.task_id
    with strategy.scope():
        model = build_model()
        optimizer = inner_optimizer()
        # Built before a restore can fill its momentum.
        optimizer.build(model.trainable_variables)
        helper = make_helper(kind, model.trainable_variables)
    shared = tf.train.Checkpoint(model=model, sync=helper)
    inner = tf.train.Checkpoint(optimizer=optimizer)
    shared_path = os.path.join(folder or "", "shared", "ckpt")
    inner_path = os.path.join(folder or "", f"inner_{task}", "ckpt")
    first_step = 0
    if restore:
        shared.read(shared_path).assert_existing_objects_matched()
        inner.read(inner_path).assert_existing_objects_matched()
        first_step = int(helper.steps_done.numpy())

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = keras.losses.mean_squared_error(y, model(x))
            loss = tf.nn.compute_average_loss(per_example)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(
            zip(grads, model.trainable_variables, strict=True)
        )

    def step(x, y):
        strategy.run(replica_step, args=(x, y))

    train_step = helper.wrap(step)

    def inputs(step: int, part: int):
        def value_fn(context):
            replica = context.replica_id_in_sync_group
            if worker_of(replica) != task:
                raise AssertionError(
                    f"task {task} got global replica {replica}"
                )
            return tf.constant(batch(step, replica)[part])

        return strategy.experimental_distribute_values_from_function(value_fn)

    kernels = []
    for s in range(first_step, stop_after):
        train_step(inputs(s, 0), inputs(s, 1))
        kernels.append(local_kernels(strategy, model))
        if folder is not None and not restore and s + 1 == CHECKPOINT_STEP:
            assert helper.is_sync_step(s + 1)
            if task == 0:
                shared.write(shared_path)
            inner.write(inner_path)
    return kernels, (first_step if restore else int(helper.steps_done.numpy()))


def fit(kind: str) -> tuple[list, int]:
    """Keras `model.fit`, one epoch of `STEPS` steps; returns the kernels
    after each step and the steps done."""
    import keras
    import tensorflow as tf

    strategy = make_strategy()

    def dataset_fn(context):
        """This worker's replicas' batches, step by step: the worker's
        share of each step, whichever of its replicas takes which."""
        per_replica = context.get_per_replica_batch_size(REPLICAS * BATCH)
        assert per_replica == BATCH, per_replica
        worker = context.input_pipeline_id
        xs, ys = [], []
        for s in range(STEPS):
            for local in range(LOCAL_DEVICES):
                x, y = batch(s, worker * LOCAL_DEVICES + local)
                xs.append(x)
                ys.append(y)
        return tf.data.Dataset.from_tensor_slices(
            (np.concatenate(xs), np.concatenate(ys))
        ).batch(BATCH)

    with strategy.scope():
        model = build_model()
        model.compile(optimizer=inner_optimizer(), loss="mse")
        helper = make_helper(kind, model.trainable_variables)
    kernels = []

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            kernels.append(local_kernels(strategy, model))

    model.fit(
        strategy.distribute_datasets_from_function(dataset_fn),
        epochs=1,
        verbose=0,
        # After the helper's callback: its sync is done when Record reads.
        callbacks=[helper.callback(), Record()],
    )
    return kernels, int(helper.steps_done.numpy())


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv[1:]))
