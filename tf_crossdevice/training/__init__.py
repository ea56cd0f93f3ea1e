"""Training-loop helpers: traffic between replicas, and preemption.

`_accumulate` holds `GradientAccumulator`: `k` micro-batches per
all-reduce (gradient accumulation), so that the wire between hosts carries
1/k of the gradient traffic of one all-reduce per micro-batch.

`_preemption` holds `PreemptionWatcher`: a SIGTERM on any worker becomes
one stop step that every worker agrees on (through a tiny all-reduce), so
that they all save a checkpoint at that step and leave cleanly.

May import: `_core`, `cluster`. Through TensorFlow's public API it works
with any strategy and CrossDeviceOps of the package (it needs none of them
by name).
"""

from tf_crossdevice.training._accumulate import GradientAccumulator
from tf_crossdevice.training._preemption import PreemptionWatcher

__all__ = ["GradientAccumulator", "PreemptionWatcher"]
