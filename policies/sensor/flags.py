"""Symbolic rendering of syscall arguments, the way Falco prints them.

Falco's ``evt.arg.flags`` of an open is ``O_WRONLY|O_CREAT|O_TRUNC``, a
ptrace ``request`` is ``PTRACE_ATTACH``, a socket ``domain`` is ``AF_PACKET``;
rules match those strings (``evt.arg.flags contains O_TRUNC``), so the sensor
keeps raw ints and this module renders them on demand.
"""

from __future__ import annotations

import errno
import os

O_ACCMODE = 0o3
O_RDONLY, O_WRONLY, O_RDWR = 0, 1, 2
O_CREAT = 0o100
O_TMPFILE = 0o20200000
O_DIRECTORY = 0o200000
AT_FDCWD = -100

# Linux x86-64 values; order is Falco's print order (roughly).
_OPEN_FLAGS: list[tuple[int, str]] = [
    (0o40000000, "O_PATH"),
    (0o100000, "O_LARGEFILE"),
    (0o200000, "O_DIRECTORY"),
    (0o40000, "O_DIRECT"),
    (0o1000, "O_TRUNC"),
    (0o4010000, "O_SYNC"),
    (0o4000, "O_NONBLOCK"),
    (0o200, "O_EXCL"),
    (0o10000, "O_DSYNC"),
    (0o2000, "O_APPEND"),
    (0o100, "O_CREAT"),
    (0o2000000, "O_CLOEXEC"),
    (0o1000000, "O_NOATIME"),
    (0o400, "O_NOCTTY"),
    (0o20000, "O_ASYNC"),
    (0o20000000, "O_TMPFILE"),
]

PTRACE_REQUESTS: dict[int, str] = {
    0: "PTRACE_TRACEME",
    1: "PTRACE_PEEKTEXT",
    2: "PTRACE_PEEKDATA",
    3: "PTRACE_PEEKUSR",
    4: "PTRACE_POKETEXT",
    5: "PTRACE_POKEDATA",
    6: "PTRACE_POKEUSR",
    7: "PTRACE_CONT",
    8: "PTRACE_KILL",
    9: "PTRACE_SINGLESTEP",
    12: "PTRACE_GETREGS",
    13: "PTRACE_SETREGS",
    14: "PTRACE_GETFPREGS",
    15: "PTRACE_SETFPREGS",
    16: "PTRACE_ATTACH",
    17: "PTRACE_DETACH",
    18: "PTRACE_GETFPXREGS",
    19: "PTRACE_SETFPXREGS",
    24: "PTRACE_SYSCALL",
    0x4200: "PTRACE_SETOPTIONS",
    0x4201: "PTRACE_GETEVENTMSG",
    0x4202: "PTRACE_GETSIGINFO",
    0x4203: "PTRACE_SETSIGINFO",
    0x4204: "PTRACE_GETREGSET",
    0x4205: "PTRACE_SETREGSET",
    0x4206: "PTRACE_SEIZE",
    0x4207: "PTRACE_INTERRUPT",
    0x4208: "PTRACE_LISTEN",
    0x4209: "PTRACE_PEEKSIGINFO",
}

ADDRESS_FAMILIES: dict[int, str] = {
    0: "AF_UNSPEC",
    1: "AF_UNIX",
    2: "AF_INET",
    10: "AF_INET6",
    16: "AF_NETLINK",
    17: "AF_PACKET",
    4: "AF_IPX",
    5: "AF_APPLETALK",
    9: "AF_X25",
    15: "AF_KEY",
    29: "AF_CAN",
    31: "AF_BLUETOOTH",
    38: "AF_ALG",
    40: "AF_VSOCK",
    44: "AF_XDP",
}

SOCKET_TYPES: dict[int, str] = {
    1: "SOCK_STREAM",
    2: "SOCK_DGRAM",
    3: "SOCK_RAW",
    4: "SOCK_RDM",
    5: "SOCK_SEQPACKET",
    6: "SOCK_DCCP",
    10: "SOCK_PACKET",
}
_SOCK_TYPE_FLAGS = [(0o4000, "SOCK_NONBLOCK"), (0o2000000, "SOCK_CLOEXEC")]

# Falco's names for capability bits (thread.cap_effective prints them).
CAPABILITIES: list[str] = [
    "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
    "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
    "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
    "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
    "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
]  # fmt: skip


def open_flags(flags: int) -> str:
    acc = flags & O_ACCMODE
    names = ["O_RDONLY" if acc == O_RDONLY else "O_WRONLY" if acc == O_WRONLY else "O_RDWR"]
    rest = flags & ~O_ACCMODE
    for bit, name in _OPEN_FLAGS:
        if rest & bit == bit:
            names.append(name)
            rest &= ~bit
    if rest:
        names.append(hex(rest))
    return "|".join(names)


def socket_type(value: int) -> str:
    names = [SOCKET_TYPES.get(value & 0xF, str(value & 0xF))]
    names += [name for bit, name in _SOCK_TYPE_FLAGS if value & bit]
    return "|".join(names)


def ptrace_request(value: int) -> str:
    return PTRACE_REQUESTS.get(value, str(value))


def address_family(value: int) -> str:
    return ADDRESS_FAMILIES.get(value, str(value))


def errno_name(res: int) -> str:
    return errno.errorcode.get(-res, f"E{-res}") if res < 0 else "SUCCESS"


def capabilities(mask: int | None) -> str | None:
    if mask is None:
        return None
    return " ".join(name for bit, name in enumerate(CAPABILITIES) if mask >> bit & 1)


def dirfd(value: int) -> str:
    return f"{value}(AT_FDCWD)" if value == AT_FDCWD else str(value)


def mode(value: int) -> str:
    return f"0{value:o}" if value else "0"


def resolve_path(path: str, cwd: str, base: str | None = None) -> str:
    """Absolute, normalized path (Falco's fd.name); ``base`` is a dirfd's path."""
    if not path:
        return path
    if not path.startswith("/"):
        path = os.path.join(base or cwd or "/", path)
    return os.path.normpath(path).replace("//", "/")


def is_write(flags: int) -> bool:
    return flags & O_ACCMODE in (O_WRONLY, O_RDWR)


def is_read(flags: int) -> bool:
    return flags & O_ACCMODE in (O_RDONLY, O_RDWR)
