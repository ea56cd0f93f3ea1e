"""One compressed PowerSGD step over a batch of matrices (the algorithm and
the reasons for it are in `_powersgd`'s docstring): bucket by bucket,
every replica's P = M Q, all-reduced, then P^ and every replica's
Q = Mᵀ P^, all-reduced; then the caller's exact sums of the rest of the
batch; then the approximations P^ Qᵀ, and every replica's error and Q
updated unless some summed Q of any bucket, or some exact sum of a float
value, is not finite.

Each all-reduce carries every factor of one dtype of one bucket, flattened
and concatenated. Within it, matrices with factors of one shape sit side by
side, so that their factors are orthogonalised together, in one batch of
ops instead of one small op per column per matrix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

import tensorflow as tf

from tf_crossdevice.compression._orthogonalize import (
    orthogonalize,
    orthogonalize_each,
)
from tf_crossdevice.compression._powersgd_state import Layout, Matrix
from tf_crossdevice.compression._replica_devices import (
    on_replica,
    replica_device,
)

Value: TypeAlias = Any
"""A dense tf.Tensor or a tf.IndexedSlices."""

AllSum: TypeAlias = Callable[[list[list[Value]]], list[list[Value]]]
"""Sums a batch across every replica: `batch[k][i]` is value k on this
process's replica i; the result's `[k][i]` is the sum of value k over every
replica of every worker, on replica i's device."""

OtherSums: TypeAlias = Callable[[], list[list[Value]]]
"""Issues the exact sums of the rest of the batch (an `AllSum` call) and
returns them: `result[k][i]`, the sum of value k on replica i."""

_PerReplica: TypeAlias = dict[tuple[int, int], tf.Tensor]
"""`[j, i]`: matrix j's tensor on replica i."""


@dataclasses.dataclass(frozen=True)
class _Batch:
    """The compressed tensors of one step, and what each one needs.

    Attributes:
        matrices: `matrices[j][i]`, compressed tensor j on replica i.
        layouts: tensor j's layout as a matrix.
        states: tensor j's variables.
        qs: `qs[j][i]`, replica i's copy of tensor j's Q.
        devices: replica i's device, or None for the caller's scope.
        groups: the tensors of each all-reduce (one per dtype), those with
            factors of one shape side by side.
    """

    matrices: list[list[tf.Tensor]]
    layouts: list[Layout]
    states: list[Matrix]
    qs: list[list[tf.Variable]]
    devices: Sequence[str] | None
    groups: list[list[int]]

    @property
    def replicas(self) -> int:
        return len(self.matrices[0])


def compressed_sums(
    matrices: list[list[tf.Tensor]],
    layouts: list[Layout],
    states: list[Matrix],
    all_sum: AllSum,
    devices: Sequence[str] | None,
    buckets: Sequence[Sequence[int]],
    other_sums: OtherSums,
) -> tuple[list[list[tf.Tensor]], list[list[Value]]]:
    """The approximate sums of `matrices` over every replica, and the
    exact sums of the rest of the batch, updating each matrix's error and
    Q in `states` if every one of those sums is finite.

    Args:
        matrices: `matrices[j][i]`, compressed tensor j on replica i.
        layouts: tensor j's layout as a matrix.
        states: tensor j's variables.
        all_sum: sums a batch over every replica of every worker; called
            twice per bucket, for its Ps and for its Qs.
        devices: replica i's device, or None for the caller's scope.
        buckets: positions in `matrices`, every one once; each bucket's
            factors are all-reduced together, bucket by bucket in this
            order, so that a bucket of the last layers' gradients crosses
            while the backward pass computes the others.
        other_sums: called once every bucket's all-reduces are issued, and
            before the errors and Qs are updated: the exact sums of the
            rest of the batch (one collective after the factors').

    Returns:
        (`result[j][i]`: the approximate sum of tensor j, on replica i,
        once the errors and Qs are updated; what `other_sums` returned).
    """
    exchanges = []
    for bucket in buckets:
        chosen = [matrices[j] for j in bucket]
        chosen_layouts = [layouts[j] for j in bucket]
        chosen_states = [states[j] for j in bucket]
        batch = _Batch(
            chosen,
            chosen_layouts,
            chosen_states,
            [[state.q, *state.q_copies] for state in chosen_states],
            devices,
            _groups(chosen, chosen_layouts),
        )
        exchanges.append(_exchange(batch, all_sum))
    others = other_sums()
    results: list[list[tf.Tensor]] = [[] for _ in matrices]
    approximations = _approximations(exchanges, others)
    for bucket, sums in zip(buckets, approximations, strict=True):
        for j, total in zip(bucket, sums, strict=True):
            results[j] = total
    return results, others


@dataclasses.dataclass(frozen=True)
class _Exchange:
    """One bucket after its two all-reduces: what the approximation and
    the state updates need."""

    batch: _Batch
    q_sums: list[list[tf.Tensor]]
    p_hat: _PerReplica
    q_local: _PerReplica
    m_of: _PerReplica


def _exchange(batch: _Batch, all_sum: AllSum) -> _Exchange:
    """The bucket's Ps all-reduced, orthogonalised, and its Qs all-reduced."""
    m_of, p_local = _local_products(batch)
    p_sums = _all_sum_by_group(batch, p_local, all_sum)
    p_hat, q_local = _orthogonalized(batch, p_sums, m_of)
    q_sums = _all_sum_by_group(batch, q_local, all_sum)
    return _Exchange(batch, q_sums, p_hat, q_local, m_of)


def _groups(
    matrices: list[list[tf.Tensor]], layouts: list[Layout]
) -> list[list[int]]:
    """The matrices of each all-reduce: one group per dtype, in order of
    first appearance, sorted by the shape of their P."""
    dtypes = list(dict.fromkeys(value[0].dtype for value in matrices))
    return [
        sorted(
            (j for j, value in enumerate(matrices) if value[0].dtype == d),
            key=lambda j: (layouts[j].n, layouts[j].r),
        )
        for d in dtypes
    ]


def _local_products(batch: _Batch) -> tuple[_PerReplica, _PerReplica]:
    """Every replica's M (its tensor as a matrix plus its error) and its
    P = M Q, with Q orthogonalised first."""
    runs = _runs(
        range(len(batch.matrices)),
        lambda j: (
            batch.matrices[j][0].dtype,
            batch.layouts[j].m,
            batch.layouts[j].r,
        ),
    )
    m_of: _PerReplica = {}
    p_local: _PerReplica = {}
    for i in range(batch.replicas):
        with replica_device(batch.devices, i):
            q_start: dict[int, tf.Tensor] = {}
            for run in runs:
                q_start.update(
                    zip(
                        run,
                        orthogonalize_each(
                            [batch.qs[j][i].read_value() for j in run]
                        ),
                        strict=True,
                    )
                )
            for j, (value, layout, state) in enumerate(
                zip(batch.matrices, batch.layouts, batch.states, strict=True)
            ):
                matrix = tf.reshape(value[i], (layout.n, layout.m))
                m_of[j, i] = matrix + state.errors[i].read_value()
                p_local[j, i] = tf.matmul(m_of[j, i], q_start[j])
    return m_of, p_local


def _all_sum_by_group(
    batch: _Batch, factors: _PerReplica, all_sum: AllSum
) -> list[list[tf.Tensor]]:
    """`factors` summed over every replica: `result[g][i]`, group g's
    factors flattened and concatenated, on replica i."""
    return all_sum(
        [
            [
                _concat([factors[j, i] for j in group], batch.devices, i)
                for i in range(batch.replicas)
            ]
            for group in batch.groups
        ]
    )


def _orthogonalized(
    batch: _Batch, p_sums: list[list[tf.Tensor]], m_of: _PerReplica
) -> tuple[_PerReplica, _PerReplica]:
    """Every replica's P^ (the summed P orthogonalised) and its Q = Mᵀ P^."""
    p_hat: _PerReplica = {}
    q_local: _PerReplica = {}
    for group, sums in zip(batch.groups, p_sums, strict=True):
        runs = _runs(group, lambda j: (batch.layouts[j].n, batch.layouts[j].r))
        sizes = [
            len(run) * batch.layouts[run[0]].n * batch.layouts[run[0]].r
            for run in runs
        ]
        for i in range(batch.replicas):
            with replica_device(batch.devices, i):
                parts = _split(sums[i], sizes)
                for run, part in zip(runs, parts, strict=True):
                    _, n, _, r = batch.layouts[run[0]]
                    ps = orthogonalize(tf.reshape(part, (-1, n, r)))
                    for j, p in zip(
                        run, tf.unstack(ps, num=len(run)), strict=True
                    ):
                        p_hat[j, i] = p
                for j in group:
                    # M^T P^ as (P^T M)^T: a product that reads M along
                    # its rows, several times faster than transposing
                    # M's reads; only the small result is transposed.
                    q_local[j, i] = tf.transpose(
                        tf.matmul(p_hat[j, i], m_of[j, i], transpose_a=True)
                    )
    return p_hat, q_local


def _approximations(
    exchanges: list[_Exchange], others: list[list[Value]]
) -> list[list[list[tf.Tensor]]]:
    """Every bucket's P^ Qᵀ on every replica, in its tensors' shapes, once
    every bucket's errors and Qs are updated (or all left alone, if any
    summed Q or any of `others`, the batch's exact sums, is not finite):
    `result[b][j][i]`."""
    replicas = exchanges[0].batch.replicas
    devices = exchanges[0].batch.devices
    results = [[[None] * replicas for _ in e.batch.matrices] for e in exchanges]
    done = []
    for i in range(replicas):
        with replica_device(devices, i):
            # A non-finite compressed gradient makes some summed Q (the
            # same on every replica) non-finite, and its sum too; a
            # non-finite bias makes its exact sum non-finite. An optimizer
            # with loss scaling skips that step, and so does the state of
            # every bucket, which would otherwise stay non-finite for good
            # (or, from a bias, take an update the model never applied).
            finite = tf.reduce_all(
                [
                    tf.reduce_all(tf.math.is_finite(s[i]))
                    for e in exchanges
                    for s in e.q_sums
                ]
                + [
                    tf.reduce_all(tf.math.is_finite(v))
                    for v in _float_parts([value[i] for value in others])
                ]
            )
            kept: list[tuple[tf.Variable, tf.Tensor]] = []
            for e, out in zip(exchanges, results, strict=True):
                kept += _approximate_on(e, i, out)
            done.append(_assign_if(finite, kept))
    with tf.control_dependencies(done):
        return [
            [
                [
                    on_replica(devices, i, tf.identity, t)
                    for i, t in enumerate(v)
                ]
                for v in out
            ]
            for out in results
        ]


def _float_parts(values: list[Value]) -> list[tf.Tensor]:
    """The floating-point tensors of `values`: dense ones as they are,
    IndexedSlices by their values; integers and the like left out."""
    parts = [v.values if isinstance(v, tf.IndexedSlices) else v for v in values]
    return [p for p in parts if p.dtype.is_floating]


def _approximate_on(
    e: _Exchange, i: int, out: list[list[Any]]
) -> list[tuple[tf.Variable, tf.Tensor]]:
    """Replica i's approximations of one bucket, into `out[j][i]`; returns
    the (variable, value) pairs that update its errors and Qs."""
    batch = e.batch
    kept = []
    for group, sums in zip(batch.groups, e.q_sums, strict=True):
        parts = _split(
            sums[i], [batch.layouts[j].m * batch.layouts[j].r for j in group]
        )
        for j, part in zip(group, parts, strict=True):
            shape, _, m, r = batch.layouts[j]
            q_sum = tf.reshape(part, (m, r))
            approx = tf.matmul(e.p_hat[j, i], q_sum, transpose_b=True)
            out[j][i] = tf.reshape(approx, shape)
            # The replica's own residual: see the module docstring (the
            # errors add up to sum M - M^).
            sent = tf.matmul(e.p_hat[j, i], e.q_local[j, i], transpose_b=True)
            kept.append((batch.states[j].errors[i], e.m_of[j, i] - sent))
            kept.append((batch.qs[j][i], q_sum))
    return kept


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


def _runs(items: Any, key: Callable[[int], Any]) -> list[list[int]]:
    """`items` (ints) grouped by `key`, groups and items in order of first
    appearance (runs of consecutive items where `items` is sorted by
    `key`)."""
    runs: dict[Any, list[int]] = {}
    for item in items:
        runs.setdefault(key(item), []).append(item)
    return list(runs.values())


def _concat(
    parts: list[tf.Tensor], devices: Sequence[str] | None, i: int
) -> tf.Tensor:
    with replica_device(devices, i):
        return tf.concat([tf.reshape(p, [-1]) for p in parts], axis=0)


def _split(flat: tf.Tensor, sizes: list[int]) -> list[tf.Tensor]:
    return tf.split(flat, sizes) if len(sizes) > 1 else [flat]
