"""The first all-reduce of a training step waits for the last layers only.

Backpropagation computes the last layer's gradients first and the first
layer's last. A device's collectives run one after another, in the order
they were issued (each touches the device's ordering token), so the
collective issued first must be one whose gradients exist early: if it
needed the first layer's gradient, every collective would wait for the
whole backward pass and none could overlap it.

The step is traced, not run: in the graph of a Keras train step (what
`model.fit` runs in each replica) and of a custom `strategy.run` step,
under our `MultiWorkerMirroredStrategy` with each collective class (with
small packs, and with the class's defaults on a model of several default
packs), the
first collective on every device must not depend, through data or control
edges (the ordering token's automatic control dependencies included), on
the gradient of the first layer (an Embedding, whose gradient is
IndexedSlices) or of the first Dense layer, and must depend on the last
layer's. One worker with two local devices is enough: its collectives are
the same ops, in the same order, that several workers would issue.

The negative controls show that the check catches a serialised step: the
collectives issued first variable first (as gradients reach the
optimizer), and one pack of every gradient (what the hierarchical class
sent by default before it packed by size).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_crossdevice
from tests.graph_ancestors import ancestors
from tf_crossdevice.collective import _launch_order

keras = tf.keras

DEVICES = tf_crossdevice.testing.cpu_devices(2)
CLASSES = {
    "flat": tf_crossdevice.CollectiveAllReduce,
    "hier": tf_crossdevice.HierarchicalCollectiveAllReduce,
}
# Small enough that the small model's variables make several packs.
BYTES_PER_PACK = 64
# Packings: explicit small packs on a small model, and the classes' own
# default on a model whose middle layer (1024 x 1024 floats, 4 MiB) fills
# a default pack, so the default makes several packs too.
PACKINGS = {
    "small_packs": (BYTES_PER_PACK, 8),
    "defaults": (0, 1024),
}
COLLECTIVES = ("CollectiveReduceV2", "CollectiveGatherV2")


def build_model(width: int) -> keras.Model:
    ids = keras.Input((1,), dtype="int32")
    x = keras.Input((3,))
    embedded = keras.layers.Flatten()(
        keras.layers.Embedding(6, 4, name="embedding")(ids)
    )
    hidden = keras.layers.Concatenate()([embedded, x])
    for name in ("dense_first", "dense_middle"):
        hidden = keras.layers.Dense(width, activation="tanh", name=name)(hidden)
    out = keras.layers.Dense(1, name="dense_last")(hidden)
    return keras.Model([ids, x], out)


class RecordingSGD(keras.optimizers.SGD):
    """SGD that keeps each replica's gradients, as the graph has them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.recorded: list[list] = []

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        self.recorded.append(grads)
        return super().apply(grads, trainable_variables)


def traced_step(kind: str, path: str, packing: str = "small_packs"):
    """The graph of one training step, and each variable's gradient ops."""
    bytes_per_pack, width = PACKINGS[packing]
    options = None
    if bytes_per_pack:
        options = tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=bytes_per_pack
        )
    ops = CLASSES[kind](options=options)
    strategy = tf_crossdevice.MultiWorkerMirroredStrategy(
        cross_device_ops=ops, local_devices=DEVICES
    )
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 6, size=(8, 1)).astype(np.int32)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    y = rng.normal(size=(8, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(((ids, x), y)).batch(4)
    with strategy.scope():
        model = build_model(width)
        optimizer = RecordingSGD(0.1)
        model.compile(optimizer=optimizer, loss="mse")

    def custom_step(inputs):
        (ids, x), y = inputs
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model([ids, x]) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    # What model.fit's train function runs in each replica.
    replica_step = model.train_step if path == "fit" else custom_step

    @tf.function
    def step(iterator):
        return strategy.run(replica_step, args=(next(iterator),))

    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    graph = step.get_concrete_function(iterator).graph
    assert len(optimizer.recorded) == len(DEVICES)  # One per replica.
    names = [v.path for v in model.trainable_variables]
    gradient_ops: dict[str, set] = {name: set() for name in names}
    for grads in optimizer.recorded:
        for name, grad in zip(names, grads, strict=True):
            gradient_ops[name].add(_producer(grad))
    return graph, gradient_ops


def _producer(grad) -> tf.Operation:
    return grad.values.op if isinstance(grad, tf.IndexedSlices) else grad.op


def collectives_by_device(graph) -> dict[str, list[tf.Operation]]:
    """Each device's collectives, in the order they were issued."""
    found: dict[str, list[tf.Operation]] = {}
    for op in graph.get_operations():  # In creation order.
        if op.type in COLLECTIVES:
            found.setdefault(op.device, []).append(op)
    return found


def first_collectives(graph) -> dict[str, tf.Operation]:
    """Each device's first collective: every other one waits for it (the
    ordering token chains a device's collectives in the order issued)."""
    first = {}
    for device, ops in collectives_by_device(graph).items():
        for later in ops[1:]:
            assert ops[0] in ancestors([later]), (ops[0].name, later.name)
        first[device] = ops[0]
    return first


def dependencies(op: tf.Operation, gradient_ops: dict[str, set]) -> set:
    """The variables whose gradient (on any replica) `op` waits for."""
    before = ancestors([op])
    return {name for name, ops in gradient_ops.items() if ops & before}


def layer(name: str) -> str:
    return name.split("/")[0]


@pytest.fixture
def forward_order(monkeypatch):
    """Issues the collectives first variable first: the order the
    gradients reach the optimizer in, not the order they are computed."""

    def forward(units):
        return sorted(units, key=min)

    monkeypatch.setattr(_launch_order, "launch_order", forward)


@pytest.mark.parametrize("packing", sorted(PACKINGS))
@pytest.mark.parametrize("path", ["fit", "custom_loop"])
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_first_collective_waits_for_the_last_layers_only(kind, path, packing):
    graph, gradient_ops = traced_step(kind, path, packing)
    first = first_collectives(graph)
    # The flat class issues collectives on every device, the hierarchical
    # one on the first device only.
    assert first, "no collective in the step"
    for device, op in first.items():
        waits_for = {layer(name) for name in dependencies(op, gradient_ops)}
        assert "dense_last" in waits_for, (device, op.name, waits_for)
        assert not waits_for & {"embedding", "dense_first"}, (
            device,
            op.name,
            waits_for,
        )


# One class and path suffice to show the check can fail: the others trace
# the same launch order.
def test_forward_order_waits_for_the_whole_backward_pass(forward_order):
    graph, gradient_ops = traced_step(sorted(CLASSES)[0], "fit")
    first = first_collectives(graph)
    assert first, "no collective in the step"
    for device, op in first.items():
        waits_for = {layer(name) for name in dependencies(op, gradient_ops)}
        assert "embedding" in waits_for, (device, op.name, waits_for)


@pytest.fixture
def one_pack(monkeypatch):
    """Packs every gradient of a dtype into one collective, as the
    hierarchical class did by default."""
    plan_packs = _launch_order.plan_packs

    def whole(values, bytes_per_pack, merge_scope):
        return plan_packs(values, bytes_per_pack, max(1, len(values)))

    monkeypatch.setattr(_launch_order, "plan_packs", whole)


def test_one_pack_waits_for_the_whole_backward_pass(one_pack):
    graph, gradient_ops = traced_step("hier", "fit", "defaults")
    first = first_collectives(graph)
    assert first, "no collective in the step"
    for device, op in first.items():
        waits_for = {layer(name) for name in dependencies(op, gradient_ops)}
        assert "dense_first" in waits_for, (device, op.name, waits_for)
