"""PowerSGD written again in numpy, from the paper, for the tests.

Vogels, Karimireddy and Jaggi 2019, Algorithm 1 with error feedback and
warm start, summing over replicas, with the decisions that
`tf_crossdevice.compression.PowerSGD` documents (matrices (rest, last
dimension), Q orthogonalised before use, the seeded initial Q, each
replica's own residual as its error). Orthogonalisation here is numpy's QR
with R's diagonal made positive, not Gram-Schmidt.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def orthonormal(a):
    """Q of a = QR with R's diagonal positive (Gram-Schmidt's Q)."""
    q, r = np.linalg.qr(a)
    return q * np.where(np.diag(r) < 0, -1.0, 1.0)


def initial_q(seed, position, m, r, dtype=tf.float64):
    """The documented initial Q: stateless_normal((m, r), (seed, position))."""
    return tf.random.stateless_normal(
        (m, r), seed=(seed, position), dtype=dtype
    ).numpy()


class NumpyPowerSGD:
    """PowerSGD (Vogels et al. 2019, Algorithm 1, error feedback, warm
    start) on numpy matrices, summing over replicas."""

    def __init__(
        self, shapes, rank, replicas, seed=0, start_step=0, dtype=tf.float64
    ):
        self.shapes = shapes  # position -> tensor shape, compressed ones
        self.rank = rank
        self.start_step = start_step
        self.step = 0
        self.q, self.errors = {}, {}
        for k, shape in shapes.items():
            n, m = int(np.prod(shape[:-1])), shape[-1]
            # The gradients' dtype draws the initial Q.
            self.q[k] = initial_q(seed, k, m, min(n, m, rank), dtype).astype(
                np.float64
            )
            self.errors[k] = [np.zeros((n, m)) for _ in range(replicas)]
        self.last = {}

    def sum(self, grads):
        """grads[k][i] -> (sum of value k) for every position k."""
        out = {}
        for k, per_replica in grads.items():
            if k not in self.shapes or self.step < self.start_step:
                out[k] = np.sum(per_replica, axis=0)
                continue
            shape = self.shapes[k]
            n, m = int(np.prod(shape[:-1])), shape[-1]
            ms = [
                g.reshape(n, m) + e
                for g, e in zip(per_replica, self.errors[k], strict=True)
            ]
            q = orthonormal(self.q[k])
            p = sum(mi @ q for mi in ms)
            p_hat = orthonormal(p)
            q_local = [mi.T @ p_hat for mi in ms]
            q_sum = sum(q_local)
            approx = p_hat @ q_sum.T
            self.errors[k] = [
                mi - p_hat @ qi.T for mi, qi in zip(ms, q_local, strict=True)
            ]
            self.q[k] = q_sum
            self.last[k] = {"p": p, "p_hat": p_hat, "q": q_sum}
            out[k] = approx.reshape(shape)
        self.step += 1
        return out
