"""Shim sharing by tenant on a real containerd: a client with shim groups puts
one tenant's sandboxes under one runc shim, another tenant's under another,
and a group whose last member left is never joined again."""

from __future__ import annotations

import uuid
from pathlib import Path

from contract.labels import TENANT_LABEL
from sandbox.client import SHIM_GROUP_LABEL, Containerd
from sandbox.daemon import ContainerdDaemon
from sandbox.models import ImageInfo, SandboxSpec


def _shim_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("PPid:")[1].split()[0])


async def test_a_tenants_sandboxes_share_a_shim_and_tenants_do_not(
    ctd: Containerd, ctd_daemon: ContainerdDaemon, busybox: ImageInfo
) -> None:
    # A second client on the session's namespace: its end-of-session check sees leaks.
    client = await Containerd.connect(ctd.socket, namespace=ctd.namespace, shim_group_size=2)
    made: list[str] = []

    async def make(tenant: str) -> tuple[str, int]:
        sandbox_id = f"t-shim-{uuid.uuid4().hex[:8]}"
        made.append(sandbox_id)
        box = await client.create_sandbox(
            sandbox_id, SandboxSpec(image=busybox.name), {TENANT_LABEL: tenant}
        )
        assert (await box.exec("true")).ok
        info = next(i for i in await client.list_sandboxes() if i.id == sandbox_id)
        assert info.pid is not None
        return info.labels[SHIM_GROUP_LABEL], _shim_of(info.pid)

    try:
        a1, a2, a3 = await make("team-a"), await make("team-a"), await make("team-a")
        b1 = await make("team-b")
        assert a1 == a2  # same tenant, room in the group: one shim
        assert a3[0] != a1[0] and a3[1] != a1[1]  # the group of 2 is full: a new shim
        assert b1[0] not in (a1[0], a3[0]) and b1[1] not in (a1[1], a3[1])
        assert {a1[1], a3[1], b1[1]} <= set(ctd_daemon.shim_pids())

        await client.destroy_sandbox(made[3])  # b's only member: its group closes
        b2 = await make("team-b")
        assert b2[0] != b1[0]  # a closed group's name is never used again
    finally:
        for sandbox_id in made:
            await client.destroy_sandbox(sandbox_id)
        await client.close()
