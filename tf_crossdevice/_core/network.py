"""Whether a TCP port answers: how the package asks if a worker is there."""

from __future__ import annotations

import concurrent.futures
import socket
from collections.abc import Sequence

# Probes in flight at once: enough for a large job's peers, few enough
# threads for any machine.
_MAX_PROBES_AT_ONCE = 32


def port_answers(address: str, timeout: float = 1.0) -> bool:
    """Whether 'host:port' (or '[v6 host]:port') accepts a TCP connection
    within `timeout` seconds.

    >>> port_answers("127.0.0.1:1", timeout=0.5)
    False
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection(
            (host.strip("[]"), int(port)), timeout=timeout
        ):
            return True
    except (OSError, ValueError):
        return False


def ports_answer(addresses: Sequence[str], timeout: float = 1.0) -> list[bool]:
    """`port_answers` for each address, probed at once (the whole call takes
    about `timeout` at most, however many addresses).

    >>> ports_answer(["127.0.0.1:1", "127.0.0.1:1"], timeout=0.5)
    [False, False]
    """
    if not addresses:
        return []
    workers = min(len(addresses), _MAX_PROBES_AT_ONCE)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda a: port_answers(a, timeout), addresses))
