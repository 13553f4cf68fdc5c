"""One place that turns grpc.aio errors from containerd into typed SandboxErrors."""

from __future__ import annotations

import grpc

from contract.errors import (
    ContainerdError,
    ContainerdUnavailable,
    InvalidSpec,
    SandboxAlreadyExists,
    SandboxError,
    SandboxNotFound,
    SandboxPaused,
    SandboxStateError,
)

_BY_CODE: dict[grpc.StatusCode, type[SandboxError]] = {
    grpc.StatusCode.ALREADY_EXISTS: SandboxAlreadyExists,
    grpc.StatusCode.UNAVAILABLE: ContainerdUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: ContainerdUnavailable,
    grpc.StatusCode.FAILED_PRECONDITION: SandboxStateError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidSpec,
}


def one_line(text: str, limit: int = 400) -> str:
    """Collapse whitespace so every message is one line; cut very long ones."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def map_grpc_error(
    err: grpc.RpcError,
    what: str,
    *,
    not_found: type[SandboxError] = SandboxNotFound,
) -> SandboxError:
    """Translate ``err`` raised while doing ``what`` (e.g. "sandbox 'x'").

    ``not_found`` says which type NOT_FOUND means in the caller's context (an
    image, a sandbox...). A task that is paused is reported as SandboxPaused
    whatever code containerd used for it.
    """
    code_fn = getattr(err, "code", None)
    code = code_fn() if callable(code_fn) else None
    details_fn = getattr(err, "details", None)
    details = one_line((details_fn() if callable(details_fn) else None) or str(err))
    message = f"{what}: {details}" if details else what
    if code == grpc.StatusCode.NOT_FOUND:
        return not_found(message)
    if "paused" in details.lower() and code in (
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.UNKNOWN,
    ):
        return SandboxPaused(f"{what}: sandbox is paused; resume it first ({details})")
    if code == grpc.StatusCode.UNAVAILABLE:
        return ContainerdUnavailable(f"{what}: containerd is unavailable ({details})")
    error_type = _BY_CODE.get(code, ContainerdError) if code is not None else ContainerdError
    return error_type(message)


def is_not_found(err: grpc.RpcError) -> bool:
    return isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.NOT_FOUND
