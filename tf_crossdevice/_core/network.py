"""Whether a TCP port answers: how the package asks if a worker is there."""

from __future__ import annotations

import socket


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
