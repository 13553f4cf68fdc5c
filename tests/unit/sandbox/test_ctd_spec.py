"""OCI spec builder, seccomp profile and SandboxSpec validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from sandbox.client import crun_blocker
from sandbox.models import SandboxSpec
from sandbox.network import EgressRule
from sandbox.seccomp import CLONE_NEW_FLAGS, DENIED_SYSCALLS, EPERM, seccomp_profile
from sandbox.spec import (
    CAPABILITIES,
    EXEC_OOM_SCORE_ADJ,
    INIT_OOM_SCORE_ADJ,
    INIT_PATH,
    build_oci_spec,
    exec_process,
)

MIB = 1024 * 1024


def spec(**fields: object) -> SandboxSpec:
    return SandboxSpec.model_validate({"image": "busybox", **fields})


def test_namespaces_and_cgroup_path() -> None:
    oci = build_oci_spec("sb-1", spec())
    kinds = {ns["type"] for ns in oci["linux"]["namespaces"]}
    assert kinds == {"pid", "ipc", "uts", "mount", "network", "user"}
    assert all("path" not in ns for ns in oci["linux"]["namespaces"])  # fresh ones
    assert oci["linux"]["cgroupsPath"] == "/corral/sb-1"
    assert oci["linux"]["cgroupsPath"].rsplit("/", 1)[1] == "sb-1"  # leaf = container id


def test_process_hardening() -> None:
    process = build_oci_spec("sb", spec(nofile=2048, user="1000:1000"))["process"]
    assert process["noNewPrivileges"] is True
    assert "CAP_NET_RAW" not in process["capabilities"]["bounding"]
    assert "CAP_SYS_ADMIN" not in process["capabilities"]["bounding"]
    assert process["capabilities"]["effective"] == []  # non-root user
    assert process["user"] == {"uid": 1000, "gid": 1000}
    assert process["rlimits"] == [{"type": "RLIMIT_NOFILE", "hard": 2048, "soft": 2048}]
    assert process["oomScoreAdj"] == INIT_OOM_SCORE_ADJ < EXEC_OOM_SCORE_ADJ


def test_capabilities_are_at_most_docker_minus_net_raw() -> None:
    docker = {
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FSETID",
        "CAP_FOWNER",
        "CAP_MKNOD",
        "CAP_NET_RAW",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETFCAP",
        "CAP_SETPCAP",
        "CAP_NET_BIND_SERVICE",
        "CAP_SYS_CHROOT",
        "CAP_KILL",
        "CAP_AUDIT_WRITE",
    }
    assert set(CAPABILITIES) <= docker - {"CAP_NET_RAW"}


def test_resources() -> None:
    res = build_oci_spec(
        "sb", spec(memory_mb=256, swap_mb=64, pids_limit=99, cpu_cores=1.5, cpu_shares=512)
    )["linux"]["resources"]
    assert res["memory"] == {"limit": 256 * MIB, "swap": 320 * MIB}
    assert res["pids"] == {"limit": 99}
    assert res["cpu"] == {"quota": 150_000, "period": 100_000, "shares": 512}
    assert res["devices"][0] == {"allow": False, "access": "rwm"}


def test_masked_readonly_and_tmpfs() -> None:
    oci = build_oci_spec("sb", spec(tmpfs_mb=32, read_only_root=True))
    for path in (
        "/proc/kcore",
        "/proc/keys",
        "/proc/timer_list",
        "/proc/sched_debug",
        "/proc/kpagecgroup",
        "/proc/kpagecount",
        "/proc/kpageflags",
        "/proc/sysrq-trigger",
        "/sys/firmware",
        "/proc/acpi",
        "/proc/scsi",
    ):
        assert path in oci["linux"]["maskedPaths"]
    assert set(oci["linux"]["readonlyPaths"]) >= {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"}
    mounts = {m["destination"]: m for m in oci["mounts"]}
    assert "size=32m" in mounts["/tmp"]["options"]
    assert "size=32m" in mounts["/dev/shm"]["options"]
    assert oci["root"] == {"path": "rootfs", "readonly": True}


def test_exec_process_overrides() -> None:
    base = build_oci_spec("sb", spec(env={"A": "1", "B": "2"}))["process"]
    process = exec_process(base, ["ls"], env={"B": "3"}, workdir="/tmp", user="5:6")
    assert process["args"] == ["ls"]
    assert "A=1" in process["env"] and "B=3" in process["env"] and "B=2" not in process["env"]
    assert process["cwd"] == "/tmp"
    assert process["user"] == {"uid": 5, "gid": 6}
    assert process["capabilities"]["effective"] == []
    assert base["args"] == [INIT_PATH, "--", "sleep", "2147483647"]  # template untouched


def test_seccomp_denies_the_list_with_eperm() -> None:
    profile = seccomp_profile("x86_64")
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert profile["architectures"] == ["SCMP_ARCH_X86_64"]
    denied = {
        name
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ERRNO"
        and rule.get("errnoRet") == EPERM
        and "args" not in rule
        for name in rule["names"]
    }
    required = {
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "mount",
        "umount2",
        "pivot_root",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "clock_settime",
        "clock_adjtime",
        "settimeofday",
        "adjtimex",
        "swapon",
        "swapoff",
        "reboot",
        "open_by_handle_at",
        "name_to_handle_at",
        "ptrace",
        "setns",
        "fsopen",
        "fsmount",
        "move_mount",
    }
    assert required <= denied
    assert set(DENIED_SYSCALLS) == denied


def test_seccomp_namespace_flags_rules() -> None:
    rules = [r for r in seccomp_profile("x86_64")["syscalls"] if "args" in r]
    flags = {r["args"][0]["value"] for r in rules}
    assert flags == set(CLONE_NEW_FLAGS.values())
    for rule in rules:
        assert set(rule["names"]) == {"unshare", "clone"}
        arg = rule["args"][0]
        assert arg["op"] == "SCMP_CMP_MASKED_EQ" and arg["value"] == arg["valueTwo"]
    clone3 = [r for r in seccomp_profile("x86_64")["syscalls"] if r["names"] == ["clone3"]]
    assert clone3 and clone3[0]["errnoRet"] == 38  # ENOSYS: libc falls back to clone


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"memory_mb": 64, "tmpfs_mb": 32}, "tmpfs_mb"),
        ({"memory_mb": 4}, "memory_mb"),
        ({"cpu_cores": 0}, "cpu_cores"),
        ({"pids_limit": 1}, "pids_limit"),
        ({"user": "root"}, "user"),
        ({"workdir": "relative"}, "workdir"),
        ({"env": {"BAD-KEY": "x"}}, "env"),
        ({"runtime": "kata"}, "runtime"),
        ({"network": "host"}, "network"),
        ({"egress": [{"cidr": "10.0.0.0/8", "port": 80}]}, "allowlist"),
        ({"network": "allowlist", "egress": [{"cidr": "10.0.0.1/8", "port": 80}]}, "cidr"),
        ({"network": "allowlist", "egress": [{"cidr": "10.0.0.0/8"}]}, "port"),
        ({"workspace_mb": 1}, "workspace_mb"),
        ({"init": "systemd"}, "init"),
        ({"command": []}, "command"),
        ({"unknown_field": 1}, "unknown_field"),
    ],
)
def test_validation_errors_name_the_field(fields: dict[str, object], field_name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(**fields)
    assert field_name in str(caught.value)


def test_missing_runtime_binary_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sandbox.models.shutil.which", lambda name: None)
    with pytest.raises(ValidationError, match=r"runsc.*gVisor is not installed"):
        spec(runtime="runsc")


def test_defaults() -> None:
    s = spec()
    assert (s.cpu_cores, s.memory_mb, s.pids_limit, s.nofile, s.tmpfs_mb) == (
        1.0,
        512,
        256,
        1024,
        64,
    )
    assert s.command == ["sleep", "2147483647"] and s.network == "none" and s.runtime == "runc"


def test_init_wraps_command_and_is_bind_mounted_read_only() -> None:
    oci = build_oci_spec("sb", spec(command=["sleep", "5"]))
    assert oci["process"]["args"] == [INIT_PATH, "--", "sleep", "5"]
    init = next(m for m in oci["mounts"] if m["destination"] == INIT_PATH)
    assert init["type"] == "bind" and init["source"] == "/usr/bin/catatonit"
    assert {"ro", "nosuid", "nodev"} <= set(init["options"])
    tini = build_oci_spec("sb", spec(init="tini", command=["sleep", "5"]))
    assert tini["process"]["args"] == [INIT_PATH, "--", "sleep", "5"]
    assert any(m["source"] == "/usr/bin/tini-static" for m in tini["mounts"])
    bare = build_oci_spec("sb", spec(init="none", command=["sleep", "5"]))
    assert bare["process"]["args"] == ["sleep", "5"]
    assert all(m["destination"] != INIT_PATH for m in bare["mounts"])


def test_workspace_volume_mount() -> None:
    with pytest.raises(ValueError, match="workspace_source"):
        build_oci_spec("sb", spec(workspace_mb=64))
    oci = build_oci_spec("sb", spec(workspace_mb=64), workspace_source="/v/sb")
    ws = next(m for m in oci["mounts"] if m["destination"] == "/workspace")
    assert ws["source"] == "/v/sb" and "rw" in ws["options"] and "nosuid" in ws["options"]
    assert all(m["destination"] != "/workspace" for m in build_oci_spec("sb", spec())["mounts"])


def test_more_masked_paths() -> None:
    masked = build_oci_spec("sb", spec())["linux"]["maskedPaths"]
    for path in (
        "/proc/kmsg",
        "/proc/slabinfo",
        "/proc/vmallocinfo",
        "/sys/kernel/debug",
        "/sys/kernel/security",
        "/sys/kernel/tracing",
    ):
        assert path in masked


def test_allowlist_spec() -> None:
    s = spec(network="allowlist", egress=[{"cidr": "198.19.255.1/32", "port": 7001}])
    assert s.egress == [EgressRule(cidr="198.19.255.1/32", port=7001)]
    assert spec(network="allowlist").egress == []  # attached, nothing allowed


def test_crun_blocker(tmp_path: Path) -> None:
    (tmp_path / "unified").mkdir()
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    assert "hugetlb" in (crun_blocker(tmp_path) or "")
    (tmp_path / "unified" / "cgroup.controllers").write_text("\n")
    assert crun_blocker(tmp_path) is None
    assert crun_blocker(tmp_path / "nowhere") is None


def test_shim_group_is_a_spec_annotation() -> None:
    oci = build_oci_spec("sb", spec(shim_group="g1"))
    assert oci["annotations"] == {"io.containerd.runc.v2.group": "g1"}
    assert "annotations" not in build_oci_spec("sb", spec())
