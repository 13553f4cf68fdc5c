"""Debian images from debootstrap, as layer tarballs that ``oci_archive`` packs.

Layout under ``<cache_dir>/debian/``::

    base-<key>/rootfs/       debootstrap --variant=minbase <suite>, built once per suite
    base-<key>/layer.tar     that rootfs as a layer: shared by every image of the suite
    base-<key>/image.json
    img-<key>/rootfs/        base + ``apt-get install <packages>`` (a full tree, for chroot use)
    img-<key>/layer.tar      only the difference from the base, with OCI whiteouts
    img-<key>/image.json     written last: its presence means the build completed

The key hashes (suite, mirror, sorted package set), so a second build of the
same set is a cache hit that reads one JSON file. The package layer is computed
by walking the base and the installed tree side by side: an entry is in the
layer when it is new or its type, mode, owner, size, mtime or link target
changed (the rsync quick check; ``cp -a`` keeps mtimes so untouched files match),
and a deleted entry becomes ``.wh.<name>`` in its parent. Layer tars keep
numeric owners and mtimes (a Debian tree has non-root owners, e.g. ``_apt``) and
are uncompressed; ``oci_archive.write_oci_archive`` gzips them and records their
diff_ids. ``make_layer_from_dir`` makes the same kind of tar from any directory
(toolkit or workspace layers on top of a base).

Not kept in layers: extended attributes (file capabilities), sockets, and the
contents of /dev, /proc and /sys (the runtime mounts those).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from contract.errors import ImageBuildError

__all__ = [
    "Change",
    "DebianImage",
    "LayerInfo",
    "build_debian_image",
    "build_debian_rootfs",
    "diff_trees",
    "make_layer_from_dir",
    "write_debian_archive",
    "write_diff_layer",
]

DEFAULT_MIRROR = "http://deb.debian.org/debian"
WHITEOUT_PREFIX = ".wh."
BUILD_VERSION = 1  # bump to invalidate caches when the build recipe changes
# Runtime-provided mounts: their contents never belong in an image.
EXCLUDED_CONTENTS = ("dev", "proc", "sys")
PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$")
DEBOOTSTRAP_TIMEOUT_S = 1800
APT_TIMEOUT_S = 1800
APT_ENV = {
    "DEBIAN_FRONTEND": "noninteractive",
    "LC_ALL": "C",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}


class LayerInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path
    diff_id: str  # sha256 of the uncompressed tar, as the image config wants it
    size: int
    kind: Literal["base", "packages", "dir"]


class DebianImage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    suite: str
    packages: list[str]
    key: str
    rootfs: Path
    layers: list[LayerInfo]  # bottom first

    @property
    def layer_paths(self) -> list[Path]:
        return [layer.path for layer in self.layers]


@dataclass(frozen=True, order=True)
class Change:
    path: str  # relative, "/"-separated, no leading slash
    kind: Literal["add", "modify", "delete"]


# ---------------------------------------------------------------- tree diff


def _same_entry(a: os.stat_result, b: os.stat_result, la: Path, lb: Path) -> bool:
    if stat.S_IFMT(a.st_mode) != stat.S_IFMT(b.st_mode):
        return False
    if (a.st_mode, a.st_uid, a.st_gid) != (b.st_mode, b.st_uid, b.st_gid):
        return False
    if stat.S_ISDIR(a.st_mode):
        return a.st_mtime_ns == b.st_mtime_ns
    if stat.S_ISLNK(a.st_mode):
        return os.readlink(la) == os.readlink(lb)
    if stat.S_ISCHR(a.st_mode) or stat.S_ISBLK(a.st_mode):
        return a.st_rdev == b.st_rdev
    return a.st_size == b.st_size and a.st_mtime_ns == b.st_mtime_ns


def _walk_added(root: Path, rel: str) -> Iterator[Change]:
    yield Change(rel, "add")
    path = root / rel
    if path.is_dir() and not path.is_symlink():
        for name in sorted(os.listdir(path)):
            yield from _walk_added(root, f"{rel}/{name}")


def _diff_dir(lower: Path, upper: Path, rel: str) -> Iterator[Change]:
    lower_names = set(os.listdir(lower / rel)) if (lower / rel).is_dir() else set()
    upper_names = set(os.listdir(upper / rel))
    for name in sorted(lower_names | upper_names):
        child = f"{rel}/{name}" if rel else name
        if name not in upper_names:
            yield Change(child, "delete")  # hides the whole subtree: no need to recurse
            continue
        if name not in lower_names:
            yield from _walk_added(upper, child)
            continue
        lo, up = lower / child, upper / child
        sl, su = lo.lstat(), up.lstat()
        if stat.S_IFMT(sl.st_mode) != stat.S_IFMT(su.st_mode):
            # A type change: whiteout the lower entry, then add the new one.
            yield Change(child, "delete")
            yield from _walk_added(upper, child)
            continue
        if not _same_entry(sl, su, lo, up):
            yield Change(child, "modify")
        if stat.S_ISDIR(su.st_mode):
            yield from _diff_dir(lower, upper, child)


def diff_trees(lower: Path, upper: Path) -> list[Change]:
    """What turns ``lower`` into ``upper``, as adds, modifications and deletions."""
    return sorted(_diff_dir(lower, upper, ""))


# ---------------------------------------------------------------- layer tars


def _clean_names(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # Numeric owners only: the host's user names mean nothing inside the image.
    info.uname = info.gname = ""
    return info


def _whiteout(rel: str) -> tarfile.TarInfo:
    parent, _, name = rel.rpartition("/")
    name = WHITEOUT_PREFIX + name
    info = tarfile.TarInfo(f"{parent}/{name}" if parent else name)
    info.mode = 0o644
    return info


def write_diff_layer(upper: Path, changes: Sequence[Change], out: Path) -> Path:
    """An OCI layer tar of ``changes`` (paths in ``upper``), whiteouts for deletions."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for change in sorted(changes, key=lambda c: (c.path, c.kind != "delete")):
            if change.kind == "delete":
                tar.addfile(_whiteout(change.path))
            else:
                tar.add(
                    upper / change.path, arcname=change.path, recursive=False, filter=_clean_names
                )
    os.replace(tmp, out)
    return out


def _tree_entries(src: Path, skip: Sequence[str], rel: str = "") -> Iterator[str]:
    for name in sorted(os.listdir(src / rel)):
        child = f"{rel}/{name}" if rel else name
        yield child
        path = src / child
        if path.is_dir() and not path.is_symlink() and child not in skip:
            yield from _tree_entries(src, skip, child)


def make_layer_from_dir(
    src: Path, out: Path | None = None, *, exclude_contents: Sequence[str] = ()
) -> Path:
    """A layer tar of everything under ``src`` (sorted, numeric owners, mtimes kept).

    Writes ``<src>.tar`` beside the directory unless ``out`` is given. Directories
    named in ``exclude_contents`` (relative paths) are kept, empty.
    """
    if not src.is_dir():
        raise ImageBuildError(f"layer source {src} is not a directory")
    changes = [Change(rel, "add") for rel in _tree_entries(src, exclude_contents)]
    return write_diff_layer(src, changes, out or src.with_name(src.name + ".tar"))


def _layer_info(path: Path, kind: Literal["base", "packages", "dir"]) -> LayerInfo:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return LayerInfo(
        path=path, diff_id="sha256:" + sha.hexdigest(), size=path.stat().st_size, kind=kind
    )


# ---------------------------------------------------------------- building


def _run(what: str, argv: Sequence[str], timeout: float) -> None:
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env={**os.environ, **APT_ENV}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ImageBuildError(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise ImageBuildError(
            f"{what} failed (exit {proc.returncode}): {tail[-1] if tail else 'no output'}"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder per cache key across processes; others wait and then hit the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _key(**parts: object) -> str:
    blob = json.dumps({"v": BUILD_VERSION, **parts}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _check_packages(packages: Sequence[str]) -> list[str]:
    bad = [p for p in packages if not PACKAGE_RE.match(p)]
    if bad:
        raise ImageBuildError(f"invalid Debian package name(s): {', '.join(bad)}")
    return sorted(set(packages))


def _debootstrap(target: Path, suite: str, mirror: str, include: Sequence[str]) -> None:
    argv = ["debootstrap", "--variant=minbase"]
    if include:
        argv.append("--include=" + ",".join(include))
    _run(f"debootstrap {suite}", [*argv, suite, str(target), mirror], DEBOOTSTRAP_TIMEOUT_S)
    # debootstrap copies the build host's name and resolver in; an image must not carry them.
    (target / "etc" / "hostname").write_text("sandbox\n")
    (target / "etc" / "resolv.conf").write_text("")
    (target / "workspace").mkdir(exist_ok=True)
    _clean_apt(target)


def _chroot(root: Path, what: str, *argv: str) -> None:
    # A private mount namespace: /proc vanishes with the process, even on a crash.
    script = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    _run(
        what,
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(root), *argv],
        APT_TIMEOUT_S,
    )


@contextlib.contextmanager
def _install_env(root: Path) -> Iterator[None]:
    """Host resolver and a no-daemons policy for apt, put back byte- and mtime-exact."""
    resolv = root / "etc" / "resolv.conf"
    saved, st = resolv.read_bytes(), resolv.stat()
    policy = root / "usr" / "sbin" / "policy-rc.d"
    shutil.copyfile("/etc/resolv.conf", resolv)
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink(missing_ok=True)
        resolv.write_bytes(saved)
        os.utime(resolv, ns=(st.st_atime_ns, st.st_mtime_ns))


def _apt_install(root: Path, packages: Sequence[str]) -> None:
    with _install_env(root):
        _chroot(root, "apt-get update", "apt-get", "update", "-q")
        _chroot(
            root,
            f"apt-get install {' '.join(packages)}",
            "apt-get",
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "--",
            *packages,
        )
    _clean_apt(root)


def _clean_apt(root: Path) -> None:
    """Drop downloaded .debs and indexes: ~200 MB that are stale tomorrow anyway."""
    cache, lists = root / "var" / "cache" / "apt", root / "var" / "lib" / "apt" / "lists"
    doomed = [*cache.glob("*.bin"), *(cache / "archives").glob("*.deb"), *lists.iterdir()]
    for entry in doomed:
        if entry.is_file() and entry.name != "lock":
            entry.unlink()


def _load(meta: Path) -> DebianImage | None:
    if not meta.exists():
        return None
    image = DebianImage.model_validate_json(meta.read_text())
    # Paths are stored relative to the cache, so a moved cache stays valid.
    base = meta.parent.parent
    return image.model_copy(
        update={
            "rootfs": base / image.rootfs,
            "layers": [
                layer.model_copy(update={"path": base / layer.path}) for layer in image.layers
            ],
        }
    )


def _save(meta: Path, image: DebianImage) -> None:
    base = meta.parent.parent
    rel = image.model_copy(
        update={
            "rootfs": image.rootfs.relative_to(base),
            "layers": [
                layer.model_copy(update={"path": layer.path.relative_to(base)})
                for layer in image.layers
            ],
        }
    )
    tmp = meta.with_suffix(".part")
    tmp.write_text(rel.model_dump_json(indent=1))
    os.replace(tmp, meta)


@contextlib.contextmanager
def _fresh_dir(path: Path) -> Iterator[Path]:
    """An empty build dir that is removed again if the build fails (~200 MB each)."""
    if path.exists():
        shutil.rmtree(path)  # a build killed before image.json was written
    path.mkdir(parents=True)
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def _build_base(root: Path, suite: str, mirror: str) -> DebianImage:
    key = _key(kind="base", suite=suite, mirror=mirror)
    out = root / f"base-{key}"
    with _locked(root / f".base-{key}.lock"):
        cached = _load(out / "image.json")
        if cached:
            return cached
        with _fresh_dir(out):
            _debootstrap(out / "rootfs", suite, mirror, include=())
            layer = _layer_info(
                make_layer_from_dir(
                    out / "rootfs", out / "layer.tar", exclude_contents=EXCLUDED_CONTENTS
                ),
                "base",
            )
            image = DebianImage(
                suite=suite, packages=[], key=key, rootfs=out / "rootfs", layers=[layer]
            )
            _save(out / "image.json", image)
        return image


def _build_layered(root: Path, base: DebianImage, packages: list[str], key: str) -> DebianImage:
    out = root / f"img-{key}"
    rootfs = out / "rootfs"
    with _fresh_dir(out):
        # --reflink=auto: a CoW copy where the filesystem can, a plain copy elsewhere.
        _run("copy base rootfs", ["cp", "-a", "--reflink=auto", str(base.rootfs), str(rootfs)], 600)
        _apt_install(rootfs, packages)
        changes = diff_trees(base.rootfs, rootfs)
        layer = _layer_info(write_diff_layer(rootfs, changes, out / "layer.tar"), "packages")
        image = DebianImage(
            suite=base.suite,
            packages=packages,
            key=key,
            rootfs=rootfs,
            layers=[*base.layers, layer],
        )
        _save(out / "image.json", image)
    return image


def _build_flat(root: Path, suite: str, mirror: str, packages: list[str], key: str) -> DebianImage:
    out = root / f"img-{key}"
    with _fresh_dir(out):
        _debootstrap(out / "rootfs", suite, mirror, include=packages)
        layer = _layer_info(
            make_layer_from_dir(
                out / "rootfs", out / "layer.tar", exclude_contents=EXCLUDED_CONTENTS
            ),
            "base",
        )
        image = DebianImage(
            suite=suite, packages=packages, key=key, rootfs=out / "rootfs", layers=[layer]
        )
        _save(out / "image.json", image)
    return image


def build_debian_image(
    cache_dir: Path,
    packages: list[str],
    suite: str = "bookworm",
    *,
    mirror: str = DEFAULT_MIRROR,
    layered: bool = True,
) -> DebianImage:
    """Build (or find in the cache) a Debian image: a shared base layer plus a package layer.

    ``layered=False`` runs one ``debootstrap --include=...`` into a single layer
    instead, for when chroot apt cannot run.
    """
    pkgs = _check_packages(packages)
    root = cache_dir.resolve() / "debian"
    if layered and not pkgs:
        return _build_base(root, suite, mirror)
    key = _key(kind="layered" if layered else "flat", suite=suite, mirror=mirror, packages=pkgs)
    with _locked(root / f".img-{key}.lock"):
        cached = _load(root / f"img-{key}" / "image.json")
        if cached:
            return cached
        if layered:
            return _build_layered(root, _build_base(root, suite, mirror), pkgs, key)
        return _build_flat(root, suite, mirror, pkgs, key)


def build_debian_rootfs(cache_dir: Path, packages: list[str], suite: str = "bookworm") -> Path:
    """The full root filesystem of ``build_debian_image`` (cached; instant the second time)."""
    return build_debian_image(cache_dir, packages, suite).rootfs


def write_debian_archive(
    image: DebianImage, out: Path, name: str, extra_layers: Sequence[Path] = ()
) -> Path:
    """Pack the image's layers (plus e.g. a workspace layer) as an OCI archive."""
    from sandbox.oci_archive import write_oci_archive  # the core's writer gzips the tars

    return write_oci_archive(out, [*image.layer_paths, *extra_layers], name)
