"""The commands that build emulated hosts: ip, tc, and one builder at a time.

Each raises RuntimeError naming the command and its error when it fails
(`check`), so that a host that cannot be built says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import pathlib
import subprocess
from collections.abc import Iterator

_LOCK = pathlib.Path("/run/tf_crossdevice_hosts.lock")


@contextlib.contextmanager
def lock() -> Iterator[None]:
    """One builder at a time on this machine (they pick free names)."""
    with open(_LOCK, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ip(*args: str, check: bool = True) -> str:
    return run(["ip", *args], check=check)


def tc(*args: str) -> str:
    if args[:1] == ("-n",):  # tc has no -n: run it in the namespace.
        return run(["ip", "netns", "exec", args[1], "tc", *args[2:]])
    return run(["tc", *args])


def run(argv: list[str], check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"emulated hosts: {' '.join(argv)!r} failed with status "
            f"{result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout
