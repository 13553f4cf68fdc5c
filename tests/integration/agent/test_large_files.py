"""Files of any size (sandbox/blobs.py): 50 MB in and out byte for byte, the bytes
through a real registry (Debian's docker-registry on a loopback port), the
episode's history holding only the digest.

The node's activities run here on an agent sandbox (the agent's chunked path);
the SDK test runs through the session stack (the agent's path by default,
runc's under CORRAL_EXEC_AGENT=0).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from activities.toolcalls import (
    GetFileInput,
    GetFileRequest,
    PutFileInput,
    PutFileRequest,
    ToolCallActivities,
)
from contract.config import RegistryConfig
from corral.sdk import Corral
from sandbox.blobs import files_repository, pull_bytes, push_bytes
from sandbox.client import Containerd
from sandbox.registry import RegistryOptions
from sandbox.sandbox import Sandbox

MakeSandbox = Callable[..., Awaitable[Sandbox]]  # the make_agent_sandbox fixture
SIZE = 50 * 1024 * 1024
HISTORY_BYTES_MAX = 1 << 20  # far below the file: the history cannot hold its bytes


async def test_a_50_mb_file_through_the_agent_activities(
    make_agent_sandbox: MakeSandbox,
    agent_ctd: Containerd,
    open_registry: object,
    tmp_path: Path,
) -> None:
    sandbox = await make_agent_sandbox()
    tools = ToolCallActivities("test", agent_ctd, tmp_path)
    repository = files_repository(open_registry.host)  # type: ignore[attr-defined]
    data = os.urandom(SIZE)
    blob = await push_bytes(repository, data, RegistryOptions())
    put = PutFileRequest(path="/tmp/big/in.bin", blob=blob, mode=0o600)
    await tools.file_put(PutFileInput(sandbox_id=sandbox.id, request=put))
    inside = await sandbox.exec("sha256sum /tmp/big/in.bin; stat -c %a /tmp/big/in.bin")
    assert inside.stdout.split() == [hashlib.sha256(data).hexdigest(), "/tmp/big/in.bin", "600"]
    # Out again, changed in the sandbox (so not the blob the registry holds already).
    assert (await sandbox.exec("echo tail >> /tmp/big/in.bin")).ok
    get = GetFileRequest(path="/tmp/big/in.bin", repository=repository, max_bytes=SIZE + 16)
    out = await tools.file_get(GetFileInput(sandbox_id=sandbox.id, request=get))
    assert out.size == SIZE + 5
    assert await pull_bytes(out, RegistryOptions()) == data + b"tail\n"


async def test_sdk_write_and_read_50_mb(corral: Corral, open_registry: object) -> None:
    registry = RegistryConfig(default=open_registry.host)  # type: ignore[attr-defined]
    with_registry = Corral(corral.client, corral.config.model_copy(update={"registry": registry}))
    data = os.urandom(SIZE)
    spec = {"image": "busybox", "interactive": True}
    async with await with_registry.start_episode(spec) as episode:
        await episode.write_file("/tmp/in.bin", data)
        assert await episode.read_file("/tmp/in.bin", max_bytes=SIZE) == data
        await episode.write_file("/tmp/small", "inline")  # small files still ride the Update
        assert await episode.read_file("/tmp/small") == b"inline"
        history = await corral.client.get_workflow_handle(episode.id).fetch_history()
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    recorded = b"".join(event.SerializeToString() for event in history.events)
    assert digest.encode() in recorded
    assert len(recorded) < HISTORY_BYTES_MAX
