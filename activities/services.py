"""An episode's services: containers beside the agent's sandbox, like a pod.

Each entry of the spec's `services:` runs as a sandbox of its own (its own
rootfs, cgroup, PID namespace and limits) that shares the agent sandbox's
network namespace and, with it, its user namespace (only the namespace's
owner may mount a sysfs for it, and binding port 80 wants the same). So the
episode's containers share one loopback that nothing else can reach: the
agent reaches `db:5432` through an `/etc/hosts` line `127.0.0.1 db`, written
into every container of the episode; network "none" stays none.

A service carries its episode's owner label, so the sensor attributes its
processes to the episode and the janitor reaps it with it; the node's
capacity ledger counts it. The agent's teardown stops its services first.
A snapshot takes the services' writable layers with the agent's, in one
pause (activities/snapshots.py): a fork's children start each service from its
snapshot, so what the service wrote to disk is there (what it held in memory
is not: the process starts again). A hibernated episode's services start
fresh from their images when it wakes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from contract.errors import CorralError, SandboxError
from contract.labels import SERVICE_NAME_LABEL, SERVICE_OF_LABEL
from contract.models import EpisodeSpec, Service
from sandbox import SandboxSpec
from sandbox.loopback import accepts_in_netns
from sandbox.runtime import RuntimeSandbox, SandboxRuntime
from sandbox.userns import range_for_tenant

__all__ = ["ServiceNotReady", "service_id", "start_services", "stop_services"]

READY_POLL_S = 0.25
EXIT_SEEN_S = 2.0  # from a process's exit to containerd's task status saying so
HOSTS = "/etc/hosts"


class ServiceNotReady(SandboxError):
    """A service exited, or its readiness check did not pass in time."""


def service_id(sandbox_id: str, name: str) -> str:
    """64 hex digits, like every sandbox id (Falco's container ids are those)."""
    return hashlib.sha256(f"{sandbox_id}/service/{name}".encode()).hexdigest()


async def start_services(
    containerd: SandboxRuntime,
    agent: RuntimeSandbox,
    spec: EpisodeSpec,
    labels: dict[str, str],
    *,
    ensure_image: Callable[[str], Awaitable[object]],
) -> list[str]:
    """Start the spec's services beside `agent` and wait until each is ready.

    Idempotent (a retried provision finds them alive). On failure the services
    made so far stay for the agent's teardown (`stop_services`), which the
    episode always runs."""
    pid = await agent.pid()
    made: list[RuntimeSandbox] = []
    for service in spec.services:
        await ensure_image(service.image)
        sandbox_labels = {**labels, SERVICE_OF_LABEL: agent.id, SERVICE_NAME_LABEL: service.name}
        made.append(
            await containerd.create_sandbox(
                service_id(agent.id, service.name),
                _sandbox_spec(service, spec, pid),
                sandbox_labels,
            )
        )
    hosts = "".join(f"127.0.0.1 {service.name}\n" for service in spec.services)
    await _add_hosts(agent, hosts)
    for service, sandbox in zip(spec.services, made, strict=True):
        try:
            await _add_hosts(sandbox, hosts)
        except CorralError:
            # Its root went with its process; containerd may not have seen the exit yet.
            await _raise_if_exited(service, sandbox, within_s=EXIT_SEEN_S)
            raise
    # In turn: they all started already, so the wait is the slowest one's.
    for service, sandbox in zip(spec.services, made, strict=True):
        await _until_ready(service, sandbox, pid)
    return [box.id for box in made]


async def stop_services(containerd: SandboxRuntime, sandbox_id: str) -> list[str]:
    """Destroy every service of the agent sandbox `sandbox_id`; their ids."""
    services = await containerd.list_sandboxes({SERVICE_OF_LABEL: sandbox_id})
    for info in services:
        await containerd.destroy_sandbox(info.id)
    return [info.id for info in services]


def _sandbox_spec(service: Service, spec: EpisodeSpec, agent_pid: int) -> SandboxSpec:
    return SandboxSpec(
        image=service.image,
        command=service.argv(),
        env=service.env,
        cpu_cores=service.cpu_cores,
        memory_mb=service.memory_mb,
        tmpfs_mb=min(64, service.memory_mb // 2),
        runtime=spec.runtime,
        user_namespace=spec.user_namespace,
        userns_range=range_for_tenant(spec.tenant),  # the agent's: one user namespace
        join_network_of=agent_pid,
        exec_agent=False,  # nobody execs in a service but its readiness check
    )


async def _add_hosts(sandbox: RuntimeSandbox, lines: str) -> None:
    """The episode's service names in the sandbox's /etc/hosts (kept if there already).

    Written by the host through the sandbox's root, not by a process inside:
    no process of the episode does it, so the sensor sees nothing to judge."""
    root = await sandbox.root_path()
    try:
        await asyncio.to_thread(_append_hosts, root, lines)
    except OSError as err:
        raise SandboxError(
            f"cannot name the services in {HOSTS} of {sandbox.id[:12]}: {err.strerror or err}"
        ) from err


def _append_hosts(root: Path, lines: str) -> None:
    # No symlink is followed: through /proc/<pid>/root an absolute link would
    # resolve against the host's root.
    etc = os.open(root / "etc", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open("hosts", flags, dir_fd=etc)
            current = _read_all(fd)
        except FileNotFoundError:
            fd = os.open("hosts", flags | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=etc)
            owner = os.fstat(etc)  # the sandbox's root, as the host numbers it
            os.fchown(fd, owner.st_uid, owner.st_gid)
            current = "127.0.0.1 localhost\n"
        try:
            if lines not in current:  # else a retried provision wrote them
                data = (current.rstrip("\n") + "\n" + lines).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
        finally:
            os.close(fd)
    finally:
        os.close(etc)


def _read_all(fd: int) -> str:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


async def _until_ready(service: Service, sandbox: RuntimeSandbox, pid: int) -> None:
    ready = service.ready
    if ready is None:
        return
    deadline = time.monotonic() + ready.timeout_s
    last = "not checked yet"
    while time.monotonic() < deadline:
        ok, last = await _check(service, sandbox, pid)
        if ok:
            return
        await _raise_if_exited(service, sandbox)
        await asyncio.sleep(READY_POLL_S)
    raise ServiceNotReady(
        f"service {service.name!r} not ready after {ready.timeout_s:g} s ({last})"
    )


async def _raise_if_exited(
    service: Service, sandbox: RuntimeSandbox, within_s: float = 0.0
) -> None:
    """ServiceNotReady if the service's process has exited (seen within `within_s`)."""
    deadline = time.monotonic() + within_s
    while True:
        if await sandbox.status() not in ("running", "created"):
            raise ServiceNotReady(f"service {service.name!r} exited before it was ready")
        if time.monotonic() >= deadline:
            return
        await asyncio.sleep(READY_POLL_S / 5)


async def _check(service: Service, sandbox: RuntimeSandbox, pid: int) -> tuple[bool, str]:
    ready = service.ready
    assert ready is not None
    if ready.tcp_port is not None:
        port = ready.tcp_port
        if not await asyncio.to_thread(accepts_in_netns, pid, port):
            return False, f"nothing accepts on port {port}"
    if ready.cmd is not None:
        try:
            result = await sandbox.exec(ready.cmd, timeout_s=10)
        except CorralError as err:
            return False, f"check failed: {err}"
        if result.exit_code != 0:
            return False, f"check exited {result.exit_code}: {result.stderr.strip()[:200]}"
    return True, ""
