"""Names the peer tasks that a failed collective could not reach.

When a host is cut off (a link down, a switch port dead, a host powered
off) its connections see silence, not an error: TensorFlow's collective
waits until `timeout_seconds` and raises a `tf.errors.DeadlineExceededError`
("Graph execution error" and the op's name) that names no task, and a peer
that dies mid-collective can fail it with an `UnavailableError` that names
only the task. `reporting_unreachable_peers` re-raises such an error with
the peer tasks whose gRPC port does not answer a TCP connection now, and
their addresses:

    with tf_crossdevice.reporting_unreachable_peers(strategy):
        step()
    # tf.errors.DeadlineExceededError: Graph execution error: ...
    # /job:worker/replica:0/task:0: tasks not reachable:
    # /job:worker/replica:0/task:1 (198.18.1.2:21374) ...

While the block runs, a step that waits longer than
`stall_warning_seconds` logs one warning (the stall report, see
`tf_crossdevice.collective._stall`) naming the peers that are slow or
cannot be reached, so that whoever watches knows which machine to look at
before the timeout ends the job:

    W ... Stalled collective: step 57 of /job:worker/replica:0/task:0 has
    waited 4.0 s in its collectives (timeout_seconds=8). Slow:
    /job:worker/replica:0/task:1 (198.18.1.2:21374): its link is slow ...

Why a context manager around the caller's step: a step is a `tf.function`
that the user calls, and its collectives fail when the function runs, in
the user's call, where the strategy cannot catch them. The strategy's
eager `reduce` reports by itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import checks
from tf_crossdevice._core.network import ports_answer
from tf_crossdevice.collective import _runtime, _stall
from tf_crossdevice.collective._runtime import CollectiveCluster

# The errors a lost peer causes: the collective timed out, or its
# connection failed (broken, refused, or the executor aborted after it).
_REPORTED = (
    tf.errors.DeadlineExceededError,
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


@contextlib.contextmanager
def reporting_unreachable_peers(
    strategy_or_cluster: Any = None,
    probe_seconds: float = 1.0,
    stall_warning_seconds: float | None = None,
) -> Iterator[None]:
    """Adds the peers that cannot be reached to a failed collective's error,
    and reports a step that waits too long before it fails.

    A `tf.errors.DeadlineExceededError`, `UnavailableError`, `AbortedError`
    or `CancelledError` raised in the block is re-raised as the same type
    (its original as `__cause__`) with a line naming each peer task whose
    gRPC port refuses or ignores a TCP connection for `probe_seconds`,
    and its address: "tasks not reachable: /job:worker/replica:0/task:1
    (198.18.1.2:21374)". If every peer answers, the line says so (a peer
    may be hung or slow, or the timeout too short). Peers are probed at
    once, after the error, so a failure takes at most `probe_seconds`
    longer to report. Other errors, and runs without peers, pass through
    unchanged.

    If the block has not ended after `stall_warning_seconds`, one warning
    is logged (absl, WARNING) that names the step (the count of blocks this
    process has run, nested ones counted with the outer one) and, for each
    peer, whether its link is slow (packets still arrive, but wait in a
    queue: a round trip of at least 0.1 s and ten times the least seen on
    the same connections; or its data trickles, at least 1 KiB but under
    1 MB/s over the report's second of watching), it is not reachable (its
    port does not answer within `probe_seconds`, or nothing arrived from it
    for half the wait while data to it waits), or it answers on a quick
    link (then it has not reached the collective). The rule reads this
    process's TCP connections with `ss` (Linux's iproute2); without it, the
    port probe alone decides. The report takes about a second (or
    `probe_seconds`, if longer) after the warning time.

    >>> alone = tf_crossdevice.CollectiveCluster(None, "worker", 0, 1)
    >>> with tf_crossdevice.reporting_unreachable_peers(alone):
    ...     print("a step")
    a step

    Args:
        strategy_or_cluster: the strategy whose collectives run in the block
            (ours or TensorFlow's MultiWorkerMirroredStrategy: its
            `cluster_resolver` says where the peers are), a
            `tf_crossdevice.CollectiveCluster`, or None for the cluster that
            `tf_crossdevice.enable_collectives` set up in this process.
        probe_seconds: how long each peer's port may take to accept.
        stall_warning_seconds: how long a step may wait before the stall
            report, a number > 0 (`math.inf`: never). Default: half the
            strategy's `timeout_seconds`, at most 60 s (Horovod's stall
            warning time); 60 s without a timeout.

    Raises:
        TypeError: `strategy_or_cluster` is none of those, or
            `probe_seconds` or `stall_warning_seconds` is not a number.
        ValueError: `probe_seconds` or `stall_warning_seconds` is not
            greater than 0.
    """
    cluster = _cluster_of(strategy_or_cluster)
    probe_seconds = checks.positive_number(probe_seconds, "probe_seconds")
    warning_seconds = _stall.check_warning_seconds(stall_warning_seconds)
    timeout_seconds = _timeout_of(strategy_or_cluster)
    if warning_seconds is None:
        warning_seconds = _stall.default_warning_seconds(timeout_seconds)
    try:
        with _stall.watching_for_stall(
            cluster, warning_seconds, probe_seconds, timeout_seconds
        ):
            yield
    except _REPORTED as error:
        if getattr(error, "_tf_crossdevice_peers_reported", False):
            raise
        if not cluster.peers:
            raise
        raise _with_unreachable_peers(error, cluster, probe_seconds) from error


def _cluster_of(strategy_or_cluster: Any) -> CollectiveCluster:
    if isinstance(strategy_or_cluster, CollectiveCluster):
        return strategy_or_cluster
    if strategy_or_cluster is None:
        enabled = _runtime.enabled_cluster()
        return enabled or CollectiveCluster(None, "worker", 0, 1)
    if isinstance(strategy_or_cluster, tf.distribute.Strategy):
        # Ours describes its cluster once, when it is built.
        known = getattr(strategy_or_cluster, "_collective_cluster", None)
        if known is not None:
            return known
        resolver = getattr(strategy_or_cluster, "cluster_resolver", None)
        if resolver is None:  # A single-process strategy: no peers.
            return CollectiveCluster(None, "worker", 0, 1)
        return _runtime.describe_cluster(resolver)
    raise TypeError(
        "strategy_or_cluster: expected None, a tf.distribute strategy or a "
        "tf_crossdevice.CollectiveCluster, got "
        f"{type(strategy_or_cluster).__name__} {strategy_or_cluster!r}"
    )


def _timeout_of(strategy_or_cluster: Any) -> float | None:
    """The strategy's default `timeout_seconds` (ours and TensorFlow's
    keep their CommunicationOptions on `extended`), if it has one."""
    extended = getattr(strategy_or_cluster, "extended", None)
    options = getattr(extended, "_communication_options", None)
    timeout = getattr(options, "timeout_seconds", None)
    return timeout if isinstance(timeout, (int, float)) and timeout else None


def _with_unreachable_peers(
    error: tf.errors.OpError, cluster: CollectiveCluster, probe_seconds: float
) -> tf.errors.OpError:
    peers = cluster.peers
    answers = ports_answer([cluster.address(t) for t in peers], probe_seconds)
    named = [f"{t} ({cluster.address(t)})" for t in peers]
    lost = [n for n, ok in zip(named, answers, strict=True) if not ok]
    if lost:
        line = (
            f"tasks not reachable: {', '.join(lost)} (no TCP connection to "
            f"their port within {probe_seconds:g} s after the failure): "
            "check those hosts, their network links and their processes"
        )
    else:
        line = (
            f"every peer task's port answers ({', '.join(named)}): none is "
            "cut off; a peer may be hung or slow, or timeout_seconds too "
            "short"
        )
    kind = next(k for k in _REPORTED if isinstance(error, k))
    reported = kind(
        error.node_def,
        error.op,
        f"{error.message}\n{cluster.worker_device}: {line}",
    )
    reported._tf_crossdevice_peers_reported = True  # type: ignore[attr-defined]
    return reported
