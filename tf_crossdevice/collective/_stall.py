"""The stall report: which peer a collective that waits too long waits for.

TensorFlow's collective ops are opaque while they wait: no API says which
member has joined, and Horovod's way (a coordinator that knows which ranks
submitted which tensor, `stall_inspector.cc`) needs a coordinator that our
strategy does not run. What this process can see is its own TCP
connections with each peer (the kernel's `tcp_info`, read with `ss`) and
whether the peer's gRPC port accepts a connection. After a step has waited
`stall_warning_seconds`, `watching_for_stall` classifies every peer with
`classify` and logs one warning:

    W ... Stalled collective: step 57 of /job:worker/replica:0/task:0 has
    waited 2.0 s in its collectives (timeout_seconds=12). Slow:
    /job:worker/replica:0/task:1 (198.18.1.2:21374): its link is slow
    (round trip 0.25 s, 0.01 ms at best; 17.6 kB/s over 1.0 s). Look at
    those hosts and their links before the timeout ends the job.

The rule (`classify`), for a step that has waited W seconds:

- slow: something arrived from the peer while the step waited (its link
  still carries packets), and either the smoothed round trip of our
  connections with it is at least `SLOW_ROUND_TRIP_SECONDS` and
  `SLOW_FACTOR` times the least one seen on them (packets wait in a queue
  that drains slowly), or, over the report's observation window
  (`probe_seconds`, at least `WINDOW_SECONDS`), its data trickles: at least
  `TRICKLE_BYTES` moved between us (received, or ours acknowledged) but
  fewer than `SLOW_BYTES_PER_SECOND`. A link slowed to a crawl shows
  both; the round trip lags (it is smoothed, and measured only on what
  this end sends), the trickle does not. A stalled step's data crosses a
  healthy link at its full rate, and a peer that is not there sends
  nothing, so neither trickles; a cut link adds no round trips and moves
  nothing, so it never looks slow;
- not reachable: otherwise, if its port does not accept a connection
  within `probe_seconds`, or nothing arrived from it for W/2 or more
  while data of ours to it waits for acknowledgement (TCP retransmits
  into silence, as when a link is cut or a host is down);
- answering: its port answers and its link is quick. Such a peer has not
  reached the collective (still computing, hung, or running other
  collectives); if every peer answers, the report says so and lists them.

With a single peer, a slow link between the two looks the same from both
ends: each names the other. With more peers, every peer looking slow
points at this host's own link, and the report says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import itertools
import math
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from absl import logging

from tf_crossdevice._core import checks
from tf_crossdevice._core.network import ports_answer
from tf_crossdevice.collective._runtime import CollectiveCluster

# A round trip this long is slow on any network a collective runs on...
SLOW_ROUND_TRIP_SECONDS = 0.1
# ...and so is one this many times the least seen on the same connections
# (which keeps a long-distance link, slow from the start, from counting).
SLOW_FACTOR = 10.0
# Data that moves at under 1 MB/s (8 Mbit/s) while a collective waits on
# it crawls on any network a collective runs on; under a kilobyte in the
# window is control traffic, not a collective's data.
SLOW_BYTES_PER_SECOND = 1e6
TRICKLE_BYTES = 1024
# The least time over which the report watches the bytes move.
WINDOW_SECONDS = 1.0
# Horovod's default warning time, used when collectives have no timeout.
DEFAULT_WARNING_SECONDS = 60.0
_SS_SECONDS = 5.0


class Verdict(enum.Enum):
    """What the stall report concludes about one peer."""

    SLOW = "slow"
    NOT_REACHABLE = "not reachable"
    ANSWERING = "answering"


@dataclasses.dataclass(frozen=True)
class PeerLink:
    """What this process sees of one peer task while a step waits.

    Attributes:
        task: the peer, '/job:worker/replica:0/task:1'.
        address: its gRPC address, host:port.
        answers: its port accepted a TCP connection within the probe time.
        connections: this process's TCP connections with it.
        silent_seconds: since the last packet from it on any of them (None
            without a connection).
        round_trip_seconds: the largest smoothed round trip among them.
        least_round_trip_seconds: the least round trip seen on them.
        unacknowledged_bytes: bytes of ours to it not yet acknowledged.
        moved_bytes: bytes received from it, or of ours acknowledged by
            it, over the observation window.
        window_seconds: how long that window was (0: not watched).
    """

    task: str
    address: str
    answers: bool
    connections: int = 0
    silent_seconds: float | None = None
    round_trip_seconds: float | None = None
    least_round_trip_seconds: float | None = None
    unacknowledged_bytes: int = 0
    moved_bytes: int = 0
    window_seconds: float = 0.0

    @property
    def trickles(self) -> bool:
        """At least TRICKLE_BYTES moved in the window, slower than
        SLOW_BYTES_PER_SECOND."""
        return (
            self.window_seconds > 0
            and self.moved_bytes >= TRICKLE_BYTES
            and self.moved_bytes / self.window_seconds < SLOW_BYTES_PER_SECOND
        )

    @property
    def queued(self) -> bool:
        """Its round trips are long: at least SLOW_ROUND_TRIP_SECONDS and
        SLOW_FACTOR times the least seen."""
        rtt, least = self.round_trip_seconds, self.least_round_trip_seconds
        return (
            rtt is not None
            and rtt >= SLOW_ROUND_TRIP_SECONDS
            and (least is None or rtt >= SLOW_FACTOR * least)
        )


def classify(link: PeerLink, waited_seconds: float) -> Verdict:
    """The verdict on one peer after a step waited `waited_seconds` (the
    rule is in the module docstring).

    >>> quick = PeerLink("/job:worker/replica:0/task:1", "h:1", True, 2,
    ...                  0.01, 0.002, 0.0001, 0)
    >>> classify(quick, 2.0).value
    'answering'
    >>> crawling = dataclasses.replace(quick, answers=False,
    ...                                round_trip_seconds=1.5)
    >>> classify(crawling, 2.0).value
    'slow'
    >>> trickling = dataclasses.replace(quick, moved_bytes=8948,
    ...                                 window_seconds=1.0)
    >>> classify(trickling, 2.0).value
    'slow'
    >>> cut = dataclasses.replace(quick, silent_seconds=1.5,
    ...                           unacknowledged_bytes=34)
    >>> classify(cut, 2.0).value
    'not reachable'
    """
    silent_for = link.silent_seconds
    heard = silent_for is not None and silent_for < waited_seconds
    if heard and (link.queued or link.trickles):
        return Verdict.SLOW
    silent = silent_for is not None and silent_for >= waited_seconds / 2
    if not link.answers or (silent and link.unacknowledged_bytes > 0):
        return Verdict.NOT_REACHABLE
    return Verdict.ANSWERING


def describe(
    links: Sequence[PeerLink],
    waited_seconds: float,
    where: str,
    timeout_seconds: float | None = None,
) -> str:
    """The stall report's text for `links` (see the module docstring).

    >>> quick = PeerLink("/job:worker/replica:0/task:1", "h:1", True, 1,
    ...                  0.01, 0.002, 0.0001, 0)
    >>> print(describe([quick], 2.0, "step 3 of /job:worker/replica:0/task:0"))
    step 3 of /job:worker/replica:0/task:0 has waited 2.0 s in its \
collectives. Every peer answers on a quick link: one has not reached \
this step's collectives (still computing, hung, or running others): \
/job:worker/replica:0/task:1 (h:1): round trip 2 ms, 0.1 ms at best.
    """
    timeout = (
        f" (timeout_seconds={timeout_seconds:g})"
        if timeout_seconds is not None
        else ""
    )
    head = (
        f"{where} has waited {waited_seconds:.1f} s in its "
        f"collectives{timeout}."
    )
    verdicts = [classify(link, waited_seconds) for link in links]
    slow = [
        f"{_name(link)}: its link is slow ({_evidence(link)})"
        for link, v in zip(links, verdicts, strict=True)
        if v is Verdict.SLOW
    ]
    lost = [
        f"{_name(link)}: {_why_not_reachable(link)}"
        for link, v in zip(links, verdicts, strict=True)
        if v is Verdict.NOT_REACHABLE
    ]
    parts = [head]
    if slow:
        parts.append("Slow: " + "; ".join(slow) + ".")
        if len(slow) == len(links) > 1:
            parts.append(
                "Every peer looks slow: this host's own link may be the "
                "slow one."
            )
    if lost:
        parts.append("Not reachable: " + "; ".join(lost) + ".")
    if slow or lost:
        parts.append(
            "Look at those hosts and their links before the timeout ends "
            "the job."
        )
    else:
        parts.append(
            "Every peer answers on a quick link: one has not reached this "
            "step's collectives (still computing, hung, or running "
            "others): "
            + "; ".join(f"{_name(link)}: {_evidence(link)}" for link in links)
            + "."
        )
    return " ".join(parts)


def _name(link: PeerLink) -> str:
    return f"{link.task} ({link.address})"


def _evidence(link: PeerLink) -> str:
    """What the verdict rests on, in a few words."""
    said = [
        f"round trip {_seconds(link.round_trip_seconds)}, "
        f"{_seconds(link.least_round_trip_seconds)} at best"
    ]
    if link.window_seconds > 0:
        said.append(
            f"{link.moved_bytes / link.window_seconds / 1000:.3g} kB/s "
            f"over {link.window_seconds:.1f} s"
        )
    return "; ".join(said)


def _seconds(value: float | None) -> str:
    if value is None:
        return "unknown"
    return f"{value:.2g} s" if value >= 0.1 else f"{value * 1000:.2g} ms"


def _why_not_reachable(link: PeerLink) -> str:
    reasons = []
    if link.silent_seconds is not None and link.unacknowledged_bytes:
        reasons.append(
            f"nothing received for {link.silent_seconds:.1f} s while "
            f"{link.unacknowledged_bytes} bytes to it wait"
        )
    if not link.answers:
        reasons.append("its port does not answer")
    return ", ".join(reasons) or "no answer"


def default_warning_seconds(timeout_seconds: float | None) -> float:
    """The warning time when none is given: half of `timeout_seconds` (so
    that the report comes well before the timeout's error), at most
    Horovod's 60 s; 60 s without a timeout.

    >>> default_warning_seconds(8), default_warning_seconds(600)
    (4.0, 60.0)
    """
    if timeout_seconds is None or timeout_seconds <= 0:
        return DEFAULT_WARNING_SECONDS
    return min(timeout_seconds / 2, DEFAULT_WARNING_SECONDS)


def check_warning_seconds(value: float | None) -> float | None:
    """`stall_warning_seconds` if it is None or a number > 0 (`math.inf`
    turns the report off).

    Raises:
        TypeError: not a number.
        ValueError: not greater than 0.
    """
    if value is None:
        return None
    return checks.positive_number(value, "stall_warning_seconds")


# One step at a time per thread is watched: a block inside a watched block
# (the strategy's eager reduce inside a user's step) is part of that step.
_state = threading.local()
_steps = itertools.count(1)


@contextlib.contextmanager
def watching_for_stall(
    cluster: CollectiveCluster,
    warning_seconds: float,
    probe_seconds: float,
    timeout_seconds: float | None = None,
) -> Iterator[None]:
    """Logs one stall report if the block runs longer than
    `warning_seconds` (none without peers, or inside another watched
    block)."""
    if (
        not cluster.peers
        or math.isinf(warning_seconds)
        or getattr(_state, "watching", False)
    ):
        yield
        return
    where = f"step {next(_steps)} of {cluster.worker_device}"
    started = time.monotonic()

    def report() -> None:
        waited = time.monotonic() - started
        links = observe_peers(cluster, probe_seconds)
        logging.warning(
            "Stalled collective: %s",
            describe(links, waited, where, timeout_seconds),
        )

    ticket = _watchdog.watch(warning_seconds, report)
    _state.watching = True
    try:
        yield
    finally:
        _state.watching = False
        _watchdog.cancel(ticket)


def observe_peers(
    cluster: CollectiveCluster, probe_seconds: float
) -> list[PeerLink]:
    """Each peer's `PeerLink`: its port probed, and this process's
    connections with it read before and after the probe (at least
    WINDOW_SECONDS apart)."""
    peers = cluster.peers
    start = time.monotonic()
    before = {c.inode: c for c in own_tcp_connections()}
    answers = ports_answer([cluster.address(t) for t in peers], probe_seconds)
    time.sleep(max(0.0, start + WINDOW_SECONDS - time.monotonic()))
    after = own_tcp_connections()
    window = time.monotonic() - start
    own_port = _port(cluster.address(cluster.worker_device))
    by_peer = _connections_by_peer(cluster, after, own_port)
    return [
        _link(
            task,
            cluster.address(task),
            ok,
            by_peer.get(task, []),
            before,
            window if before or after else 0.0,
        )
        for task, ok in zip(peers, answers, strict=True)
    ]


@dataclasses.dataclass(frozen=True)
class TcpConnection:
    """One established TCP connection of this process, as `ss` shows it."""

    local: tuple[str, int]
    remote: tuple[str, int]
    unacknowledged_bytes: int
    silent_seconds: float
    round_trip_seconds: float | None
    least_round_trip_seconds: float | None
    received_bytes: int = 0
    acknowledged_bytes: int = 0
    inode: int = 0


_SS_ADDRESS = re.compile(r"^\[?(?:::ffff:)?([^\]]*)\]?:(\d+)$")


def parse_ss(text: str, inodes: set[int] | None = None) -> list[TcpConnection]:
    """The connections in `ss -tieHn` output (of the sockets in `inodes`,
    when given).

    >>> text = (
    ...     "ESTAB 0 220 [::ffff:198.18.1.1]:42934 [::ffff:198.18.1.2]:40239"
    ...     " ino:7 sk:1 <->\\n\\t bbr rto:832 rtt:436.6/865.6 mss:8948"
    ...     " bytes_acked:5485 bytes_received:199843"
    ...     " lastsnd:148 lastrcv:1016 lastack:772 minrtt:0.02\\n")
    >>> (c,) = parse_ss(text, {7})
    >>> c.remote, c.unacknowledged_bytes, c.silent_seconds
    (('198.18.1.2', 40239), 220, 0.772)
    >>> round(c.round_trip_seconds, 6), c.least_round_trip_seconds
    (0.4366, 2e-05)
    >>> c.received_bytes, c.acknowledged_bytes, c.inode
    (199843, 5485, 7)
    >>> parse_ss(text, {8})
    []
    """
    out = []
    for entry in re.split(r"\n(?=\S)", text.strip()):
        words = entry.split()
        if len(words) < 5 or words[0] != "ESTAB":
            continue
        local, remote = _SS_ADDRESS.match(words[3]), _SS_ADDRESS.match(words[4])
        if local is None or remote is None:
            continue
        fields = dict(re.findall(r"\b([a-z_]+):([0-9.]+)", entry))
        if inodes is not None and int(fields.get("ino", -1)) not in inodes:
            continue
        # Absent when zero: something arrived in the kernel's last tick.
        since = min(
            float(fields.get("lastrcv", 0)), float(fields.get("lastack", 0))
        )
        rtt = re.search(r"\brtt:([0-9.]+)/", entry)
        least = fields.get("minrtt")
        out.append(
            TcpConnection(
                local=(local[1], int(local[2])),
                remote=(remote[1], int(remote[2])),
                unacknowledged_bytes=int(words[2]),
                silent_seconds=since / 1000,
                round_trip_seconds=float(rtt[1]) / 1000 if rtt else None,
                least_round_trip_seconds=(
                    float(least) / 1000 if least is not None else None
                ),
                received_bytes=int(fields.get("bytes_received", 0)),
                acknowledged_bytes=int(fields.get("bytes_acked", 0)),
                inode=int(fields.get("ino", 0)),
            )
        )
    return out


def own_tcp_connections() -> list[TcpConnection]:
    """This process's established TCP connections; [] where `ss` (Linux's
    iproute2) or /proc is missing, so that the report rests on the port
    probe alone."""
    ss = shutil.which("ss")
    if ss is None or not os.path.isdir("/proc/self/fd"):
        return []
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    try:
        text = subprocess.run(
            [ss, "-tieHn"],
            capture_output=True,
            text=True,
            timeout=_SS_SECONDS,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ss(text, inodes)


def _connections_by_peer(
    cluster: CollectiveCluster,
    connections: Sequence[TcpConnection],
    own_port: int | None,
) -> dict[str, list[TcpConnection]]:
    """Connections to a peer's port are its own; those that come in to this
    task's port are its when it is the only peer at their address."""
    ips = {t: _ips(cluster.address(t)) for t in cluster.peers}
    out: dict[str, list[TcpConnection]] = {t: [] for t in cluster.peers}
    for conn in connections:
        ip, port = conn.remote
        owners = [t for t in cluster.peers if ip in ips[t]]
        dialled = [t for t in owners if _port(cluster.address(t)) == port]
        if dialled:
            out[dialled[0]].append(conn)
        elif len(owners) == 1 and conn.local[1] == own_port:
            out[owners[0]].append(conn)
    return out


def _link(
    task: str,
    address: str,
    answers: bool,
    conns: Sequence[TcpConnection],
    before: Mapping[int, TcpConnection],
    window_seconds: float,
) -> PeerLink:
    rtts = [c.round_trip_seconds for c in conns if c.round_trip_seconds]
    least = [
        c.least_round_trip_seconds
        for c in conns
        if c.least_round_trip_seconds is not None
    ]
    # Connections there at the window's start only: a new one (the
    # probe's, say) has moved nothing that a step waits for.
    moved = sum(
        c.received_bytes
        - before[c.inode].received_bytes
        + c.acknowledged_bytes
        - before[c.inode].acknowledged_bytes
        for c in conns
        if c.inode in before
    )
    return PeerLink(
        task=task,
        address=address,
        answers=answers,
        connections=len(conns),
        silent_seconds=min((c.silent_seconds for c in conns), default=None),
        round_trip_seconds=max(rtts, default=None),
        least_round_trip_seconds=min(least, default=None),
        unacknowledged_bytes=sum(c.unacknowledged_bytes for c in conns),
        moved_bytes=moved,
        window_seconds=window_seconds,
    )


def _port(address: str) -> int | None:
    try:
        return int(address.rpartition(":")[2])
    except ValueError:
        return None


def _ips(address: str) -> set[str]:
    host = address.rpartition(":")[0].strip("[]")
    try:
        return {str(a[4][0]) for a in socket.getaddrinfo(host, None)}
    except OSError:
        return {host}


class _Watchdog:
    """One thread that runs each watched block's report when it is due,
    unless the block ended first (a thread per step would cost more than
    the check)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, seconds: float, report: Callable[[], None]) -> int:
        with self._changed:
            ticket = next(self._tickets)
            self._due[ticket] = (time.monotonic() + seconds, report)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tf_crossdevice stall", daemon=True
                )
                self._thread.start()
            self._changed.notify()
            return ticket

    def cancel(self, ticket: int) -> None:
        with self._changed:
            self._due.pop(ticket, None)

    def _run(self) -> None:
        while True:
            with self._changed:
                while True:
                    now = time.monotonic()
                    ready = [t for t, (at, _) in self._due.items() if at <= now]
                    if ready:
                        break
                    soonest = min(
                        (at for at, _ in self._due.values()), default=None
                    )
                    self._changed.wait(
                        None if soonest is None else soonest - now
                    )
                reports = [self._due.pop(t)[1] for t in ready]
            for report in reports:
                try:
                    report()
                except Exception:  # A report must never end the thread.
                    logging.exception("tf_crossdevice: the stall report failed")


_watchdog = _Watchdog()
