"""Running the host's own tools (nft, ip, tc, mkfs, mount, ...) for the sandbox layer.

One place for what every caller wants: no stdin unless given, a timeout, and
failures as one line naming what was being done, the tool and its first
stderr line, raised as the caller's error type.
"""

from __future__ import annotations

import asyncio

from contract.errors import SandboxError

DEFAULT_TIMEOUT_S = 30.0


async def run_tool(
    what: str,
    *argv: str,
    error: type[SandboxError],
    stdin: str | None = None,
    ok_stderr: tuple[str, ...] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """Run `argv`; return its stdout, or raise `error` unless it succeeded (or
    failed with stderr containing one of `ok_stderr`: a benign failure)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        raise error(f"{what}: cannot run {argv[0]}: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(stdin.encode() if stdin is not None else None), timeout_s
        )
    except TimeoutError as exc:
        proc.kill()
        await proc.wait()
        raise error(f"{what}: {argv[0]} timed out") from exc
    text = err.decode(errors="replace").strip()
    if proc.returncode != 0 and not any(s in text for s in ok_stderr):
        first = text.splitlines()[0] if text else f"exit status {proc.returncode}"
        raise error(f"{what} failed: {first}")
    return out.decode(errors="replace")
