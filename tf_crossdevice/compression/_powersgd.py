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
  `min_compression_size` elements, whose factors are smaller than the
  matrix ((n + m)·r < n·m with r = min(n, m, rank)). Everything else in a
  batch (vectors, scalars, small tensors, integers, 16-bit floats,
  IndexedSlices) is summed exactly, in one call of the sum.
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
- A step whose gradients hold inf or nan anywhere returns non-finite sums
  (as an exact sum would) and leaves the errors and Q as they were: an
  optimizer with loss scaling skips such a step, and the state skips it
  too instead of carrying inf or nan into every later step.
- `start_step`: the first `start_step` batches are summed exactly (the
  paper's and PyTorch's warm-up). Error feedback starts with the first
  compressed step, from zero: exact steps leave no error.

Example: three replicas of one process, summed by a function that adds
their values (a real reduction passes its all-reduce).

>>> def add(batch):  # batch[k][i]: value k on replica i.
...     return [[tf.add_n(list(value))] * len(value) for value in batch]
>>> compressor = PowerSGD(rank=1, min_compression_size=0)
>>> u, v = np.ones((4, 1)), np.arange(1.0, 4.0)[None]
>>> grads = [[tf.constant(u @ v * i), tf.constant([1.0, 2.0])]
...          for i in (1.0, 2.0, 3.0)]           # grads[i][k]: replica i
>>> sums = compressor.sum([list(g) for g in zip(*grads)], add)
>>> np.round(sums[0][0].numpy(), 5).tolist()     # rank 1: exact here
[[6.0, 12.0, 18.0], [6.0, 12.0, 18.0], [6.0, 12.0, 18.0], [6.0, 12.0, 18.0]]
>>> sums[1][2].numpy().tolist()                  # a vector: summed exactly
[3.0, 6.0]
>>> int(compressor.step.numpy())
1
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import tensorflow as tf

from tf_crossdevice._core import checks, tf_internal
from tf_crossdevice.compression import _codec as codec

Value: TypeAlias = Any
"""A dense tf.Tensor or a tf.IndexedSlices."""

AllSum: TypeAlias = Callable[[list[list[Value]]], list[list[Value]]]
"""Sums a batch across every replica: `batch[k][i]` is value k on this
process's replica i; the result's `[k][i]` is the sum of value k over every
replica of every worker, on replica i's device."""

_COMPRESSIBLE = (tf.float32, tf.float64)


@dataclasses.dataclass(frozen=True)
class MatrixState:
    """The state of one compressed tensor (see `PowerSGD.state`).

    Attributes:
        position: the tensor's index in the batch.
        shape: the tensor's shape.
        matrix_shape: (n, m), the matrix it is reshaped to.
        rank: r = min(n, m, the compressor's rank).
        q: the factor Q, (m, r): the last step's all-reduced Q (before the
            next step orthogonalises it), or the seeded initial one; the
            first replica's copy.
        errors: the error feedback of each replica, (n, m) each.
        q_replicas: every replica's copy of Q, each on its replica's
            device (the first is `q`): the same values, kept where they are
            used, so that no step reads Q across a worker boundary.
    """

    position: int
    shape: tuple[int, ...]
    matrix_shape: tuple[int, int]
    rank: int
    q: tf.Variable
    errors: tuple[tf.Variable, ...]
    q_replicas: tuple[tf.Variable, ...]


class _Matrix(tf.Module):
    """The variables of one compressed tensor, tracked for checkpoints."""

    def __init__(
        self, qs: list[tf.Variable], errors: list[tf.Variable], name: str
    ) -> None:
        super().__init__(name=name)
        self.q = qs[0]
        self.q_copies = qs[1:]
        self.errors = errors


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
        name: the module's name.

    Raises:
        TypeError: an argument is not an int.
        ValueError: `rank` < 1, or `start_step` or `min_compression_size`
            < 0.

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
        name: str | None = None,
    ) -> None:
        super().__init__(name=name)
        self._rank = checks.positive_int(rank, "rank")
        self._start_step = checks.non_negative_int(start_step, "start_step")
        self._min_size = checks.non_negative_int(
            min_compression_size, "min_compression_size"
        )
        self._seed = checks.integer(seed, "seed")
        # Every variable is created on first use: building the compressor
        # must not start TensorFlow's runtime, which a multi-worker
        # strategy built after it still has to configure.
        self._step: tf.Variable | None = None
        self._matrices: dict[str, _Matrix] = {}
        self._signature: tuple[Any, ...] | None = None
        self._replicas: int | None = None
        self._layout: dict[int, tuple[tuple[int, ...], int, int, int]] = {}

    def __repr__(self) -> str:
        return (
            f"PowerSGD(rank={self._rank}, start_step={self._start_step}, "
            f"min_compression_size={self._min_size}, seed={self._seed})"
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
        return (n + m) * r < n * m

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
        matrix = self._matrices[_key(position)]
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
                every worker (an all-reduce; see `AllSum`). Called at most
                three times: the values summed exactly, the Ps and the Qs
                (one concatenated tensor per dtype each).
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

        exact = [k for k in range(len(batch)) if k not in compressed]
        results: list[Any] = [None] * len(batch)
        if exact:
            for k, sums in zip(
                exact, all_sum([batch[k] for k in exact]), strict=True
            ):
                results[k] = sums
        matrices = [batch[k] for k in compressed]

        def exact_sums() -> list[list[tf.Tensor]]:
            return [list(v) for v in all_sum(matrices)]

        def compressed_sums() -> list[list[tf.Tensor]]:
            return self._compressed_sums(matrices, compressed, all_sum, devices)

        if self._start_step == 0:
            sums = compressed_sums()
        else:
            sums = tf.cond(
                self.step < self._start_step, exact_sums, compressed_sums
            )
        with tf.control_dependencies(_flat(sums)):
            counted = self.step.assign_add(1)
        # A TF 1 Session that fetches only the sums still counts the step.
        with tf.control_dependencies([counted]):
            for k, per_replica in zip(compressed, sums, strict=True):
                results[k] = [
                    _on(devices, i, tf.identity, t)
                    for i, t in enumerate(per_replica)
                ]
        return results

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
            if _key(k) in self._matrices:
                continue
            tensor = batch[k][0]
            shape = tuple(tensor.shape.as_list())
            n, m = self.matrix_shape(shape)
            r = min(n, m, self._rank)
            dtype = tensor.dtype
            with tf.init_scope():
                qs, errors = [], []
                for i in range(replicas):
                    with _device(devices, i):
                        qs.append(
                            tf_internal.new_resource_variable(
                                tf.random.stateless_normal(
                                    (m, r), seed=(self._seed, k), dtype=dtype
                                ),
                                trainable=False,
                                name=f"powersgd_q_{k}" + f"_{i}" * (i > 0),
                            )
                        )
                        errors.append(
                            tf_internal.new_resource_variable(
                                tf.zeros((n, m), dtype),
                                trainable=False,
                                name=f"powersgd_error_{k}_{i}",
                            )
                        )
            self._layout[k] = (shape, n, m, r)
            # Assigning tracks the new variables; a checkpoint restored
            # before they existed fills them in now.
            self._matrices[_key(k)] = _Matrix(qs, errors, _key(k))

    def _compressed_sums(
        self,
        matrices: list[list[tf.Tensor]],
        positions: list[int],
        all_sum: AllSum,
        devices: list[str] | None,
    ) -> list[list[tf.Tensor]]:
        replicas = len(matrices[0])
        layouts = [self._layout[k] for k in positions]
        states = [self._matrices[_key(k)] for k in positions]
        qs = [[state.q, *state.q_copies] for state in states]
        # One all-reduce of every P (and one of every Q) per dtype. Within
        # it, matrices with factors of one shape sit side by side, so that
        # their factors are orthogonalised together, in one batch of ops
        # instead of one small op per column per matrix.
        dtypes = list(dict.fromkeys(value[0].dtype for value in matrices))
        groups = [
            sorted(
                (j for j, value in enumerate(matrices) if value[0].dtype == d),
                key=lambda j: (layouts[j][1], layouts[j][3]),
            )
            for d in dtypes
        ]

        m_of: dict[tuple[int, int], tf.Tensor] = {}
        p_local: dict[tuple[int, int], tf.Tensor] = {}
        for i in range(replicas):
            with _device(devices, i):
                q_start: dict[int, tf.Tensor] = {}
                for run in _runs(
                    range(len(matrices)),
                    lambda j: (matrices[j][0].dtype, layouts[j][2:]),
                ):
                    q_start.update(
                        zip(
                            run,
                            _orthogonalize_each(
                                [qs[j][i].read_value() for j in run]
                            ),
                            strict=True,
                        )
                    )
                for j, (value, (_, n, m, _), state) in enumerate(
                    zip(matrices, layouts, states, strict=True)
                ):
                    matrix = tf.reshape(value[i], (n, m))
                    m_of[j, i] = matrix + state.errors[i].read_value()
                    p_local[j, i] = tf.matmul(m_of[j, i], q_start[j])

        p_sums = all_sum(
            [
                [
                    _concat([p_local[j, i] for j in group], devices, i)
                    for i in range(replicas)
                ]
                for group in groups
            ]
        )
        p_hat: dict[tuple[int, int], tf.Tensor] = {}
        q_local: dict[tuple[int, int], tf.Tensor] = {}
        for group, sums in zip(groups, p_sums, strict=True):
            runs = _runs(group, lambda j: layouts[j][1::2])
            for i in range(replicas):
                with _device(devices, i):
                    parts = _split(
                        sums[i],
                        [
                            len(run) * layouts[run[0]][1] * layouts[run[0]][3]
                            for run in runs
                        ],
                    )
                    for run, part in zip(runs, parts, strict=True):
                        _, n, _, r = layouts[run[0]]
                        batch = orthogonalize(tf.reshape(part, (-1, n, r)))
                        for j, p in zip(
                            run, tf.unstack(batch, num=len(run)), strict=True
                        ):
                            p_hat[j, i] = p
                    for j in group:
                        # M^T P^ as (P^T M)^T: a product that reads M along
                        # its rows, several times faster than transposing
                        # M's reads; only the small result is transposed.
                        q_local[j, i] = tf.transpose(
                            tf.matmul(p_hat[j, i], m_of[j, i], transpose_a=True)
                        )

        q_sums = all_sum(
            [
                [
                    _concat([q_local[j, i] for j in group], devices, i)
                    for i in range(replicas)
                ]
                for group in groups
            ]
        )
        results: list[list[tf.Tensor]] = [
            [None] * replicas
            for _ in matrices  # type: ignore[list-item]
        ]
        done = []
        for i in range(replicas):
            with _device(devices, i):
                # A non-finite gradient anywhere makes some summed Q (the
                # same on every replica) non-finite, and its sum too: an
                # optimizer with loss scaling skips that step, and so does
                # the state, which would otherwise stay non-finite for good.
                finite = tf.reduce_all(
                    [tf.reduce_all(tf.math.is_finite(s[i])) for s in q_sums]
                )
                kept = []
                for group, sums in zip(groups, q_sums, strict=True):
                    parts = _split(
                        sums[i], [layouts[j][2] * layouts[j][3] for j in group]
                    )
                    for j, part in zip(group, parts, strict=True):
                        shape, _, m, r = layouts[j]
                        q_sum = tf.reshape(part, (m, r))
                        approx = tf.matmul(p_hat[j, i], q_sum, transpose_b=True)
                        results[j][i] = tf.reshape(approx, shape)
                        # The replica's own residual: see the module
                        # docstring (the errors add up to sum M - M^).
                        sent = tf.matmul(
                            p_hat[j, i], q_local[j, i], transpose_b=True
                        )
                        kept.append((states[j].errors[i], m_of[j, i] - sent))
                        kept.append((qs[j][i], q_sum))
                done.append(_assign_if(finite, kept))
        with tf.control_dependencies(done):
            return [
                [_on(devices, i, tf.identity, t) for i, t in enumerate(v)]
                for v in results
            ]


def split_compression(value: Any) -> tuple[str | None, PowerSGD | None]:
    """A between-worker reduction's `compression` argument as (the wire
    codec, the PowerSGD compressor): one of them, or neither.

    >>> split_compression("bf16")
    ('bf16', None)
    >>> split_compression("powersgd")
    Traceback (most recent call last):
    ...
    ValueError: compression: unknown value 'powersgd'; expected one of \
None, 'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD
    """
    if isinstance(value, PowerSGD):
        return None, value
    try:
        return codec.check_compression(value), None
    except ValueError:
        raise ValueError(
            f"compression: unknown value {value!r}; expected one of None, "
            "'bf16', 'fp16' or a tf_crossdevice.compression.PowerSGD"
        ) from None


def orthogonalize(matrix: tf.Tensor) -> tf.Tensor:
    """`matrix`'s columns made orthonormal, left to right (Gram-Schmidt);
    a batch of matrices (..., n, r) one by one.

    Two passes of modified Gram-Schmidt: the second removes what rounding
    left of the earlier columns, so a nearly dependent column still comes
    out orthogonal. A column that is (or becomes) exactly zero stays zero.
    For a matrix of full column rank this is the Q of its QR factorization
    with R's diagonal positive.

    >>> p = orthogonalize(tf.constant([[3.0, 1.0], [4.0, 1.0]], tf.float64))
    >>> np.round(p.numpy(), 4).tolist()
    [[0.6, 0.8], [0.8, -0.6]]
    """
    columns = tf.unstack(matrix, axis=-1)
    done: list[tf.Tensor] = []
    for column in columns:
        for _ in range(2):
            for previous in done:
                dot = tf.reduce_sum(previous * column, axis=-1, keepdims=True)
                column -= dot * previous
        norm = tf.norm(column, axis=-1, keepdims=True)
        done.append(tf.math.divide_no_nan(column, norm))
    return tf.stack(done, axis=-1)


def _orthogonalize_each(matrices: list[tf.Tensor]) -> list[tf.Tensor]:
    """`orthogonalize` of each of `matrices` (one shape), in one batch."""
    batch = orthogonalize(tf.stack(matrices))
    return tf.unstack(batch, num=len(matrices))


def _runs(items: Any, key: Callable[[int], Any]) -> list[list[int]]:
    """`items` (ints) grouped by `key`, groups and items in order of first
    appearance (runs of consecutive items where `items` is sorted by
    `key`)."""
    runs: dict[Any, list[int]] = {}
    for item in items:
        runs.setdefault(key(item), []).append(item)
    return list(runs.values())


def _assign_if(
    condition: tf.Tensor, assignments: list[tuple[tf.Variable, tf.Tensor]]
) -> tf.Tensor:
    """Assigns each value to its variable if `condition` (a scalar bool)
    holds, else leaves every variable alone; returns a tensor that exists
    once that is done either way.

    With the graph's own Switch and Merge: `tf.where` would pass over every
    element of every error buffer to pick one whole tensor, and `tf.cond`
    registers its branches as functions, on the remote workers in-graph,
    where the client's teardown then races the servers' shutdown. Switch
    forwards a tensor to one of its outputs; the assignment fed by the
    other never runs. Eagerly, where tensors have values, the condition is
    read and the assignments run or not.
    """
    if tf.executing_eagerly():
        if bool(condition):
            for variable, value in assignments:
                variable.assign(value)
        return condition
    updates = [
        variable.assign(tf.raw_ops.Switch(data=value, pred=condition)[1])
        for variable, value in assignments
    ]
    skipped, applied = tf.raw_ops.Switch(data=condition, pred=condition)
    with tf.control_dependencies(updates):
        applied = tf.identity(applied)
    return tf.raw_ops.Merge(inputs=[skipped, applied]).output


def _key(position: int) -> str:
    return f"value_{position}"


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


def _device(devices: Sequence[str] | None, i: int) -> Any:
    # None keeps the caller's scope (tf.device(None) would clear it).
    return tf.device(devices[i]) if devices else contextlib.nullcontext()


def _on(devices: list[str] | None, i: int, fn: Any, *args: Any) -> Any:
    with _device(devices, i):
        return fn(*args)


def _concat(
    parts: list[tf.Tensor], devices: list[str] | None, i: int
) -> tf.Tensor:
    with _device(devices, i):
        return tf.concat([tf.reshape(p, [-1]) for p in parts], axis=0)


def _split(flat: tf.Tensor, sizes: list[int]) -> list[tf.Tensor]:
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]


def _flat(nested: Any) -> list[tf.Tensor]:
    return tf.nest.flatten(nested)
