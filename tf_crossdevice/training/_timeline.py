"""A step's timeline: every op each thread of a worker ran during one step.

A training step's time splits between computing (the forward and backward
passes, the update) and all-reducing the gradients, and the packs of the
all-reduce may run while backpropagation still computes earlier layers.
Timings of the whole step cannot tell how much the two overlap; a timeline
of the step's ops, thread by thread, shows it. `profile_step` records one
step with TensorFlow's profiler (`tf.profiler.experimental`, host tracer
only: every TensorFlow op and runtime activity on the host's threads) and
turns what it recorded into Chrome trace events, the JSON format that trace
viewers open offline (Perfetto UI, Chromium's chrome://tracing,
TensorBoard's profile plugin). `write_trace` writes them, `merge_traces`
joins the files of several workers into one, and `summarize_trace` reads
the all-reduce's share of the step back from the events.

Time is the profiler's clock, the wall clock (CLOCK_REALTIME), as
microseconds since the Unix epoch: the traces of several processes of one
machine line up as they are, by concatenation; those of several machines
only as well as their clocks agree.

The profiler's own file format (XSpace, a protocol buffer) has no public
reader in TensorFlow: `_core.tf_internal.read_xspace` reads it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import tensorflow as tf

from tf_crossdevice._core import tf_internal

__all__ = [
    "COLLECTIVE_OPS",
    "STEP_EVENT",
    "StepProfile",
    "StepSummary",
    "merge_traces",
    "profile_step",
    "summarize_trace",
    "write_trace",
]

# The op types of TensorFlow's collectives (tensorflow/core/ops/
# collective_ops.cc): what the all-reduce's share counts. Transfers inside
# one graph (_Send, _Recv, copies between devices) and the ordinary ops of
# an in-process reduction (AddN, Add) are not among them: by their type
# they cannot be told apart from the model's own.
COLLECTIVE_OPS = frozenset(
    {
        "CollectiveReduce",
        "CollectiveReduceV2",
        "CollectiveReduceV3",
        "CollectiveReduceScatterV2",
        "CollectiveGather",
        "CollectiveGatherV2",
        "CollectiveBcastSend",
        "CollectiveBcastSendV2",
        "CollectiveBcastRecv",
        "CollectiveBcastRecvV2",
        "CollectiveAllToAllV2",
        "CollectiveAllToAllV3",
        "NcclAllReduce",
        "NcclReduce",
        "NcclBroadcast",
    }
)

# The event that marks the step's own wall-clock window, on a thread of its
# own (tid 0) in each process: what the share of the step is taken of. Its
# name has a space: TensorFlow names its events of a tf.function call after
# the Python function ("step"), never so.
STEP_EVENT = "profiled step"
_STEP_TID = 0

# Markers the thread pool records for every task, all of zero length: tens
# of thousands of them in a step, and nothing to see on a timeline.
_MARKER_PREFIX = "ThreadpoolListener::"

# The host tracer at level 2 records every TensorFlow op; the Python tracer
# (every Python call) would drown them and slow the step many times over.
_OPTIONS = dict(
    host_tracer_level=2, python_tracer_level=0, device_tracer_level=0
)

# ARPHRD_LOOPBACK, /sys/class/net/<dev>/type of a loopback interface.
_LOOPBACK_TYPE = "772"


@dataclasses.dataclass
class StepProfile:
    """What `profile_step` recorded; filled in when its block ends.

    Attributes:
        events: Chrome trace events ("X": ts and dur in microseconds since
            the Unix epoch; "M": process and thread names).
        start_us: when the block started (after the profiler started), in
            microseconds since the Unix epoch.
        end_us: when it ended (before the profiler stopped).
        sent_bytes: bytes this process's network namespace sent meanwhile
            (`sent_bytes()`: every interface but loopback and a bridge's
            ports; None where the counters cannot be read).
    """

    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    start_us: float = 0.0
    end_us: float = 0.0
    sent_bytes: int | None = None

    @property
    def wall_seconds(self) -> float:
        """The block's wall time."""
        return (self.end_us - self.start_us) / 1e6

    @property
    def sent_bytes_per_second(self) -> float | None:
        """`sent_bytes` over the block's wall time (None: not counted)."""
        if self.sent_bytes is None or self.wall_seconds <= 0:
            return None
        return self.sent_bytes / self.wall_seconds


@contextlib.contextmanager
def profile_step(
    process_name: str | None = None,
    *,
    profile_dir: str | None = None,
    profile_host: str | None = None,
) -> Iterator[StepProfile]:
    """Profiles what runs in the block: one step, as Chrome trace events.

    TensorFlow allows one profiler per process at a time; each call
    profiles into a temporary folder of its own, removed after. The block
    must wait for the step's results (read one with `.numpy()`): ops still
    running when it ends are cut from the trace.

    Args:
        process_name: the process's name in a trace viewer (default: the
            host name and the process id).
        profile_dir: where to keep TensorFlow's own profile as well (its
            <host>.xplane.pb, which TensorBoard's profile plugin opens):
            a folder `<logdir>/plugins/profile/<run>` under a TensorBoard
            log folder. None: not kept.
        profile_host: the host's name in that folder: its file is
            <profile_host>.xplane.pb, and the plugin shows one host by that
            name. Default: this machine's host name. The processes of one
            step (the workers of a job) that keep their profiles in one
            folder, as hosts of one run, need a name each.

    Yields:
        A `StepProfile`, empty until the block ends; then its events hold
        every op and runtime activity of the host's threads during the
        block, and a STEP_EVENT ("profiled step") on a thread of its own,
        spanning the block's wall-clock window (to the end of the last op
        the profile saw, if an asynchronous op closed after the block's
        wait returned). Left by an exception, it stays empty.

    Raises:
        tf.errors.AlreadyExistsError: another profiler is running in this
            process (TensorFlow's error).
        RuntimeError: the profiler wrote no trace.
    """
    pid = os.getpid()
    name = process_name or f"{socket.gethostname()} pid {pid}"
    profile = StepProfile()
    logdir = tempfile.mkdtemp(prefix="tf_crossdevice_timeline_")
    try:
        options = tf.profiler.experimental.ProfilerOptions(**_OPTIONS)
        tf.profiler.experimental.start(logdir, options=options)
        try:
            sent_before = sent_bytes()
            start_ns = time.time_ns()
            yield profile
            end_ns = time.time_ns()
            sent_after = sent_bytes()
        finally:
            tf.profiler.experimental.stop()
        space = _read_xspace(logdir, profile_dir, profile_host)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    events = _xspace_events(space, pid, name)
    # An asynchronous op (a collective) closes its trace event a little
    # after its result is handed on, so after the block's wait may have
    # returned: the step lasts until the last op the profile saw ends.
    last_op_end = max(
        (e["ts"] + e["dur"] for e in events if e.get("cat") == "op"),
        default=0.0,
    )
    profile.start_us = start_ns / 1e3
    profile.end_us = max(end_ns / 1e3, last_op_end)
    if sent_before is not None and sent_after is not None:
        profile.sent_bytes = sent_after - sent_before
    profile.events = [
        *events,
        *_step_events(pid, profile.start_us, profile.end_us),
    ]


def _read_xspace(
    logdir: str, keep_in: str | None, host: str | None = None
) -> Any:
    """The XSpace the profiler wrote under `logdir`
    (plugins/profile/<run>/<host>.xplane.pb); the file is copied into
    `keep_in` (as <host>.xplane.pb, when `host` is given) unless that is
    None."""
    pattern = os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")
    files = sorted(glob.glob(pattern))
    if not files:
        raise RuntimeError(
            f"TensorFlow's profiler wrote no trace under {logdir} "
            "(no plugins/profile/*/*.xplane.pb)"
        )
    if keep_in is not None:
        os.makedirs(keep_in, exist_ok=True)
        name = f"{host}.xplane.pb" if host else os.path.basename(files[-1])
        shutil.copyfile(files[-1], os.path.join(keep_in, name))
    return tf_internal.read_xspace(files[-1])


def _step_events(pid: int, start_us: float, end_us: float) -> list[dict]:
    """The STEP_EVENT over the window, on its own named thread."""
    return [
        _thread_name(pid, _STEP_TID, STEP_EVENT),
        {
            "ph": "X",
            "cat": STEP_EVENT,
            "name": STEP_EVENT,
            "pid": pid,
            "tid": _STEP_TID,
            "ts": start_us,
            "dur": end_us - start_us,
            "args": {},
        },
    ]


def _thread_name(pid: int, tid: int, name: str) -> dict[str, Any]:
    return {
        "ph": "M",
        "name": "thread_name",
        "pid": pid,
        "tid": tid,
        "args": {"name": name},
    }


def _process_events(pid: int, name: str, sort_index: int) -> list[dict]:
    """A process's name, and where viewers list it (by `sort_index`)."""
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
        {
            "ph": "M",
            "name": "process_sort_index",
            "pid": pid,
            "args": {"sort_index": sort_index},
        },
    ]


def _xspace_events(space: Any, pid: int, process_name: str) -> list[dict]:
    """Chrome trace events of a profiler XSpace: one thread per line.

    Each line of each plane (on a CPU host, the plane "/host:CPU": one line
    per thread, such as tf_Compute/... or collective_ops/...) becomes a
    thread; each of its events an "X" event. A TensorFlow op's metadata is
    named "<node name>:<op type>" with the op type as its display name: the
    event is named by the op type (what a viewer colours and groups by),
    with the node name in its args. Zero-length thread-pool markers are
    dropped.
    """
    start_ns = _profile_start_ns(space)
    events = _process_events(pid, process_name, pid)
    tid = _STEP_TID
    for plane in space.planes:
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            tid += 1
            thread = line.display_name or line.name
            events.append(_thread_name(pid, tid, f"{plane.name} {thread}"))
            base_ps = (start_ns + line.timestamp_ns) * 1000
            for event in line.events:
                metadata = plane.event_metadata[event.metadata_id]
                if (
                    metadata.name.startswith(_MARKER_PREFIX)
                    and event.duration_ps == 0
                ):
                    continue
                stats = [*metadata.stats, *event.stats]
                x = _x_event(metadata, _stats(stats, stat_names))
                x.update(
                    pid=pid,
                    tid=tid,
                    ts=(base_ps + event.offset_ps) / 1e6,
                    dur=event.duration_ps / 1e6,
                )
                events.append(x)
    return events


def _profile_start_ns(space: Any) -> int:
    """The profile's start (ns since the Unix epoch): lines count from it.

    It is the stat "profile_start_time" of the plane "Task Environment".
    """
    for plane in space.planes:
        if plane.name != "Task Environment":
            continue
        names = {k: v.name for k, v in plane.stat_metadata.items()}
        for stat in plane.stats:
            if names.get(stat.metadata_id) == "profile_start_time":
                return int(stat.uint64_value)
    raise RuntimeError(
        "the profiler's trace has no profile_start_time: its events cannot "
        "be placed on the wall clock"
    )


def _stats(stats: Iterable[Any], names: Mapping[int, str]) -> dict[str, Any]:
    """An event's stats by name; the profiler's internal ones (named "_..."
    : ids that link events inside its own viewer) are left out."""
    found = {}
    for stat in stats:
        name = names.get(stat.metadata_id, str(stat.metadata_id))
        kind = stat.WhichOneof("value")
        if name.startswith("_") or kind is None:
            continue
        value = getattr(stat, kind)
        if kind == "ref_value":
            value = names.get(value, value)
        elif kind == "bytes_value":
            value = value.hex()
        found[name] = value
    return found


def _x_event(metadata: Any, args: dict[str, Any]) -> dict[str, Any]:
    """An "X" event's name, category and args (without its times)."""
    op_type = metadata.display_name
    if op_type and metadata.name.endswith(":" + op_type):
        args["node"] = metadata.name[: -len(op_type) - 1]
        return {"ph": "X", "cat": "op", "name": op_type, "args": args}
    name = op_type or metadata.name
    return {"ph": "X", "cat": "runtime", "name": name, "args": args}


def sent_bytes(sys_class_net: str = "/sys/class/net") -> int | None:
    """Bytes this host has sent so far on its interfaces, summed.

    The counters are those of this process's network namespace (an
    emulated host's, under `ip netns exec`, which mounts its own /sys),
    every process's traffic there. Loopback is left out, so a machine with
    loopback only counts 0: traffic between processes on one machine never
    crosses a counted interface. So are a bridge's ports: what a bridge
    forwards out of them is other hosts' traffic (the emulated hosts'
    between each other), or what this host sent through the bridge's own
    interface, which counts it once.

    Args:
        sys_class_net: where the interfaces' folders are (for tests).

    Returns:
        The sum of `<dev>/statistics/tx_bytes`, or None where there is no
        such folder (not Linux).
    """
    if not os.path.isdir(sys_class_net):
        return None
    total = 0
    for dev in sorted(os.listdir(sys_class_net)):
        folder = os.path.join(sys_class_net, dev)
        try:
            if os.path.exists(os.path.join(folder, "brport")):
                continue
            with open(os.path.join(folder, "type")) as f:
                if f.read().strip() == _LOOPBACK_TYPE:
                    continue
            with open(os.path.join(folder, "statistics", "tx_bytes")) as f:
                total += int(f.read())
        except OSError:  # Gone meanwhile, or not an interface.
            continue
    return total


def write_trace(
    path: str,
    events: Sequence[Mapping[str, Any]],
    other_data: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes a Chrome trace-event file: `{"traceEvents": [...], ...}`;
    returns what it wrote.

    Written to a temporary file and renamed, so that a reader (a chief
    merging the workers' files) never sees half of one.

    Args:
        path: the file to write (its folder must exist).
        events: the trace events.
        other_data: anything else to keep in the file ("otherData", which
            viewers show as metadata).
    """
    trace = {
        "traceEvents": list(events),
        "displayTimeUnit": "ms",
        "otherData": dict(other_data or {}),
    }
    # Beside the file, named by this process: os.replace is atomic within
    # one file system, and the file gets the usual permissions.
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w") as f:
            json.dump(trace, f)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
    return trace


def merge_traces(paths: Mapping[int, str], path: str) -> dict[str, Any]:
    """Joins the trace files of several workers into one file at `path`.

    Every event of worker i's file moves to process id i, named
    "worker i" and listed in that order; its "otherData" is kept under
    "workers" by index. The times stay as they are: files written on one
    machine share its clock.

    Args:
        paths: each worker's index -> its trace file.
        path: the merged file.

    Returns:
        The merged trace (what `path` holds).
    """
    events: list[dict[str, Any]] = []
    workers = {}
    for worker, worker_path in sorted(paths.items()):
        with open(worker_path) as f:
            trace = json.load(f)
        events += _process_events(worker, f"worker {worker}", worker)
        for event in trace["traceEvents"]:
            if event.get("ph") == "M" and event["name"].startswith("process_"):
                continue
            events.append({**event, "pid": worker})
        workers[str(worker)] = trace.get("otherData", {})
    return write_trace(path, events, {"workers": workers})


@dataclasses.dataclass(frozen=True)
class StepSummary:
    """One process's step in a trace.

    Attributes:
        pid: the process id in the trace.
        process_name: its name there ("" where it has none).
        step_us: the step's wall time (its STEP_EVENT's duration).
        all_reduce_us: the time in the step during which at least one
            collective op (COLLECTIVE_OPS) ran: the union of their
            intervals, clipped to the step.
        collective_ops: how many collective op events overlap the step.
    """

    pid: int
    process_name: str
    step_us: float
    all_reduce_us: float
    collective_ops: int

    @property
    def all_reduce_share(self) -> float:
        """`all_reduce_us` over `step_us`: the all-reduce's share of the
        step, from 0 to 1.

        Where no collective op ran (`collective_ops` == 0) it is 0: a
        reduction of ordinary ops (an in-process one) is not counted."""
        return self.all_reduce_us / self.step_us if self.step_us > 0 else 0.0


def summarize_trace(events: Iterable[Mapping[str, Any]]) -> list[StepSummary]:
    """The all-reduce's share of the step of each process in a trace.

    For each process with a STEP_EVENT (`profile_step` writes one), the
    union of its collective ops' intervals within the step's window,
    against the window. Collective ops that run at once (the packs of one
    all-reduce, two replicas' halves) count once.

    >>> step = {"ph": "X", "name": STEP_EVENT, "pid": 1, "ts": 0, "dur": 100}
    >>> reduce = {"ph": "X", "name": "CollectiveReduceV2", "pid": 1}
    >>> [s.all_reduce_share for s in summarize_trace([
    ...     step, {**reduce, "ts": 10, "dur": 30}, {**reduce, "ts": 20,
    ...     "dur": 30}, {"ph": "X", "name": "MatMul", "pid": 1, "ts": 0,
    ...     "dur": 90}])]
    [0.4]

    Args:
        events: Chrome trace events.

    Returns:
        One summary per process with a STEP_EVENT, by process id.

    Raises:
        ValueError: a process has more than one STEP_EVENT.
    """
    steps: dict[int, tuple[float, float]] = {}
    names: dict[int, str] = {}
    intervals: dict[int, list[tuple[float, float]]] = {}
    for event in events:
        pid = event.get("pid", 0)
        if event.get("ph") == "M" and event.get("name") == "process_name":
            names[pid] = event["args"]["name"]
        if event.get("ph") != "X":
            continue
        span = (float(event["ts"]), float(event["ts"]) + float(event["dur"]))
        if event["name"] == STEP_EVENT:
            if pid in steps:
                raise ValueError(
                    f"events: process {pid} has more than one "
                    f"{STEP_EVENT!r} event; one step per process"
                )
            steps[pid] = span
        elif event["name"] in COLLECTIVE_OPS:
            intervals.setdefault(pid, []).append(span)
    summaries = []
    for pid, (start, end) in sorted(steps.items()):
        clipped = [
            (max(a, start), min(b, end))
            for a, b in intervals.get(pid, [])
            if a < end and b > start
        ]
        summaries.append(
            StepSummary(
                pid,
                names.get(pid, ""),
                end - start,
                _union_length(clipped),
                len(clipped),
            )
        )
    return summaries


def _union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """The length of the union of intervals [a, b).

    >>> _union_length([(0, 2), (1, 3), (5, 6)])
    4.0
    """
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total
