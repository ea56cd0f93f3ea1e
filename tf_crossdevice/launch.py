"""Starts a between-graph job's workers on this machine, one process each.

Every worker runs the same command with its own `TF_CONFIG` (a cluster of
`num_workers` tasks of job "worker" on free ports of 127.0.0.1, and its
task index), which `tf_crossdevice.MultiWorkerMirroredStrategy` reads. Each
line a worker prints is echoed with a "[worker i] " prefix. When a worker
fails, the others get `grace_seconds` to fail too (their collectives time
out or see the peer gone) and are then stopped; every worker is stopped on
leaving, also on Ctrl-C or an exception. Processes are started, watched and
stopped by `tf_crossdevice.cluster.processes`, the package's one process layer.

With `link_rate` (`--emulate_hosts`), each worker runs on its own emulated
host (`tf_crossdevice.cluster.hosts`): its own network namespace and
address, a link shaped to that rate, an equal share of the cores; the
hosts are removed when the job ends, also when it fails or is stopped.

With `max_restarts` (`--max_restarts`), a job whose worker fails is run
again, every worker started anew, and resumes from its last checkpoint;
with `min_workers` (`--num_workers=MIN:MAX`), each restart runs on the
emulated hosts that answer then, at least MIN of them (`run_local_job`).

On several machines, run one launcher on each host with `--rendezvous`
(an etcd server every host reaches, and the job's id) and `--address`
(where this host's worker listens): each runs one worker, and they meet
in rounds on etcd (`tf_crossdevice.cluster.run_host_agent`). Or give each
worker the same cluster in `TF_CONFIG` with its own task index yourself.

Command line (exits with the first failing worker's status, else 0; the
workers' command goes after --):

    python -m tf_crossdevice.launch --num_workers=2 -- \\
        python examples/train.py --job_name=worker --epochs=2
    python -m tf_crossdevice.launch --num_workers=4 --emulate_hosts \\
        --link_rate=1gbit -- python examples/train.py --job_name=worker
    python -m tf_crossdevice.launch --num_workers=2:3 --max_restarts=2 \\
        --emulate_hosts -- python train.py --model_dir=/tmp/job
    # On each host:
    python -m tf_crossdevice.launch --num_workers=2:4 --max_restarts=3 \\
        --rendezvous=etcd://10.0.0.1:2379/job1 --address=10.0.0.2:2222 \\
        -- python train.py --model_dir=/shared/job
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import NoReturn

from absl import app, flags

from tf_crossdevice import cluster as _cluster
from tf_crossdevice._core import checks
from tf_crossdevice.cluster import HeartbeatWatch
from tf_crossdevice.cluster import hosts as _hosts
from tf_crossdevice.cluster import processes as _processes

__all__ = [
    "RESTART_VARIABLE",
    "parse_num_workers",
    "run_local_job",
    "tf_config_envs",
]

# In every worker's environment: which round of the job it belongs to, 0
# for the first, k for the k-th restart (`run_local_job`'s max_restarts).
RESTART_VARIABLE = "TF_CROSSDEVICE_RESTART"

_POLL_SECONDS = 0.05
# How long the other workers may run after one failed, when another round
# follows: their own errors then add nothing (the peer is gone), and a
# worker hung in TensorFlow's abort path would hold the restart back, and
# one waiting in a collective with the lost peer cannot finish anything.
_RESTART_GRACE_SECONDS = 1.0


def tf_config_envs(
    num_workers: int, host: str | Sequence[str] = "127.0.0.1"
) -> list[dict[str, str]]:
    """Each worker's `TF_CONFIG` for a cluster on free ports of `host`.

    `host` may list one address per worker (emulated hosts): each worker
    then listens on the same port of its own address.

    >>> envs = tf_config_envs(2)
    >>> json.loads(envs[1]["TF_CONFIG"])["task"]
    {'type': 'worker', 'index': 1}
    >>> envs = tf_config_envs(2, ["198.18.1.1", "198.18.1.2"])
    >>> [a.split(":")[0] for a in json.loads(envs[0]["TF_CONFIG"])[
    ...     "cluster"]["worker"]]
    ['198.18.1.1', '198.18.1.2']
    """
    checks.positive_int(num_workers, "num_workers")
    if isinstance(host, str):
        addresses = [f"{host}:{p}" for p in _processes.free_ports(num_workers)]
    else:
        names = checks.string_list(host, "host", "address")
        if len(names) != num_workers:
            raise ValueError(
                f"host: {len(names)} addresses for num_workers={num_workers}; "
                "expected one address, or one per worker"
            )
        port = _processes.free_ports(1)[0]
        addresses = [f"{h}:{port}" for h in names]
    cluster = {"worker": addresses}
    return [
        {
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": i}}
            )
        }
        for i in range(num_workers)
    ]


def run_local_job(
    argv: Sequence[str],
    num_workers: int,
    *,
    timeout_seconds: float | None = None,
    grace_seconds: float = 30.0,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    link_rate: str | None = None,
    min_workers: int | None = None,
    max_restarts: int = 0,
    rendezvous_seconds: float = 60.0,
    stall_seconds: float | None = None,
    stall_warning_seconds: float | None = None,
) -> list[int]:
    """Runs `argv` as `num_workers` workers of one cluster; their statuses.

    A round fails when a worker ends with a status other than 0 (a signal
    too: its status is then negative). With `max_restarts`, a failed round
    is followed by another, up to `max_restarts` times: every worker is
    started again, and a job that saves checkpoints resumes from its last
    one. Each round takes the hosts that answer when it starts
    (`hosts.answering`; without emulated hosts, this machine, which
    always does), at least `min_workers` of them and at most `num_workers`:
    a host cut off is left out and one that answers again is taken back.
    Every worker's environment holds RESTART_VARIABLE, the round's number
    (0 for the first), and a restart prints a line that says how many
    workers it runs ("restart 1: 2 workers on hosts 0, 2 (1 does not
    answer)").

    With `stall_seconds`, a worker that has not called
    `tf_crossdevice.cluster.heartbeat()` for that long since it last did (a
    job calls it once per step) fails its round too, as one that hangs (in
    TensorFlow's abort path, say) neither exits nor fails by itself.
    A restart's round prints when its first step is done, as far as the
    heartbeats tell ("round 1: first step done 21.3 s after the workers
    started"). Each collective of the package's collective classes counts
    as progress too, and says which it is: a worker without progress for
    `stall_warning_seconds` makes the launcher print one report that names
    the late workers, how far each got (step and collective) and the
    collective the others wait in ("stall: no progress for 4.0 s. Late:
    worker 1 (step 58, collective 1: ...) has not reached step 58,
    collective 2: all_reduce of pack 2 of 2 (3 tensors) in
    CollectiveAllReduce, instance key 10, where worker 0 waits.").

    Args:
        argv: the command every worker runs, e.g. [sys.executable,
            "train.py", "--epochs=2"].
        num_workers: worker processes, at most (and at least, without
            `min_workers`).
        timeout_seconds: stop every worker after this long in all (None:
            never); a stopped worker's status is negative (the signal).
        grace_seconds: how long the others may run after one fails (at
            most 1 s when a restart follows).
        env: variables set on top of this process's environment.
        echo: print each worker's lines with a "[worker i] " prefix.
        link_rate: run each worker on its own emulated host, on a link of
            this rate ('1gbit'; see `tf_crossdevice.cluster.hosts`); None:
            every worker on this machine's loopback.
        min_workers: the fewest workers a round may run (default:
            `num_workers`).
        max_restarts: how many failed rounds are followed by another.
        rendezvous_seconds: how long a round waits for `min_workers` hosts
            to answer.
        stall_seconds: fail a round whose worker has sent no heartbeat for
            this long since its last one (None: never); a worker is watched
            from its first heartbeat, so start-up may take longer.
        stall_warning_seconds: print the stall report when a worker has
            made no progress for this long (default: half `stall_seconds`;
            None without it: never).

    Returns:
        Each worker's exit status in the last round, in task order.

    Raises:
        RuntimeError: fewer than `min_workers` hosts answered within
            `rendezvous_seconds`.
    """
    argv = checks.string_list(argv, "argv", "command-line word")
    checks.positive_int(num_workers, "num_workers")
    if timeout_seconds is not None:
        checks.positive_number(timeout_seconds, "timeout_seconds")
    least = num_workers if min_workers is None else min_workers
    checks.positive_int(least, "min_workers")
    if least > num_workers:
        raise ValueError(
            f"min_workers: {least} is more than num_workers={num_workers}"
        )
    checks.non_negative_int(max_restarts, "max_restarts")
    checks.positive_number(rendezvous_seconds, "rendezvous_seconds")
    if stall_seconds is not None:
        checks.positive_number(stall_seconds, "stall_seconds")
    if stall_warning_seconds is not None:
        checks.positive_number(stall_warning_seconds, "stall_warning_seconds")
    elif stall_seconds is not None:
        stall_warning_seconds = stall_seconds / 2
    deadline = None if timeout_seconds is None else (
        time.monotonic() + timeout_seconds
    )  # fmt: skip
    hosts: contextlib.AbstractContextManager[_hosts.EmulatedHosts | None]
    if link_rate is None:
        hosts = contextlib.nullcontext()
    else:
        hosts = _hosts.EmulatedHosts(num_workers, link_rate)
    with hosts as bed:
        restart = 0
        while True:
            members = _members(bed, num_workers, least, rendezvous_seconds)
            if restart:
                print(_restart_line(restart, members, bed), flush=True)
            last = restart == max_restarts
            limits = _Limits(
                deadline,
                grace_seconds
                if last
                else min(grace_seconds, _RESTART_GRACE_SECONDS),
                stall_seconds,
                stall_warning_seconds,
                announce=restart,
            )
            codes = _run(
                argv, members, bed, limits,
                {**(env or {}), RESTART_VARIABLE: str(restart)}, echo,
            )  # fmt: skip
            if all(c == 0 for c in codes) or restart == max_restarts:
                return codes
            if deadline is not None and time.monotonic() >= deadline:
                return codes
            restart += 1


def _members(
    bed: _hosts.EmulatedHosts | None,
    num_workers: int,
    least: int,
    rendezvous_seconds: float,
) -> list[int]:
    """The hosts a round runs its workers on, by index: those that answer,
    once at least `least` do."""
    if bed is None:
        return list(range(num_workers))
    give_up = time.monotonic() + rendezvous_seconds
    while True:
        there = _hosts.answering(bed)
        if len(there) >= least:
            return there
        if time.monotonic() >= give_up:
            raise RuntimeError(
                f"min_workers: {least} hosts needed, {len(there)} "
                f"answered within {rendezvous_seconds:g} s (hosts "
                f"{_names(there) or 'none'} of 0-{num_workers - 1})"
            )
        time.sleep(1.0)


def _restart_line(
    restart: int, members: list[int], bed: _hosts.EmulatedHosts | None
) -> str:
    line = f"restart {restart}: {len(members)} workers"
    if bed is None:
        return line
    line += f" on hosts {_names(members)}"
    silent = [h.index for h in bed.hosts if h.index not in members]
    if silent:
        verb = "does" if len(silent) == 1 else "do"
        line += f" ({_names(silent)} {verb} not answer)"
    return line


def _names(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


@dataclasses.dataclass(frozen=True)
class _Limits:
    """When a round stops its workers: at `deadline` (time.monotonic(); None:
    never), `grace_seconds` after the first failure, or when a worker has
    sent no heartbeat for `stall_seconds` (None: not watched); with a
    stall report after `warning_seconds` without progress (None: none)."""

    deadline: float | None
    grace_seconds: float
    stall_seconds: float | None
    warning_seconds: float | None
    # The round's number, if it is a restart whose first step to announce
    # (0: none).
    announce: int = 0


def _run(
    argv: list[str],
    members: list[int],
    bed: _hosts.EmulatedHosts | None,
    limits: _Limits,
    env: Mapping[str, str],
    echo: bool,
) -> list[int]:
    """One round: a worker on each of `members` (hosts' indices; this
    machine's loopback without `bed`); their statuses in task order."""
    num_workers = len(members)
    if bed is None:
        configs = tf_config_envs(num_workers)
    else:
        addresses = [bed.hosts[i].address for i in members]
        configs = tf_config_envs(num_workers, addresses)
    watch = HeartbeatWatch(limits.stall_seconds, limits.warning_seconds)
    children = []
    try:
        for i, config in enumerate(configs):
            command = argv if bed is None else bed.command(members[i], argv)
            children.append(
                _processes.Child(
                    command,
                    name=f"worker {i}",
                    env={**env, **config, **watch.env(i)},
                )
            )
        ended: dict[int, int] = {}
        failed_at = None
        started, first_step = time.time(), None
        while len(ended) < num_workers:
            now = time.monotonic()
            if first_step is None and limits.announce:
                first_step = watch.first_step()
                if first_step is not None:
                    print(
                        f"round {limits.announce}: first step done "
                        f"{first_step - started:.1f} s after the workers "
                        "started",
                        flush=True,
                    )
            if limits.deadline is not None and now > limits.deadline:
                break
            if failed_at is not None and now - failed_at > limits.grace_seconds:
                break
            stalled = watch.stalled(ended)
            if stalled is not None:
                print(
                    f"[worker {stalled}] no heartbeat for "
                    f"{limits.stall_seconds:g} s (stall_seconds): the round "
                    "stops",
                    file=sys.stderr,
                    flush=True,
                )
                watch.print_stacks(children[stalled], stalled)
                break
            for i, child in enumerate(children):
                if i in ended:
                    continue
                status = child.echo(f"[worker {i}] " if echo else None)
                if status is not None:
                    ended[i] = status
                    if status != 0:
                        failed_at = failed_at or now
            time.sleep(_POLL_SECONDS)
    finally:
        _processes.stop_all(children)
        watch.close()
    return [
        ended.get(i, child.process.returncode)
        for i, child in enumerate(children)
    ]


def parse_num_workers(text: str) -> tuple[int, int]:
    """The fewest and most workers of --num_workers: 'N' or 'MIN:MAX'.

    >>> parse_num_workers("4"), parse_num_workers("2:4")
    ((4, 4), (2, 4))

    Raises:
        ValueError: not that form, or not 1 <= MIN <= MAX; the message
            names the flag.
    """
    parts = str(text).split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1:
        numbers *= 2
    if len(numbers) != 2 or not 1 <= numbers[0] <= numbers[1]:
        raise ValueError(
            f"--num_workers: expected N or MIN:MAX with 1 <= MIN <= MAX, "
            f"got {text!r}"
        )
    return numbers[0], numbers[1]


def _define_flags() -> None:
    flags.DEFINE_string(
        "num_workers",
        "2",
        "Worker processes: N, or MIN:MAX for a job whose restarts "
        "(--max_restarts) run on as few as MIN hosts, those that answer.",
    )
    flags.DEFINE_integer(
        "max_restarts",
        0,
        "Start every worker again after a worker fails, up to this many "
        "times; the job resumes from its last checkpoint.",
        lower_bound=0,
    )
    flags.DEFINE_float(
        "timeout_seconds", None, "Stop every worker after this long."
    )
    flags.DEFINE_float(
        "stall_seconds",
        None,
        "Fail a round (and restart it, with --max_restarts) when a worker "
        "has not called tf_crossdevice.cluster.heartbeat() for this long "
        "(unset or 0: never).",
        lower_bound=0.0,
    )
    flags.DEFINE_float(
        "stall_warning_seconds",
        None,
        "Print a report naming the late workers and the collective the "
        "others wait in when a worker has made no progress for this long "
        "(default: half --stall_seconds; unset or 0 without it: never).",
        lower_bound=0.0,
    )
    flags.DEFINE_string(
        "rendezvous",
        None,
        "etcd://HOST:PORT/JOB_ID: run this host's one worker of a job on "
        "several machines, meeting the other hosts' launchers on that etcd "
        "server (start one launcher per host, each with its --address).",
    )
    flags.DEFINE_string(
        "address",
        None,
        "With --rendezvous: HOST:PORT where this host's worker listens, as "
        "the other hosts reach it.",
    )
    flags.DEFINE_bool(
        "emulate_hosts",
        False,
        "Run each worker on its own emulated host (needs root on Linux).",
    )
    flags.DEFINE_string(
        "link_rate", "1gbit", "Each emulated host's link rate, each way."
    )


def _parse_flags(argv: list[str]) -> list[str]:
    """The launcher's flags from `argv` into absl's FLAGS, for `app.run`;
    returns [program, the workers' command] (every word after the first --).

    A word before -- that is no flag starts a command without its --. absl
    would read that command's flags as the launcher's (an unknown flag, or
    its own --num_workers): it is an error, whose message shows the command
    line with -- in place. Errors end the process as absl's do for a bad
    flag (status 1).
    """
    split = argv.index("--") if "--" in argv else len(argv)
    # Stop at the first word that is no flag: the rest is the command.
    flags.FLAGS.set_gnu_getopt(False)
    try:
        left = flags.FLAGS(argv[:split])[1:]
    except flags.Error as e:
        _flag_error(str(e))
    try:
        parse_num_workers(flags.FLAGS.num_workers)
    except ValueError as e:
        _flag_error(str(e))
    if flags.FLAGS.rendezvous and not flags.FLAGS.address:
        _flag_error(
            "--address: needed with --rendezvous (HOST:PORT where this "
            "host's worker listens, e.g. --address=10.0.0.2:2222)"
        )
    if flags.FLAGS.address and not flags.FLAGS.rendezvous:
        _flag_error("--address: only with --rendezvous")
    if flags.FLAGS.rendezvous and flags.FLAGS.emulate_hosts:
        _flag_error(
            "--emulate_hosts: runs every worker on this machine; with "
            "--rendezvous each host runs its own (use one or the other)"
        )
    if left:
        own = argv[1 : split - len(left)]
        command = [*left, *argv[split + 1 :]]
        fixed = ["python", "-m", "tf_crossdevice.launch", *own, "--", *command]
        _flag_error(
            f"{left[0]!r} is no flag of the launcher; put the job's command "
            f"after --: {shlex.join(fixed)}"
        )
    return [argv[0], *argv[split + 1 :]]


def _flag_error(message: str) -> NoReturn:
    """Ends the process as absl's flag parser does for a bad flag."""
    sys.stderr.write(f"FATAL Flags parsing error: {message}\n")
    sys.stderr.write("Pass --helpshort or --helpfull to see help on flags.\n")
    sys.exit(1)


def _main(argv: list[str]) -> int:
    command = argv[1:]
    if not command:
        raise app.UsageError(
            "expected the workers' command after --, e.g. "
            "python -m tf_crossdevice.launch --num_workers=2 -- python train.py"
        )
    # Stopped from outside, still stop the workers and remove the hosts.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    least, most = parse_num_workers(flags.FLAGS.num_workers)
    if flags.FLAGS.rendezvous:
        return _run_host(command, least, most)
    try:
        codes = run_local_job(
            command,
            most,
            timeout_seconds=flags.FLAGS.timeout_seconds,
            link_rate=(
                flags.FLAGS.link_rate if flags.FLAGS.emulate_hosts else None
            ),
            min_workers=least,
            max_restarts=flags.FLAGS.max_restarts,
            stall_seconds=flags.FLAGS.stall_seconds or None,
            stall_warning_seconds=flags.FLAGS.stall_warning_seconds or None,
        )
    except RuntimeError as e:  # Too few hosts answered.
        print(f"launch: {e}", file=sys.stderr, flush=True)
        return 1
    return next((c for c in codes if c != 0), 0)


def _run_host(command: list[str], least: int, most: int) -> int:
    """This host's worker of a job on several machines (--rendezvous)."""
    try:
        return _cluster.run_host_agent(
            command,
            rendezvous=flags.FLAGS.rendezvous,
            address=flags.FLAGS.address,
            min_workers=least,
            max_workers=most,
            max_restarts=flags.FLAGS.max_restarts,
            timeout_seconds=flags.FLAGS.timeout_seconds,
            stall_seconds=flags.FLAGS.stall_seconds or None,
        )
    except (RuntimeError, ValueError, ImportError) as e:
        # etcd unreachable, too few hosts, a bad rendezvous, no etcd3gw.
        print(f"launch: {e}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    _define_flags()
    app.run(_main, flags_parser=_parse_flags)
