"""Which emulated hosts answer: what an elastic launcher runs a round on.

A launcher on real machines learns which ones are there when each
machine's own agent checks in; `answering` does the same for emulated
hosts: a process started on each host connects back to this (the root)
namespace. A host cut off at the bridge, or whose own end of its link is
down, does not connect.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Sequence
from typing import Protocol

from tf_crossdevice._core import checks
from tf_crossdevice.cluster import processes as _processes

# Run on a host: connects to argv[1]:argv[2] within argv[3] seconds, else
# exits with a status other than 0.
_PROBE = (
    "import socket, sys; "
    "socket.create_connection((sys.argv[1], int(sys.argv[2])), "
    "timeout=float(sys.argv[3])).close()"
)


class _Host(Protocol):
    @property
    def index(self) -> int: ...


class _Hosts(Protocol):
    """What `answering` uses of `hosts.EmulatedHosts`."""

    client_address: str

    @property
    def hosts(self) -> Sequence[_Host]: ...

    def command(self, index: int, argv: Sequence[str]) -> list[str]: ...


def answering(hosts: _Hosts, timeout: float = 3.0) -> list[int]:
    """The indices of the hosts of `hosts` (an `EmulatedHosts` that is up)
    that reach this namespace now, within `timeout` seconds each.

    Raises:
        ValueError: `timeout` is not a positive number.
    """
    checks.positive_number(timeout, "timeout")
    with socket.create_server((hosts.client_address, 0)) as server:
        port = str(server.getsockname()[1])
        probe = [sys.executable, "-c", _PROBE, hosts.client_address, port,
                 str(timeout)]  # fmt: skip
        probes = [
            _processes.Child(
                hosts.command(host.index, probe),
                name=f"host {host.index}'s probe",
            )
            for host in hosts.hosts
        ]
        answered = []
        try:
            for host, child in zip(hosts.hosts, probes, strict=True):
                with contextlib.suppress(_processes.ChildError):
                    if child.wait(timeout + 10) == 0:
                        answered.append(host.index)
        finally:
            _processes.stop_all(probes)
        return answered
