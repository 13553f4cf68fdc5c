#!/usr/bin/env python3
"""Generate containerd's Python gRPC stubs into ``sandbox/_gen`` at set-up time.

Why generate instead of depending on a PyPI package: the ``containerd`` PyPI
package (1.5.3) does not import with current protobuf, and generated code
checks that the grpcio-tools that made it matches the grpcio at run time.

Inputs (Debian and PyPI, nothing fetched):
  * containerd API protos from golang-github-containerd-containerd-dev,
  * cgroups v1 metrics proto (the payload of Tasks.Metrics on this machine),
  * gogo.proto from golang-github-gogo-protobuf-dev,
  * google/rpc/status.proto from googleapis-common-protos (imported at run time
    from that package, so it is only an include path here).

The protos are staged under a temporary tree where ``github.com/...`` paths
become ``sandbox/_gen/...`` paths, so protoc emits ``from sandbox._gen... import``
lines directly; ``import weak`` (a gogo idiom protoc's Python plugin rejects
the meaning of) becomes a plain ``import``. A stamp file records a hash of the
inputs and the grpcio-tools version; when it matches, nothing is done.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import shutil
import sys
import tempfile
from pathlib import Path

GOCODE = Path("/usr/share/gocode/src/github.com")
REPO = Path(__file__).resolve().parent.parent
OUT_PKG = REPO / "sandbox" / "_gen"
STAMP = OUT_PKG / "STAMP"

# Only what the sandbox layer talks to, plus the types they import.
CONTAINERD_PROTOS = [
    "api/types/descriptor.proto",
    "api/types/metrics.proto",
    "api/types/mount.proto",
    "api/types/platform.proto",
    "api/types/task/task.proto",
    "api/services/containers/v1/containers.proto",
    "api/services/content/v1/content.proto",
    "api/services/diff/v1/diff.proto",
    "api/services/events/v1/events.proto",
    "api/services/images/v1/images.proto",
    "api/services/introspection/v1/introspection.proto",
    "api/services/leases/v1/leases.proto",
    "api/services/namespaces/v1/namespace.proto",
    "api/services/snapshots/v1/snapshots.proto",
    "api/services/tasks/v1/tasks.proto",
    "api/services/version/v1/version.proto",
    "api/events/task.proto",
    "api/events/container.proto",
    "protobuf/plugin/fieldpath.proto",
    "runtime/v2/runc/options/oci.proto",
]
CGROUPS_PROTOS = ["stats/v1/metrics.proto"]

# source prefix (as written in import lines) -> staged prefix (a Python package path)
PATH_MAP = {
    "github.com/containerd/containerd/": "sandbox/_gen/containerd/",
    "github.com/containerd/cgroups/": "sandbox/_gen/cgroups/",
    "gogoproto/": "sandbox/_gen/gogoproto/",
}


def _sources() -> dict[str, Path]:
    """Map each proto's original import path to its file on disk."""
    found: dict[str, Path] = {}
    for rel in CONTAINERD_PROTOS:
        found["github.com/containerd/containerd/" + rel] = GOCODE / "containerd/containerd" / rel
    for rel in CGROUPS_PROTOS:
        found["github.com/containerd/cgroups/" + rel] = GOCODE / "containerd/cgroups" / rel
    found["gogoproto/gogo.proto"] = GOCODE / "gogo/protobuf/gogoproto/gogo.proto"
    missing = [str(p) for p in found.values() if not p.is_file()]
    if missing:
        sys.exit(f"gen_stubs: missing proto inputs (install the Debian -dev packages): {missing}")
    return found


def _staged_path(import_path: str) -> str:
    for src, dst in PATH_MAP.items():
        if import_path.startswith(src):
            return dst + import_path[len(src) :]
    return import_path


_IMPORT_RE = re.compile(r'^import\s+(weak\s+|public\s+)?"([^"]+)";', re.MULTILINE)


def _rewrite(text: str) -> str:
    def repl(match: re.Match[str]) -> str:
        return f'import "{_staged_path(match.group(2))}";'

    return _IMPORT_RE.sub(repl, text)


def _input_hash(sources: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    digest.update(importlib.metadata.version("grpcio-tools").encode())
    digest.update(Path(__file__).read_bytes())
    for name in sorted(sources):
        digest.update(name.encode())
        digest.update(sources[name].read_bytes())
    return digest.hexdigest()


def _status_proto_include() -> Path:
    import google.rpc

    for base in google.rpc.__path__:
        if (Path(base) / "status.proto").is_file():
            return Path(base).parent.parent
    sys.exit("gen_stubs: google/rpc/status.proto not found (pip install googleapis-common-protos)")


def _protoc(stage: Path, out: Path, files: list[str]) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{stage}",
        f"-I{_status_proto_include()}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        sys.exit("gen_stubs: protoc failed")


def _add_init_files(root: Path) -> None:
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()


def generate(force: bool = False) -> bool:
    """Generate the stubs if missing or stale; return whether anything was done."""
    sources = _sources()
    wanted = _input_hash(sources)
    if not force and STAMP.is_file() and STAMP.read_text().strip() == wanted:
        return False
    with tempfile.TemporaryDirectory(prefix="corral-protos-") as tmp:
        stage, out = Path(tmp) / "stage", Path(tmp) / "out"
        staged_files = []
        for import_path, src in sources.items():
            staged = _staged_path(import_path)
            (stage / staged).parent.mkdir(parents=True, exist_ok=True)
            (stage / staged).write_text(_rewrite(src.read_text()))
            staged_files.append(staged)
        out.mkdir()
        _protoc(stage, out, staged_files)
        generated = out / "sandbox" / "_gen"
        _add_init_files(generated)
        (generated / "__init__.py").write_text(
            '"""Generated containerd gRPC stubs (scripts/gen_stubs.py); never edit or commit."""\n'
        )
        (generated / "STAMP").write_text(wanted + "\n")
        if OUT_PKG.exists():
            shutil.rmtree(OUT_PKG)
        shutil.copytree(generated, OUT_PKG)
    return True


def main() -> None:
    force = "--force" in sys.argv[1:]
    did = generate(force=force)
    print(f"gen_stubs: {'generated' if did else 'up to date'} {OUT_PKG.relative_to(REPO)}")


if __name__ == "__main__":
    main()
