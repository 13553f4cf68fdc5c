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

from sandbox.errors import NetworkError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)

__all__ = ["listen_in_netns"]


def listen_in_netns(pid: int, port: int, *, backlog: int = 128) -> socket.socket:
    """A non-blocking TCP socket listening on 127.0.0.1:`port` in the network
    namespace of process `pid` (a sandbox's PID 1); NetworkError names what failed."""
    made: list[socket.socket] = []
    failed: list[str] = []
    thread = threading.Thread(
        target=_make_listener, args=(pid, port, backlog, made, failed), name="netns-listen"
    )
    thread.start()
    thread.join()
    if failed:
        raise NetworkError(f"listen on 127.0.0.1:{port} in the netns of pid {pid}: {failed[0]}")
    return made[0]


def _make_listener(
    pid: int, port: int, backlog: int, made: list[socket.socket], failed: list[str]
) -> None:
    try:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        failed.append(f"own namespace: {exc.strerror}")
        return
    try:
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        os.close(own)
        failed.append(f"no such process or namespace ({exc.strerror})")
        return
    try:
        if os.fstat(target).st_ino == os.fstat(own).st_ino:
            # Binding here would open the port on the host itself.
            failed.append("the process shares the host's network namespace")
            return
        _setns(target, "enter")
        try:
            made.append(_bound(port, backlog))
        except OSError as exc:
            failed.append(f"bind: {exc.strerror}")
        finally:
            _setns(own, "leave")
    except OSError as exc:
        failed.append(str(exc))
    finally:
        os.close(target)
        os.close(own)


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
