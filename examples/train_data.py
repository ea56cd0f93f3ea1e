"""The example job's data: a learnable synthetic task, or images from disk.

Synthetic (the default, as tf_cnn_benchmarks trains on synthetic images):
example `i` is an image drawn from the seed and `i` alone (smooth noise:
4x4 random values scaled up, plus fine noise), and its label comes from a
fixed random teacher network (conv 3x3, ReLU, global average pooling, a
dense layer, each class's logit standardized so that the classes are about
equally common). A model that learns the task reaches high accuracy on
held-out examples; one that does not stays near 1 / num_classes.

From disk (`--data_dir`): an image folder (one sub-folder per class, PNG
or JPEG files) or TFRecord files (`*.tfrecord`, features `image`: encoded
PNG/JPEG bytes, `label`: int64). They are read and decoded through tf.data
and held in memory (every worker holds them all), so this is for data sets
that fit in memory.

Every step's global batch is a function of the step number alone (a
permutation per epoch, from the seed), so a job restarted from a checkpoint
continues with the batches it would have seen. With --uneven_data the last
worker's data ends early, at a step fixed by the job's length
(`uneven_stop`), so a restart sees the same data then too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np
import tensorflow as tf

_COARSE = 4  # Side of the random grid that is scaled up to the image.
# The most memory a job's table of examples may take (see _examples).
_TABLE_BYTES = 1 << 30
_EVAL_EXAMPLES = 1024
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclasses.dataclass
class Data:
    """Where examples come from.

    Attributes:
        image_size: images are image_size x image_size x 3, float32.
        num_classes: labels are 0 .. num_classes - 1.
        num_train: training examples (the epoch length).
        example: maps an int64 index tensor to (image, label) tensors.
        eval_images, eval_labels: held-out examples, as numpy arrays.
        description: one line for the job's header.
    """

    image_size: int
    num_classes: int
    num_train: int
    example: Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
    eval_images: np.ndarray
    eval_labels: np.ndarray
    description: str


def synthetic(
    image_size: int,
    num_classes: int,
    num_train: int,
    seed: int,
    eval_examples: int = _EVAL_EXAMPLES,
) -> Data:
    """The synthetic teacher task; `eval_examples` examples past the
    training ones (and the 2048 that fix the label's scale) are held out."""
    rng = np.random.default_rng(seed)
    filters = 2 * num_classes
    conv = tf.constant(rng.normal(size=(3, 3, 3, filters)), tf.float32)
    dense = tf.constant(rng.normal(size=(filters, num_classes)), tf.float32)

    def image(index: tf.Tensor) -> tf.Tensor:
        pair = tf.stack([tf.constant(seed, tf.int64), index])
        coarse = tf.random.stateless_normal([_COARSE, _COARSE, 3], seed=pair)
        fine = tf.random.stateless_normal(
            [image_size, image_size, 3], seed=pair + 1
        )
        smooth = tf.image.resize(coarse[None], [image_size, image_size])[0]
        return smooth + 0.3 * fine

    def raw_logits(images: tf.Tensor) -> tf.Tensor:
        features = tf.nn.relu(tf.nn.conv2d(images, conv, 1, "SAME"))
        return tf.reduce_mean(features, axis=[1, 2]) @ dense

    @tf.function
    def images(indices: tf.Tensor) -> tf.Tensor:
        return tf.map_fn(image, indices, fn_output_signature=tf.float32)

    sample = images(tf.range(num_train, num_train + 2048, dtype=tf.int64))
    logits = raw_logits(sample)
    mean = tf.reduce_mean(logits, axis=0)
    std = tf.math.reduce_std(logits, axis=0)

    def example(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        x = image(index)
        label = tf.argmax((raw_logits(x[None])[0] - mean) / std)
        return x, tf.cast(label, tf.int32)

    eval_index = tf.range(
        num_train + 2048, num_train + 2048 + eval_examples, dtype=tf.int64
    )
    eval_images = images(eval_index)
    eval_labels = tf.argmax((raw_logits(eval_images) - mean) / std, axis=1)
    return Data(
        image_size,
        num_classes,
        num_train,
        example,
        eval_images.numpy(),
        eval_labels.numpy().astype(np.int32),
        f"synthetic: {num_train} training examples of {image_size}x"
        f"{image_size}x3, {num_classes} classes from a fixed teacher",
    )


def from_directory(data_dir: str, image_size: int, seed: int) -> Data:
    """An image folder or TFRecord files; every 8th example is held out."""
    records = sorted(
        os.path.join(data_dir, f)
        for f in os.listdir(data_dir)
        if f.endswith(".tfrecord")
    )
    if records:
        dataset = tf.data.TFRecordDataset(records).map(_parse_record)
        classes = None
    else:
        classes = sorted(
            d
            for d in os.listdir(data_dir)
            if os.path.isdir(os.path.join(data_dir, d))
        )
        files, labels = [], []
        for label, name in enumerate(classes):
            folder = os.path.join(data_dir, name)
            for f in sorted(os.listdir(folder)):
                if f.lower().endswith(_IMAGE_SUFFIXES):
                    files.append(os.path.join(folder, f))
                    labels.append(label)
        if not files:
            raise ValueError(
                f"--data_dir: {data_dir!r} holds no *.tfrecord files and no "
                "class folders of .png/.jpg images"
            )
        dataset = tf.data.Dataset.from_tensor_slices((files, labels)).map(
            lambda f, y: (tf.io.read_file(f), y)
        )

    def decode(encoded: tf.Tensor, label: tf.Tensor) -> tuple:
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
        image = tf.image.resize(image, [image_size, image_size]) / 127.5 - 1.0
        return image, tf.cast(label, tf.int32)

    images, labels = [], []
    for x, y in dataset.map(decode).as_numpy_iterator():
        images.append(x)
        labels.append(y)
    order = np.random.default_rng(seed).permutation(len(images))
    all_images = np.stack(images)[order]
    all_labels = np.array(labels, np.int32)[order]
    held_out = np.arange(len(order)) % 8 == 7
    train_x = tf.constant(all_images[~held_out])
    train_y = tf.constant(all_labels[~held_out])
    num_classes = len(classes) if classes else int(all_labels.max()) + 1

    def example(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.gather(train_x, index), tf.gather(train_y, index)

    return Data(
        image_size,
        num_classes,
        int(train_x.shape[0]),
        example,
        all_images[held_out],
        all_labels[held_out],
        f"{data_dir}: {int(train_x.shape[0])} training and "
        f"{int(held_out.sum())} held-out images, {num_classes} classes",
    )


def _parse_record(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    parsed = tf.io.parse_single_example(
        record,
        {
            "image": tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        },
    )
    return parsed["image"], parsed["label"]


def batch_indices(
    num_train: int, global_batch: int, seed: int, start: int, stop: int
) -> np.ndarray:
    """Rows [start, stop) of the example index of each step's global batch.

    The examples run through one permutation per epoch; a batch may span
    two epochs.

    >>> batch_indices(4, 2, seed=0, start=1, stop=3).shape
    (2, 2)
    >>> sorted(batch_indices(4, 2, seed=0, start=0, stop=2).ravel().tolist())
    [0, 1, 2, 3]
    """
    first, last = start * global_batch, stop * global_batch
    epochs = range(first // num_train, (last - 1) // num_train + 1)
    stream = np.concatenate(
        [
            np.random.default_rng([seed, e]).permutation(num_train)
            for e in epochs
        ]
    )
    offset = first - epochs[0] * num_train
    rows = stream[offset : offset + last - first]
    return rows.reshape(stop - start, global_batch).astype(np.int64)


def dataset(
    data: Data, global_batch: int, seed: int, start: int, stop: int
) -> tf.data.Dataset:
    """Global batches of steps [start, stop), as (images, labels): for a
    reader that splits them itself (the in-graph controller)."""
    rows = batch_indices(data.num_train, global_batch, seed, start, stop)
    return _examples(data, rows)


def uneven_stop(steps: int, fraction: float) -> int:
    """With --uneven_data=`fraction`: the last worker's data covers steps
    [0, uneven_stop) of a job of `steps` steps (that fraction, rounded, at
    least one step); from then on it gets empty batches.

    >>> uneven_stop(400, 0.5), uneven_stop(10, 0.3), uneven_stop(3, 0.01)
    (200, 3, 1)
    """
    return max(1, round(fraction * steps))


def uneven_note(steps: int, fraction: float, num_workers: int) -> str:
    """The summary's line for --uneven_data.

    >>> print(uneven_note(6, 0.5, 2))
    uneven data: worker 1 (the last) has 3 of the others' 6 batches (50%)
    """
    held = uneven_stop(steps, fraction)
    return (
        f"uneven data: worker {num_workers - 1} (the last) has {held} of "
        f"the others' {steps} batches ({held / steps:.0%})"
    )


def replica_dataset(
    data: Data,
    global_batch: int,
    seed: int,
    start: int,
    stop: int,
    context: tf.distribute.InputContext,
    micro_steps: int = 1,
    last_stop: int | None = None,
) -> tf.data.Dataset:
    """One input pipeline's share of steps [start, stop): for
    `strategy.distribute_datasets_from_function`. With `last_stop`
    (--uneven_data, `uneven_stop`), the last pipeline's share ends before
    step `last_stop`: it has fewer batches than the others, or none.

    Each global batch is split into `micro_steps` micro-batches, and each
    micro-batch into one slice per replica of the job, in order: replica
    `g` (this pipeline's replicas come after the earlier pipelines') gets
    the g-th slice. The dataset yields this pipeline's slices, micro-batch
    by micro-batch, and the strategy hands them to its replicas in turn.
    So a worker computes only the examples its own replicas train on.

    >>> rows = batch_indices(8, 8, seed=0, start=0, stop=1)[0]
    >>> second = tf.distribute.InputContext(2, 1, num_replicas_in_sync=4)
    >>> def example(i):
    ...     return tf.ones([1, 1, 3]), tf.cast(i, tf.int32)
    >>> data = Data(1, 2, 8, example, None, None, "")
    >>> labels = [y.numpy().tolist() for _, y in
    ...           replica_dataset(data, 8, 0, 0, 1, second)]
    >>> labels == [rows[4:6].tolist(), rows[6:8].tolist()]
    True
    """
    replicas = context.num_replicas_in_sync
    local = replicas // context.num_input_pipelines
    first = context.input_pipeline_id * local
    per_replica = global_batch // (micro_steps * replicas)
    rows = batch_indices(data.num_train, global_batch, seed, start, stop)
    last = context.input_pipeline_id == context.num_input_pipelines - 1
    if last_stop is not None and last:
        rows = rows[: max(0, last_stop - start)]
    slices = rows.reshape(-1, replicas, per_replica)
    return _examples(
        data, slices[:, first : first + local].reshape(-1, per_replica)
    )


def _examples(data: Data, rows: np.ndarray) -> tf.data.Dataset:
    """Batches of (images, labels), one per row of example indices.

    Each example the rows name is made once, before the first batch, and
    the batches gather from that table: drawing and labelling a synthetic
    image costs a sizeable part of what training on it does, which a
    host would otherwise pay again every epoch, in every step, out of the
    cores its training and its all-reduce need. Where the table would
    outgrow _TABLE_BYTES, each batch makes its examples as it goes.
    """
    used, where = np.unique(rows, return_inverse=True)
    example_bytes = 4 * 3 * data.image_size**2
    if not used.size or used.size * example_bytes > _TABLE_BYTES:
        return _made_per_batch(data, rows)
    make = tf.function(lambda indices: _each(data, indices))
    images, labels = make(tf.constant(used, tf.int64))
    return (
        tf.data.Dataset.from_tensor_slices(where.reshape(rows.shape))
        .map(lambda i: (tf.gather(images, i), tf.gather(labels, i)))
        .prefetch(2)
    )


def _made_per_batch(data: Data, rows: np.ndarray) -> tf.data.Dataset:
    return (
        tf.data.Dataset.from_tensor_slices(rows)
        .map(lambda indices: _each(data, indices))
        .prefetch(2)
    )


def _each(data: Data, indices: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Examples `indices`, each made by `data.example` on its own."""
    return tf.map_fn(
        data.example,
        indices,
        fn_output_signature=(
            tf.TensorSpec([data.image_size, data.image_size, 3]),
            tf.TensorSpec([], tf.int32),
        ),
    )
