"""One worker process of the collective tests (started by them, not pytest).

    python -m tests.collective_worker MODE CLASSES [TIMEOUT]

reads its cluster from `TF_CONFIG`, gives itself `LOCAL_DEVICES` logical CPUs
and builds `tf_crossdevice.MultiWorkerMirroredStrategy` with each of CLASSES
in turn ("flat": CollectiveAllReduce, "hier":
HierarchicalCollectiveAllReduce; "flat,hier" for both, in one process) and
`timeout_seconds=TIMEOUT` (default 60). It answers
the test with `processes.reply` lines and ends when its test does
(`exit_when_parent_goes`). Modes:

- train: a variable created inside a tf.function step, with another
  initial value on every worker; then Keras `model.fit` and a custom loop
  with `strategy.run`, on the global batches of `batches_arrays()`, with
  momentum SGD whose slots the optimizer creates in the first step;
  replies every replica's copy of each.
- trace: traces a `strategy.run` step that all-reduces `BYTES_SHAPES`,
  replies each collective op in its graph (type, device, group size and
  key, bytes), then runs it and replies the sums.
- construct: builds the strategy; replies how long construction took and
  how it failed (status 3 on a TensorFlow error).
- loop: all-reduces in a loop, replying after every step, until a
  collective fails; then replies the error and exits with status 2.

The data, the model's initial weights and the shapes live here without
TensorFlow, so that the tests compute their references from the same
numbers.
"""

from __future__ import annotations

import os
import pathlib
import sys
import time
from collections.abc import Sequence

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[1]
LOCAL_DEVICES = 2
NUM_EXAMPLES = 32
GLOBAL_BATCH = 8
VOCAB = 6
EMBED = 3
FEATURES = 2
HIDDEN = 4
LEARNING_RATE = 0.1
MOMENTUM = 0.5
FIT_EPOCHS = 2
LOOP_STEPS = NUM_EXAMPLES // GLOBAL_BATCH
# The tensors the trace mode all-reduces (two dtypes: two packs per device).
BYTES_SHAPES = [((3, 5), "float32"), ((7,), "float32"), ((2, 2, 2), "float64")]


def batches_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids, features and targets of every example."""
    rng = np.random.default_rng(13)
    ids = rng.integers(0, VOCAB, size=(NUM_EXAMPLES, 1)).astype(np.int32)
    x = rng.normal(size=(NUM_EXAMPLES, FEATURES)).astype(np.float32)
    y = rng.normal(size=(NUM_EXAMPLES, 1)).astype(np.float32)
    return ids, x, y


def initial_weights() -> dict[str, np.ndarray]:
    """The model's starting weights, by name."""
    rng = np.random.default_rng(7)

    def draw(*shape: int) -> np.ndarray:
        return (rng.normal(size=shape) * 0.5).astype(np.float32)

    return {
        "embedding": draw(VOCAB, EMBED),
        "kernel1": draw(EMBED + FEATURES, HIDDEN),
        "bias1": draw(HIDDEN),
        "kernel2": draw(HIDDEN, 1),
        "bias2": draw(1),
    }


def bytes_values(replica: int) -> list[np.ndarray]:
    """What global replica `replica` all-reduces in trace mode."""
    return [
        np.full(shape, replica + 1 + k, dtype=dtype)
        for k, (shape, dtype) in enumerate(BYTES_SHAPES)
    ]


# ---- Everything below runs in the worker only ------------------------------


def replies(
    mode: str, kinds: Sequence[str], num_workers: int, timeout: float
) -> dict[str, list[dict]]:
    """Runs MODE for each of `kinds` on `num_workers` workers (for tests).

    Each worker answers two replies per kind, the first naming the kind.

    Returns:
        replies[kind][task]: that worker's two replies, merged.
    """
    from tf_crossdevice import launch
    from tf_crossdevice.cluster import processes

    children = []
    try:
        for i, env in enumerate(launch.tf_config_envs(num_workers)):
            children.append(
                processes.start_module(
                    "tests.collective_worker",
                    mode,
                    ",".join(kinds),
                    name=f"worker {i}",
                    env=env,
                    cwd=_ROOT,
                )
            )
        out: dict[str, list[dict]] = {kind: [] for kind in kinds}
        for child in children:
            for kind in kinds:
                first = child.receive(timeout=timeout)
                second = child.receive(timeout=timeout)
                assert first["kind"] == kind
                out[kind].append({**first, **second})
        for child in children:
            assert child.wait(timeout=timeout) == 0, child.stderr_text(3000)
        return out
    finally:
        processes.stop_all(children)


def main(argv: list[str]) -> int:
    from tf_crossdevice.cluster import processes

    processes.exit_when_parent_goes()
    mode, kind = argv[0], argv[1]
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * LOCAL_DEVICES
    )
    timeout = float(argv[2]) if len(argv) > 2 else 60.0
    if mode == "construct":
        return construct(kind, timeout)
    if mode == "loop":
        return loop(make_strategy(kind, timeout))
    for one in kind.split(","):  # Several strategies can share a process.
        strategy = make_strategy(one, timeout)
        {"train": train, "trace": trace}[mode](strategy, one)
    return 0


def make_strategy(kind: str, timeout: float):
    import tensorflow as tf

    import tf_crossdevice

    ops = {
        "flat": tf_crossdevice.CollectiveAllReduce,
        "hier": tf_crossdevice.HierarchicalCollectiveAllReduce,
    }[kind]()
    return tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=ops,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout
        ),
        local_devices=[f"/cpu:{i}" for i in range(LOCAL_DEVICES)],
    )


def construct(kind: str, timeout: float) -> int:
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    processes.reply({"constructing": True})
    start = time.monotonic()
    try:
        make_strategy(kind, timeout)
    except tf.errors.OpError as e:
        processes.reply(
            {
                "seconds": time.monotonic() - start,
                "error": type(e).__name__,
                "message": e.message,
            }
        )
        return 3
    processes.reply({"seconds": time.monotonic() - start, "error": None})
    return 0


def build_model():
    import keras

    init = initial_weights()

    def constant(name):
        return lambda shape, dtype=None: np.reshape(init[name], shape)

    ids = keras.Input((1,), dtype="int32")
    x = keras.Input((FEATURES,))
    embedded = keras.layers.Flatten()(
        keras.layers.Embedding(
            VOCAB, EMBED, embeddings_initializer=constant("embedding")
        )(ids)
    )
    hidden = keras.layers.Dense(
        HIDDEN,
        activation="tanh",
        kernel_initializer=constant("kernel1"),
        bias_initializer=constant("bias1"),
    )(keras.layers.Concatenate()([embedded, x]))
    out = keras.layers.Dense(
        1,
        kernel_initializer=constant("kernel2"),
        bias_initializer=constant("bias2"),
    )(hidden)
    return keras.Model([ids, x], out)


def replica_weights(strategy, model) -> list[list[list[float]]]:
    """weights[r][i]: replica r's copy of model variable i, flattened."""
    per_variable = [
        strategy.experimental_local_results(getattr(w, "value", w))
        for w in model.weights
    ]
    return [
        [np.ravel(np.asarray(v[r])).tolist() for v in per_variable]
        for r in range(len(per_variable[0]))
    ]


def train(strategy, kind: str) -> None:
    import keras
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    created: list = []

    @tf.function
    def create_in_step():
        # As Keras layers, metrics and optimizers do: created on first call.
        if not created:
            with strategy.scope():
                task = strategy.cluster_resolver.task_id
                created.append(tf.Variable(float(task + 1)))
        return created[0].read_value()

    create_in_step()
    in_step = [
        float(v) for v in strategy.experimental_local_results(created[0])
    ]

    ids, x, y = batches_arrays()
    ds = tf.data.Dataset.from_tensor_slices(((ids, x), y)).batch(
        GLOBAL_BATCH, drop_remainder=True
    )
    with strategy.scope():
        model = build_model()
        model.compile(
            optimizer=keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
            loss="mse",
        )
    history = model.fit(ds, epochs=FIT_EPOCHS, verbose=0)
    processes.reply(
        {
            "kind": kind,
            "created_in_step": in_step,
            "fit": replica_weights(strategy, model),
            "fit_loss": [float(v) for v in history.history["loss"]],
        }
    )

    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM)
    assert not optimizer.built  # Its slots come in the first step.

    grad_types: list[str] = []

    @tf.function
    def step(inputs):
        def replica_step(inputs):
            (ids, x), y = inputs
            with tf.GradientTape() as tape:
                pred = model([ids, x], training=True)
                per_example = tf.reduce_mean(tf.square(pred - y), axis=-1)
                loss = tf.nn.compute_average_loss(
                    per_example, global_batch_size=GLOBAL_BATCH
                )
            grads = tape.gradient(loss, model.trainable_variables)
            grad_types[:] = [type(g).__name__ for g in grads]
            optimizer.apply_gradients(
                zip(grads, model.trainable_variables, strict=True)
            )
            return loss

        losses = strategy.run(replica_step, args=(inputs,))
        return strategy.reduce("sum", losses, axis=None)

    losses = [
        float(step(batch))
        for batch in strategy.experimental_distribute_dataset(ds)
    ]
    processes.reply(
        {
            "loop": replica_weights(strategy, model),
            "loop_losses": losses,
            "gradient_types": grad_types,
        }
    )


def collective_ops(graph) -> list[dict]:
    """Every collective op in `graph` and the functions it calls."""
    import tensorflow as tf

    found = []
    seen = set()

    def const(tensor):
        return tf.make_ndarray(tensor.op.get_attr("value")).item()

    def visit(g):
        for op in g.get_operations():
            if op.type in ("CollectiveReduceV2", "CollectiveGatherV2"):
                value = op.inputs[0]
                found.append(
                    {
                        "type": op.type,
                        "device": op.device,
                        "group_size": const(op.inputs[1]),
                        "group_key": const(op.inputs[2]),
                        "bytes": value.shape.num_elements() * value.dtype.size,
                    }
                )
            for attr in ("f", "then_branch", "else_branch", "body", "cond"):
                try:
                    fn = op.get_attr(attr)
                except (ValueError, TypeError):
                    continue
                name = getattr(fn, "name", None)
                if name and name not in seen:
                    seen.add(name)
                    visit(g._get_function(name).graph)

    visit(graph)
    return found


def trace(strategy, kind: str) -> None:
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    def value_fn(context):
        # The replica's id among every worker's replicas.
        replica = context.replica_id_in_sync_group
        return [tf.constant(v) for v in bytes_values(replica)]

    values = strategy.experimental_distribute_values_from_function(value_fn)

    @tf.function
    def step(values):
        def replica_step(values):
            context = tf.distribute.get_replica_context()
            return context.all_reduce("sum", values)

        return strategy.run(replica_step, args=(values,))

    concrete = step.get_concrete_function(values)
    processes.reply({"kind": kind, "ops": collective_ops(concrete.graph)})
    result = step(values)
    processes.reply(
        {
            "sums": [
                [np.ravel(t.numpy()).tolist() for t in values_of_replica]
                for values_of_replica in zip(
                    *[strategy.experimental_local_results(r) for r in result],
                    strict=True,
                )
            ]
        }
    )


def loop(strategy) -> int:
    import tensorflow as tf

    from tf_crossdevice.cluster import processes

    @tf.function
    def step():
        def replica_step():
            context = tf.distribute.get_replica_context()
            return context.all_reduce("sum", tf.ones([1 << 16]))

        return strategy.run(replica_step)

    steps = 0
    try:
        while True:
            step()
            steps += 1
            processes.reply({"steps": steps})
    except tf.errors.OpError as e:
        processes.reply(
            {"error": type(e).__name__, "message": e.message[:4000]}
        )
        return 2


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main(sys.argv[1:]))
