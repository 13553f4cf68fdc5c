"""destroy_sandbox under a burst of deletes: a shared shim that exits meanwhile
answers a task Delete with "ttrpc: closed"; containerd then cleans that task up
as a dead shim's. The delete counts as done once the task is gone, and is an
error while it is still there."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from contract.errors import ContainerdError
from sandbox import client as client_module
from sandbox.client import Containerd


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


@dataclass
class FakeTasks:
    """Get finds the (stopped) task `gets_before_cleanup` times, then NotFound."""

    gets_before_cleanup: int
    gets: int = 0
    deletes: list[str] = field(default_factory=list)

    async def Get(self, request: Any, metadata: Any = None) -> Any:
        self.gets += 1
        if self.gets > self.gets_before_cleanup:
            raise _rpc_error(grpc.StatusCode.NOT_FOUND, "no running task found")
        return type("Resp", (), {"process": type("Process", (), {"status": 3})()})()

    async def Delete(self, request: Any, metadata: Any = None) -> Any:
        self.deletes.append(request.container_id)
        raise _rpc_error(grpc.StatusCode.UNKNOWN, "failed to delete task: ttrpc: closed")


@dataclass
class FakeConn:
    tasks: FakeTasks
    socket: str

    def md(self, lease: str | None = None) -> tuple[tuple[str, str], ...]:
        return (("containerd-namespace", "test"),)


def _client(tmp_path: Path, tasks: FakeTasks) -> Containerd:
    return Containerd(FakeConn(tasks, str(tmp_path / "containerd.sock")))  # type: ignore[arg-type]


async def test_a_task_its_dead_shim_cleaned_up_counts_as_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "SHIM_CLEANUP_WAIT_S", 0.0)
    tasks = FakeTasks(gets_before_cleanup=3)  # found at first, then cleaned up
    assert await _client(tmp_path, tasks)._kill_and_delete_task("box") is True
    assert tasks.deletes == ["box"]


async def test_a_task_still_there_after_ttrpc_closed_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "SHIM_CLEANUP_WAIT_S", 0.0)
    tasks = FakeTasks(gets_before_cleanup=1_000)
    with pytest.raises(ContainerdError, match="ttrpc: closed"):
        await _client(tmp_path, tasks)._kill_and_delete_task("box")
