"""Corral's sandbox layer: containerd over gRPC, OCI specs, images, exec I/O.

No Temporal imports here; activities wrap this layer. Names are imported
lazily so that ``sandbox.models`` and the other pure modules work before the
gRPC stubs are generated (``scripts/gen_stubs.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Containerd": "sandbox.client",
    "ContainerdDaemon": "sandbox.daemon",
    "ExecResult": "sandbox.models",
    "ImageInfo": "sandbox.models",
    "SandboxEvent": "sandbox.models",
    "SandboxInfo": "sandbox.models",
    "SandboxMetrics": "sandbox.models",
    "SandboxSpec": "sandbox.models",
    "BUSYBOX_IMAGE": "sandbox.oci_archive",
    "build_busybox_image": "sandbox.oci_archive",
    "build_busybox_rootfs": "sandbox.oci_archive",
    "write_oci_archive": "sandbox.oci_archive",
    "Sandbox": "sandbox.sandbox",
    "build_oci_spec": "sandbox.spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
