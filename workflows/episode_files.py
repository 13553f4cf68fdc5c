"""The sandbox's files and snapshots as Updates on the episode: `write_file`
and `read_file` (small files in the history), `put_file` and `get_file`
(files of any size: the bytes travel as a registry blob, the history holds
its digest) and `snapshot` (the filesystem committed as an image a new
episode or a fork starts from). Each waits for the sandbox, runs in turn
with the other requests and wakes a hibernated sandbox first.
"""

from __future__ import annotations

import base64
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.node import NodeActivities
    from activities.toolcalls import (
        GetFileInput,
        GetFileRequest,
        PutFileInput,
        PutFileRequest,
        ToolCallActivities,
    )
    from contract.models import (
        FileBlob,
        FileContent,
        ReadFileInput,
        ReadFileRequest,
        SnapshotRequest,
        SnapshotResult,
        WriteFileInput,
        WriteFileRequest,
    )
    from workflows.episode_hibernation import EpisodeHibernation
    from workflows.steps import surfaced


class EpisodeFiles(EpisodeHibernation):
    @workflow.update
    async def snapshot(self, request: SnapshotRequest) -> SnapshotResult:
        """Commit the sandbox's filesystem as an image: `EpisodeSpec(image=ref)` starts from it."""
        await workflow.wait_condition(
            lambda: self._s.ready or self._s.closing or self._s.kill is not None
        )
        async with self._lock:
            self._check_open()
            await surfaced(self._wake())
            self._touch()
            return await surfaced(self._take_snapshot(request.name))

    @snapshot.validator
    def _validate_snapshot(self, request: SnapshotRequest) -> None:
        self._check_open()

    @workflow.update
    async def write_file(self, request: WriteFileRequest) -> None:
        async with self._request_turn(frozen_waits=False):
            self._touch()
            await surfaced(
                self._node_activity(
                    NodeActivities.write_file,
                    WriteFileInput(sandbox_id=self._s.sandbox_id, request=request),
                    timeout_s=60,
                )
            )

    @write_file.validator
    def _validate_write_file(self, request: WriteFileRequest) -> None:
        self._check_open()
        try:
            base64.b64decode(request.content_b64, validate=True)
        except ValueError as err:
            raise ApplicationError(
                f"content_b64 is not base64: {err}", type="InvalidRequest"
            ) from None

    @workflow.update
    async def read_file(self, request: ReadFileRequest) -> FileContent:
        async with self._request_turn(frozen_waits=False):
            self._touch()
            content: FileContent = await surfaced(
                self._node_activity(
                    NodeActivities.read_file,
                    ReadFileInput(sandbox_id=self._s.sandbox_id, request=request),
                    timeout_s=60,
                )
            )
            return content

    @read_file.validator
    def _validate_read_file(self, request: ReadFileRequest) -> None:
        self._check_open()

    # Files of any size: the bytes travel as a registry blob, the history holds its digest.
    @workflow.update(name="put_file")
    async def put_file_update(self, request: PutFileRequest) -> None:
        await self._file_activity(
            ToolCallActivities.file_put,
            PutFileInput(sandbox_id=self._s.sandbox_id, request=request),
        )

    @put_file_update.validator
    def _validate_put_file(self, request: PutFileRequest) -> None:
        self._check_open()

    @workflow.update(name="get_file")
    async def get_file_update(self, request: GetFileRequest) -> FileBlob:
        blob: FileBlob = await self._file_activity(
            ToolCallActivities.file_get,
            GetFileInput(sandbox_id=self._s.sandbox_id, request=request),
        )
        return blob

    @get_file_update.validator
    def _validate_get_file(self, request: GetFileRequest) -> None:
        self._check_open()

    async def _file_activity(self, method: Any, call: Any) -> Any:
        """As `write_file`/`read_file` do: in turn with other requests, the sandbox awake."""
        async with self._request_turn(frozen_waits=False):
            self._touch()
            return await surfaced(self._node_activity(method, call, timeout_s=600))
