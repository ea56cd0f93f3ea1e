"""Starts a between-graph job's workers on this machine, one process each.

Every worker runs the same command with its own `TF_CONFIG` (a cluster of
`num_workers` tasks of job "worker" on free ports of 127.0.0.1, and its
task index), which `tf_crossdevice.MultiWorkerMirroredStrategy` reads. Each
line a worker prints is echoed with a "[worker i] " prefix. When a worker
fails, the others get `grace_seconds` to fail too (their collectives time
out or see the peer gone) and are then stopped; every worker is stopped on
leaving, also on Ctrl-C or an exception. Processes are started, watched and
stopped by `tf_crossdevice.cluster.processes`, the package's one process layer.

On several machines, give each worker the same cluster in `TF_CONFIG` with
its own task index instead; nothing else changes.

Command line (exits with the first failing worker's status, else 0):

    python -m tf_crossdevice.launch --num_workers=2 -- \\
        python examples/train.py --job_name=worker --epochs=2
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence

from absl import app, flags

from tf_crossdevice._core import checks
from tf_crossdevice.cluster import processes as _processes

__all__ = [
    "run_local_job",
    "tf_config_envs",
]

_POLL_SECONDS = 0.05


def tf_config_envs(
    num_workers: int, host: str = "127.0.0.1"
) -> list[dict[str, str]]:
    """Each worker's `TF_CONFIG` for a cluster on free ports of `host`.

    >>> envs = tf_config_envs(2)
    >>> json.loads(envs[1]["TF_CONFIG"])["task"]
    {'type': 'worker', 'index': 1}
    """
    checks.positive_int(num_workers, "num_workers")
    ports = _processes.free_ports(num_workers)
    cluster = {"worker": [f"{host}:{p}" for p in ports]}
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
) -> list[int]:
    """Runs `argv` as `num_workers` workers of one cluster; their statuses.

    Args:
        argv: the command every worker runs, e.g. [sys.executable,
            "train.py", "--epochs=2"].
        num_workers: worker processes.
        timeout_seconds: stop every worker after this long (None: never);
            a stopped worker's status is negative (the signal).
        grace_seconds: how long the others may run after one fails.
        env: variables set on top of this process's environment.
        echo: print each worker's lines with a "[worker i] " prefix.

    Returns:
        Each worker's exit status, in task order.
    """
    argv = checks.string_list(argv, "argv", "command-line word")
    checks.positive_int(num_workers, "num_workers")
    if timeout_seconds is not None:
        checks.positive_number(timeout_seconds, "timeout_seconds")
    start = time.monotonic()
    children = []
    try:
        for i, config in enumerate(tf_config_envs(num_workers)):
            children.append(
                _processes.Child(
                    argv, name=f"worker {i}", env={**(env or {}), **config}
                )
            )
        ended: dict[int, int] = {}
        failed_at = None
        while len(ended) < num_workers:
            now = time.monotonic()
            if timeout_seconds is not None and now - start > timeout_seconds:
                break
            if failed_at is not None and now - failed_at > grace_seconds:
                break
            for i, child in enumerate(children):
                if i in ended:
                    continue
                try:
                    line = child.next_line()
                    while line is not None:
                        if echo:
                            print(f"[worker {i}] {line}", flush=True)
                        line = child.next_line()
                except _processes.ChildError:
                    ended[i] = child.wait(timeout=60)
                    if ended[i] != 0:
                        if echo:
                            print(
                                f"[worker {i}] exited with {ended[i]}:\n"
                                f"{child.stderr_text(3000)}",
                                file=sys.stderr,
                                flush=True,
                            )
                        failed_at = failed_at or now
            time.sleep(_POLL_SECONDS)
    finally:
        _processes.stop_all(children)
    return [
        ended.get(i, child.process.returncode)
        for i, child in enumerate(children)
    ]


def _define_flags() -> None:
    flags.DEFINE_integer("num_workers", 2, "Worker processes.", lower_bound=1)
    flags.DEFINE_float(
        "timeout_seconds", None, "Stop every worker after this long."
    )


def _main(argv: list[str]) -> int:
    command = argv[1:]
    if not command:
        raise app.UsageError(
            "expected the workers' command after --, e.g. "
            "python -m tf_crossdevice.launch --num_workers=2 -- python train.py"
        )
    codes = run_local_job(
        command,
        flags.FLAGS.num_workers,
        timeout_seconds=flags.FLAGS.timeout_seconds,
    )
    return next((c for c in codes if c != 0), 0)


if __name__ == "__main__":
    _define_flags()
    app.run(_main)
