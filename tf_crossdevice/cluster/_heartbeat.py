"""A worker's heartbeat: how a launcher tells a stalled job from a slow one.

A worker that hangs (in TensorFlow's abort path after a collective timed
out, say) neither exits nor fails, so a launcher that waits for exits
waits for ever. A launcher that watches for stalls names a file per worker
in the worker's environment (HEARTBEAT_VARIABLE); the worker calls
`heartbeat()` once per step, which sets that file's modification time to
now. A file left alone for longer than the launcher's limit is a stall.
After its last step, before work that sends no heartbeats (an evaluation,
a final save), a worker calls `end_heartbeats()`: its file goes, and the
launcher stops watching it. Outside such a launcher, both do nothing.
"""

from __future__ import annotations

import contextlib
import os

HEARTBEAT_VARIABLE = "TF_CROSSDEVICE_HEARTBEAT"


def heartbeat() -> None:
    """Tells the launcher, if one watches, that this worker makes progress:
    call it once per step (a system call, microseconds)."""
    path = os.environ.get(HEARTBEAT_VARIABLE)
    if not path:
        return
    # Removed with its round: nobody watches any more.
    with contextlib.suppress(FileNotFoundError):
        os.utime(path)


def end_heartbeats() -> None:
    """Tells the launcher, if one watches, that this worker's steps are
    over: it is no longer watched for stalls (and `heartbeat` does nothing
    from then on)."""
    path = os.environ.get(HEARTBEAT_VARIABLE)
    if path:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
