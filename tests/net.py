"""Network helpers the tests share."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int, timeout_s: float = 0.3) -> bool:
    """Does something accept connections on this loopback port?"""
    with socket.socket() as sock:
        sock.settimeout(timeout_s)
        return sock.connect_ex(("127.0.0.1", port)) == 0
