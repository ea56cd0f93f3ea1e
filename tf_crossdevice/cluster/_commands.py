"""The commands that build emulated hosts: ip, tc (and its token bucket), a
free subnet, and one builder at a time.

Each raises RuntimeError naming the command and its error when it fails
(`check`), so that a host that cannot be built says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import pathlib
import re
import subprocess
from collections.abc import Iterator

_LOCK = pathlib.Path("/run/tf_crossdevice_hosts.lock")
# A full-rate link's token bucket: 1 MiB, as `tc`'s "1mb" reads.
FULL_BURST_BYTES = 1 << 20


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


def tbf(verb: str, where: list[str], dev: str, rate: str, burst: int) -> None:
    """Adds ("add") or changes ("change") `dev`'s token bucket: `rate`
    each way out of it, a bucket of `burst` bytes; `where` is ["-n", ns]
    for a device in namespace ns, else []."""
    tc(*where, "qdisc", verb, "dev", dev, "root", "tbf", "rate", rate,
       "burst", str(burst), "latency", "100ms")  # fmt: skip


def run(argv: list[str], check: bool = True) -> str:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(
            f"emulated hosts: {' '.join(argv)!r} failed with status "
            f"{result.returncode}: {result.stderr.strip()}"
        )
    return result.stdout


def burst_bytes(rate_bits: float, mtu: int) -> int:
    """A token bucket for `rate_bits`: a tenth of a second's bytes, and at
    least one frame of `mtu` bytes with its Ethernet header (a bucket
    smaller than a frame never lets it through), at most the full rate's."""
    return int(min(max(rate_bits / 8 / 10, mtu + 14), FULL_BURST_BYTES))


def free_subnet() -> int:
    """A k for 198.18.k.0/24 that no interface here uses."""
    used = set(re.findall(r"inet 198\.18\.(\d+)\.", run(["ip", "-o", "addr"])))
    for k in range(1, 256):
        if str(k) not in used:
            return k
    raise RuntimeError("every 198.18.k.0/24 network is in use on this machine")
