"""The example job's Keras models: a small ResNet-style CNN, a dense model.

The CNN has no batch normalization: each replica would keep its own moving
statistics, and the job checks that every replica ends with the same
weights. Residual branches instead start small (their last convolution's
initial weights are scaled down), which keeps a deep stack trainable.
"""

from __future__ import annotations

import keras

MODELS = ("cnn", "dense")


def resnet(
    image_size: int, num_classes: int, depth: int, width: int
) -> keras.Model:
    """`depth` residual blocks of two 3x3 convolutions, `width` channels.

    The resolution halves after every second block while it is above 4.
    """
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(inputs)
    size = image_size
    for block in range(depth):
        y = keras.layers.Conv2D(width, 3, padding="same", activation="relu")(x)
        y = keras.layers.Conv2D(
            width,
            3,
            padding="same",
            kernel_initializer=keras.initializers.VarianceScaling(0.1),
        )(y)
        x = keras.layers.ReLU()(keras.layers.Add()([x, y]))
        if block % 2 == 1 and size > 4:
            x = keras.layers.AveragePooling2D(2)(x)
            size //= 2
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name=f"resnet_d{depth}_w{width}")


def dense(
    image_size: int, num_classes: int, depth: int, width: int
) -> keras.Model:
    """`depth` hidden ReLU layers of `width` units on the flattened image."""
    inputs = keras.Input((image_size, image_size, 3))
    x = keras.layers.Flatten()(inputs)
    for _ in range(depth):
        x = keras.layers.Dense(width, activation="relu")(x)
    outputs = keras.layers.Dense(num_classes)(x)
    return keras.Model(inputs, outputs, name=f"dense_d{depth}_w{width}")


def build(
    name: str, image_size: int, num_classes: int, depth: int, width: int
) -> keras.Model:
    """The model `name` ("cnn" or "dense"); logits out."""
    builder = {"cnn": resnet, "dense": dense}[name]
    return builder(image_size, num_classes, depth, width)
