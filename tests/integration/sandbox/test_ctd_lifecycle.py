"""Create, exec, destroy; idempotency; rollback; images."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from contract.errors import (
    ImageNotFound,
    InvalidSpec,
    SandboxError,
    SandboxNotFound,
    SandboxStartFailed,
)
from contract.ids import resolve_image_name
from sandbox.client import Containerd
from sandbox.models import ImageInfo, SandboxSpec
from sandbox.sandbox import Sandbox

MakeSandbox = Callable[..., Awaitable[Sandbox]]

pytestmark = pytest.mark.integration


async def test_create_exec_destroy(ctd: Containerd, busybox: ImageInfo) -> None:
    sandbox_id = f"life-{uuid.uuid4().hex[:8]}"
    try:
        sandbox = await ctd.create_sandbox(
            sandbox_id, SandboxSpec(image="busybox"), labels={"corral.tenant": "t1"}
        )
        result = await sandbox.exec(["echo", "hello"])
        assert result.ok and result.stdout == "hello\n"
        assert await sandbox.status() == "running"
        assert sandbox.labels["corral.sandbox"] == "1"
        assert sandbox.labels["corral.image"] == busybox.name
        assert sandbox.labels["corral.tenant"] == "t1"
        listed = await ctd.list_sandboxes({"corral.tenant": "t1"})
        assert [info.id for info in listed] == [sandbox_id]
        assert listed[0].status == "running" and listed[0].pid
    finally:
        assert await ctd.destroy_sandbox(sandbox_id) is True
    assert await ctd.destroy_sandbox(sandbox_id) is False
    with pytest.raises(SandboxNotFound, match=sandbox_id):
        await ctd.get_sandbox(sandbox_id)
    assert sandbox_id not in await ctd.snapshot_keys()


async def test_create_is_idempotent(ctd: Containerd, make_sandbox: MakeSandbox) -> None:
    first = await make_sandbox("idem-1")
    await first.write_file("/workspace/marker", b"first")
    second = await make_sandbox("idem-1")
    assert await second.read_file("/workspace/marker") == b"first"
    assert (await ctd.container_ids()).count("idem-1") == 1
    got = await ctd.get_sandbox("idem-1")
    assert (await got.exec("cat /workspace/marker")).stdout == "first"


async def test_half_made_sandbox_is_recreated(ctd: Containerd, make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox("half-1")
    await ctd._kill_and_delete_task("half-1")  # container left without a task
    assert await sandbox.status() == "stopped"
    again = await make_sandbox("half-1")
    assert await again.status() == "running"
    assert (await again.exec("true")).ok


async def test_unknown_image_leaves_nothing(ctd: Containerd, busybox: ImageInfo) -> None:
    before = await ctd.snapshot_keys()
    with pytest.raises(ImageNotFound, match=r"corral\.local/no-such-image:latest"):
        await ctd.create_sandbox("noimg-1", SandboxSpec(image="no-such-image"))
    assert "noimg-1" not in await ctd.container_ids()
    assert await ctd.snapshot_keys() == before


async def test_failed_task_creation_rolls_back(ctd: Containerd, busybox: ImageInfo) -> None:
    before = (await ctd.snapshot_keys(), await ctd.container_ids(), await ctd.lease_ids())
    spec = SandboxSpec(image="busybox", command=["/no/such/binary"])
    with pytest.raises(SandboxStartFailed, match="rollback-1") as caught:
        await ctd.create_sandbox("rollback-1", spec)
    assert "\n" not in str(caught.value)
    after = (await ctd.snapshot_keys(), await ctd.container_ids(), await ctd.lease_ids())
    assert after == before


async def test_failing_runtime_rolls_back(ctd: Containerd, busybox: ImageInfo) -> None:
    # crun refuses this hybrid cgroup layout (FIELD-NOTES): a real failing runtime
    try:
        spec = SandboxSpec(image="busybox", runtime="crun")
    except ValueError:
        pytest.skip("crun not installed")
    before = (await ctd.snapshot_keys(), await ctd.container_ids())
    try:
        sandbox = await ctd.create_sandbox("crun-1", spec)
    except SandboxStartFailed:
        assert (await ctd.snapshot_keys(), await ctd.container_ids()) == before
    else:  # crun works here after all: then it must really work
        try:
            assert (await sandbox.exec("echo ok")).stdout == "ok\n"
        finally:
            await ctd.destroy_sandbox("crun-1")


async def test_images_list_get_and_names(ctd: Containerd, busybox: ImageInfo) -> None:
    assert resolve_image_name("busybox") == "corral.local/busybox:latest"
    assert busybox.name in [image.name for image in await ctd.images.list()]
    got = await ctd.images.get("busybox")
    assert got.digest == busybox.digest and got.chain_id
    with pytest.raises(ImageNotFound, match="nope"):
        await ctd.images.get("nope")


async def test_reimport_and_remove_image(
    ctd: Containerd, busybox: ImageInfo, tmp_path: Path
) -> None:
    from sandbox.oci_archive import build_busybox_archive

    archive = build_busybox_archive(tmp_path / "bb.tar", "corral.local/bb-copy:v1")
    imported = await ctd.images.import_archive(archive)
    assert [image.name for image in imported] == ["corral.local/bb-copy:v1"]
    assert imported[0].digest == busybox.digest  # deterministic layers
    await ctd.images.remove("bb-copy:v1")
    with pytest.raises(ImageNotFound):
        await ctd.images.get("bb-copy:v1")


async def test_exec_streams(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    result = await sandbox.exec("echo out; echo err >&2; exit 7")
    assert (result.exit_code, result.stdout, result.stderr) == (7, "out\n", "err\n")
    assert not result.ok
    seen: list[tuple[str, bytes]] = []

    async def on_output(stream: str, data: bytes) -> None:
        seen.append((stream, data))

    await sandbox.exec(["sh", "-c", "echo a; echo b >&2"], on_output=on_output)
    assert b"".join(d for s, d in seen if s == "stdout") == b"a\n"
    assert b"".join(d for s, d in seen if s == "stderr") == b"b\n"


async def test_exec_stdin_env_workdir_user(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox(env={"FROM_SPEC": "s"})
    assert (await sandbox.exec(["cat"], stdin=b"piped\x00bytes")).stdout == "piped\x00bytes"
    big = b"x" * 300_000
    assert (await sandbox.exec(["wc", "-c"], stdin=big)).stdout.strip() == str(len(big))
    result = await sandbox.exec("echo $FROM_SPEC $EXTRA; pwd", env={"EXTRA": "e"}, workdir="/tmp")
    assert result.stdout == "s e\n/tmp\n"
    assert (await sandbox.exec("pwd")).stdout == "/workspace\n"
    assert (await sandbox.exec("id -u; id -g", user="65534:65534")).stdout == "65534\n65534\n"


async def test_exec_timeout_kills(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    result = await sandbox.exec("echo started; sleep 1000 & sleep 1000", timeout_s=1)
    assert result.timed_out and result.exit_code == 137 and not result.ok
    assert result.stdout == "started\n"
    # the killed background sleep may linger as a zombie of PID 1 (sleep never reaps)
    live = await sandbox.exec("""cat /proc/[0-9]*/stat | awk '$2 == "(sleep)" && $3 != "Z"'""")
    assert live.stdout.count("(sleep)") == 1  # only PID 1 is left


async def test_exec_output_cap(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    result = await sandbox.exec("head -c 100000 /dev/zero | tr '\\0' a", output_limit_bytes=1000)
    assert result.truncated and result.ok
    assert result.stdout == "a" * 1000


async def test_files_and_tars(make_sandbox: MakeSandbox) -> None:
    sandbox = await make_sandbox()
    payload = bytes(range(256)) * 100
    await sandbox.write_file("/workspace/sub/data.bin", payload, mode=0o600)
    assert await sandbox.read_file("/workspace/sub/data.bin") == payload
    assert (await sandbox.exec("stat -c %a /workspace/sub/data.bin")).stdout == "600\n"
    with pytest.raises(SandboxError, match="/workspace/missing"):
        await sandbox.read_file("/workspace/missing")

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("proj/hello.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    await sandbox.put_tar("/workspace", buf.getvalue())
    assert await sandbox.read_file("/workspace/proj/hello.txt") == b"hello"
    with tarfile.open(fileobj=io.BytesIO(await sandbox.get_tar("/workspace/proj"))) as tar:
        member = tar.extractfile("proj/hello.txt")
        assert member is not None and member.read() == b"hello"


async def test_invalid_sandbox_id(ctd: Containerd) -> None:
    with pytest.raises(InvalidSpec, match="sandbox_id"):
        await ctd.create_sandbox("bad/id", SandboxSpec(image="busybox"))
