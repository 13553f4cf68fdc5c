"""The seccomp profile every sandbox runs under.

Style: default-allow with a deny list returning EPERM. Why not Docker's
allow-list: agents run arbitrary toolchains (compilers, language runtimes,
test suites) and an allow-list that misses a new syscall breaks them in ways
that are hard to diagnose; the dangerous surface is small and well known, so
we deny that explicitly. EPERM (not KILL) so programs see an ordinary
"permission denied" and carry on. Seccomp runs before the syscall
tracepoints, so a denied attempt is invisible to the sensor (and to Falco):
rules on these calls matter only for sandboxes under a more permissive
profile. Seeing denied attempts would need SECCOMP_FILTER_FLAG_LOG and an
audit reader.

Denied, and why:
  * kernel keyrings (keyctl, add_key, request_key): not namespaced; shared
    with the host and every other sandbox.
  * bpf, perf_event_open: kernel attack surface and host-wide observation.
  * userfaultfd: a classic primitive for widening kernel race windows.
  * mount family (mount, umount2, pivot_root, and the new fs* mount API:
    fsopen, fsconfig, fsmount, fspick, move_mount, open_tree, mount_setattr):
    the sandbox's mount table is fixed at creation; without the fs* calls the
    mount denial is trivially bypassed.
  * kexec_load, kexec_file_load, init_module, finit_module, delete_module,
    reboot, swapon, swapoff, acct, quotactl, syslog, vhangup, iopl, ioperm,
    uselib, nfsservctl, lookup_dcookie: host administration.
  * clock_settime, clock_adjtime, settimeofday, adjtimex: the clock is not
    namespaced (time namespaces only offset monotonic/boottime).
  * open_by_handle_at, name_to_handle_at: open_by_handle_at escaped containers
    ("shocker"); file handles bypass the mount namespace.
  * ptrace, process_vm_readv, process_vm_writev, kcmp: inspection of other
    processes; the sensor, not the agent, watches processes.
  * setns: entering namespaces is never needed inside a sandbox.
  * unshare and clone with any CLONE_NEW* flag: new (user) namespaces are the
    entry point for most container escapes of the last years; unshare with
    only CLONE_FILES/CLONE_FS/CLONE_SYSVSEM stays allowed.
  * clone3: its flags live in a struct seccomp cannot read, so it gets ENOSYS
    and libc falls back to clone(2), whose flags we can check.
  * io_uring_setup/enter/register: io_uring operations are not seen by
    seccomp (a bypass) and have had many kernel bugs.
"""

from __future__ import annotations

import platform
from typing import Any

EPERM = 1
ENOSYS = 38

CLONE_NEW_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

DENIED_SYSCALLS: tuple[str, ...] = (
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "uselib",
    "nfsservctl",
    "lookup_dcookie",
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "adjtimex",
    "stime",
    "open_by_handle_at",
    "name_to_handle_at",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "setns",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)

# Syscalls whose first argument is a flags word holding CLONE_NEW* bits
# (true for unshare everywhere and for clone on x86_64 and arm64).
NAMESPACE_FLAG_SYSCALLS = ("unshare", "clone")

_ARCHES = {
    "x86_64": ["SCMP_ARCH_X86_64"],
    "aarch64": ["SCMP_ARCH_AARCH64"],
}


def seccomp_profile(machine: str | None = None) -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object.

    Only the native architecture is listed: syscalls made through another ABI
    (e.g. int 0x80 on x86_64) then hit libseccomp's bad-arch action and are
    refused, instead of slipping past a filter keyed on native numbers.
    """
    arch = machine or platform.machine()
    rules: list[dict[str, Any]] = [
        {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
    ]
    rules.extend(_namespace_flag_rules())
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": _ARCHES.get(arch, []),
        "syscalls": rules,
    }


def _namespace_flag_rules() -> list[dict[str, Any]]:
    # OCI ANDs the args of one rule and ORs separate rules: one rule per flag
    # gives "deny if any CLONE_NEW* bit is set".
    return [
        {
            "names": list(NAMESPACE_FLAG_SYSCALLS),
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": EPERM,
            "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
        }
        for flag in CLONE_NEW_FLAGS.values()
    ]
