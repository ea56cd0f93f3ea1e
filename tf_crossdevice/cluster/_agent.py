"""One host's launcher of a job that runs on several machines.

`run_host_agent` runs on every host: each meets the others through the
rendezvous on an etcd server (`_rendezvous`), starts this host's one worker
with the round's `TF_CONFIG`, watches it and the round's failure key, and
after a failure anywhere starts the next round with the hosts that join it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Mapping, Sequence

from tf_crossdevice._core import checks
from tf_crossdevice.cluster import _rendezvous
from tf_crossdevice.cluster import processes as _processes
from tf_crossdevice.cluster._stall_watch import HeartbeatWatch

# In every worker's environment: its round, 0 for the first and k for the
# k-th restart; the same name as the local launcher's
# (tf_crossdevice.launch.RESTART_VARIABLE), so that a job reads one.
RESTART_VARIABLE = "TF_CROSSDEVICE_RESTART"

_POLL_SECONDS = 0.05


def run_host_agent(
    argv: Sequence[str],
    *,
    rendezvous: str,
    address: str,
    min_workers: int,
    max_workers: int,
    max_restarts: int = 0,
    timeout_seconds: float | None = None,
    grace_seconds: float = 30.0,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    rendezvous_seconds: float = 60.0,
    last_call_seconds: float = 10.0,
    lease_seconds: int = 10,
    stall_seconds: float | None = None,
) -> int:
    """Runs this host's worker of a job on several machines; its status.

    Start one on every host, each with the same `rendezvous` and its own
    `address`. They meet in rounds on the etcd server: a round takes the
    hosts that joined it, at least `min_workers` and at most `max_workers`
    (it closes at once with `max_workers`, else `last_call_seconds` after
    there were enough). Each host then runs `argv` as one worker whose
    `TF_CONFIG` holds the round's hosts, sorted by address, and its index
    among them; `TF_CROSSDEVICE_RESTART` holds the round's number. When a
    worker fails anywhere (a status other than 0, or a host whose launcher
    stopped answering for `lease_seconds`), every other worker gets
    `grace_seconds` to end and is then stopped, and, up to `max_restarts`
    times, the next round starts: every host that joins it runs its
    worker anew (a job that saves checkpoints resumes from its last one),
    one that came back or started late included, up to `max_workers`.
    Each restart prints how many workers it runs ("restart 1: 2
    workers"); each line the worker prints is echoed with a "[worker i] "
    prefix. With `stall_seconds`, a worker that has made no progress
    (`tf_crossdevice.cluster.heartbeat()`, or one of the package's
    collectives) for that long fails its round too.

    Args:
        argv: the command the worker runs, e.g. [sys.executable,
            "train.py", "--model_dir=/shared/job"].
        rendezvous: 'etcd://HOST:PORT/JOB_ID': the client address of an
            etcd server every host reaches, and an id that this job alone
            uses.
        address: HOST:PORT where this host's worker listens, as the other
            hosts reach it.
        min_workers: the fewest hosts a round may run on.
        max_workers: the most; a host beyond them waits for the next round.
        max_restarts: how many failed rounds are followed by another.
        timeout_seconds: stop the worker after this long in all (None:
            never).
        grace_seconds: how long the worker may run after a failure
            elsewhere.
        env: variables set on top of this process's environment.
        echo: print the worker's lines with a "[worker i] " prefix.
        rendezvous_seconds: how long a round waits for `min_workers` hosts
            (while a round runs without this host, it waits for that one to
            end first).
        last_call_seconds: how long a round with enough hosts waits for
            more.
        lease_seconds: how long after this host stops answering etcd the
            others take it for lost (at least 2).
        stall_seconds: fail the round when this host's worker has made no
            progress for this long since its first heartbeat (None: never).

    Returns:
        0 when a round succeeded on every host; else the status of the
        worker whose failure ended the last round (1 for a lost host), or
        this worker's when `timeout_seconds` stopped it.

    Raises:
        ImportError: etcd3gw is missing (the `elastic` extra).
        RuntimeError: etcd does not answer, fewer than `min_workers` hosts
            joined within `rendezvous_seconds`, or the job ended before
            this host was admitted.
    """
    argv = checks.string_list(argv, "argv", "command-line word")
    store = _rendezvous.parse_rendezvous(rendezvous)
    _rendezvous.check_address(address)
    checks.positive_int(min_workers, "min_workers")
    checks.positive_int(max_workers, "max_workers")
    if min_workers > max_workers:
        raise ValueError(
            f"min_workers: {min_workers} is more than max_workers={max_workers}"
        )
    checks.non_negative_int(max_restarts, "max_restarts")
    if timeout_seconds is not None:
        checks.positive_number(timeout_seconds, "timeout_seconds")
    checks.positive_number(grace_seconds, "grace_seconds")
    checks.positive_number(rendezvous_seconds, "rendezvous_seconds")
    checks.positive_number(last_call_seconds, "last_call_seconds")
    checks.integer(lease_seconds, "lease_seconds", minimum=2)
    if stall_seconds is not None:
        checks.positive_number(stall_seconds, "stall_seconds")
    deadline = None if timeout_seconds is None else (
        time.monotonic() + timeout_seconds
    )  # fmt: skip
    limits = _rendezvous.Limits(
        min_workers, max_workers, rendezvous_seconds, last_call_seconds,
        deadline,
    )  # fmt: skip
    worker = _Worker(
        argv, dict(env or {}), grace_seconds, deadline, echo, stall_seconds
    )
    with _rendezvous.EtcdRendezvous(store, address, lease_seconds) as meeting:
        number = 0
        while True:
            members = _rendezvous.gather(meeting, number, limits)
            if members is None:
                print(
                    f"round {number} closed without {address} (at most "
                    f"{max_workers} hosts): waiting for the next one",
                    flush=True,
                )
                number += 1
                continue
            if number:
                print(f"restart {number}: {len(members)} workers", flush=True)
            end = worker.run(meeting, number, members)
            if end.status == 0 or end.timed_out or number == max_restarts:
                meeting.end(_rendezvous.Outcome(number, end.status))
                return end.status
            number += 1


@dataclasses.dataclass(frozen=True)
class _RoundEnd:
    status: int  # 0: every member's worker exited with 0.
    timed_out: bool = False


@dataclasses.dataclass(frozen=True)
class _Worker:
    """This host's worker, run once per round."""

    argv: list[str]
    env: dict[str, str]
    grace_seconds: float
    deadline: float | None
    echo: bool
    stall_seconds: float | None

    def run(
        self,
        meeting: _rendezvous.EtcdRendezvous,
        number: int,
        members: list[str],
    ) -> _RoundEnd:
        """Round `number` on `members`: starts the worker, and watches it
        and the round's keys until every member is done, a failure was
        published (then gives the worker `grace_seconds`), or the deadline;
        the worker is stopped on leaving."""
        index = members.index(meeting.address)
        config = {
            "cluster": {"worker": members},
            "task": {"type": "worker", "index": index},
        }
        # Its progress alone: no report comparing workers (each host's
        # launcher sees only its own).
        watch = HeartbeatWatch(self.stall_seconds, None)
        child = _processes.Child(
            self.argv,
            name=f"worker {index}",
            env={
                **self.env,
                "TF_CONFIG": json.dumps(config),
                RESTART_VARIABLE: str(number),
                **watch.env(0),
            },
        )
        status: int | None = None
        failure: _rendezvous.Failure | None = None
        failed_at = 0.0
        next_read = 0.0
        try:
            while True:
                now = time.monotonic()
                if status is None:
                    status = self._ended(meeting, number, child, index, watch)
                    if status is not None:
                        next_read = now  # Read which failure etcd kept.
                if now >= next_read:
                    next_read = now + _rendezvous.POLL_SECONDS
                    round_ = meeting.state().round(number)
                    for lost in round_.lost():
                        meeting.fail(
                            number,
                            _rendezvous.Failure(
                                lost,
                                None,
                                "lost (its launcher has not answered etcd "
                                f"for {meeting.lease_seconds} s)",
                            ),
                        )
                    if round_.failure is not None and failure is None:
                        failure, failed_at = round_.failure, now
                        print(
                            f"round {number} failed: {failure}",
                            file=sys.stderr,
                            flush=True,
                        )
                    if failure is None and round_.done.issuperset(members):
                        return _RoundEnd(0)
                if failure is not None and (
                    status is not None or now - failed_at > self.grace_seconds
                ):
                    return _RoundEnd(failure.status or 1)
                if self.deadline is not None and now > self.deadline:
                    meeting.fail(
                        number,
                        _rendezvous.Failure(
                            meeting.address, None, "timeout_seconds passed"
                        ),
                    )
                    _processes.stop_all([child])
                    return _RoundEnd(child.process.returncode or 1, True)
                time.sleep(_POLL_SECONDS)
        finally:
            _processes.stop_all([child])
            watch.close()

    def _ended(
        self,
        meeting: _rendezvous.EtcdRendezvous,
        number: int,
        child: _processes.Child,
        index: int,
        watch: HeartbeatWatch,
    ) -> int | None:
        """The worker's status once it ended (exited, or stopped after it
        stalled), published to the round: done, or its failure."""
        status = child.echo(f"[worker {index}] " if self.echo else None)
        failure = None
        if status is not None and status != 0:
            failure = _rendezvous.Failure(
                meeting.address, status, f"exited with {status}"
            )
        elif status is None and watch.stalled({}) is not None:
            _processes.stop_all([child])
            status = child.process.returncode
            failure = _rendezvous.Failure(
                meeting.address,
                None,
                f"no heartbeat for {self.stall_seconds:g} s (stall_seconds)",
            )
        if status == 0:
            meeting.report_done(number)
        elif failure is not None:
            meeting.fail(number, failure)
        return status
