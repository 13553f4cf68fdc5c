"""Tree diff, whiteouts and layer tars of sandbox.debian, on small temp trees."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from contract.errors import ImageBuildError
from sandbox.debian import (
    Change,
    _check_packages,
    diff_trees,
    make_layer_from_dir,
    write_diff_layer,
)


def make_lower(root: Path) -> Path:
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "keep").write_text("same")
    (root / "etc" / "edit").write_text("old")
    (root / "etc" / "chmod").write_text("x")
    (root / "gone").mkdir()
    (root / "gone" / "deep").write_text("deep")
    (root / "oldfile").write_text("file")
    (root / "becomes_dir").write_text("file")
    (root / "link").symlink_to("etc/keep")
    return root


def copy_tree(src: Path, dst: Path) -> Path:
    # cp -a as the builder does: keeps mtimes, so untouched files compare equal.
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    return dst


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    lower = make_lower(tmp_path / "lower")
    upper = copy_tree(lower, tmp_path / "upper")
    (upper / "etc" / "edit").write_text("new and longer")
    (upper / "etc" / "chmod").chmod(0o600)
    (upper / "etc" / "added").write_text("hi")
    shutil.rmtree(upper / "gone")
    (upper / "oldfile").unlink()
    (upper / "becomes_dir").unlink()
    (upper / "becomes_dir").mkdir()
    (upper / "becomes_dir" / "inner").write_text("in")
    (upper / "link").unlink()
    (upper / "link").symlink_to("etc/added")
    (upper / "newdir" / "sub").mkdir(parents=True)
    (upper / "newdir" / "sub" / "f").write_text("f")
    return lower, upper


def test_identical_copies_have_no_diff(tmp_path: Path) -> None:
    lower = make_lower(tmp_path / "lower")
    assert diff_trees(lower, copy_tree(lower, tmp_path / "upper")) == []


def test_diff_classifies_every_change(trees: tuple[Path, Path]) -> None:
    changes = {(c.path, c.kind) for c in diff_trees(*trees)}
    assert changes == {
        ("etc", "modify"),  # its mtime moved: entries were added
        ("etc/edit", "modify"),
        ("etc/chmod", "modify"),
        ("etc/added", "add"),
        ("gone", "delete"),  # one whiteout hides the subtree: gone/deep is not listed
        ("oldfile", "delete"),
        ("becomes_dir", "delete"),  # a type change is a whiteout plus the new entry
        ("becomes_dir", "add"),
        ("becomes_dir/inner", "add"),
        ("link", "modify"),
        ("newdir", "add"),
        ("newdir/sub", "add"),
        ("newdir/sub/f", "add"),
    }
    assert ("etc/keep", "modify") not in changes


def test_diff_sees_owner_change(tmp_path: Path) -> None:
    lower = make_lower(tmp_path / "lower")
    upper = copy_tree(lower, tmp_path / "upper")
    os.chown(upper / "etc" / "keep", 100, 101, follow_symlinks=False)
    assert diff_trees(lower, upper) == [Change("etc/keep", "modify")]


def test_diff_layer_has_whiteouts_and_contents(trees: tuple[Path, Path], tmp_path: Path) -> None:
    lower, upper = trees
    layer = write_diff_layer(upper, diff_trees(lower, upper), tmp_path / "layer.tar")
    with tarfile.open(layer) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert tar.extractfile(members["etc/edit"]).read() == b"new and longer"  # type: ignore[union-attr]
    assert {".wh.gone", ".wh.oldfile", ".wh.becomes_dir"} <= set(members)
    assert members[".wh.gone"].isfile() and members[".wh.gone"].size == 0
    assert members["becomes_dir"].isdir() and members["becomes_dir/inner"].isfile()
    assert members["link"].issym() and members["link"].linkname == "etc/added"
    assert members["etc/chmod"].mode & 0o777 == 0o600
    assert "etc/keep" not in members and "gone/deep" not in members
    names = list(members)
    assert names.index(".wh.becomes_dir") < names.index("becomes_dir")
    assert all(m.uname == "" and m.gname == "" for m in members.values())


def test_layer_applied_on_lower_gives_upper(trees: tuple[Path, Path], tmp_path: Path) -> None:
    """Apply the layer the way an OCI runtime would, and compare with the real tree."""
    lower, upper = trees
    layer = write_diff_layer(upper, diff_trees(lower, upper), tmp_path / "layer.tar")
    applied = copy_tree(lower, tmp_path / "applied")
    with tarfile.open(layer) as tar:
        for member in tar.getmembers():
            parent, _, name = member.name.rpartition("/")
            if name.startswith(".wh."):
                target = applied / parent / name[len(".wh.") :]
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
                continue
            target = applied / member.name
            if target.is_symlink() or (target.exists() and not target.is_dir()):
                target.unlink()
            tar.extract(member, applied, filter="tar")
    # mtimes are left out: tar keeps microseconds, and extracting touches directories.
    assert snapshot(applied) == snapshot(upper)


def snapshot(root: Path) -> dict[str, tuple[int, int, int, str]]:
    out = {}
    for path in root.rglob("*"):
        st = path.lstat()
        if path.is_symlink():
            body = "->" + os.readlink(path)
        else:
            body = path.read_text() if path.is_file() else ""
        out[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid, body)
    return out


def test_make_layer_from_dir(tmp_path: Path) -> None:
    src = tmp_path / "workspace"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "main.py").write_text("print(1)\n")
    (src / "dev").mkdir()
    (src / "dev" / "node").write_text("skip me")
    os.link(src / "pkg" / "main.py", src / "pkg" / "alias.py")
    layer = make_layer_from_dir(src, exclude_contents=("dev",))
    assert layer == tmp_path / "workspace.tar"
    with tarfile.open(layer) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"dev", "pkg", "pkg/alias.py", "pkg/main.py"}
    assert members["pkg/main.py"].islnk() or members["pkg/alias.py"].islnk()
    assert make_layer_from_dir(src, tmp_path / "again.tar").read_bytes() != b""
    with pytest.raises(ImageBuildError, match="not a directory"):
        make_layer_from_dir(tmp_path / "missing")


def test_layers_are_deterministic(tmp_path: Path) -> None:
    lower = make_lower(tmp_path / "lower")
    a = make_layer_from_dir(lower, tmp_path / "a.tar").read_bytes()
    b = make_layer_from_dir(lower, tmp_path / "b.tar").read_bytes()
    assert a == b


def test_package_names_are_checked() -> None:
    assert _check_packages(["python3", "git", "python3"]) == ["git", "python3"]
    assert _check_packages(["libc6=2.36-9+deb12u4"]) == ["libc6=2.36-9+deb12u4"]
    with pytest.raises(ImageBuildError, match="invalid Debian package"):
        _check_packages(["python3; rm -rf /"])
    with pytest.raises(ImageBuildError):
        _check_packages(["-oAPT::X=1"])
