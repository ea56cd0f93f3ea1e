"""Preemption notices from worker servers to the client that drives them.

In an in-graph job the worker servers run no Python of the job: a SIGTERM
that a cluster manager sends to one of them (its preemption notice) would
kill the server, its devices' variables with it, before the client could
save a checkpoint. A server started through this package instead records
the notice in a file and serves on; the client finds the file by running
`tf.io.matching_files` on that worker's own CPU (so the file is read on the
worker's host, by TensorFlow's runtime), saves at the next step and
leaves. The file lives in the host's temporary directory
(`tempfile.gettempdir()`, /tmp unless TMPDIR says otherwise), named by the
worker's job, task and port; the server clears it when it starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterable
from typing import Any, NoReturn

from absl import logging

_FOLDER = "tf_crossdevice_preemption"
_WAKE_SECONDS = 0.2


def notice_path(job_name: str, task_index: int, port: int) -> str:
    """Where the worker server `job_name`/`task_index` listening on `port`
    records its preemption notice, in this host's temporary directory.

    >>> os.path.basename(notice_path("worker", 1, 2222))
    'worker-1-2222'
    """
    folder = os.path.join(tempfile.gettempdir(), _FOLDER)
    return os.path.join(folder, f"{job_name}-{task_index}-{port}")


def port_of(address: str) -> int:
    """The port of a 'host:port' address ('[::1]:2222' included).

    >>> port_of("198.18.1.2:2222"), port_of("[::1]:80")
    (2222, 80)
    """
    return int(address.rsplit(":", 1)[1])


def clear_notice(job_name: str, task_index: int, port: int) -> None:
    """Removes a notice left by an earlier server on the same port."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(notice_path(job_name, task_index, port))


def record_notices_on(
    job_name: str,
    task_index: int,
    port: int,
    signals: Iterable[int] = (signal.SIGTERM,),
) -> None:
    """Makes `signals` record this server's preemption notice instead of
    ending the process; clears an old notice first.

    Python runs the handler only while the main thread runs Python code:
    serve with `serve`, not `tf.distribute.Server.join()`.
    """
    clear_notice(job_name, task_index, port)
    path = notice_path(job_name, task_index, port)

    def record(signum: int, frame: Any) -> None:
        del frame
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # Written aside and renamed: whoever finds the notice finds it whole.
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w") as f:
            f.write(f"{signal.Signals(signum).name}\n")
        os.replace(partial, path)
        logging.warning(
            "/job:%s/replica:0/task:%d received %s: preemption notice "
            "recorded at %s for the client; serving on until stopped.",
            job_name,
            task_index,
            signal.Signals(signum).name,
            path,
        )

    for sig in signals:
        signal.signal(sig, record)


def serve(server: Any, signals: Iterable[int] = (signal.SIGTERM,)) -> NoReturn:
    """Serves a started `tf.distribute.Server` until the process ends, like
    `server.join()`; a SIGTERM records a preemption notice for the in-graph
    client that drives it (`tf_crossdevice.training.PreemptionWatcher(
    workers=...)`) instead of ending the process. Call it in the main
    thread of the server's process.

        server = tf.distribute.Server(cluster_spec, "worker", task_index)
        tf_crossdevice.cluster.serve(server)

    Args:
        server: the started server (its `server_def` names its job, task
            and port).
        signals: the signals that announce a preemption.
    """
    record_notices_of(server, signals)
    wait_forever()


def record_notices_of(
    server: Any, signals: Iterable[int] = (signal.SIGTERM,)
) -> None:
    """`record_notices_on` for a started `tf.distribute.Server`."""
    definition = server.server_def
    job_name, task_index = definition.job_name, definition.task_index
    (job,) = [j for j in definition.cluster.job if j.name == job_name]
    record_notices_on(
        job_name, task_index, port_of(job.tasks[task_index]), signals
    )


def wait_forever() -> NoReturn:
    """Blocks the main thread for good while signal handlers still run
    (`Server.join()` would keep them from running). Not `signal.pause()`:
    the kernel may hand the signal to one of TensorFlow's threads, which
    does not wake the main thread; a short sleep lets the handler run
    within `_WAKE_SECONDS`."""
    while True:
        time.sleep(_WAKE_SECONDS)
