"""Training-loop helpers that save traffic between replicas.

`_accumulate` holds `GradientAccumulator`: `k` micro-batches per
all-reduce (gradient accumulation), so that the wire between hosts carries
1/k of the gradient traffic of one all-reduce per micro-batch.

May import: `_core`, and through TensorFlow's public API any strategy and
CrossDeviceOps of the package (it needs none of them by name).
"""

from tf_crossdevice.training._accumulate import GradientAccumulator

__all__ = ["GradientAccumulator"]
