"""The example job's training loops: under a strategy, and in-graph.

`train_with_strategy` trains under `tf.distribute.MirroredStrategy` or
`tf_crossdevice.MultiWorkerMirroredStrategy` with Keras `model.fit` or a
custom loop of `strategy.run` steps; the custom loop can split each global
batch into micro-batches and all-reduce once per update
(`tf_crossdevice.GradientAccumulator`). `train_in_graph` is the controller of
an in-graph job: it keeps one copy of the model per replica on the
workers' devices and all-reduces their gradients with
`tf_crossdevice.MultiWorkerAllReduce` inside one `tf.function` per step.

Both save a checkpoint (weights, optimizer state, step) at every progress
line and at the end, and resume from the latest one in the model folder.
On SIGTERM (a preemption) to any worker, or to the in-graph controller,
every worker stops at one agreed step
(`tf_crossdevice.training.PreemptionWatcher`), saves a checkpoint there and
returns; the next run resumes from it, mid-epoch in model.fit too.

With --timeline, every worker of `train_with_strategy` profiles one step
(`tf_crossdevice.training.profile_step`) and writes its trace; after
training, when every worker has written its own, the chief merges those on
its machine (train_report.timeline_report).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf
import train_data
import train_models
import train_report
import train_timing

import tf_crossdevice
from tf_crossdevice import launch

MOMENTUM = 0.9
_EVAL_BATCH = 256
_MEAN_LOSS = "mean_loss"  # model.fit's loss metric with --uneven_data.


@dataclasses.dataclass(frozen=True)
class SyncConfig:
    """--sync and its flags: how often the workers' weights meet."""

    how: str = "every_step"  # every_step, local_sgd or diloco
    period: int = 1
    warmup_steps: int = 0
    outer_learning_rate: float = 0.7
    outer_momentum: float = 0.9
    # What all-reduces the syncs (None: the strategy's).
    cross_device_ops: Any = None


@dataclasses.dataclass
class Config:
    """What every loop needs from the flags."""

    loop: str
    model: str
    depth: int
    width: int
    steps: int
    batch_size: int
    learning_rate: float
    log_every: int
    seed: int
    model_dir: str
    timeout_seconds: float
    # Micro-batches per update in the custom loop (1: no accumulation).
    accumulation_steps: int = 1
    # A PowerSGD compressor whose state (each replica's error, Q) is this
    # worker's own, saved and restored beside the model's checkpoint.
    compression_state: Any = None
    # After training, steps timed on this host alone and all-reduces timed
    # alone (train_timing; 0: none).
    timing_steps: int = 0
    # In-graph: the first worker's CPU clock, where the controller started
    # that worker (None: not known here).
    worker_cpu_seconds: Callable[[], float] | None = None
    # --timeline: the trace's path ("": none) and the step it traces; this
    # worker's index among the job's workers (the file's name).
    timeline: str = ""
    timeline_step: int = 0
    worker: int = 0
    num_workers: int = 1
    # --uneven_data: the last worker's data ends early
    # (train_data.uneven_stop; None: every worker has every step's data).
    uneven_data: float | None = None
    # --lr_schedule: "constant" or "cosine" (to 0 at `steps`).
    lr_schedule: str = "constant"
    sync: SyncConfig = dataclasses.field(default_factory=SyncConfig)
    # --eval_every: the chief scores the held-out examples at every
    # checkpoint of a multiple of this (0: only at the end).
    eval_every: int = 0


def _periodic_sync(config: Config, model: keras.Model) -> Any:
    """--sync=local_sgd or diloco: the helper that syncs the workers every
    --sync_period steps (create under the strategy's scope); else None."""
    sync = config.sync
    if sync.how == "every_step":
        return None
    variables = model.trainable_variables
    if sync.how == "local_sgd":
        return tf_crossdevice.training.LocalSGD(
            variables, sync.period, sync.warmup_steps, sync.cross_device_ops
        )
    outer = keras.optimizers.SGD(
        sync.outer_learning_rate, momentum=sync.outer_momentum, nesterov=True
    )
    return tf_crossdevice.training.DiLoCo(
        variables, sync.period, sync.warmup_steps, outer,
        sync.cross_device_ops,
    )  # fmt: skip


def _learning_rate(config: Config) -> Any:
    """The optimizer's rate: a number, or a schedule of its step (which the
    checkpoint restores, so a restarted job goes on down the same curve)."""
    if config.lr_schedule == "cosine":
        return keras.optimizers.schedules.CosineDecay(
            config.learning_rate, config.steps
        )
    return config.learning_rate


def build_model(config: Config, data: train_data.Data) -> keras.Model:
    keras.utils.set_random_seed(config.seed)
    return train_models.build(
        config.model, data.image_size, data.num_classes, config.depth,
        config.width,
    )  # fmt: skip


def _loss_fn() -> keras.losses.Loss:
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"
    )


def _value(variable: Any) -> Any:
    """The TensorFlow variable under a Keras variable."""
    return getattr(variable, "value", variable)


def _print_eval(step: int, model: keras.Model, data: train_data.Data) -> None:
    """--eval_every: the chief's held-out accuracy at a checkpoint, and how
    long it took (a benchmark of accuracy against time subtracts it)."""
    began = time.monotonic()
    accuracy = _eval_accuracy(lambda x: model(x, training=False), data)
    print(
        f"held-out accuracy at step {step}: {accuracy:.4f} "
        f"({len(data.eval_labels)} examples, "
        f"{time.monotonic() - began:.3f} s)",
        flush=True,
    )


def _eval_accuracy(predict: Any, data: train_data.Data) -> float:
    correct = 0
    for i in range(0, len(data.eval_labels), _EVAL_BATCH):
        logits = predict(data.eval_images[i : i + _EVAL_BATCH])
        guess = np.argmax(np.asarray(logits), axis=1)
        correct += int(np.sum(guess == data.eval_labels[i : i + _EVAL_BATCH]))
    return correct / len(data.eval_labels)


def _checkpoint_dir(model_dir: str, is_chief: bool, task: int) -> str:
    # Every worker saves (as TensorFlow's multi-worker examples do); only the
    # chief's folder is kept, the others write to a scratch folder.
    if is_chief:
        return model_dir
    return os.path.join(model_dir, ".scratch", f"task_{task}")


def _preempted(step: int, steps: int) -> str:
    return (
        f"preempted: checkpoint saved at step {step} of {steps}; run the "
        "same command again to resume"
    )


def train_with_strategy(
    strategy: tf.distribute.Strategy,
    config: Config,
    data: train_data.Data,
    *,
    is_chief: bool,
    task: int,
) -> str:
    """Trains under `strategy`; returns the closing summary.

    Preempted, every worker prints where it saved and this returns "".
    """
    # Before the model, whose variables the workers create together: a
    # SIGTERM that any worker gets after the chief's first line is caught.
    with tf_crossdevice.training.PreemptionWatcher(strategy) as watcher:
        return _train_with_strategy(
            strategy, config, data, is_chief, task, watcher
        )


def _train_with_strategy(strategy, config, data, is_chief, task, watcher):
    global_batch = config.batch_size
    since_us = time.time() * 1e6  # A trace written later is this run's.
    with strategy.scope():
        model = build_model(config, data)
        optimizer = keras.optimizers.SGD(
            _learning_rate(config), momentum=MOMENTUM
        )
        optimizer.build(model.trainable_variables)
        syncing = _periodic_sync(config, model)
        if config.loop == "fit":
            model.compile(
                optimizer=optimizer,
                **_fit_loss_and_metrics(config),
                jit_compile=False,
            )
    # With --sync, saved at syncs only (--log_every is a multiple of the
    # period): the weights are every worker's, and so is the helper's state.
    checkpoint = tf.train.Checkpoint(
        weights=[_value(v) for v in model.weights],
        optimizer=[_value(v) for v in optimizer.variables],
        **({} if syncing is None else {"sync": syncing}),
    )
    save_dir = _checkpoint_dir(config.model_dir, is_chief, task)
    manager = tf.train.CheckpointManager(checkpoint, save_dir, max_to_keep=2)
    latest = tf.train.latest_checkpoint(config.model_dir)
    if latest:
        if is_chief:  # What a restart costs: start-up, then the restore.
            print(f"restoring {latest}", flush=True)
        checkpoint.restore(latest).assert_existing_objects_matched()
    start = int(optimizer.iterations.numpy())
    if is_chief:
        if latest:
            print(f"resumed from step {start} ({latest})", flush=True)
        restart = int(os.environ.get(launch.RESTART_VARIABLE, "0"))
        if restart:
            print(
                f"restart {restart}: {config.num_workers} workers, from step "
                f"{start}; "
                f"global batch {config.batch_size}, learning rate "
                f"{config.learning_rate:g}",
                flush=True,
            )
        params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
        print(
            f"model {model.name}: {params} parameters; "
            f"{strategy.num_replicas_in_sync} replicas; global batch "
            f"{global_batch}; loop={config.loop}",
            flush=True,
        )
    reporter = train_report.Reporter(
        global_batch,
        start,
        config.steps,
        os.path.join(config.model_dir, "train") if is_chief else None,
        verbose=is_chief,
    )
    timeline = _Timeline(config, reporter)

    # Each worker's PowerSGD state differs (its replicas' errors), and with
    # --sync its optimizer's (its own steps between syncs): every worker
    # keeps its own, in a folder of its own, restored over the chief's.
    state_manager = None
    own = {}
    if config.compression_state is not None:
        own["compression"] = config.compression_state
    if syncing is not None:
        own["optimizer"] = [_value(v) for v in optimizer.variables]
    if own:
        state = tf.train.Checkpoint(**own)
        state_manager = tf.train.CheckpointManager(
            state,
            os.path.join(config.model_dir, "compression", f"task_{task}"),
            max_to_keep=2,
        )
        if latest and state_manager.latest_checkpoint:
            state.restore(state_manager.latest_checkpoint)

    def save(step: int) -> None:
        manager.save(checkpoint_number=step)
        if state_manager is not None:
            state_manager.save(checkpoint_number=step)
        if is_chief:
            print(f"checkpoint saved at step {step}", flush=True)
            if config.eval_every and step % config.eval_every == 0:
                _print_eval(step, model, data)

    last_stop = None
    if config.uneven_data is not None:
        last_stop = train_data.uneven_stop(config.steps, config.uneven_data)

    def dataset(first: int, stop: int, micro_steps: int = 1) -> Any:
        return _distributed(
            strategy, data, global_batch, config.seed, first, stop,
            micro_steps, last_stop,
        )  # fmt: skip

    stopped = None
    if start < config.steps:
        if config.loop == "fit":
            stopped = _fit(model, dataset, config, start, reporter, save,
                           watcher, timeline, syncing)  # fmt: skip
        else:
            batches = itertools.islice(
                dataset(start, config.steps, config.accumulation_steps),
                (config.steps - start) * config.accumulation_steps,
            )
            if config.accumulation_steps > 1:
                steps = _accumulating_loop(
                    strategy, model, optimizer, batches, config
                )
            else:
                steps = _custom_loop(
                    strategy, model, optimizer, batches, config, syncing
                )
            stopped = _log_and_save(
                timeline.trace(steps, start),
                start, config, global_batch, reporter, save, watcher,
                syncing,
            )  # fmt: skip
    # The evaluation and the summary below take no steps.
    tf_crossdevice.cluster.end_heartbeats()
    if stopped is not None:
        # Every worker says where it saved; the job's launcher prefixes it.
        print(_preempted(stopped, config.steps), flush=True)
        if not is_chief:
            _remove_scratch(save_dir)
        return ""

    # A gather from every worker: each has written its trace by now.
    replicas_equal = _replicas_equal(strategy, model, config.timeout_seconds)
    if is_chief:
        timeline.report(start, since_us)
    weights = [np.asarray(v.numpy()) for v in model.weights]
    eval_accuracy = _eval_accuracy(lambda x: model(x, training=False), data)
    reporter.write_eval(config.steps, eval_accuracy)
    parts = None
    # The same answers on every worker, so that none waits alone in the
    # timed all-reduces.
    if _can_time(config, reporter, is_chief) and not watcher.should_stop():
        parts = _time_parts(strategy, model, config, data, reporter)
    if not is_chief:
        _remove_scratch(save_dir)
    notes = []
    if config.uneven_data is not None:
        notes.append(
            train_data.uneven_note(
                config.steps, config.uneven_data, config.num_workers
            )
        )
    return train_report.summary(
        reporter,
        eval_accuracy,
        len(data.eval_labels),
        replicas_equal,
        strategy.num_replicas_in_sync,
        train_report.weights_digest(weights),
        config.model_dir,
        parts,
        notes,
    )


def _fit_loss_and_metrics(config: Config) -> dict[str, Any]:
    """model.compile's loss and metrics.

    With --uneven_data the loss divides by the examples present (Keras's
    own divide by every replica's full batch, also the empty batches of a
    worker whose data ran out), and the progress lines read the loss from
    the metric `_MEAN_LOSS`: Keras's loss tracker scales each replica's
    loss up by the replica count, weighted by its batch, which overstates
    the steps where some replicas' batches are empty.
    """
    if config.uneven_data is None:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return {"loss": loss, "metrics": ["accuracy"]}
    return {
        "loss": tf_crossdevice.training.AverageOverExamples(
            _loss_fn(), name="sparse_categorical_crossentropy"
        ),
        "metrics": [
            "accuracy",
            keras.metrics.SparseCategoricalCrossentropy(
                name=_MEAN_LOSS, from_logits=True
            ),
        ],
    }


def _can_time(config, reporter, verbose: bool) -> bool:
    """Whether --timing_steps asks for timing and the run trained the 3
    steps a median step needs; says so (if `verbose`) when it did not."""
    if not config.timing_steps:
        return False
    if reporter.steps_trained >= 3:
        return True
    if verbose:
        print(
            f"--timing_steps: nothing timed; this run trained "
            f"{reporter.steps_trained} steps, fewer than the 3 a median "
            "step needs",
            flush=True,
        )
    return False


def _time_parts(strategy, model, config, data, reporter):
    """The training's step against the same step on this host alone and
    the all-reduce alone (train_timing)."""
    devices = list(strategy.extended.worker_devices)
    batch = config.batch_size * len(devices) // strategy.num_replicas_in_sync
    weights = model.get_weights()
    # Not TensorFlow's default for CPUs, collectives: their group keys,
    # counted from 1 in each strategy, would clash with the job's.
    alone = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    with alone.scope():
        copy = build_model(config, data)
        copy.set_weights(weights)
        optimizer = keras.optimizers.SGD(
            config.learning_rate, momentum=MOMENTUM
        )
        optimizer.build(copy.trainable_variables)
    calls = config.timing_steps
    batches = itertools.islice(
        _distributed(alone, data, batch, config.seed, 0, calls + 1), calls + 1
    )
    steps = _custom_loop(
        alone,
        copy,
        optimizer,
        batches,
        dataclasses.replace(config, batch_size=batch),
    )
    alone_seconds, alone_cores = train_timing.steps_seconds(steps, calls)
    all_reduce, all_reduce_cores = train_timing.all_reduce_seconds(
        strategy, model.trainable_variables, calls
    )
    loss_fn = _loss_fn()

    @tf.function
    def forward(inputs):
        def replica(x, y):
            return tf.reduce_sum(loss_fn(y, copy(x, training=True)))

        return alone.experimental_local_results(alone.run(replica, inputs))

    batches = itertools.islice(
        _distributed(alone, data, batch, config.seed, 0, calls + 1), calls + 1
    )
    forward_seconds, _ = train_timing.steps_seconds(
        (forward(inputs) for inputs in batches), calls
    )
    return train_timing.Parts(
        reporter.median_step_seconds(),
        alone_seconds,
        all_reduce,
        (reporter.step_cores(), alone_cores, all_reduce_cores),
        forward_seconds,
    )


def _distributed(
    strategy, data, global_batch, seed, start, stop, micro_steps=1,
    last_stop=None,
):  # fmt: skip
    """Steps [start, stop) under `strategy`, each input pipeline building
    only its own replicas' examples (train_data.replica_dataset), then the
    same steps again without end: callers take the steps they need.

    Endless because TensorFlow's iterator over a finite dataset between
    workers all-reduces, before every step, whether each worker still has
    data (for a last partial batch): a collective that makes every worker
    wait for the slowest before its step can start. Over an endless one it
    does not.

    With `last_stop` (--uneven_data) the datasets end instead, the last
    worker's before step `last_stop`: that check is what hands its
    replicas empty batches while the others train on.
    """

    def dataset_fn(context):
        dataset = train_data.replica_dataset(
            data, global_batch, seed, start, stop, context, micro_steps,
            last_stop,
        )  # fmt: skip
        return dataset if last_stop is not None else dataset.repeat()

    return strategy.distribute_datasets_from_function(dataset_fn)


def _remove_scratch(save_dir: str) -> None:
    shutil.rmtree(save_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # The last worker's to go.
        os.rmdir(os.path.dirname(save_dir))


def fit_epochs(
    start: int, steps: int, log_every: int
) -> list[tuple[int, int, int]]:
    """The model.fit calls that train steps [start, steps) with one Keras
    epoch per progress line: (first step, epochs, steps per epoch) each.

    Epochs end at the multiples of `log_every` and at `steps`: a run that
    resumes mid-epoch first fits the rest of that epoch, and a last, shorter
    epoch fits the steps after the last multiple.

    >>> fit_epochs(0, 120, 40)
    [(0, 3, 40)]
    >>> fit_epochs(0, 50, 40)
    [(0, 1, 40), (40, 1, 10)]
    >>> fit_epochs(13, 130, 40)  # resumed at step 13
    [(13, 1, 27), (40, 2, 40), (120, 1, 10)]
    >>> fit_epochs(3, 7, 40)
    [(3, 1, 4)]
    """
    calls = []
    step = start
    head = min(-(-start // log_every) * log_every, steps)
    if step < head:
        calls.append((step, 1, head - step))
        step = head
    whole = (steps - step) // log_every
    if whole:
        calls.append((step, whole, log_every))
        step += whole * log_every
    if step < steps:
        calls.append((step, 1, steps - step))
    return calls


def _fit(
    model, dataset, config, start, reporter, save, watcher, timeline,
    syncing=None,
) -> int | None:  # fmt: skip
    """model.fit, one Keras epoch per progress line (`fit_epochs`); the
    step it stopped at when preempted, else None. `timeline` profiles its
    step.

    Raises:
        ValueError: with --uneven_data, a fit call would start after the
            last worker's data ran out (model.fit first reduces a batch of
            every replica, which fails on an empty one).
    """
    loss_key = "loss" if config.uneven_data is None else _MEAN_LOSS

    class Progress(keras.callbacks.Callback):
        step = start
        stopped = None
        tracing = contextlib.ExitStack()

        def on_train_batch_begin(self, batch, logs=None):
            if timeline.wants(self.step + 1):
                self.tracing.enter_context(timeline.profiling(self.step + 1))

        def on_train_batch_end(self, batch, logs=None):
            if timeline.wants(self.step + 1):
                float(logs["loss"])  # Waits for the step's ops.
                self.tracing.close()
            self.step += 1
            reporter.step_done()
            tf_crossdevice.cluster.heartbeat(self.step)  # --stall_seconds
            if (
                self.step < config.steps
                and _may_stop(syncing, self.step)
                and watcher.should_stop()
            ):
                self.stopped = self.step
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            # A preempted epoch ends between the two: saved, not reported.
            if self.step % config.log_every == 0 or self.step == config.steps:
                reporter.record(
                    self.step, float(logs[loss_key]), float(logs["accuracy"])
                )
            save(self.step)

    progress = Progress()
    for first, epochs, steps_per_epoch in fit_epochs(
        start, config.steps, config.log_every
    ):
        if config.uneven_data is not None:
            last_stop = train_data.uneven_stop(config.steps, config.uneven_data)
            if first >= last_stop:
                raise ValueError(
                    f"--uneven_data: model.fit would start at step {first}, "
                    f"after the last worker's data ended at step {last_stop}; "
                    "Keras first reduces a batch of every replica, which "
                    "fails on an empty one: resume with --loop=custom"
                )
        model.fit(
            dataset(first, config.steps),
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            # The sync first: the progress callback saves the synced weights.
            callbacks=[progress]
            if syncing is None
            else [syncing.callback(), progress],
            shuffle=False,
            verbose=0,
        )
        if progress.stopped is not None:
            break
    return progress.stopped


class _Timeline:
    """--timeline: profiles step `config.timeline_step` of this worker,
    writes its trace and, on the chief, the step's scalars; after training,
    the chief reports (train_report.timeline_report)."""

    def __init__(self, config: Config, reporter: train_report.Reporter):
        self.config = config
        self.reporter = reporter

    def wants(self, step: int) -> bool:
        """Whether step `step` (counted from 1) is the one to trace."""
        return bool(self.config.timeline) and step == self.config.timeline_step

    @contextlib.contextmanager
    def profiling(self, step: int) -> Iterator[None]:
        """Profiles the block (step `step`, finished when the block ends),
        then writes the trace and the scalars."""
        config = self.config
        # TensorFlow's own profile, for TensorBoard's profile plugin: one
        # run of the step, each worker a host of it by its own name (the
        # workers of one machine share its host name).
        keep = os.path.join(
            config.model_dir, "plugins", "profile", f"step{step}"
        )
        with tf_crossdevice.training.profile_step(
            f"worker {config.worker}",
            profile_dir=keep,
            profile_host=f"worker{config.worker}",
        ) as profile:
            yield
        summary = train_report.save_timeline(
            profile, config.timeline, step, config.worker, config.num_workers
        )
        self.reporter.write_timeline(
            step, summary, profile.sent_bytes_per_second
        )

    def trace(
        self, steps: Iterable[tuple[Any, Any]], start: int
    ) -> Iterator[tuple[Any, Any]]:
        """`steps` (each a step's loss and correct count, from step
        `start` + 1 on), the one to trace profiled."""
        iterator = iter(steps)
        for step in itertools.count(start + 1):
            traced = self.wants(step)
            with self.profiling(step) if traced else contextlib.nullcontext():
                done = next(iterator, None)
                if traced and done is not None:
                    float(done[0])  # Waits for the step's ops.
            if done is None:
                return
            yield done

    def report(self, start: int, since_us: float) -> None:
        """The chief's report, once every worker has traced the step."""
        config = self.config
        if not config.timeline:
            return
        if not start < config.timeline_step <= config.steps:
            print(
                f"--timeline: step {config.timeline_step} is not among the "
                f"steps {start + 1} to {config.steps} of this run; nothing "
                "traced",
                flush=True,
            )
            return
        lines = train_report.timeline_report(
            config.timeline,
            config.timeline_step,
            config.num_workers,
            since_us,
            config.model_dir,
        )
        print("\n".join(lines), flush=True)


def _custom_loop(
    strategy, model, optimizer, batches, config, syncing=None
) -> Iterator[tuple[Any, Any]]:
    """strategy.run steps on `batches` (a distributed dataset, one element
    per step); the optimizer all-reduces the gradients (with `syncing`, a
    LocalSGD or DiLoCo, within the worker between its syncs). Each step's
    summed loss and correct count, as the steps run; with --uneven_data
    also its examples (fewer once a worker's data ran out)."""
    loss_fn = _loss_fn()
    global_batch = config.batch_size
    uneven = config.uneven_data is not None

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            if uneven:  # Over the examples there: some batches are empty.
                loss = tf_crossdevice.training.compute_average_loss(
                    loss_fn(labels, logits)
                )
            else:
                loss = tf.nn.compute_average_loss(
                    loss_fn(labels, logits), global_batch_size=global_batch
                )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(
            zip(grads, model.trainable_variables, strict=True)
        )
        guesses = tf.cast(tf.argmax(logits, axis=1), labels.dtype)
        correct = tf.reduce_sum(tf.cast(guesses == labels, tf.float32))
        # One reduction for all, not a collective each.
        if uneven:
            examples = tf.cast(tf.size(labels), tf.float32)
            return tf.stack([loss, correct, examples])
        return tf.stack([loss, correct])

    def step(inputs):
        totals = strategy.run(replica_step, args=inputs)
        # Between syncs, within the worker: the chief's own replicas' sums
        # times the workers.
        return tuple(tf.unstack(strategy.reduce("sum", totals, axis=None)))

    run = tf.function(step) if syncing is None else syncing.wrap(step)
    return (run(inputs) for inputs in batches)


def _accumulating_loop(
    strategy, model, optimizer, batches, config
) -> Iterator[tuple[Any, Any]]:
    """strategy.run micro-steps; one all-reduce per global batch. Each
    update's summed loss and correct count, as the updates run.

    `batches` holds each global batch as `accumulation_steps` micro-batches
    (a distributed dataset, one element per micro-step). Every replica sums
    its micro-batch gradients (and its loss and correct count, for the
    progress lines) locally; after the last micro-batch of
    a global batch the gradients are all-reduced once and applied, and the
    loss and count reduced once. Checkpoints are saved between global
    batches, where the sums are zero, so they hold no accumulator.
    """
    loss_fn = _loss_fn()
    k = config.accumulation_steps
    micro_batch = config.batch_size // k
    with strategy.scope():
        accumulator = tf_crossdevice.GradientAccumulator(
            model.trainable_variables, steps=k
        )
        # Per replica; read outside the replicas: summed over them.
        totals = [
            tf.Variable(
                0.0,
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )
            for _ in ("loss", "correct")
        ]

    def replica_micro_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            # Scaled as a step on the global micro-batch alone; the
            # accumulator averages over the k micro-batches.
            loss = tf.nn.compute_average_loss(
                loss_fn(labels, logits), global_batch_size=micro_batch
            )
        accumulator.accumulate(tape.gradient(loss, model.trainable_variables))
        guesses = tf.cast(tf.argmax(logits, axis=1), labels.dtype)
        totals[0].assign_add(loss / k)
        totals[1].assign_add(
            tf.reduce_sum(tf.cast(guesses == labels, tf.float32))
        )

    @tf.function
    def micro_step(inputs):
        strategy.run(replica_micro_step, args=inputs)
        return accumulator.maybe_apply_gradients(optimizer)

    @tf.function
    def read_totals():
        loss, correct = (t.read_value() for t in totals)
        with tf.control_dependencies([loss, correct]):
            for t in totals:
                t.assign(0.0)
        return loss, correct

    def updates():
        for i, inputs in enumerate(batches):
            micro_step(inputs)
            if i % k == k - 1:
                yield read_totals()

    return updates()


def _may_stop(syncing: Any, step: int) -> bool:
    """Whether a preempted job may stop after `step` steps: anywhere, or
    with --sync at a sync (a checkpoint between syncs would hold only the
    chief's weights)."""
    return syncing is None or syncing.is_synced(step)


def _log_and_save(
    steps: Iterable[tuple[Any, Any]],
    start: int,
    config: Config,
    global_batch: int,
    reporter: Any,
    save: Callable[[int], None],
    watcher: tf_crossdevice.training.PreemptionWatcher,
    syncing: Any = None,
) -> int | None:
    """Runs `steps` (each gives the step's summed loss and correct count,
    and its examples where they may be fewer than `global_batch`) from step
    `start`: a progress line every `log_every` steps and at the end, each
    followed by `save(step)`. Once `watcher` says stop, saves and returns
    that step (before the end); else returns None. With `syncing`, the
    watcher is asked at syncs only, where the workers' weights agree."""
    losses, correct, examples = [], 0.0, 0.0
    step_number = start
    for loss, right, *present in steps:
        losses.append(float(loss))
        correct += float(right)
        examples += float(present[0]) if present else global_batch
        step_number += 1
        reporter.step_done()
        tf_crossdevice.cluster.heartbeat(step_number)  # --stall_seconds
        saved = False
        if step_number % config.log_every == 0 or step_number == config.steps:
            reporter.record(
                step_number, float(np.mean(losses)), correct / examples
            )
            losses, correct, examples = [], 0.0, 0.0
            save(step_number)
            saved = True
        if (
            step_number < config.steps
            and _may_stop(syncing, step_number)
            and watcher.should_stop()
        ):
            if not saved:
                save(step_number)
            return step_number
    return None


def _replicas_equal(
    strategy: tf.distribute.Strategy, model, timeout_seconds: float
) -> bool:
    """Whether every replica of every worker holds the same weights.

    Each replica hashes its own copy of the weights (their bits, as
    integers) into two numbers below 2**20; one all-reduce sums them and
    their squares. n numbers are all equal exactly when n times the sum of
    their squares is the square of their sum, and below 2**20 every one of
    those sums is exact in float64. An all-reduce over the job's usual
    groups, not a gather from every device of every worker (a group the
    job never used before).
    """

    def replica_sums():
        hashes = []
        for salt in (997, 991):
            total = tf.constant(0, tf.int64)
            for v in model.weights:
                bits = tf.bitcast(tf.reshape(_value(v), [-1]), tf.int32)
                weight = tf.range(tf.size(bits)) % salt + 1
                total += tf.reduce_sum(
                    tf.cast(bits, tf.int64) * tf.cast(weight, tf.int64)
                )
            hashes.append(tf.cast(total % (1 << 20), tf.float64))
        hashes = tf.stack(hashes)
        return tf.concat([hashes, hashes * hashes, [1.0]], 0)

    # Not the steps' timeout: the workers leave training at different
    # times, and on 4 emulated hosts this first collective after it has
    # waited longer than a 20 s step timeout for the last of them.
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=max(timeout_seconds, 300.0)
    )

    # TensorFlow's strategies take no options in reduce.
    ours = isinstance(strategy, tf_crossdevice.MultiWorkerMirroredStrategy)
    extra = {"options": options} if ours else {}

    @tf.function
    def sums():
        return strategy.reduce(
            "sum", strategy.run(replica_sums), axis=None, **extra
        )

    total, squares, n = np.split(np.asarray(sums()), [2, 4])
    return bool(np.all(n[0] * squares == total * total))


def train_in_graph(
    replicas: Any,
    ops: tf.distribute.CrossDeviceOps,
    config: Config,
    data: train_data.Data,
) -> str:
    """The controller's loop; returns the closing summary.

    Preempted (SIGTERM to this controller, or to a worker server, which
    records it as a notice and serves on), it prints where it saved and
    returns "".

    Args:
        replicas: a `tf_crossdevice.cluster.WorkerReplicas`.
        ops: the cross-device ops that average the gradients.
    """
    # One client: no other process to agree with; the workers' servers
    # report their own notices.
    with tf_crossdevice.training.PreemptionWatcher(workers=replicas) as watcher:
        return _train_in_graph(replicas, ops, config, data, watcher)


def _train_in_graph(replicas, ops, config, data, watcher):
    global_batch = config.batch_size
    per_replica = global_batch // replicas.num_replicas
    models, velocities = [], []
    for device in replicas.devices:
        with tf.device(device):
            model = build_model(config, data)
            velocities.append(
                [tf.Variable(tf.zeros_like(v)) for v in model.trainable_weights]
            )
        models.append(model)
    for model in models[1:]:
        model.set_weights(models[0].get_weights())
    step_var = tf.Variable(0, dtype=tf.int64)
    # A PowerSGD compressor's state (every replica's error, Q) lives on the
    # controller's side of the job: it is saved with the weights.
    powersgd = tf_crossdevice.ops.wire_of(ops).powersgd
    state = {"compression": powersgd} if powersgd is not None else {}
    checkpoint = tf.train.Checkpoint(
        weights=[_value(v) for v in models[0].weights],
        velocity=velocities[0],
        step=step_var,
        **state,
    )
    manager = tf.train.CheckpointManager(
        checkpoint, config.model_dir, max_to_keep=2
    )
    if manager.latest_checkpoint:
        status = checkpoint.restore(manager.latest_checkpoint)
        if state:  # The compressor's variables come with the first step.
            status.assert_existing_objects_matched()
        else:
            status.assert_consumed()
        for model, velocity in zip(models[1:], velocities[1:], strict=True):
            model.set_weights(models[0].get_weights())
            for v, v0 in zip(velocity, velocities[0], strict=True):
                v.assign(v0)
        print(
            f"resumed from step {int(step_var.numpy())} "
            f"({manager.latest_checkpoint})",
            flush=True,
        )
    start = int(step_var.numpy())
    params = sum(int(np.prod(v.shape)) for v in models[0].trainable_variables)
    print(
        f"model {models[0].name}: {params} parameters; "
        f"{replicas.num_replicas} replicas; global batch {global_batch}; "
        "loop=custom (in-graph)",
        flush=True,
    )
    reporter = train_report.Reporter(
        global_batch,
        start,
        config.steps,
        os.path.join(config.model_dir, "train"),
        verbose=True,
        cpu_seconds=config.worker_cpu_seconds or time.process_time,
    )

    def average(grads):
        per_variable = [
            replicas.per_replica(lambda r, i=i: grads[r][i])
            for i in range(len(grads[0]))
        ]
        return ops.batch_reduce("mean", [(g, None) for g in per_variable])

    step = _in_graph_step(
        replicas.devices, models, velocities, per_replica, average, config
    )

    # The same global batches as the other loops, split here in the same
    # order among the replicas.
    batches = train_data.dataset(
        data, global_batch, config.seed, start, config.steps
    )

    def save(step_number: int) -> None:
        step_var.assign(step_number)
        manager.save(checkpoint_number=step_number)
        print(f"checkpoint saved at step {step_number}", flush=True)

    stopped = _log_and_save(
        (
            replicas.run(
                step, images, labels, timeout_seconds=config.timeout_seconds
            )
            for images, labels in batches
        ),
        start,
        config,
        global_batch,
        reporter,
        save,
        watcher,
    )
    if stopped is not None:
        print(_preempted(stopped, config.steps), flush=True)
        return ""

    copies = [[np.asarray(w) for w in m.get_weights()] for m in models]
    replicas_equal = all(
        all(np.array_equal(a, b) for a, b in zip(c, copies[0], strict=True))
        for c in copies
    )

    def predict(x):
        with tf.device(replicas.devices[0]):
            return models[0](x, training=False)

    eval_accuracy = _eval_accuracy(predict, data)
    reporter.write_eval(config.steps, eval_accuracy)
    parts = None
    if _can_time(config, reporter, verbose=True):
        # After the summary's weights were read: the step alone updates
        # the first host's copies.
        parts = _time_in_graph_parts(
            replicas, average, models, velocities, config, data, reporter
        )
    return train_report.summary(
        reporter,
        eval_accuracy,
        len(data.eval_labels),
        replicas_equal,
        replicas.num_replicas,
        train_report.weights_digest(copies[0]),
        config.model_dir,
        parts,
    )


def _in_graph_step(devices, models, velocities, per_replica, average, config):
    """The in-graph step of the replicas on `devices` (one model and one
    list of momentum velocities each): replica r computes the gradients of
    its `per_replica` examples of the batch, `average(grads)` (grads[r][i]:
    replica r's gradient of variable i) returns each variable's mean, read
    for each replica with `_at`, and each replica applies it."""
    loss_fn = _loss_fn()
    lr = config.learning_rate

    @tf.function
    def step(images, labels):
        grads, losses, correct = [], [], []
        for r, (device, model) in enumerate(zip(devices, models, strict=True)):
            x = images[r * per_replica : (r + 1) * per_replica]
            y = labels[r * per_replica : (r + 1) * per_replica]
            with tf.device(device), tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(loss_fn(y, logits))
            with tf.device(device):
                grads.append(tape.gradient(loss, model.trainable_variables))
                guesses = tf.cast(tf.argmax(logits, axis=1), y.dtype)
                correct.append(tf.reduce_sum(tf.cast(guesses == y, tf.float32)))
            losses.append(loss)
        means = average(grads)
        for r, (device, model) in enumerate(zip(devices, models, strict=True)):
            with tf.device(device):
                for i, variable in enumerate(model.trainable_variables):
                    velocity = velocities[r][i]
                    velocity.assign(MOMENTUM * velocity - lr * _at(means[i], r))
                    variable.assign_add(velocity)
        return tf.add_n(losses) / len(losses), tf.add_n(correct)

    return step


def _time_in_graph_parts(
    replicas, average, models, velocities, config, data, reporter
):
    """The training's step against the same step on the first host alone
    (its replicas, their gradients averaged on its first device, as
    ReductionToOneDevice does) and the step's `average` alone
    (train_timing).

    The other hosts idle meanwhile; each host's core share is a quota, so
    their idling lends the first host nothing.
    """
    task0 = [
        r
        for r, d in enumerate(replicas.devices)
        if tf.DeviceSpec.from_string(d).task == 0
    ]
    per_replica = config.batch_size // replicas.num_replicas
    k = len(task0)

    def average_here(grads):
        with tf.device(replicas.devices[task0[0]]):
            return [tf.add_n(list(g)) / k for g in zip(*grads, strict=True)]

    alone = _in_graph_step(
        [replicas.devices[r] for r in task0],
        [models[r] for r in task0],
        [velocities[r] for r in task0],
        per_replica,
        average_here,
        config,
    )
    calls = config.timing_steps
    batches = iter(
        train_data.dataset(data, per_replica * k, config.seed, 0, calls + 1)
    )
    cpu = reporter.cpu_seconds
    alone_seconds, alone_cores = train_timing.median_seconds(
        lambda: replicas.run(alone, *next(batches)), calls, cpu
    )
    all_reduce_seconds, all_reduce_cores = train_timing.average_seconds(
        replicas, average, [m.trainable_variables for m in models], calls, cpu
    )
    # The controller's own clock would say nothing of the hosts.
    cores = (
        (reporter.step_cores(), alone_cores, all_reduce_cores)
        if config.worker_cpu_seconds
        else None
    )
    loss_fn = _loss_fn()

    @tf.function
    def forward(images, labels):
        losses = []
        for i, r in enumerate(task0):
            rows = slice(i * per_replica, (i + 1) * per_replica)
            with tf.device(replicas.devices[r]):
                logits = models[r](images[rows], training=True)
                losses.append(tf.reduce_sum(loss_fn(labels[rows], logits)))
        # One scalar back, as the step alone returns: not every example's.
        return tf.add_n(losses)

    batches = iter(
        train_data.dataset(data, per_replica * k, config.seed, 0, calls + 1)
    )
    forward_seconds, _ = train_timing.median_seconds(
        lambda: replicas.run(forward, *next(batches)), calls, cpu
    )
    return train_timing.Parts(
        reporter.median_step_seconds(),
        alone_seconds,
        all_reduce_seconds,
        cores,
        forward_seconds,
    )


def _at(value: Any, replica: int) -> Any:
    """Replica `replica`'s tensor of a reduction's result."""
    if isinstance(value, tf.distribute.DistributedValues):
        return value.values[replica]
    return value
