"""The rendezvous of one launcher per host, on an etcd server.

Each host's agent (`run_host_agent`) joins round r of a job with the
address its worker will listen on. etcd, not this package, decides who is
in: the round's membership is written once, by whichever agent's
transaction creates its key first, and every agent reads that one value.
An agent holds a lease that it keeps alive, and its join keys live under
it: when a host dies, its keys expire `lease_seconds` later, and the
others take it for lost. A failure anywhere is one key of the round, which
every agent polls. As in TorchElastic's etcd rendezvous, a round closes
once `max_workers` hosts joined, or `min_workers` did and a short last
call has passed (or, at a restart, every host of the last round that is
still alive has joined again); a host that arrives after that waits for
the next round.

Keys, under `/tf_crossdevice/JOB/`:

    round/R/joined/ADDRESS   an agent that joined round R (under its lease)
    round/R/members          the closed membership: a sorted JSON list
    round/R/done/ADDRESS     a member whose worker exited with status 0
    round/R/failed           the round's first failure (JSON), created once
    outcome                  how the job ended (JSON), created once

A job id is used once: a job that ended leaves `outcome` behind, and an
agent that finds it ends with an error (delete the keys with `etcdctl del
--prefix /tf_crossdevice/JOB/` to reuse the id).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import etcd3gw

T = TypeVar("T")

# How often an agent reads the job's keys while it waits.
POLL_SECONDS = 0.2
# How long one request to etcd may take.
_REQUEST_SECONDS = 5.0
_URL = re.compile(
    r"etcd://(?P<host>\[[0-9A-Fa-f:.]+\]|[^:/\[\]]+):(?P<port>\d+)"
    r"/(?P<job>[A-Za-z0-9_.-]+)/?"
)


@dataclasses.dataclass(frozen=True)
class Store:
    """Where a job meets: an etcd server's client address, and its job id."""

    host: str
    port: int
    job: str

    def __str__(self) -> str:
        return f"etcd {self.host}:{self.port} job {self.job!r}"

    @property
    def prefix(self) -> str:
        return f"/tf_crossdevice/{self.job}/"


def parse_rendezvous(text: str) -> Store:
    """The store of `rendezvous`: 'etcd://HOST:PORT/JOB_ID'.

    >>> parse_rendezvous("etcd://10.0.0.1:2379/resnet-7")
    Store(host='10.0.0.1', port=2379, job='resnet-7')

    Raises:
        ValueError: not that form.
    """
    match = _URL.fullmatch(str(text))
    if not match or not 0 < int(match["port"]) < 65536:
        raise ValueError(
            f"rendezvous: expected etcd://HOST:PORT/JOB_ID (JOB_ID of "
            f"letters, digits, '.', '_' and '-'), got {text!r}"
        )
    host = match["host"].strip("[]")
    return Store(host, int(match["port"]), match["job"])


def check_address(address: str) -> str:
    """`address`, if it is HOST:PORT (the address a worker listens on).

    Raises:
        ValueError: not that form.
    """
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"address: expected HOST:PORT, the address this host's worker "
            f"listens on and the others reach it at, got {address!r}"
        )
    return address


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a round failed: the host, its worker's exit status (None: the
    host was lost), and what happened in words."""

    address: str
    status: int | None
    reason: str

    def __str__(self) -> str:
        return f"{self.address}: {self.reason}"


@dataclasses.dataclass
class Round:
    """What the keys of one round say."""

    joined: list[str] = dataclasses.field(default_factory=list)  # In order.
    members: list[str] | None = None  # None: not closed yet.
    done: set[str] = dataclasses.field(default_factory=set)
    failure: Failure | None = None

    def running(self) -> bool:
        """Closed, and neither failed nor done."""
        return (
            self.members is not None
            and self.failure is None
            and not self.done.issuperset(self.members)
        )

    def lost(self) -> list[str]:
        """Members that are neither done nor alive (their join key expired
        with their lease)."""
        alive = set(self.joined) | self.done
        return [m for m in self.members or [] if m not in alive]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the job ended: its last round and the exit status."""

    round: int
    status: int


@dataclasses.dataclass
class JobState:
    rounds: dict[int, Round]
    outcome: Outcome | None

    def round(self, number: int) -> Round:
        return self.rounds.get(number, Round())


def _etcd3gw() -> Any:
    try:
        return importlib.import_module("etcd3gw")
    except ImportError as e:
        raise ImportError(
            "rendezvous: the etcd rendezvous needs etcd3gw; install the "
            "`elastic` extra: pip install 'tf_crossdevice[elastic]'"
        ) from e


class EtcdRendezvous:
    """One agent's side of the rendezvous: its lease and the job's keys.

    Args:
        store: where the job meets (`parse_rendezvous`).
        address: this host's worker address (HOST:PORT).
        lease_seconds: how long this host's keys outlive its last word
            with etcd: the others take it for lost that long after it
            died (etcd's least is about 2 s).

    Raises:
        ImportError: etcd3gw is not installed.
        RuntimeError: etcd does not answer at `store`.
    """

    def __init__(self, store: Store, address: str, lease_seconds: int) -> None:
        self.store = store
        self.address = address
        self.lease_seconds = lease_seconds
        module = _etcd3gw()
        self._errors: tuple[type[Exception], ...] = (
            module.exceptions.ConnectionFailedError,
            module.exceptions.ConnectionTimeoutError,
            # etcd answers 500 while it elects a leader.
            module.exceptions.InternalServerError,
        )
        self._client: etcd3gw.Etcd3Client = self._connect(module)
        self._lease = self._call(lambda: self._client.lease(lease_seconds))
        # A client of its own: a requests.Session is not shared by threads.
        self._keeper = _Keeper(self._connect(module), self._lease.id, self)
        self._keeper.start()

    def _connect(self, module: Any) -> etcd3gw.Etcd3Client:
        client = module.Etcd3Client(
            self.store.host, self.store.port, timeout=_REQUEST_SECONDS
        )
        self._call(client.status)
        return client

    def _call(self, request: Callable[[], T]) -> T:
        """`request()`, tried again while etcd does not answer, for up to
        `lease_seconds` (by then this host's keys are gone anyway)."""
        give_up = time.monotonic() + self.lease_seconds
        while True:
            try:
                return request()
            except self._errors as e:
                if time.monotonic() >= give_up:
                    raise RuntimeError(
                        f"rendezvous: {self.store} does not answer "
                        f"({type(e).__name__}: {str(e) or 'no answer'}); "
                        "start etcd there (or pass the address of a running "
                        "one) and check that this host reaches it"
                    ) from e
            time.sleep(POLL_SECONDS)

    def check(self) -> None:
        """Raises RuntimeError once this host's lease is lost."""
        if self._keeper.lost:
            raise RuntimeError(
                f"rendezvous: {self.store}: this host's lease is lost "
                f"({self._keeper.lost}); the others take {self.address} "
                "for lost"
            )

    def state(self) -> JobState:
        """Every key of the job, read at once."""
        self.check()
        prefix = self.store.prefix
        kvs = self._call(
            lambda: self._client.get_prefix(
                prefix, sort_order="ascend", sort_target="create"
            )
        )
        rounds: dict[int, Round] = {}
        outcome = None
        for value, meta in kvs:
            key: bytes | str = meta["key"]  # Decoded to bytes by etcd3gw.
            if isinstance(key, bytes):
                key = key.decode()
            parts = key[len(prefix) :].split("/")
            text = value.decode()
            if parts == ["outcome"]:
                outcome = Outcome(**json.loads(text))
                continue
            if parts[0] != "round" or not parts[1].isdigit():
                continue
            entry = rounds.setdefault(int(parts[1]), Round())
            kind = parts[2:3]
            if kind == ["joined"]:
                entry.joined.append(text)
            elif kind == ["members"]:
                entry.members = json.loads(text)
            elif kind == ["done"]:
                entry.done.add(text)
            elif kind == ["failed"]:
                entry.failure = Failure(**json.loads(text))
        return JobState(rounds, outcome)

    def _key(self, number: int, *parts: str) -> str:
        return self.store.prefix + "/".join(["round", str(number), *parts])

    def join(self, number: int) -> None:
        """Joins round `number` (under this host's lease)."""
        key = self._key(number, "joined", self.address)
        self._call(lambda: self._client.put(key, self.address, self._lease))

    def close(self, number: int, members: Sequence[str]) -> None:
        """Proposes round `number`'s membership: one etcd transaction
        creates its key if no agent did yet (`state` reads which did)."""
        key = self._key(number, "members")
        value = json.dumps(sorted(members))
        self._call(lambda: self._client.create(key, value))

    def report_done(self, number: int) -> None:
        """This host's worker of round `number` exited with status 0."""
        key = self._key(number, "done", self.address)
        self._call(lambda: self._client.put(key, self.address))

    def fail(self, number: int, failure: Failure) -> None:
        """Publishes a failure of round `number`, unless one was already."""
        key = self._key(number, "failed")
        value = json.dumps(dataclasses.asdict(failure))
        self._call(lambda: self._client.create(key, value))

    def end(self, outcome: Outcome) -> None:
        """Publishes how the job ended, unless an agent already did."""
        key = self.store.prefix + "outcome"
        value = json.dumps(dataclasses.asdict(outcome))
        self._call(lambda: self._client.create(key, value))

    def leave(self) -> None:
        """Stops the lease's keep-alive and revokes it (this host's join
        keys go at once); safe to call again."""
        if self._keeper.stop():
            # Whatever goes wrong, the lease expires by itself.
            with contextlib.suppress(Exception):
                self._lease.revoke()

    def __enter__(self) -> EtcdRendezvous:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.leave()


class _Keeper(threading.Thread):
    """Keeps a lease alive: refreshes it three times per `lease_seconds`.
    `lost` says why it could not (etcd gone for longer than the lease, or
    the lease expired)."""

    def __init__(
        self, client: etcd3gw.Etcd3Client, lease_id: int, owner: EtcdRendezvous
    ) -> None:
        super().__init__(daemon=True, name="rendezvous lease")
        self._lease = _etcd3gw().Lease(lease_id, client)
        self._seconds = owner.lease_seconds
        self._errors = owner._errors
        self._stopped = threading.Event()
        self._claimed = threading.Lock()
        self.lost = ""

    def run(self) -> None:
        last = time.monotonic()
        while not self._stopped.wait(self._seconds / 3):
            try:
                if self._lease.refresh() <= 0:
                    self.lost = "it expired"
                    return
                last = time.monotonic()
            except self._errors as e:
                if time.monotonic() - last > self._seconds:
                    self.lost = (
                        f"etcd did not answer for {self._seconds} s: {e}"
                    )
                    return

    def stop(self) -> bool:
        """True for the first caller only."""
        if not self._claimed.acquire(blocking=False):
            return False
        self._stopped.set()
        return True


@dataclasses.dataclass(frozen=True)
class Limits:
    """How a round's membership is gathered: at least `min_workers` hosts
    and at most `max_workers`; `last_call_seconds` for more to come once
    there are enough; give up `rendezvous_seconds` after joining (counted
    from the end of a round that runs without this host) or at `deadline`
    (a `time.monotonic()` value; None: never)."""

    min_workers: int
    max_workers: int
    rendezvous_seconds: float
    last_call_seconds: float
    deadline: float | None = None


def gather(
    rendezvous: EtcdRendezvous, number: int, limits: Limits
) -> list[str] | None:
    """Joins round `number` and waits for it to close; its members, sorted
    (None: it closed without this host, which then joins the next).

    Raises:
        RuntimeError: fewer than `min_workers` hosts joined in time, the
            deadline passed, or the job ended before this host was in.
    """
    rendezvous.join(number)
    give_up = time.monotonic() + limits.rendezvous_seconds
    enough_since = None
    while True:
        now = time.monotonic()
        state = rendezvous.state()
        if state.outcome is not None:
            raise RuntimeError(
                f"rendezvous: {rendezvous.store} ended (round "
                f"{state.outcome.round}, status {state.outcome.status}) "
                f"before {rendezvous.address} was admitted; a new job needs a "
                "new job id"
            )
        this = state.round(number)
        if this.members is not None:
            return this.members if rendezvous.address in this.members else None
        before = state.round(number - 1)
        if before.running():  # This host waits for the next restart.
            give_up = now + limits.rendezvous_seconds
        joined = this.joined[: limits.max_workers]
        enough = len(joined) >= limits.min_workers
        enough_since = (enough_since or now) if enough else None
        # After a failed round, the hosts of that round that are alive.
        expected = set(before.joined) & set(before.members or [])
        if len(joined) == limits.max_workers or (
            enough_since is not None
            and (
                now - enough_since >= limits.last_call_seconds
                or (before.failure is not None and expected <= set(joined))
            )
        ):
            rendezvous.close(number, joined)
            continue  # The next read tells whose membership etcd kept.
        if limits.deadline is not None and now >= limits.deadline:
            raise RuntimeError(
                f"timeout_seconds: the job's time ran out while "
                f"{rendezvous.address} waited for round {number} at "
                f"{rendezvous.store}"
            )
        if now >= give_up and enough_since is None:
            raise RuntimeError(
                f"min_workers: {limits.min_workers} hosts needed, "
                f"{len(joined)} joined within {limits.rendezvous_seconds:g} s "
                f"({', '.join(joined) or 'none'}) at {rendezvous.store}; "
                "start a launcher on more hosts, or lower min_workers"
            )
        time.sleep(POLL_SECONDS)
