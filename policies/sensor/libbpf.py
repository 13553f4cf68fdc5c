"""The compiled backend: where ``corral-sensor-bpf`` is built, and what it is told.

``scripts/setup.sh`` builds ``bpf/`` (a libbpf CO-RE program and its loader)
into ``$CORRAL_CACHE_DIR/sensor-bpf`` (default ``<repo>/.cache/sensor-bpf``).
The BPF object is generic over syscalls: each syscall's enter/exit programs
save the raw tracepoint arguments and write them by a descriptor the loader
puts in a map, ``NAME=FLAGS:KIND.POS.LENPOS.SIZE/...`` per traced syscall,
made here from ``program.SYSCALLS`` and this kernel's tracepoint formats
(the argument's position and its C type's size, so that an ``int`` reads as
bpftrace reads it). Programs of syscalls no rule needs are never loaded.
"""

from __future__ import annotations

import os
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


def build_dir() -> Path:
    cache = os.environ.get("CORRAL_CACHE_DIR")
    return (Path(cache) if cache else REPO / ".cache") / "sensor-bpf"


def loader_path() -> Path | None:
    """The built loader, if ``scripts/setup.sh`` built it."""
    path = build_dir() / LOADER
    return path if os.access(path, os.X_OK) else None


def tracepoint_fields(syscall: str, events: Path = pg.TRACEFS_EVENTS) -> Fields:
    """The arguments of ``sys_enter_<syscall>`` as its tracefs format lists them."""
    text = (events / f"sys_enter_{syscall}" / "format").read_text()
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
    args = ["--parent-id", str(cfg.parent_id), "--subsys", str(cfg.subsys_index)]
    if not exe_details:
        args.append("--no-exe-details")
    for name in syscalls:
        args += ["--trace", trace_spec(name, fields_of(name))]
    return args
