"""Files in a sandbox through the history: `corral.write_file` and `corral.read_file`.

The bytes travel base64 in the activity's payload (files over 1 MiB go
through the registry instead: `corral.file_put`/`file_get` in
activities/toolcalls.py). Like a step, a file operation gives its sandbox
its full CPU weight and holds the node's background work while it runs.
"""

from __future__ import annotations

import base64

from activities.glue import heartbeating, mapped
from activities.ledger import NodeLedger
from contract.models import FileContent, ReadFileInput, WriteFileInput
from sandbox.runtime import SandboxRuntime


class SandboxFiles:
    def __init__(self, runtime: SandboxRuntime, ledger: NodeLedger) -> None:
        self._runtime = runtime
        self._ledger = ledger

    async def write_file(self, input: WriteFileInput) -> None:
        sandbox = await mapped(self._runtime.get_sandbox(input.sandbox_id))
        data = base64.b64decode(input.request.content_b64)
        with self._ledger.working(sandbox.id, sandbox.labels):
            await heartbeating(
                mapped(sandbox.write_file(input.request.path, data, input.request.mode))
            )

    async def read_file(self, input: ReadFileInput) -> FileContent:
        sandbox = await mapped(self._runtime.get_sandbox(input.sandbox_id))
        with self._ledger.working(sandbox.id, sandbox.labels):
            data = await heartbeating(
                mapped(sandbox.read_file(input.request.path, input.request.max_bytes))
            )
        return FileContent(
            path=input.request.path, content_b64=base64.b64encode(data).decode(), size=len(data)
        )
