"""bpftrace program generator: the syscalls the rules need, from sandboxes only.

Kernel-side filtering
---------------------
On this hybrid cgroup layout every process is in the cgroup v2 root, so
bpftrace's ``cgroup`` builtin (a v2 id) cannot tell sandboxes apart. runc
puts each sandbox in the v1 cgroup ``/corral/<container-id>`` of every
controller, so each probe's predicate walks

    curtask->cgroups->subsys[<pids>]->cgroup->kn->__parent->id

and compares it with the kernfs id (== inode number) of the v1 directory
``/sys/fs/cgroup/pids/corral``, a constant baked into the program. That is
four pointer loads and one compare per syscall of every process on the
host: no string compare, no map lookup, and no restart when sandboxes come
and go (new sandboxes are children of the same directory). The grandparent
is checked too so that a nested cgroup inside a sandbox stays watched. The
program must be regenerated only if ``/corral`` itself is removed and made
again (its id changes); the sensor watches for that. Filtering on the pid
namespace was rejected: it also matches every non-Corral container and
needs a walk over ``nsproxy`` that costs the same.

The leaf's kernfs id is printed with each event; ``cgroups.CgroupMap`` turns
it into the container id (the leaf's name) in user space.

Output framing
--------------
bpftrace runs with ``-f json``: each ``print((...))`` is one JSON line, so
paths containing newlines or tabs cannot forge records. Every record starts
with ``(code, nsecs, tid, pid, cgid, uid, gid, comm)``; the rest depends on
the code (see ``RECORDS``). Syscall arguments are saved at enter in per-tid
maps and printed at exit with the return value, so one syscall is one record
(strings are read at exit: the caller's buffers are still there). execve is
the exception: the old image is gone at exit, so its filename and argv are
printed at enter. Strings travel in their own ``REC_STR`` records, just
before the syscall's record (same CPU, same program run: order is kept):
a 200-byte string in a wide tuple overflows the 512-byte BPF stack (tried
for the syscall, exec-enter and exe records: bpftrace 0.17 refuses each).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# Record codes (first tuple element).
REC_SYSCALL = 1  # (hdr..., syscall_code, res, a0, a1, ...)
REC_EXEC_ENTER = 2  # (hdr..., syscall_code, 0): its REC_STR (filename) precedes it
REC_ARGV = 3  # (3, tid, index, string)
REC_EXEC_EXIT = 4  # (hdr..., syscall_code, res, exec details...)
REC_FORK = 5  # (hdr..., child_tid)
REC_EXIT = 6  # (hdr..., exit_code)
REC_EXE_INO = 8  # (8, tid, ino, ctime_s, ctime_ns, mtime_s, mtime_ns): precedes REC_EXEC_EXIT
REC_STR = 7  # (7, tid, arg_index, string): precedes the REC_SYSCALL of that tid

# bpftrace 0.17's maximum: longer paths are cut (the parser flags them).
STRLEN = 200

MAX_ARGV = 20  # argv entries printed per execve
MAX_SOCKADDR = 112  # bytes of a sockaddr (sockaddr_un is 110)
N_ARG_MAPS = 5

# Argument kinds: how a value is saved at enter and printed at exit.
INT, STR, SOCKADDR, PEER, HOW = "int", "str", "sockaddr", "peer", "how"


@dataclass(frozen=True, slots=True)
class ArgSpec:
    falco: str  # Falco's argument name
    field: str  # tracepoint field (args->X)
    kind: str = INT
    len_field: str | None = None  # sockaddr length field


def _a(falco: str, fld: str, kind: str = INT, length: str | None = None) -> ArgSpec:
    return ArgSpec(falco, fld, kind, length)


# Falco event name -> tracepoint arguments (Falco's names, e.g. "name" for a path).
SYSCALLS: dict[str, tuple[ArgSpec, ...]] = {
    "open": (_a("name", "filename", STR), _a("flags", "flags"), _a("mode", "mode")),
    "openat": (_a("dirfd", "dfd"), _a("name", "filename", STR), _a("flags", "flags"),
               _a("mode", "mode")),
    "openat2": (_a("dirfd", "dfd"), _a("name", "filename", STR), _a("flags", "how", HOW)),
    "creat": (_a("name", "pathname", STR), _a("mode", "mode")),
    "execve": (_a("filename", "filename", STR),),
    "execveat": (_a("dirfd", "fd"), _a("filename", "filename", STR), _a("flags", "flags")),
    "connect": (_a("fd", "fd"), _a("addr", "uservaddr", SOCKADDR, "addrlen")),
    "accept": (_a("fd", "fd"), _a("tuple", "upeer_sockaddr", PEER, "upeer_addrlen")),
    "accept4": (_a("fd", "fd"), _a("tuple", "upeer_sockaddr", PEER, "upeer_addrlen"),
                _a("flags", "flags")),
    "bind": (_a("fd", "fd"), _a("addr", "umyaddr", SOCKADDR, "addrlen")),
    "listen": (_a("fd", "fd"), _a("backlog", "backlog")),
    "socket": (_a("domain", "family"), _a("type", "type"), _a("proto", "protocol")),
    "socketpair": (_a("domain", "family"), _a("type", "type"), _a("proto", "protocol")),
    "sendto": (_a("fd", "fd"), _a("size", "len"), _a("tuple", "addr", SOCKADDR, "addr_len")),
    "sendmsg": (_a("fd", "fd"),),
    "symlink": (_a("target", "oldname", STR), _a("linkpath", "newname", STR)),
    "symlinkat": (_a("target", "oldname", STR), _a("linkdirfd", "newdfd"),
                  _a("linkpath", "newname", STR)),
    "link": (_a("oldpath", "oldname", STR), _a("newpath", "newname", STR)),
    "linkat": (_a("olddir", "olddfd"), _a("oldpath", "oldname", STR), _a("newdir", "newdfd"),
               _a("newpath", "newname", STR), _a("flags", "flags")),
    "unlink": (_a("path", "pathname", STR),),
    "unlinkat": (_a("dirfd", "dfd"), _a("name", "pathname", STR), _a("flags", "flag")),
    "rename": (_a("oldpath", "oldname", STR), _a("newpath", "newname", STR)),
    "renameat": (_a("olddirfd", "olddfd"), _a("oldpath", "oldname", STR),
                 _a("newdirfd", "newdfd"), _a("newpath", "newname", STR)),
    "renameat2": (_a("olddirfd", "olddfd"), _a("oldpath", "oldname", STR),
                  _a("newdirfd", "newdfd"), _a("newpath", "newname", STR), _a("flags", "flags")),
    "mkdir": (_a("path", "pathname", STR), _a("mode", "mode")),
    "mkdirat": (_a("dirfd", "dfd"), _a("path", "pathname", STR), _a("mode", "mode")),
    "rmdir": (_a("path", "pathname", STR),),
    "chmod": (_a("filename", "filename", STR), _a("mode", "mode")),
    "fchmodat": (_a("dirfd", "dfd"), _a("filename", "filename", STR), _a("mode", "mode")),
    "fchmod": (_a("fd", "fd"), _a("mode", "mode")),
    "ptrace": (_a("request", "request"), _a("pid", "pid")),
    "dup": (_a("fd", "fildes"),),
    "dup2": (_a("oldfd", "oldfd"), _a("newfd", "newfd")),
    "dup3": (_a("oldfd", "oldfd"), _a("newfd", "newfd"), _a("flags", "flags")),
    "init_module": (_a("uargs", "uargs", STR),),
    "finit_module": (_a("fd", "fd"), _a("uargs", "uargs", STR), _a("flags", "flags")),
    "setuid": (_a("uid", "uid"),),
    "setgid": (_a("gid", "gid"),),
    # At most two strings per record: each costs 2 x 64 bytes of the 512-byte BPF stack.
    "mount": (_a("dev", "dev_name", STR), _a("dir", "dir_name", STR), _a("flags", "flags")),
    "umount": (_a("name", "name", STR), _a("flags", "flags")),
    "umount2": (_a("name", "name", STR), _a("flags", "flags")),
    "chroot": (_a("path", "filename", STR),),
    "chdir": (_a("path", "filename", STR),),
    "fchdir": (_a("fd", "fd"),),
    "memfd_create": (_a("name", "uname", STR), _a("flags", "flags")),
    "kill": (_a("pid", "pid"), _a("sig", "sig")),
    "setns": (_a("fd", "fd"), _a("nstype", "flags")),
    "unshare": (_a("flags", "unshare_flags"),),
    "close": (_a("fd", "fd"),),
    "prctl": (_a("option", "option"),),
    "bpf": (_a("cmd", "cmd"),),
    "userfaultfd": (_a("flags", "flags"),),
}  # fmt: skip

# Always traced: they keep the process table (exe, args, cwd) and fd table right.
PROCESS_SYSCALLS = frozenset({"execve", "execveat", "chdir", "fchdir"})
# Traced when rules look at fds these did not create themselves (dup, sendto...).
FD_PRODUCERS = frozenset({"open", "openat", "openat2", "creat", "socket", "connect",
                          "accept", "accept4", "bind"})  # fmt: skip
FD_CONSUMERS = frozenset({"dup", "dup2", "dup3", "sendto", "sendmsg", "listen", "fchdir"})
# Calls the sandbox's seccomp profile denies (sandbox/seccomp.py) that rules watch:
# seccomp runs before sys_enter, so their enter probe never runs for a denied
# call; their exit tracepoint still fires. The bpftrace program writes such an
# exit with no saved arguments as a record of its own (return value only; the
# arguments are unknown here); the compiled backend reads them from the caller's
# registers (libbpf.RAW_EXIT_NRS).
DENIED_SYSCALLS = frozenset({"mount", "umount", "umount2", "ptrace", "setns", "unshare",
                             "init_module", "finit_module", "bpf", "userfaultfd"})  # fmt: skip
# Falco event types served by the sched tracepoints rather than a syscall.
SCHED_EVENTS = frozenset({"procexit", "clone", "clone3", "fork", "vfork"})

CODES: dict[str, int] = {name: i for i, name in enumerate(sorted(SYSCALLS), start=1)}
NAMES: dict[int, str] = {code: name for name, code in CODES.items()}

TRACEFS_EVENTS = Path("/sys/kernel/tracing/events/syscalls")


def tracepoint_exists(syscall: str) -> bool:
    return (TRACEFS_EVENTS / f"sys_enter_{syscall}").is_dir()


@dataclass(frozen=True, slots=True)
class FilterConfig:
    """Where sandboxes live: the v1 ``/corral`` directory of one controller."""

    parent_id: int  # kernfs id (inode) of /sys/fs/cgroup/<ctrl>/corral
    subsys_index: int  # index of <ctrl> in curtask->cgroups->subsys[]
    kn_parent_field: str = "__parent"  # "parent" before Linux 6.15


@dataclass(frozen=True, slots=True)
class Program:
    text: str
    syscalls: tuple[str, ...]  # traced
    unavailable: tuple[str, ...]  # requested, but no tracepoint on this kernel / unknown


def select_syscalls(
    event_types: Iterable[str], available: Callable[[str], bool] = tracepoint_exists
) -> tuple[list[str], list[str]]:
    wanted = set(event_types) - SCHED_EVENTS
    unknown = sorted(t for t in wanted if t not in SYSCALLS)
    wanted = (wanted & SYSCALLS.keys()) | PROCESS_SYSCALLS
    if wanted & FD_CONSUMERS:
        wanted |= FD_PRODUCERS
    missing = sorted(t for t in wanted if not available(t))
    chosen = sorted(t for t in wanted if available(t))
    requested_missing = [t for t in missing if t in set(event_types)]
    return chosen, sorted(set(unknown) | set(requested_missing))


def generate(
    event_types: Iterable[str],
    cfg: FilterConfig,
    available: Callable[[str], bool] = tracepoint_exists,
    *,
    exe_details: bool = True,
) -> Program:
    """``exe_details``: the exe's inode and name after each exec (two records per
    exec; only the ``proc.exe_ino*`` and ``proc.is_exe_from_memfd`` fields need them)."""
    syscalls, unavailable = select_syscalls(event_types, available)
    parts = [_header(), _sched_probes(cfg)]
    for name in syscalls:
        parts.append(_enter_probe(name, cfg))
        if name in DENIED_SYSCALLS:
            parts.append(_denied_exit_probe(name, cfg))  # first: it runs before the exit probe
        parts.append(_exit_probe(name, exe_details))
    return Program("\n".join(parts), tuple(syscalls), tuple(unavailable))


def _in_sandbox(cfg: FilterConfig) -> str:
    p = cfg.kn_parent_field
    kn = f"curtask->cgroups->subsys[{cfg.subsys_index}]->cgroup->kn"
    return f"({kn}->{p}->id == {cfg.parent_id} || {kn}->{p}->{p}->id == {cfg.parent_id})"


def _hdr(code: int) -> str:
    # The leaf cgroup's kernfs id identifies the sandbox (mapped in user space).
    return f"{code}, nsecs, tid, pid, @cg[tid], uid, gid, comm"


def _header() -> str:
    return "// generated by policies.sensor.program; do not edit\n"


def _sched_probes(cfg: FilterConfig) -> str:
    cond = _in_sandbox(cfg)
    kn = f"curtask->cgroups->subsys[{cfg.subsys_index}]->cgroup->kn->id"
    return f"""
tracepoint:sched:sched_process_fork /{cond}/ {{
  print(({REC_FORK}, nsecs, tid, pid, {kn}, uid, gid, comm, args->child_pid));
}}
tracepoint:sched:sched_process_exit /{cond}/ {{
  print(({REC_EXIT}, nsecs, tid, pid, {kn}, uid, gid, comm, curtask->exit_code));
}}
"""


def _enter_probe(name: str, cfg: FilterConfig) -> str:
    kn = f"curtask->cgroups->subsys[{cfg.subsys_index}]->cgroup->kn->id"
    lines = [f"  @cg[tid] = {kn};"]
    for i, arg in enumerate(SYSCALLS[name][:N_ARG_MAPS]):
        lines.append(f"  @a{i}[tid] = (int64)args->{arg.field};")
        if arg.len_field:
            lines.append(f"  @l{i}[tid] = (int64)args->{arg.len_field};")
    if name in ("execve", "execveat"):
        lines += _exec_enter_lines(name)
    body = "\n".join(lines)
    return f"tracepoint:syscalls:sys_enter_{name} /{_in_sandbox(cfg)}/ {{\n{body}\n}}"


def _exec_enter_lines(name: str) -> list[str]:
    code = CODES[name]
    fn_field = "filename"
    out = [f"  print(({REC_STR}, tid, 0, str(args->{fn_field})));",
           f"  print(({REC_EXEC_ENTER}, nsecs, tid, pid, @cg[tid], uid, gid, comm, {code}, 0));",
           "  $i = 0;",
           # A loop, not unroll(): unrolled copies each take their own 200-byte slot.
           f"  while ($i < {MAX_ARGV}) {{",
           "    $p = *(args->argv + $i);",
           "    if ($p == 0) { return; }",
           f"    print(({REC_ARGV}, tid, $i, str($p)));",
           "    $i++;",
           "  }"]  # fmt: skip
    return out


def _exit_value(i: int, arg: ArgSpec) -> tuple[list[str], str]:
    """Statements to run first, and the tuple element printing saved arg i."""
    if arg.kind == STR:
        # One record per string: a 200-byte string, copied into a tuple, leaves no
        # room in the 512-byte BPF stack for a second one.
        return [f"  print(({REC_STR}, tid, {i}, str(@a{i}[tid])));"], "0"
    if arg.kind == HOW:  # struct open_how *: print flags; mode follows as an extra int
        return [f"  $how = (struct open_how *)@a{i}[tid];"], "$how->flags, $how->mode"
    if arg.kind in (SOCKADDR, PEER):
        length = f"@l{i}[tid]" if arg.kind == SOCKADDR else f"*((int32 *)@l{i}[tid])"
        pre = [
            f"  $len{i} = {length};",
            f"  if ($len{i} > {MAX_SOCKADDR} || $len{i} < 0) {{ $len{i} = {MAX_SOCKADDR}; }}",
        ]
        if arg.kind == PEER:  # accept(fd, NULL, NULL) is common
            pre.append(f"  if (@a{i}[tid] == 0) {{ $len{i} = 0; }}")
        pre.append(f"  print(({REC_STR}, tid, {i}, buf(@a{i}[tid], $len{i})));")
        return pre, "0"
    return [], f"@a{i}[tid]"


def _denied_exit_probe(name: str, cfg: FilterConfig) -> str:
    """An exit whose enter never ran (seccomp denied the call): one record with
    the return value and empty arguments."""
    kn = f"curtask->cgroups->subsys[{cfg.subsys_index}]->cgroup->kn->id"
    n_values = sum(2 if a.kind == HOW else 1 for a in SYSCALLS[name][:N_ARG_MAPS])
    tail = ", 0" * n_values
    return (f"tracepoint:syscalls:sys_exit_{name} /@cg[tid] == 0 && {_in_sandbox(cfg)}/ {{\n"
            f"  print(({REC_SYSCALL}, nsecs, tid, pid, {kn}, uid, gid, comm, {CODES[name]}, "
            f"args->ret{tail}));\n}}")  # fmt: skip


def _exit_probe(name: str, exe_details: bool = True) -> str:
    specs = SYSCALLS[name][:N_ARG_MAPS]
    code = CODES[name]
    pre: list[str] = []
    values: list[str] = []
    is_exec = name in ("execve", "execveat")
    for i, arg in enumerate(specs):
        p, v = _exit_value(i, arg)
        pre += [] if is_exec else p  # exec strings were printed at enter
        values.append(v)
    if name in ("execve", "execveat"):
        printed = _exec_exit_print(code)
    else:
        tail = "".join(", " + v for v in values)
        printed = f"  print(({_hdr(REC_SYSCALL)}, {code}, args->ret{tail}));"
    first = ""
    if is_exec and exe_details:
        # Its own program (attached first, so it runs first): in the same one the
        # 200-byte string and the wide tuple overflow the 512-byte BPF stack.
        first = (f"tracepoint:syscalls:sys_exit_{name} /@cg[tid]/ {{\n"
                 f"  print(({REC_STR}, tid, 0, "
                 f"str(curtask->mm->exe_file->f_path.dentry->d_name.name)));\n}}\n"
                 f"tracepoint:syscalls:sys_exit_{name} /@cg[tid]/ {{\n"
                 f"  $i = curtask->mm->exe_file->f_inode;\n"
                 f"  print(({REC_EXE_INO}, tid, $i->i_ino, $i->i_ctime_sec, $i->i_ctime_nsec, "
                 f"$i->i_mtime_sec, $i->i_mtime_nsec));\n}}\n")  # fmt: skip
    deletes = [f"  delete(@a{i}[tid]);" for i in range(len(specs))]
    deletes += [f"  delete(@l{i}[tid]);" for i, a in enumerate(specs) if a.len_field]
    body = "\n".join([*pre, printed, *deletes, "  delete(@cg[tid]);"])
    return f"{first}tracepoint:syscalls:sys_exit_{name} /@cg[tid]/ {{\n{body}\n}}"


def _exec_exit_print(code: int) -> str:
    # After a successful exec, curtask is the new image: its caps, exe inode
    # and tty are what Falco reports on the execve exit event. (bpftrace 0.17
    # cannot index pid->numbers[], a flexible array: vpid comes from /proc.)
    return f"""  $t = curtask;
  $tty = $t->signal->tty;
  $lvl = $t->thread_pid->level;
  print(({_hdr(REC_EXEC_EXIT)}, {code}, args->ret, $t->real_parent->tgid,
    $t->cred->cap_effective.val, $t->cred->cap_permitted.val, $t->loginuid.val,
    $tty != 0 ? $tty->driver->major : 0,
    $tty != 0 ? $tty->driver->minor_start + $tty->index : 0,
    $lvl));"""
