"""Files too large for a Temporal payload travel beside it, as registry blobs.

`Episode.write_file`/`read_file` of more than `INLINE_MAX` bytes (docs/agent.md,
"Files of any size"): the bytes go to the stack's registry (`registry.default`)
as a blob of the repository `<registry>/corral/files`, named by their sha256;
the Update and the activity carry only the reference, digest and size, so the
episode's history records the file by digest. Both ends check the digest
(`RegistrySession.blob_chunks` raises on a mismatch).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from contract.errors import InvalidSpec, SandboxError
from contract.models import FileBlob
from sandbox.registry import CHUNK, Reference, RegistryOptions, RegistrySession, digest_of

INLINE_MAX = 1 << 20  # up to this many bytes ride in the Update itself
FILES_REPOSITORY = "corral/files"


def files_repository(registry: str | None) -> str:
    """`<registry>/corral/files`, or a one-line error when no registry is configured."""
    if not registry:
        raise InvalidSpec(
            f"files over {INLINE_MAX} bytes go through a registry: set registry.default "
            "(CORRAL_REGISTRY) in the stack's config"
        )
    return f"{registry}/{FILES_REPOSITORY}"


def _session(repository: str, options: RegistryOptions, *, push: bool) -> RegistrySession:
    return RegistrySession(Reference.parse(repository), options, push=push)


async def push_bytes(repository: str, data: bytes, options: RegistryOptions) -> FileBlob:
    """Upload `data` as a blob (skipped when the registry has it already)."""
    blob = FileBlob(repository=repository, digest=digest_of(data), size=len(data))
    async with _session(repository, options, push=True) as registry:
        if not await registry.has_blob(blob.digest):
            await registry.upload_blob(blob.digest, blob.size, _chunks(data))
    return blob


async def pull_bytes(blob: FileBlob, options: RegistryOptions) -> bytes:
    """The blob's bytes, checked against its digest and size."""
    parts: list[bytes] = []
    async with _session(blob.repository, options, push=False) as registry:
        async for chunk in registry.blob_chunks(blob.digest, blob.size):
            parts.append(chunk)
    data = b"".join(parts)
    if len(data) != blob.size:
        raise SandboxError(f"blob {blob.digest}: {len(data)} bytes, expected {blob.size}")
    return data


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(data), CHUNK):
        yield bytes(view[start : start + CHUNK])
