"""ContainerdDaemon config and the per-id locks of the client (no daemon started)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sandbox.client import KeyedLocks
from sandbox.daemon import ContainerdDaemon


def test_config_keeps_everything_under_root(tmp_path: Path) -> None:
    daemon = ContainerdDaemon(tmp_path)
    config = daemon.render_config()
    assert f'root = "{tmp_path}/root"' in config
    # state (task bundles) lives under a searchable /run dir for user-namespaced sandboxes
    assert f'state = "{daemon.state_dir}"' in config
    assert str(daemon.state_dir).startswith("/run/corral-containerd/")
    assert f'address = "{tmp_path}/containerd.sock"' in config
    assert 'disabled_plugins = ["io.containerd.grpc.v1.cri"]' in config
    assert daemon.socket == str(tmp_path / "containerd.sock")
    assert not daemon.is_running()


def test_stale_pid_file_is_not_running(tmp_path: Path) -> None:
    daemon = ContainerdDaemon(tmp_path)
    daemon.pid_path.write_text("1\n")  # PID 1 is alive but not our containerd
    assert not daemon.is_running()


async def test_keyed_locks_serialise_one_key_and_forget_it() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def worker(name: str) -> None:
        async with locks.hold("k"):
            order.append(f"{name}-in")
            await asyncio.sleep(0.01)
            order.append(f"{name}-out")

    await asyncio.gather(worker("a"), worker("b"))
    assert order in (["a-in", "a-out", "b-in", "b-out"], ["b-in", "b-out", "a-in", "a-out"])
    assert locks._locks == {}
