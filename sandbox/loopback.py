"""A host-owned listening socket on a sandbox's loopback.

A sandbox with network "none" has its own network namespace holding only
`lo`. To offer it one service (the node's model gateway) without giving it a
route anywhere, the host makes the socket *inside* that namespace: a thread
enters the namespace with setns(2), creates and binds the socket, and goes
back. A socket stays in the namespace it was made in, so processes in the
sandbox reach `127.0.0.1:<port>` while the host process accepts on the same
socket from its own namespace. Nothing is routed; the sandbox cannot signal,
trace or replace the host process behind the socket.

setns(CLONE_NEWNET) acts on the calling thread only, which is why it runs on a
short-lived thread of its own: the event loop's thread never changes namespace.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from collections.abc import Callable
from typing import TypeVar

from contract.errors import NetworkError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")

__all__ = ["accepts_in_netns", "listen_in_netns"]


def listen_in_netns(pid: int, port: int, *, backlog: int = 128) -> socket.socket:
    """A non-blocking TCP socket listening on 127.0.0.1:`port` in the network
    namespace of process `pid` (a sandbox's PID 1); NetworkError names what failed."""
    return in_netns(pid, lambda: _bound(port, backlog), f"listen on 127.0.0.1:{port}")


def accepts_in_netns(pid: int, port: int, *, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:`port` in the network
    namespace of `pid` (a service's readiness check)."""

    def probe() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=timeout_s).close()
        except OSError:
            return False
        return True

    return in_netns(pid, probe, f"probe 127.0.0.1:{port}")


def in_netns(pid: int, work: Callable[[], T], what: str) -> T:
    """`work()` run on a thread of its own inside the network namespace of `pid`."""
    results: list[T] = []
    failed: list[str] = []

    def run() -> None:
        try:
            with _entered(pid):
                results.append(work())
        except OSError as exc:
            failed.append(exc.strerror or str(exc))
        except NetworkError as exc:
            failed.append(str(exc))

    thread = threading.Thread(target=run, name="netns")
    thread.start()
    thread.join()
    if failed:
        raise NetworkError(f"{what} in the netns of pid {pid}: {failed[0]}")
    return results[0]


class _entered:
    """setns into `pid`'s network namespace on this thread, and back on leaving."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._own = self._target = -1

    def __enter__(self) -> None:
        self._own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            self._target = os.open(f"/proc/{self._pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            os.close(self._own)
            raise NetworkError(f"no such process or namespace ({exc.strerror})") from exc
        if os.fstat(self._target).st_ino == os.fstat(self._own).st_ino:
            self._close()
            # Binding here would open the port on the host itself.
            raise NetworkError("the process shares the host's network namespace")
        try:
            _setns(self._target, "enter")
        except OSError:
            self._close()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            _setns(self._own, "leave")
        finally:
            self._close()

    def _close(self) -> None:
        os.close(self._target)
        os.close(self._own)


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"setns ({what}): {os.strerror(errno)}")


def _bound(port: int, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
