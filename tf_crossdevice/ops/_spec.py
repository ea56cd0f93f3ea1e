"""SpecAllReduce: any all_reduce_spec algorithm as a CrossDeviceOps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice import algorithms
from tf_crossdevice.compression import (
    PowerSGD,
    WirePolicy,
    check_compression,
)
from tf_crossdevice.ops._adapter import CrossDeviceOpsAdapter
from tf_crossdevice.ops._in_process import InProcessReducer
from tf_crossdevice.packing import PackedAllReduce, check_packing


class SpecAllReduce(CrossDeviceOpsAdapter):
    """All-reduce with the algorithms of TF 1's all_reduce_spec.

    Works across the devices of one process (logical CPUs, GPUs) and across
    worker processes in one graph (devices named `/job:worker/task:i/...`);
    devices are grouped into workers by their job, replica and task.

    Args:
        all_reduce_spec: which algorithm reduces which tensor sizes. One of
            - a name: xring, rechd, pscpu, psgpu, nccl, hierarchical_copy
              (the registry's names), or 'inner/outer' for any two of them
              (TF 1 had nccl/xring, nccl/rechd, nccl/pscpu, pscpu/pscpu);
            - a tuple `(alg, shards, limit)` of 1 to 3 elements;
            - a list of such tuples whose limits increase and end with -1;
            - the tf_cnn_benchmarks grammar: `alg#shards`, `alg/alg`, and
              ranges `spec:size:spec` with sizes in bytes, suffix k, M or G
              (e.g. "pscpu:32k:xring#2").
            Limits are in bytes: a (packed) tensor goes to the first range
            whose limit it does not exceed. Algorithms with a '/' reduce
            inside each worker first, then across one device per worker.
            Where NCCL cannot run (CPU devices) its stage logs one warning
            and sums on one device instead.
        num_packs: if > 0, concatenate each dtype's tensors and split them
            into this many packs first (0: no packing).
        agg_small_grads_max_bytes: with num_packs=0, concatenate tensors of
            at most this many bytes into groups first (0: off).
        agg_small_grads_max_group: the most tensors in one such group.
        compression: keyword-only; None (default), 'bf16' or 'fp16'. Float32
            and float64 values that cross worker boundaries (devices with
            different job, replica or task) travel as 16 bits: encoded on
            the sender's device, decoded back to their dtype on the
            receiver's, every addition in the original dtype. Inside a
            worker nothing changes; for 'inner/outer' only the outer stage
            compresses. Ints, float16 and bfloat16 pass unchanged (exact).
            When a reduction crosses workers its final sum is rounded to 16
            bits once, so every replica gets the same bits. See the README
            section "Wire compression" for the error bounds; in short, one
            transfer errs by at most 2**-8 (bf16) or 2**-11 (fp16) relative,
            and a sum over p workers by about k * u * sum|x_i| with k = 2
            for pscpu-style and two-level specs and k <= p + 1 for xring.

    Raises:
        ValueError: a bad spec (the message quotes it, points at the bad
            part and lists the algorithms) or bad packing arguments.
        TypeError: arguments of the wrong type.

    >>> devices = tf_crossdevice.testing.cpu_devices(4)
    >>> ops = tf_crossdevice.SpecAllReduce("pscpu:1k:xring#2")
    >>> strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=ops)
    >>> @tf.function
    ... def step():
    ...     ctx = tf.distribute.get_replica_context()
    ...     replica = tf.cast(ctx.replica_id_in_sync_group, tf.float32)
    ...     small = tf.ones([8]) * replica
    ...     large = tf.ones([1000])
    ...     return ctx.all_reduce("sum", [small, large])
    >>> small, large = strategy.run(step)
    >>> small.values[0].numpy()[:2], large.values[3].numpy()[:2]
    (array([6., 6.], dtype=float32), array([4., 4.], dtype=float32))
    """

    def __init__(
        self,
        all_reduce_spec: Any = "xring",
        num_packs: int = 0,
        agg_small_grads_max_bytes: int = 0,
        agg_small_grads_max_group: int = 10,
        *,
        compression: str | None = None,
    ):
        self._spec = algorithms.parse_all_reduce_spec(
            all_reduce_spec, algorithms.algorithm_names()
        )
        if isinstance(compression, PowerSGD):
            # PowerSGD approximates sums across workers; SpecAllReduce has
            # no worker boundary of its own to apply it at.
            raise ValueError(
                f"compression: SpecAllReduce cannot carry {compression!r}; "
                "expected None, 'bf16' or 'fp16' (PowerSGD goes to "
                "MultiWorkerAllReduce or the collective classes)"
            )
        wire = WirePolicy(codec=check_compression(compression))
        (
            self._num_packs,
            self._agg_small_grads_max_bytes,
            self._agg_small_grads_max_group,
        ) = check_packing(
            num_packs, agg_small_grads_max_bytes, agg_small_grads_max_group
        )
        super().__init__(
            InProcessReducer(
                type(self).__name__,
                all_reduce=PackedAllReduce(
                    SpecPacks(self._spec, wire),
                    self._num_packs,
                    self._agg_small_grads_max_bytes,
                    self._agg_small_grads_max_group,
                ),
                wire=wire,
            )
        )

    @property
    def all_reduce_spec(self) -> tuple[algorithms.AllReduceSpecTuple, ...]:
        """The parsed spec: one (alg, shards, limit) per size range."""
        return self._spec


class SpecPacks:
    """Sums packs with the algorithm of the spec range their size falls in.

    Each range's packs go as one batch (see `algorithms.all_reduce_batch`).
    """

    def __init__(
        self, spec: tuple[algorithms.AllReduceSpecTuple, ...], wire: WirePolicy
    ) -> None:
        self.spec = spec
        self.builders = {
            r: algorithms.build(r.alg, r.shards, wire=wire) for r in spec
        }

    def __call__(
        self, packs: Sequence[Sequence[tf.Tensor]], indices: Sequence[int]
    ) -> list[list[tf.Tensor]]:
        by_range: dict = {}
        for k, pack in enumerate(packs):
            chosen = algorithms.select_range(self.spec, size_in_bytes(pack[0]))
            by_range.setdefault(chosen, []).append(k)
        results: list[list[tf.Tensor]] = [[] for _ in packs]
        for chosen, members in by_range.items():
            summed = algorithms.all_reduce_batch(
                self.builders[chosen],
                [packs[k] for k in members],
                [indices[k] for k in members],
            )
            for k, sums in zip(members, summed, strict=True):
                results[k] = sums
        return results


def size_in_bytes(tensor: tf.Tensor) -> int:
    """Static size in bytes; a tensor of unknown size counts as unbounded.

    Unbounded sends it to the last range (limit -1), the one meant for the
    largest tensors.
    """
    elements = tensor.shape.num_elements()
    if elements is None:
        return 2**62
    return elements * tensor.dtype.size
