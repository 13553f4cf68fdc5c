"""Write OCI image archives without a registry, and a busybox rootfs to put in one.

Layout of an archive (a tar of an OCI image layout):
  oci-layout, index.json (one manifest, annotated with
  ``io.containerd.image.name``), blobs/sha256/<hex> for each layer (tar.gz),
  the config (with ``rootfs.diff_ids``, the digests of the uncompressed
  layers) and the manifest.

Layers are written deterministically (sorted entries, uid/gid 0, mtime 0), so
the same rootfs gives the same digests and re-imports are no-ops.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.client_api import ImageClient
    from sandbox.models import ImageInfo

MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
NAME_ANNOTATION = "io.containerd.image.name"
REF_ANNOTATION = "org.opencontainers.image.ref.name"
BUSYBOX_IMAGE = "corral.local/busybox:latest"
CHUNK = 1024 * 1024

GOARCH = {"x86_64": "amd64", "aarch64": "arm64"}


@dataclass(frozen=True)
class Blob:
    media_type: str
    digest: str
    size: int

    def descriptor(self, annotations: dict[str, str] | None = None) -> dict[str, Any]:
        desc: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if annotations:
            desc["annotations"] = annotations
        return desc


def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _tar_directory(src: Path, out: io.BufferedWriter) -> None:
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(src.iterdir()):
            tar.add(entry, arcname=entry.name, recursive=True, filter=_normalize)


class _HashingWriter(io.RawIOBase):
    """Counts and hashes bytes on their way to ``sink``."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:  # tarfile asks where it starts
        return self.size

    def write(self, data: Any) -> int:
        view = bytes(data)
        self.sha.update(view)
        self.size += len(view)
        self.sink.write(view)
        return len(view)


def _write_layer(layer: Path, blobs_dir: Path) -> tuple[Blob, str]:
    """Compress one layer (a tar file or a directory) into blobs_dir; return (blob, diff_id)."""
    with tempfile.NamedTemporaryFile(dir=blobs_dir, delete=False) as tmp:
        compressed = _HashingWriter(tmp)
        with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0, compresslevel=6) as gz:
            uncompressed = _HashingWriter(gz)
            if layer.is_dir():
                _tar_directory(layer, uncompressed)  # type: ignore[arg-type]
            else:
                with layer.open("rb") as src:
                    shutil.copyfileobj(src, uncompressed, CHUNK)
    digest = "sha256:" + compressed.sha.hexdigest()
    os.replace(tmp.name, blobs_dir / compressed.sha.hexdigest())
    return Blob(MEDIA_LAYER_GZIP, digest, compressed.size), "sha256:" + uncompressed.sha.hexdigest()


def _write_json_blob(obj: dict[str, Any], media_type: str, blobs_dir: Path) -> Blob:
    data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    hexdigest = hashlib.sha256(data).hexdigest()
    (blobs_dir / hexdigest).write_bytes(data)
    return Blob(media_type, "sha256:" + hexdigest, len(data))


def image_config(
    diff_ids: Sequence[str], *, env: Sequence[str] = (), cmd: Sequence[str] = (), workdir: str = ""
) -> dict[str, Any]:
    return {
        "architecture": GOARCH.get(platform.machine(), platform.machine()),
        "os": "linux",
        "config": {"Env": list(env), "Cmd": list(cmd), "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        "history": [{"created_by": "corral oci_archive"} for _ in diff_ids],
    }


def write_oci_archive(
    out: Path,
    layers: Sequence[Path],
    name: str,
    *,
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",),
    cmd: Sequence[str] = ("/bin/sh",),
    workdir: str = "/workspace",
) -> Path:
    """Write an OCI archive of ``layers`` (bottom first) named ``name`` to ``out``."""
    if not layers:
        raise ValueError("an image needs at least one layer")
    with tempfile.TemporaryDirectory(prefix="corral-oci-") as tmp:
        layout = Path(tmp)
        blobs_dir = layout / "blobs" / "sha256"
        blobs_dir.mkdir(parents=True)
        written = [_write_layer(Path(layer), blobs_dir) for layer in layers]
        config = _write_json_blob(
            image_config([diff_id for _, diff_id in written], env=env, cmd=cmd, workdir=workdir),
            MEDIA_CONFIG,
            blobs_dir,
        )
        manifest = _write_json_blob(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_MANIFEST,
                "config": config.descriptor(),
                "layers": [blob.descriptor() for blob, _ in written],
            },
            MEDIA_MANIFEST,
            blobs_dir,
        )
        tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
        index = {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [manifest.descriptor({NAME_ANNOTATION: name, REF_ANNOTATION: tag})],
        }
        (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
        (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
            for entry in ("oci-layout", "index.json", "blobs"):
                tar.add(layout / entry, arcname=entry, filter=_normalize)
    return out


# -- busybox ------------------------------------------------------------------

PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


def _busybox_applets(busybox: Path) -> list[str]:
    # The applet list is only known to the binary itself; running the host's
    # static busybox once is the honest way to ask it.
    listing = subprocess.run(
        [str(busybox), "--list-full"], check=True, capture_output=True, text=True
    ).stdout
    return [line.strip() for line in listing.splitlines() if line.strip()]


def build_busybox_rootfs(root: Path, busybox: Path = Path("/bin/busybox")) -> Path:
    """A minimal rootfs: static busybox with applet symlinks, passwd/group, /tmp, /workspace."""
    if not busybox.is_file():
        raise FileNotFoundError(f"{busybox} not found (apt-get install busybox-static)")
    root.mkdir(parents=True, exist_ok=True)
    for folder in (
        "bin",
        "sbin",
        "usr/bin",
        "usr/sbin",
        "etc",
        "root",
        "proc",
        "sys",
        "dev",
        "var",
        "run",
        "workspace",
    ):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    shutil.copy2(busybox, root / "bin" / "busybox")
    (root / "bin" / "busybox").chmod(0o755)
    for applet in _busybox_applets(busybox):
        link = root / applet.lstrip("/")
        if link.name == "busybox" or link.exists() or link.is_symlink():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    (root / "etc" / "passwd").write_text(PASSWD)
    (root / "etc" / "group").write_text(GROUP)
    (root / "etc" / "hostname").write_text("sandbox\n")
    return root


def build_busybox_archive(out: Path, name: str = BUSYBOX_IMAGE) -> Path:
    with tempfile.TemporaryDirectory(prefix="corral-busybox-") as tmp:
        rootfs = build_busybox_rootfs(Path(tmp) / "rootfs")
        return write_oci_archive(out, [rootfs], name)


async def build_busybox_image(client: ImageClient, name: str = BUSYBOX_IMAGE) -> ImageInfo:
    """Build the busybox image and import it into ``client``'s namespace."""
    with tempfile.TemporaryDirectory(prefix="corral-busybox-") as tmp:
        archive = build_busybox_archive(Path(tmp) / "busybox.tar", name)
        images = await client.images.import_archive(archive)
    return next(image for image in images if image.name == name)
