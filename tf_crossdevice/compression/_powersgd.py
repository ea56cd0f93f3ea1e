"""PowerSGD: low-rank gradient compression with error feedback.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization" (NeurIPS 2019), Algorithm 1 with
error feedback and warm start. Instead of a gradient matrix, every replica
sends two thin matrices of `rank` columns; what the approximation leaves
out stays with the replica as error feedback and is added to its next
gradient, so nothing is lost, only delayed.

One step, for every compressible gradient g (replica i of N):

    M_i  = g_i reshaped to a matrix + e_i       (e_i: replica i's error)
    P_i  = M_i Q                                (Q: the warm-started factor)
    P    = sum_i P_i                            (all-reduce #1)
    P^   = orthogonalise(P)                     (Gram-Schmidt, every replica)
    Q_i  = M_i^T P^
    Q    = sum_i Q_i                            (all-reduce #2)
    M^   = P^ Q^T  = P^ P^^T (sum_i M_i)        (what every replica gets)
    e_i <- M_i - P^ Q_i^T                       (what replica i did not send)

Decisions, and why:

- Reshape: a tensor of shape (d_1, ..., d_k, c) becomes the matrix
  (d_1·...·d_k, c). TensorFlow keeps output channels last (Dense kernels
  (in, out), Conv2D kernels (h, w, in, out)), so this is PyTorch's
  "output channels × the rest" transposed, and a free reshape. A rank-r
  approximation does not care which side is which (Mᵀ's is the transpose
  of M's); only which factor is warm-started changes.
- SUM, not MEAN: `sum` approximates the sum over every replica. Every step
  is linear in the replicas' matrices once P^ is fixed, and P^ does not
  depend on P's scale, so the mean is the sum divided by N afterwards,
  exactly as for exact reductions; the caller divides. The error is each
  replica's own residual M_i - P^ Q_iᵀ (the paper's form), so the errors
  of all replicas add up to sum_i M_i - M^ whatever the reduction: the
  running sum of what was applied plus the errors held equals the running
  sum of the true gradients.
- Q is orthogonalised (like P) before each step's product M Q. The result
  depends only on the column space of M Q, which that does not change;
  it keeps P's magnitude that of the gradients, so tiny gradients do not
  underflow. Q starts as `tf.random.stateless_normal((m, r),
  seed=(seed, position))`: the same on every replica and every worker
  without communication.
- Gram-Schmidt runs twice over the columns ("twice is enough"): a column
  that is nearly a combination of the previous ones (gradients of rank
  below `rank`, common with small batches) still comes out orthogonal to
  them. A column that is exactly zero stays zero.
- Which tensors are compressed (`compresses`): float32 and float64 dense
  tensors of fully known shape with at least two dimensions and at least
  `min_compression_size` elements, whose factors are at least
  `min_compression_rate` times smaller than the matrix ((n + m)·r·rate <
  n·m with r = min(n, m, rank); PyTorch's rule, and its default rate 2: a
  tensor the factors would shrink by less is not worth its two
  all-reduces, its products and its approximation error). Everything
  else in a batch (vectors, scalars, small tensors, integers, 16-bit
  floats, IndexedSlices) is summed exactly, in one call of the sum, after
  the factors.
- Buckets (`bucket_bytes`): the compressed tensors' factors are
  all-reduced bucket by bucket, last layers first, so that with the
  collectives (which run in the order they are issued) the first bucket
  crosses while backpropagation computes the others, as PyTorch's PowerSGD
  hook compresses each DDP bucket on its own. The errors and Qs of every
  bucket are updated together, once every Q sum and every exact sum of
  the batch is known finite.
- State is keyed by position in the batch: the factor Q of every
  compressed tensor and its error, on every replica, live in variables the
  compressor owns (it is a `tf.Module`, so `tf.train.Checkpoint(...,
  compression=compressor)` saves and restores them). Every replica keeps its
  own copy of Q (the same values: each updates it from the same all-reduced
  sum), so that no step reads Q from another worker. They are created on
  first use, inside a tf.function's first trace too. This assumes the same
  batch of gradients every step, in the same order (an optimizer's
  gradients are); a later batch of other shapes or dtypes raises. A batch
  with nothing to compress (a scalar loss, say) is summed exactly and
  leaves the state and the step alone.
- A step whose gradients hold inf or nan anywhere (in a compressed tensor
  or in one summed exactly, such as a bias) returns non-finite sums (as
  an exact sum would) and leaves the errors and Q as they were: an
  optimizer with loss scaling skips such a step, and the state skips it
  too instead of carrying inf or nan into every later step. The step
  still counts in `step` (and towards `start_step`): it counts batches.
- `start_step`: the first `start_step` batches are summed exactly (the
  paper's and PyTorch's warm-up). Error feedback starts with the first
  compressed step, from zero: exact steps leave no error.

Here: the compressor, which tensors it compresses and its checks. The
compressed step is in `_powersgd_step`, the variables it keeps in
`_powersgd_state`, Gram-Schmidt in `_orthogonalize`.

Example: three replicas of one process, summed by a function that adds
their values (a real reduction passes its all-reduce).

>>> def add(batch):  # batch[k][i]: value k on replica i.
...     return [[tf.add_n(list(value))] * len(value) for value in batch]
>>> compressor = PowerSGD(rank=1, min_compression_size=0)
>>> u, v = np.ones((5, 1)), np.arange(1.0, 5.0)[None]  # factors: 9 of 20
>>> grads = [[tf.constant(u @ v * i), tf.constant([1.0, 2.0])]
...          for i in (1.0, 2.0, 3.0)]           # grads[i][k]: replica i
>>> sums = compressor.sum([list(g) for g in zip(*grads)], add)
>>> np.allclose(sums[0][0].numpy(), u @ v * 6.0)  # rank 1: exact here
True
>>> sums[1][2].numpy().tolist()                  # a vector: summed exactly
[3.0, 6.0]
>>> int(compressor.step.numpy())
1
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal
from tf_crossdevice.compression._powersgd_state import (
    Layout,
    Matrix,
    MatrixState,
    matrix_key,
    new_matrix,
)
from tf_crossdevice.compression._powersgd_step import (
    AllSum,
    Value,
    compressed_sums,
)
from tf_crossdevice.compression._replica_devices import on_replica

_COMPRESSIBLE = (tf.float32, tf.float64)


class PowerSGD(tf.Module):
    """Low-rank compression of gradient sums with error feedback (PowerSGD).

    Pass it as the `compression` of a reduction that supports it; that
    reduction calls `sum` with its own all-reduce. See the module docstring
    for the algorithm and the decisions behind it.

    Args:
        rank: columns of the factors P and Q; bytes sent per compressed
            n×m matrix are (n + m)·rank values instead of n·m. The paper
            and PyTorch find 1 to 4 enough for most image models.
        start_step: batches summed exactly before compression starts
            (warm-up); error feedback starts with compression.
        min_compression_size: tensors with fewer elements are summed
            exactly.
        seed: seeds the initial Q (the same on every replica and worker).
        bucket_bytes: the compressed gradients are all-reduced in buckets
            of about this many bytes of gradients (each at least that large,
            the last excepted), last layers first, each bucket's P and Q
            all-reduces on their own, so that the first bucket crosses while
            the backward pass computes the rest. The default is PyTorch
            DDP's bucket size: a few buckets for a large model, so the
            added collectives cost little; 0 makes one bucket of all.
        min_compression_rate: an n×m tensor is compressed only if its
            factors are at least this many times smaller than it:
            (n + m)·r·min_compression_rate < n·m, r = min(n, m, rank)
            (PyTorch's rule and default); a number >= 1.
        name: the module's name.

    Raises:
        TypeError: an argument is not an int (`min_compression_rate`: not
            an int or float).
        ValueError: `rank` < 1, `start_step`, `min_compression_size` or
            `bucket_bytes` < 0, or `min_compression_rate` < 1.

    >>> PowerSGD(rank=0)
    Traceback (most recent call last):
    ...
    ValueError: rank: expected an int >= 1, got 0
    """

    def __init__(
        self,
        rank: int = 4,
        start_step: int = 0,
        min_compression_size: int = 4096,
        seed: int = 0,
        bucket_bytes: int = 25 << 20,
        min_compression_rate: float = 2.0,
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self._rank = checks.positive_int(rank, "rank")
        self._start_step = checks.non_negative_int(start_step, "start_step")
        self._min_size = checks.non_negative_int(
            min_compression_size, "min_compression_size"
        )
        self._seed = checks.integer(seed, "seed")
        self._bucket_bytes = checks.non_negative_int(
            bucket_bytes, "bucket_bytes"
        )
        self._min_rate = checks.number_at_least(
            min_compression_rate, "min_compression_rate", 1
        )
        # Every variable is created on first use: building the compressor
        # must not start TensorFlow's runtime, which a multi-worker
        # strategy built after it still has to configure.
        self._step: tf.Variable | None = None
        self._matrices: dict[str, Matrix] = {}
        self._signature: tuple[Any, ...] | None = None
        self._replicas: int | None = None
        self._layout: dict[int, Layout] = {}

    def __repr__(self) -> str:
        return (
            f"PowerSGD(rank={self._rank}, start_step={self._start_step}, "
            f"min_compression_size={self._min_size}, seed={self._seed}, "
            f"bucket_bytes={self._bucket_bytes}, "
            f"min_compression_rate={self._min_rate})"
        )

    @property
    def rank(self) -> int:
        """The factors' columns (at most; see `compresses`)."""
        return self._rank

    @property
    def start_step(self) -> int:
        """Batches summed exactly before compression starts."""
        return self._start_step

    @property
    def min_compression_size(self) -> int:
        """Tensors with fewer elements are summed exactly."""
        return self._min_size

    @property
    def min_compression_rate(self) -> float:
        """How many times smaller than a tensor its factors must be for it
        to be compressed (see `compresses`)."""
        return self._min_rate

    @property
    def seed(self) -> int:
        """Seeds the initial Q."""
        return self._seed

    @property
    def step(self) -> tf.Variable:
        """Batches with something to compress summed so far (int64)."""
        if self._step is None:
            # Plain variables, also inside a strategy's scope: the state
            # belongs to this process's replicas, it is not mirrored.
            with tf.init_scope():
                self._step = tf_internal.new_resource_variable(
                    tf.constant(0, tf.int64),
                    trainable=False,
                    name="powersgd_step",
                )
        return self._step

    @staticmethod
    def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
        """The matrix a tensor of `shape` (two or more dimensions) becomes.

        >>> PowerSGD.matrix_shape((3, 3, 16, 32))
        (144, 32)
        """
        dims = [int(d) for d in shape]
        if len(dims) < 2:
            raise ValueError(
                f"shape: expected two or more dimensions, got {tuple(dims)}"
            )
        rows = 1
        for d in dims[:-1]:
            rows *= d
        return rows, dims[-1]

    def compresses(self, shape: Any, dtype: Any) -> bool:
        """Whether a dense tensor of `shape` and `dtype` is compressed.

        >>> c = PowerSGD(rank=4, min_compression_size=1000)
        >>> c.compresses((64, 32), tf.float32), c.compresses((64,), "float32")
        (True, False)
        >>> c.compresses((20, 20), tf.float32)   # 400 < 1000 elements
        False
        >>> c.compresses((4096, 2), tf.float32)  # factors not smaller
        False
        >>> c.compresses((256, 8), tf.float32)   # 1056 values for 2048
        False
        >>> at_1 = PowerSGD(rank=4, min_compression_size=1000,
        ...                 min_compression_rate=1)
        >>> at_1.compresses((256, 8), tf.float32)  # smaller is enough
        True
        >>> c.compresses((64, 32), tf.int32), c.compresses((64, 32), "bfloat16")
        (False, False)
        """
        if tf.as_dtype(dtype) not in _COMPRESSIBLE:
            return False
        shape = tf.TensorShape(shape)
        if not shape.is_fully_defined() or shape.rank < 2:
            return False
        if shape.num_elements() < max(self._min_size, 1):
            return False
        n, m = self.matrix_shape(shape.as_list())
        r = min(n, m, self._rank)
        return (n + m) * r * self._min_rate < n * m

    def elements_sent(self, shape: Any, dtype: Any = tf.float32) -> int:
        """Values one replica sends for a tensor of `shape` and `dtype`:
        (n + m)·r (its P and its Q) if it is compressed, else its size.

        The bytes are that times the dtype's size, per all-reduced value
        (an all-reduce algorithm moves a multiple of it).

        >>> c = PowerSGD(rank=4)
        >>> c.elements_sent((3, 3, 256, 256)), 3 * 3 * 256 * 256
        (10240, 589824)
        >>> c.elements_sent((256,))
        256
        """
        if self.compresses(shape, dtype):
            n, m = self.matrix_shape(tf.TensorShape(shape).as_list())
            return (n + m) * min(n, m, self._rank)
        size = tf.TensorShape(shape).num_elements()
        if size is None:
            raise ValueError(
                f"shape: expected a fully known shape, got {shape!r}"
            )
        return size

    def state(self, position: int) -> MatrixState:
        """The variables of the compressed tensor at `position` in the batch.

        Raises:
            KeyError: no compressed tensor at `position` (yet): state is
                created by the first `sum`.
        """
        if position not in self._layout:
            raise KeyError(
                f"position: no compressed tensor at {position!r}; "
                f"compressed positions: {sorted(self._layout)}"
            )
        shape, n, m, r = self._layout[position]
        matrix = self._matrices[matrix_key(position)]
        return MatrixState(
            position,
            shape,
            (n, m),
            r,
            matrix.q,
            tuple(matrix.errors),
            (matrix.q, *matrix.q_copies),
        )

    # ---- Summing ------------------------------------------------------------

    def sum(
        self,
        batch: Sequence[Sequence[Value]],
        all_sum: AllSum,
        devices: Sequence[str] | None = None,
    ) -> list[list[Value]]:
        """The sums of `batch` over every replica, compressed where it pays.

        Args:
            batch: `batch[k][i]`, value k (a tensor or IndexedSlices) on
                this process's replica i; every value has one component
                per replica.
            all_sum: sums a batch of the same layout over every replica of
                every worker (an all-reduce; see `AllSum`). Called for each
                bucket's Ps and its Qs (one concatenated tensor per dtype
                each; see `buckets`), then once for the values summed
                exactly.
            devices: replica i's device, where its error and its part of
                the computation go; None leaves placement to the caller's
                scope.

        Returns:
            `result[k][i]`: the (approximate) sum of value k, on replica i.
            Every replica gets the same compressed sums.

        Raises:
            ValueError: the batch's layout (count, shapes, dtypes, replica
                count) differs from the first batch this compressor
                compressed, or the values do not all have the same number
                of replicas.
        """
        return self._sum([list(v) for v in batch], all_sum, devices)

    def _sum(
        self,
        batch: list[list[Value]],
        all_sum: AllSum,
        devices: Sequence[str] | None,
    ) -> list[list[Value]]:
        if not batch:
            return []
        replicas = len(batch[0])
        if replicas == 0 or any(len(v) != replicas for v in batch):
            raise ValueError(
                "batch: expected every value to have one component per "
                f"replica, got {[len(v) for v in batch]} components"
            )
        if devices is not None:
            devices = list(devices)
            if len(devices) != replicas:
                raise ValueError(
                    f"devices: expected {replicas} devices (one per replica),"
                    f" got {len(devices)}"
                )
        compressed = [
            k
            for k, value in enumerate(batch)
            if not isinstance(value[0], tf.IndexedSlices)
            and self.compresses(value[0].shape, value[0].dtype)
        ]
        if not compressed:
            return all_sum(batch)
        self._check_layout(batch, replicas)
        self._create_state(batch, compressed, devices, replicas)
        return self._sum_compressed(batch, compressed, all_sum, devices)

    def _sum_compressed(
        self,
        batch: list[list[Value]],
        compressed: list[int],
        all_sum: AllSum,
        devices: Sequence[str] | None,
    ) -> list[list[Value]]:
        """`_sum` of a batch that holds something to compress (at
        `compressed`): its factors, bucket by bucket (or, before
        `start_step`, its matrices exactly), then the rest exactly, then the
        errors and Qs, updated only if all of it is finite."""
        matrices = [batch[k] for k in compressed]
        buckets = self.buckets([_num_bytes(m[0]) for m in matrices])
        # The rest is summed after the factors: a device's collectives run
        # in the order they are issued, and this sum waits for the first
        # layers' vectors, so issued first it would hold every bucket until
        # the backward pass ends. It is small (vectors, small tensors).
        exact = sorted(set(range(len(batch))) - set(compressed))

        def rest_sums() -> list[list[Value]]:
            return all_sum([batch[k] for k in exact]) if exact else []

        def exact_sums() -> tuple[list[list[Value]], list[list[Value]]]:
            sums: list[Any] = [None] * len(matrices)
            for bucket in buckets:
                _sum_into(sums, matrices, bucket, all_sum)
            return sums, rest_sums()

        def low_rank_sums() -> tuple[list[list[Value]], list[list[Value]]]:
            return compressed_sums(
                matrices,
                [self._layout[k] for k in compressed],
                [self._matrices[matrix_key(k)] for k in compressed],
                all_sum,
                devices,
                buckets,
                rest_sums,
            )

        if self._start_step == 0:
            sums, rest = low_rank_sums()
        else:
            sums, rest = tf.cond(
                self.step < self._start_step, exact_sums, low_rank_sums
            )
            # tf.cond's outputs are its own: each back on its replica.
            rest = [_on_each_replica(devices, v) for v in rest]
        results: list[Any] = [None] * len(batch)
        for k, per_replica in zip(exact, rest, strict=True):
            results[k] = list(per_replica)
        with tf.control_dependencies(_flat(sums)):
            counted = self.step.assign_add(1)
        # A TF 1 Session that fetches only the sums still counts the step.
        with tf.control_dependencies([counted]):
            for k, per_replica in zip(compressed, sums, strict=True):
                results[k] = _on_each_replica(devices, per_replica)
        return results

    def buckets(self, num_bytes: Sequence[int]) -> list[list[int]]:
        """Positions of the compressed tensors, grouped into the buckets
        their factors are all-reduced in, in that order: taken last
        position first, a bucket closed once it holds more than
        `bucket_bytes` (TensorFlow's rule for packs); with `bucket_bytes`
        0, one bucket. Positions ascend inside a bucket.

        >>> PowerSGD(bucket_bytes=10).buckets([8, 8, 8, 8, 8])
        [[3, 4], [1, 2], [0]]
        >>> PowerSGD(bucket_bytes=0).buckets([8, 8, 8])
        [[0, 1, 2]]
        """
        out: list[list[int]] = []
        size = 0
        for j in reversed(range(len(num_bytes))):
            if not out or (self._bucket_bytes and size > self._bucket_bytes):
                out.append([])
                size = 0
            out[-1].append(j)
            size += num_bytes[j]
        return [sorted(bucket) for bucket in out]

    def _check_layout(self, batch: list[list[Value]], replicas: int) -> None:
        signature = tuple(_spec(value[0]) for value in batch)
        if self._signature is None:
            self._signature = signature
            self._replicas = replicas
            return
        if signature != self._signature or replicas != self._replicas:
            raise ValueError(
                "batch: PowerSGD keeps state (error feedback, Q) per "
                "position in the batch of gradients and expects the same "
                "batch every step; the first had "
                f"{_describe(self._signature, self._replicas)}, this one "
                f"{_describe(signature, replicas)}. Use one compressor per "
                "batch of gradients, and reduce other values (metrics, "
                "losses) with strategy.reduce or without PowerSGD."
            )

    def _create_state(
        self,
        batch: list[list[Value]],
        compressed: list[int],
        devices: list[str] | None,
        replicas: int,
    ) -> None:
        for k in compressed:
            if matrix_key(k) in self._matrices:
                continue
            tensor = batch[k][0]
            shape = tuple(tensor.shape.as_list())
            n, m = self.matrix_shape(shape)
            layout = Layout(shape, n, m, min(n, m, self._rank))
            matrix = new_matrix(
                layout, tensor.dtype, k, self._seed, devices, replicas
            )
            self._layout[k] = layout
            # Assigning tracks the new variables; a checkpoint restored
            # before they existed fills them in now.
            self._matrices[matrix_key(k)] = matrix


def _spec(value: Value) -> tuple[Any, ...]:
    if isinstance(value, tf.IndexedSlices):
        return ("IndexedSlices", value.values.dtype.name)
    return ("Tensor", value.dtype.name, tuple(value.shape.as_list()))


def _describe(signature: Any, replicas: Any) -> str:
    values = ", ".join(
        f"{s[1]}{list(s[2])}" if s[0] == "Tensor" else f"{s[1]} IndexedSlices"
        for s in signature
    )
    return f"{len(signature)} values on {replicas} replica(s) [{values}]"


def _sum_into(
    out: list[Any],
    batch: Sequence[Sequence[Value]],
    positions: Sequence[int],
    all_sum: AllSum,
) -> None:
    """`out[k]`: the sum of `batch[k]` for each of `positions`, in one call
    of `all_sum`."""
    sums = all_sum([list(batch[k]) for k in positions])
    for k, total in zip(positions, sums, strict=True):
        out[k] = list(total)


def _num_bytes(tensor: tf.Tensor) -> int:
    # Compressed tensors have fully known shapes (`compresses`).
    return tensor.shape.num_elements() * tensor.dtype.size


def _flat(nested: Any) -> list[tf.Tensor]:
    return tf.nest.flatten(nested)


def _on_each_replica(
    devices: Sequence[str] | None, per_replica: Sequence[Value]
) -> list[Value]:
    """A new `per_replica[i]` on replica i's device, for every i."""
    return [
        on_replica(devices, i, tf.identity, v)
        for i, v in enumerate(per_replica)
    ]
