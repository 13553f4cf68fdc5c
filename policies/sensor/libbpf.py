"""The compiled backend: where ``corral-sensor-bpf`` is built, and what it is told.

``scripts/setup.sh`` builds ``bpf/`` (a libbpf CO-RE program and its loader)
into ``$CORRAL_CACHE_DIR/sensor-bpf`` (default ``<repo>/.cache/sensor-bpf``).
The BPF object is generic over syscalls: each syscall's enter/exit programs
save the raw tracepoint arguments and write them by a descriptor the loader
puts in a map, ``NAME=FLAGS:KIND.POS.LENPOS.SIZE/...`` per traced syscall,
made here from ``program.SYSCALLS`` and this kernel's tracepoint formats
(the argument's position and its C type's size, so that an ``int`` reads as
bpftrace reads it). Programs of syscalls no rule needs are never loaded.

Calls seccomp denies: the sandbox's profile (``sandbox/seccomp.py``) denies
mount, umount2, ptrace, setns, unshare, the module calls, bpf and userfaultfd
before the
per-syscall tracepoints fire, so their enter/exit programs never see an
attempt. On x86_64 those syscalls (``RAW_EXIT_NRS``) are written instead by
one raw ``sys_exit`` program that reads the arguments from the caller's
registers (``--raw-exit NR:NAME``); the loader then leaves their enter/exit
pair out, so a call that is let through is one record too, never two.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable
from pathlib import Path

from policies.sensor import program as pg

LOADER = "corral-sensor-bpf"
REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("auto", "bpftrace", "libbpf")

KINDS = {pg.INT: 0, pg.STR: 1, pg.SOCKADDR: 2, pg.PEER: 3, pg.HOW: 4}
DESC_EXEC = 1
EXECS = frozenset({"execve", "execveat"})
# Sizes of the integer C types syscall tracepoints declare (every field is 8 bytes wide).
INT_SIZES = {"int": 4, "unsigned int": 4, "pid_t": 4, "uid_t": 4, "gid_t": 4, "qid_t": 4,
             "key_serial_t": 4, "rwf_t": 4, "clockid_t": 4, "umode_t": 2, "u32": 4}  # fmt: skip

Fields = list[tuple[str, str]]  # (C type, name) of the tracepoint's arguments, in order

# x86_64 syscall numbers of the calls the sandbox's seccomp profile denies (and
# the rules watch), written by the raw sys_exit program. umount and umount2 are
# one syscall there (166): its events are named umount2, as Falco names them,
# unless only umount is wanted.
RAW_EXIT_NRS = {"mount": 165, "umount": 166, "umount2": 166, "ptrace": 101, "setns": 308,
                "unshare": 272, "init_module": 175, "finit_module": 313, "bpf": 321,
                "userfaultfd": 323}  # fmt: skip
# Their arguments, for a kernel without the syscall's tracepoint (no modules:
# no init_module tracepoint); the names are the tracepoints' (program.SYSCALLS).
RAW_EXIT_FIELDS: dict[str, Fields] = {
    "mount": [("char *", "dev_name"), ("char *", "dir_name"), ("char *", "type"),
              ("unsigned long", "flags"), ("void *", "data")],
    "umount": [("char *", "name"), ("int", "flags")],
    "umount2": [("char *", "name"), ("int", "flags")],
    "ptrace": [("long", "request"), ("long", "pid"), ("unsigned long", "addr"),
               ("unsigned long", "data")],
    "setns": [("int", "fd"), ("int", "flags")],
    "unshare": [("unsigned long", "unshare_flags")],
    "init_module": [("void *", "umod"), ("unsigned long", "len"), ("const char *", "uargs")],
    "finit_module": [("int", "fd"), ("const char *", "uargs"), ("int", "flags")],
    "bpf": [("int", "cmd"), ("union bpf_attr *", "uattr"), ("unsigned int", "size")],
    "userfaultfd": [("int", "flags")],
}  # fmt: skip


def raw_exit_supported() -> bool:
    return platform.machine() == "x86_64"


def raw_exits(syscalls: Iterable[str]) -> dict[str, int]:
    """The syscalls of ``syscalls`` the raw sys_exit program writes: name -> number
    (one name per number)."""
    if not raw_exit_supported():
        return {}
    chosen = set(syscalls) & RAW_EXIT_NRS.keys()
    if {"umount", "umount2"} <= chosen:
        chosen.discard("umount")
    return {name: RAW_EXIT_NRS[name] for name in sorted(chosen)}


def available(syscall: str) -> bool:
    """Traceable by the compiled backend: a tracepoint, or the raw exit's."""
    return pg.tracepoint_exists(syscall) or (raw_exit_supported() and syscall in RAW_EXIT_NRS)


def build_dir() -> Path:
    cache = os.environ.get("CORRAL_CACHE_DIR")
    return (Path(cache) if cache else REPO / ".cache") / "sensor-bpf"


def loader_path() -> Path | None:
    """The built loader, if ``scripts/setup.sh`` built it."""
    path = build_dir() / LOADER
    return path if os.access(path, os.X_OK) else None


def tracepoint_fields(syscall: str, events: Path = pg.TRACEFS_EVENTS) -> Fields:
    """The arguments of ``sys_enter_<syscall>`` as its tracefs format lists them
    (a raw-exit syscall without a tracepoint: ``RAW_EXIT_FIELDS``)."""
    path = events / f"sys_enter_{syscall}" / "format"
    if syscall in RAW_EXIT_FIELDS and not path.exists():
        return list(RAW_EXIT_FIELDS[syscall])
    text = path.read_text()
    fields: Fields = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("field:"):
            continue
        decl = line[len("field:") :].split(";", 1)[0].strip()
        ctype, _, name = decl.replace("*", "* ").rpartition(" ")
        ctype = " ".join(ctype.split())
        if name.startswith("common_") or name == "__syscall_nr":
            continue
        fields.append((ctype, name))
    return fields


def _size(ctype: str) -> int:
    if "*" in ctype:
        return 8
    return INT_SIZES.get(ctype.removeprefix("const "), 8)


def trace_spec(syscall: str, fields: Fields) -> str:
    """``NAME=FLAGS:KIND.POS.LENPOS.SIZE/...`` for the loader's ``--trace``."""
    names = [name for _, name in fields]
    types = dict((name, ctype) for ctype, name in fields)
    specs = pg.SYSCALLS[syscall][: pg.N_ARG_MAPS]
    flags = 0
    if syscall in EXECS:  # only the filename (argv follows it): the exit record has no args
        flags = DESC_EXEC
        specs = tuple(a for a in specs if a.kind == pg.STR)
    slots = []
    for arg in specs:
        pos = names.index(arg.field)
        lenpos = names.index(arg.len_field) if arg.len_field else 0
        slots.append(f"{KINDS[arg.kind]}.{pos}.{lenpos}.{_size(types[arg.field])}")
    return f"{syscall}={flags}:{'/'.join(slots)}"


def loader_args(
    syscalls: Iterable[str],
    cfg: pg.FilterConfig,
    *,
    exe_details: bool = True,
    fields_of: Callable[[str], Fields] = tracepoint_fields,
) -> list[str]:
    syscalls = list(syscalls)
    args = ["--parent-id", str(cfg.parent_id), "--subsys", str(cfg.subsys_index)]
    if not exe_details:
        args.append("--no-exe-details")
    raw = raw_exits(syscalls)
    for name in syscalls:
        if name in RAW_EXIT_NRS and raw_exit_supported() and name not in raw:
            continue  # umount beside umount2: the same syscall, traced once
        args += ["--trace", trace_spec(name, fields_of(name))]
    for name, nr in raw.items():
        args += ["--raw-exit", f"{nr}:{name}"]
    return args
