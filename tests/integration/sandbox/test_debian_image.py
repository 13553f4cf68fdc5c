"""A real debootstrap bookworm image with python3: layers, cache, OCI archive, unpack.

About 40-80 s on a cold cache (debootstrap from Debian's mirror), instant when
``CORRAL_CACHE_DIR`` (default ``<repo>/.cache``) already holds the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from contract.errors import ImageBuildError
from sandbox.debian import (
    build_debian_image,
    build_debian_rootfs,
    make_layer_from_dir,
    write_debian_archive,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        os.geteuid() != 0 or not shutil.which("debootstrap"), reason="needs root and debootstrap"
    ),
]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def cache_dir() -> Path:
    return Path(os.environ.get("CORRAL_CACHE_DIR", REPO / ".cache"))


def sha256_file(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def layer_names(path: Path) -> set[str]:
    with tarfile.open(path) as tar:
        return set(tar.getnames())


def test_python3_image_layers_and_cache(cache_dir: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    image = build_debian_image(cache_dir, ["python3"])
    print(f"build: {time.monotonic() - t0:.1f} s")
    base, pkgs = image.layers
    assert (base.kind, pkgs.kind) == ("base", "packages")
    for layer in image.layers:
        assert layer.path.is_file() and layer.size == layer.path.stat().st_size
        assert layer.diff_id == sha256_file(layer.path)

    base_names, pkg_names = layer_names(base.path), layer_names(pkgs.path)
    assert "usr/bin/apt-get" in base_names and "usr/bin/python3.11" not in base_names
    assert "usr/bin/python3.11" in pkg_names and "usr/lib/python3.11/os.py" in pkg_names
    assert "usr/bin/apt-get" not in pkg_names  # unchanged base files stay in the base
    assert not any(n.startswith("var/lib/apt/lists/") and "Packages" in n for n in pkg_names)
    assert "dev" in base_names and not any(n.startswith("dev/") for n in base_names)
    assert pkgs.size < base.size

    # The cache: same set in another order is the same image, and instant.
    t0 = time.monotonic()
    again = build_debian_image(cache_dir, ["python3", "python3"])
    assert time.monotonic() - t0 < 1.0
    assert again == image
    assert build_debian_rootfs(cache_dir, ["python3"]) == image.rootfs
    out = subprocess.run(
        ["chroot", str(image.rootfs), "python3", "-c", "print(6 * 7)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "42"


def test_oci_archive_unpacks_with_umoci(cache_dir: Path, tmp_path: Path) -> None:
    if not shutil.which("umoci"):
        pytest.skip("umoci not installed")
    image = build_debian_image(cache_dir, ["python3"])
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "task.py").write_text("print('from the workspace')\n")
    ws_layer = make_layer_from_dir(workspace)

    t0 = time.monotonic()
    archive = write_debian_archive(
        image, tmp_path / "img.tar", "corral.local/debian-py:test", extra_layers=[ws_layer]
    )
    print(f"archive: {time.monotonic() - t0:.1f} s, {archive.stat().st_size / 1e6:.0f} MB")
    layout = tmp_path / "layout"
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="tar")
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].split(":")[1]
    manifest = json.loads((layout / "blobs" / "sha256" / manifest_digest).read_text())
    config = json.loads(
        (layout / "blobs" / "sha256" / manifest["config"]["digest"].split(":")[1]).read_text()
    )
    assert len(manifest["layers"]) == 3
    assert config["rootfs"]["diff_ids"][:2] == [layer.diff_id for layer in image.layers]

    # An independent OCI implementation applies the layers (whiteouts included).
    bundle = tmp_path / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:test", str(bundle)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    rootfs = bundle / "rootfs"
    out = subprocess.run(
        ["chroot", str(rootfs), "python3", "/task.py"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "from the workspace"
    assert (rootfs / "etc" / "shadow").stat().st_gid == 42  # numeric owners survive


def test_unknown_package_fails_cleanly(cache_dir: Path) -> None:
    with pytest.raises(ImageBuildError, match="apt-get install corral-no-such-package failed"):
        build_debian_image(cache_dir, ["corral-no-such-package"])
    leftovers = [p for p in (cache_dir / "debian").glob("img-*") if not (p / "image.json").exists()]
    assert leftovers == []
