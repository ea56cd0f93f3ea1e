"""Reductions among one worker's devices, for the steps between syncs.

Between two syncs of local SGD or DiLoCo a worker's replicas still train as
one model (they all-reduce among themselves), but nothing crosses to the
other workers. The optimizer does not know: it asks for the SUM of the
replicas' gradients, each computed from a loss that Keras (and
`tf.nn.compute_average_loss`) divided by every replica of every worker.
So a sum here is this worker's sum times the number of workers, what the
global sum would be if every worker had this worker's gradients: the
optimizer then applies this worker's mean gradient, as a synchronous step
would apply the job's. A mean is this worker's mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import values


class WithinWorker(tf.distribute.CrossDeviceOps):
    """Reduces among `devices` (this worker's) alone; a SUM is scaled by
    `workers`. Built by the training helpers, not by users."""

    def __init__(self, devices: Sequence[str], workers: int) -> None:
        super().__init__()
        # In-process, through the first device: no collective, so nothing
        # waits for another worker.
        self._one = tf.distribute.ReductionToOneDevice(
            reduce_to_device=devices[0]
        )
        self._workers = workers

    def reduce(
        self,
        reduce_op: Any,
        per_replica_value: Any,
        destinations: Any,
        options: Any = None,
    ) -> Any:
        return self.batch_reduce(
            reduce_op, [(per_replica_value, destinations)], options
        )[0]

    def batch_reduce(
        self, reduce_op: Any, value_destination_pairs: Any, options: Any = None
    ) -> list[Any]:
        # Overridden whole, not through the *_implementation hooks: the
        # base class returns a value with one component as it is, unscaled.
        reduced = self._one.batch_reduce(
            reduce_op, value_destination_pairs, options
        )
        if values.check_reduce_op(reduce_op) != tf.distribute.ReduceOp.SUM:
            return reduced
        return [
            values.regroup(
                [_times(v, self._workers) for v in values.per_destination(r)]
            )
            for r in reduced
        ]

    def broadcast(self, tensor: Any, destinations: Any) -> Any:
        return self._one.broadcast(tensor, destinations)


def _times(value: Any, factor: int) -> Any:
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(
            _times(value.values, factor), value.indices, value.dense_shape
        )
    with tf.device(value.device):
        return value * tf.cast(factor, value.dtype)
