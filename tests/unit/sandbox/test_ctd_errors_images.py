"""gRPC error mapping, image names, chain ids, the OCI archive writer, event filters."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import grpc
import pytest

from contract.errors import (
    ContainerdError,
    ContainerdUnavailable,
    ImageNotFound,
    InvalidSpec,
    SandboxAlreadyExists,
    SandboxError,
    SandboxNotFound,
    SandboxPaused,
    SandboxStateError,
)
from contract.ids import resolve_image_name
from sandbox.events import event_filters
from sandbox.grpc_errors import map_grpc_error
from sandbox.images import chain_ids
from sandbox.oci_archive import (
    MEDIA_LAYER_GZIP,
    NAME_ANNOTATION,
    build_busybox_rootfs,
    write_oci_archive,
)


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.ALREADY_EXISTS, SandboxAlreadyExists),
        (grpc.StatusCode.UNAVAILABLE, ContainerdUnavailable),
        (grpc.StatusCode.FAILED_PRECONDITION, SandboxStateError),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidSpec),
        (grpc.StatusCode.UNKNOWN, ContainerdError),
        (grpc.StatusCode.NOT_FOUND, SandboxNotFound),
    ],
)
def test_codes_map_to_types(code: grpc.StatusCode, expected: type[SandboxError]) -> None:
    err = map_grpc_error(FakeRpcError(code, "boom\nsecond line"), "sandbox 'x'")
    assert type(err) is expected
    assert "sandbox 'x'" in str(err) and "\n" not in str(err)


def test_not_found_type_comes_from_context() -> None:
    err = map_grpc_error(
        FakeRpcError(grpc.StatusCode.NOT_FOUND, "image not found"),
        "image 'corral.local/x:latest'",
        not_found=ImageNotFound,
    )
    assert isinstance(err, ImageNotFound) and "corral.local/x:latest" in str(err)


def test_paused_is_recognised() -> None:
    err = map_grpc_error(
        FakeRpcError(grpc.StatusCode.FAILED_PRECONDITION, "cannot exec in a paused state"),
        "exec in sandbox 'x'",
    )
    assert isinstance(err, SandboxPaused) and "resume" in str(err)


def test_long_messages_are_cut() -> None:
    err = map_grpc_error(FakeRpcError(grpc.StatusCode.UNKNOWN, "x" * 5000), "thing")
    assert len(str(err)) < 500


@pytest.mark.parametrize(
    ("short", "full"),
    [
        ("busybox", "corral.local/busybox:latest"),
        ("busybox:1.0", "corral.local/busybox:1.0"),
        ("team/tool", "corral.local/team/tool:latest"),
        ("corral.local/busybox:latest", "corral.local/busybox:latest"),
        ("localhost:5000/img", "localhost:5000/img:latest"),
        ("docker.io/library/debian:bookworm", "docker.io/library/debian:bookworm"),
    ],
)
def test_resolve_image_name(short: str, full: str) -> None:
    assert resolve_image_name(short) == full


def test_chain_ids() -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    expected = "sha256:" + hashlib.sha256(f"{a} {b}".encode()).hexdigest()
    assert chain_ids([a, b]) == [a, expected]


def test_event_filters_scope_namespace() -> None:
    assert event_filters("ns", ["/tasks/oom"]) == ['namespace=="ns",topic=="/tasks/oom"']


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    member = tar.extractfile("blobs/sha256/" + digest.split(":")[1])
    assert member is not None
    return member.read()


def test_oci_archive_multi_layer(tmp_path: Path) -> None:
    base = tmp_path / "base"
    (base / "etc").mkdir(parents=True)
    (base / "etc" / "os").write_text("one\n")
    extra_tar = tmp_path / "extra.tar"
    with tarfile.open(extra_tar, "w") as tar:
        info = tarfile.TarInfo("opt/tool")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"abc"))
    out = write_oci_archive(tmp_path / "img.tar", [base, extra_tar], "corral.local/two:v2")

    with tarfile.open(out) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        entry = index["manifests"][0]
        assert entry["annotations"][NAME_ANNOTATION] == "corral.local/two:v2"
        assert entry["annotations"]["org.opencontainers.image.ref.name"] == "v2"
        manifest = json.loads(_blob(tar, entry["digest"]))
        assert hashlib.sha256(_blob(tar, entry["digest"])).hexdigest() in entry["digest"]
        config = json.loads(_blob(tar, manifest["config"]["digest"]))
        assert len(manifest["layers"]) == 2 == len(config["rootfs"]["diff_ids"])
        for layer, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
            data = _blob(tar, layer["digest"])
            assert layer["mediaType"] == MEDIA_LAYER_GZIP and layer["size"] == len(data)
            assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"]
            assert "sha256:" + hashlib.sha256(gzip.decompress(data)).hexdigest() == diff_id
        layer0 = gzip.decompress(_blob(tar, manifest["layers"][0]["digest"]))
    with tarfile.open(fileobj=io.BytesIO(layer0)) as first:
        assert "etc/os" in first.getnames()
        assert all(m.uid == 0 and m.mtime == 0 for m in first)


def test_archive_is_deterministic(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "a" / "f").write_text("x")
    one = write_oci_archive(tmp_path / "1.tar", [root], "corral.local/d:latest")
    two = write_oci_archive(tmp_path / "2.tar", [root], "corral.local/d:latest")
    assert one.read_bytes() == two.read_bytes()


@pytest.mark.skipif(not Path("/bin/busybox").is_file(), reason="needs busybox-static")
def test_busybox_rootfs(tmp_path: Path) -> None:
    root = build_busybox_rootfs(tmp_path / "rootfs")
    assert (root / "bin" / "busybox").is_file()
    assert (root / "bin" / "sh").is_symlink() and str(
        (root / "bin" / "sh").readlink()
    ) == "/bin/busybox"
    assert (root / "etc" / "passwd").read_text().startswith("root:x:0:0:")
    assert (root / "etc" / "group").read_text().startswith("root:x:0:")
    assert (root / "tmp").stat().st_mode & 0o1777 == 0o1777
    assert (root / "workspace").is_dir()
