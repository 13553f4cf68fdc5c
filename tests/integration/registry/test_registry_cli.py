"""`corral image push|pull|prune` as a user runs them, against the test stack."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid

from registry_helpers import RegistryServer

from sandbox.models import ImageInfo
from tests.conftest import REPO


async def _corral(*args: str, password: str | None = None) -> tuple[int, str, str]:
    """The CLI of this checkout with the test session's CORRAL_* variables (so: the
    test stack), a password on its stdin when given."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral", *args, cwd=REPO, env=dict(os.environ),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate((password or "").encode()), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_push_pull_prune_with_password_on_stdin(
    busybox_local: ImageInfo, auth_registry: RegistryServer
) -> None:
    assert auth_registry.credentials is not None
    user, password = auth_registry.credentials.username, auth_registry.credentials.password
    ref = auth_registry.ref(f"tests/cli-{uuid.uuid4().hex[:8]}", "v1")
    login = ("--username", user, "--password-stdin")

    code, out, err = await _corral(
        "image", "push", busybox_local.name, ref, *login, password=password
    )
    assert code == 0, err
    assert ref in out and busybox_local.digest[:19] in out

    code, out, err = await _corral(
        "image", "pull", ref, "--node", "node-2", *login, password="wrong"
    )
    assert code != 0 and "unauthorized" in err and ref in err
    assert len(err.strip().splitlines()) == 1

    code, out, err = await _corral(
        "image", "pull", ref, "--node", "node-2", *login, password=password
    )
    assert code == 0, err
    assert f"node-2: {ref} {busybox_local.digest[:19]}" in out

    code, out, err = await _corral("image", "prune", "--node", "node-2", "--json")
    assert code == 0, err
    assert {"node": "node-2", "name": ref, "digest": busybox_local.digest} in json.loads(out)
