"""One live sandbox: exec, files, pause/resume, status, metrics, destroy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf import any_pb2

from contract.errors import FileNotFound, SandboxError, SandboxNotFound, SandboxPaused
from contract.labels import AGENT_LABEL
from sandbox import network
from sandbox._gen.cgroups.stats.v1 import metrics_pb2 as cgroup_metrics_pb2
from sandbox._gen.containerd.api.services.tasks.v1 import tasks_pb2
from sandbox._gen.containerd.api.types.task import task_pb2
from sandbox.cgroups import is_frozen
from sandbox.connection import Connection
from sandbox.exec_io import (
    ExecFiles,
    ExecPipes,
    OutputCallback,
    OutputCollector,
    kill_process_tree,
)
from sandbox.grpc_errors import is_not_found, map_grpc_error
from sandbox.models import ExecResult, SandboxMetrics, SandboxStatus, parse_user
from sandbox.network import NetworkAttachment
from sandbox.spec import EXEC_OOM_SCORE_ADJ, exec_process
from sandbox.tracing import agent_span

if TYPE_CHECKING:
    from sandbox.agent import AgentChannel, AgentResult
    from sandbox.client_api import SandboxHost

PROCESS_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Process"
DEFAULT_OUTPUT_LIMIT = 1_048_576
DEFAULT_READ_LIMIT = 64 * 1024 * 1024
_NO_SUCH_FILE = 2  # read_file's script exits 2 for a path that is not a file
DRAIN_GRACE_S = 2.0  # how long to wait for output EOF after the process exited
KILL_WAIT_S = 10.0
SIGKILL = 9
AGENT_MARKER = "agent"  # in a durable exec's output dir: it ran through the exec agent

STATUS_NAMES: dict[int, SandboxStatus] = {
    task_pb2.CREATED: "created",
    task_pb2.RUNNING: "running",
    task_pb2.STOPPED: "stopped",
    task_pb2.PAUSED: "paused",
    task_pb2.PAUSING: "pausing",
}


@dataclass
class RawExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool
    truncated: bool

    def decoded(self) -> ExecResult:
        return ExecResult(
            exit_code=self.exit_code,
            stdout=self.stdout.decode("utf-8", errors="replace"),
            stderr=self.stderr.decode("utf-8", errors="replace"),
            duration_s=self.duration_s,
            timed_out=self.timed_out,
            truncated=self.truncated,
        )


class Sandbox:
    """Handle on a sandbox that exists in containerd; cheap to make, holds no resources."""

    def __init__(
        self,
        client: SandboxHost,
        conn: Connection,
        sandbox_id: str,
        *,
        image: str,
        labels: dict[str, str],
        process: dict[str, Any],
    ) -> None:
        self._client = client
        self._conn = conn
        self.id = sandbox_id
        self.image = image
        self.labels = labels
        self._process = process  # PID 1's OCI process: the template of every exec

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, image={self.image!r})"

    # -- exec ------------------------------------------------------------------
    async def exec(
        self,
        cmd: list[str] | str,
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
        on_output: OutputCallback | None = None,
    ) -> ExecResult:
        """Run ``cmd`` (a str runs via /bin/sh -c) and wait for it; never raises on exit code."""
        args = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        raw = await self.exec_raw(
            args,
            env=env,
            workdir=workdir,
            user=user,
            stdin=stdin,
            timeout_s=timeout_s,
            output_limit_bytes=output_limit_bytes,
            on_output=on_output,
        )
        return raw.decoded()

    async def exec_raw(
        self,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
        on_output: OutputCallback | None = None,
    ) -> RawExecResult:
        """Like exec, with bytes output (for files and tars)."""
        _check_exec_args(args, user, timeout_s, output_limit_bytes)
        channel = await self._agent_for(user)
        if channel is not None:
            result = await self._agent_run(
                channel,
                args,
                env=env,
                cwd=workdir,
                stdin=stdin,
                timeout_s=timeout_s,
                output_limit_bytes=output_limit_bytes,
                on_output=on_output,
            )
            return _raw_of(result)
        process = exec_process(self._process, args, env=env, workdir=workdir, user=user)
        exec_id = f"exec-{uuid.uuid4().hex[:16]}"
        started = time.monotonic()
        collector = OutputCollector(output_limit_bytes, on_output)
        pipes = ExecPipes(exec_id, stdin is not None, collector)
        try:
            await self._create_exec(exec_id, process, pipes)
            try:
                exit_code, timed_out = await self._start_and_wait(exec_id, pipes, stdin, timeout_s)
                await pipes.drain(DRAIN_GRACE_S)
            finally:
                await self._delete_exec(exec_id)
        finally:
            await pipes.close()
        return RawExecResult(
            exit_code=exit_code,
            stdout=collector.text("stdout"),
            stderr=collector.text("stderr"),
            duration_s=time.monotonic() - started,
            timed_out=timed_out,
            truncated=collector.truncated,
        )

    async def exec_durable(
        self,
        args: list[str],
        *,
        exec_id: str,
        output_dir: Path,
        env: dict[str, str] | None = None,
        workdir: str | None = None,
        user: str | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
    ) -> RawExecResult:
        """Like exec_raw under a fixed ``exec_id``, with output in files under ``output_dir``.

        The shim writes the output files, so if this process dies mid-exec,
        the next one gets the exec's real output and exit code with
        ``reattach_exec``. The exec is deleted only after its end is recorded.
        """
        _check_exec_args(args, user, timeout_s, output_limit_bytes)
        channel = await self._agent_for(user)
        if channel is not None:
            return await self._agent_durable(
                channel, args, output_dir, env, workdir, stdin, timeout_s, output_limit_bytes
            )
        process = exec_process(self._process, args, env=env, workdir=workdir, user=user)
        files = ExecFiles.create(output_dir, stdin is not None)
        try:
            await self._create_exec(exec_id, process, files)
            exit_code, timed_out = await self._start_and_wait(exec_id, files, stdin, timeout_s)
        finally:
            await files.close()
        files.record_end(exit_code, timed_out)
        await self._delete_exec(exec_id)  # the shim flushes the files first
        return _durable_result(files, output_limit_bytes)

    async def reattach_exec(
        self,
        exec_id: str,
        output_dir: Path,
        *,
        timeout_s: float | None,
        output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT,
    ) -> RawExecResult | None:
        """The result of an ``exec_durable`` an earlier process started; None if it never ran.

        Waits for it if it still runs (killing it after ``timeout_s``).
        Raises SandboxNotFound when the sandbox is gone, SandboxError when
        the exec vanished before its exit code was recorded.
        """
        files = ExecFiles(output_dir)
        if (output_dir / AGENT_MARKER).exists() and files.end() is None:
            # Its channel died with the process that sent it: never run it twice.
            raise SandboxError(f"exec {exec_id} in sandbox {self.id!r} was lost with its worker")
        if not files.started:
            return None
        if files.end() is None:
            process = await self._exec_process(exec_id)
            if process.status == task_pb2.CREATED:  # made, never started: run it afresh
                await self._delete_exec(exec_id)
                return None
            wait = self._wait_for(exec_id)
            try:
                exit_code, timed_out = await self._exit_of(wait, exec_id, process.pid, timeout_s)
            finally:
                await _cancel(wait)
            files.record_end(exit_code, timed_out)
        await self._delete_exec(exec_id)
        return _durable_result(files, output_limit_bytes)

    # -- the exec agent (sandbox/agent.py) --------------------------------------
    def agent(self) -> AgentChannel | None:
        """The exec agent's channel when the agent is this sandbox's PID 1 and this
        process holds it (made or attached it); None otherwise."""

        if AGENT_LABEL not in self.labels:
            return None
        return self._client.agent_channel(self.id)

    async def agent_channel(self) -> AgentChannel | None:
        """`agent()`, or else the channel attached again when another process
        started this sandbox's agent (a node worker before a restart)."""

        channel = self.agent()
        if channel is None and AGENT_LABEL in self.labels:
            channel = await self._client.attach_agent(self.id)
        return channel

    async def _agent_for(self, user: str | None) -> AgentChannel | None:
        """The channel for a call, or None for runc exec (another user: the agent
        runs everything as the sandbox's user). A paused sandbox refuses, as runc does."""
        channel = await self.agent_channel() if user is None else None
        if channel is not None and await self._is_paused():
            raise SandboxPaused(f"exec in sandbox {self.id!r}: sandbox is paused; resume it first")
        return channel

    async def _agent_run(self, channel: AgentChannel, *args: Any, **kwargs: Any) -> AgentResult:
        from sandbox.agent import AgentGone

        try:
            with agent_span("run", self.id):
                return await channel.run(*args, **kwargs)
        except AgentGone as err:  # PID 1 exited, or the sandbox was destroyed
            raise SandboxNotFound(f"sandbox {self.id!r} is gone ({err})") from err

    async def _agent_durable(
        self,
        channel: AgentChannel,
        args: list[str],
        output_dir: Path,
        env: dict[str, str] | None,
        workdir: str | None,
        stdin: bytes | None,
        timeout_s: float | None,
        output_limit_bytes: int,
    ) -> RawExecResult:
        """exec_durable through the agent. Its channel dies with this process, so
        there is nothing to reattach to: the marker alone makes ``reattach_exec``
        report the call lost (never run twice), and the caller journals the result."""
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / AGENT_MARKER).touch()
        result = await self._agent_run(
            channel,
            args,
            env=env,
            cwd=workdir,
            stdin=stdin,
            timeout_s=timeout_s,
            output_limit_bytes=output_limit_bytes,
        )
        return _raw_of(result)

    async def _exec_process(self, exec_id: str) -> Any:
        try:
            resp = await self._conn.tasks.Get(
                tasks_pb2.GetRequest(container_id=self.id, exec_id=exec_id),
                metadata=self._conn.md(),
            )
        except grpc.aio.AioRpcError as err:
            if not is_not_found(err):
                raise map_grpc_error(err, f"exec {exec_id} in sandbox {self.id!r}") from err
            if await self.status() == "stopped":
                raise SandboxNotFound(f"sandbox {self.id!r} is gone (its task ended)") from err
            raise SandboxError(
                f"exec {exec_id} in sandbox {self.id!r} vanished before its exit was recorded"
            ) from err
        return resp.process

    async def _create_exec(
        self, exec_id: str, process: dict[str, Any], pipes: ExecPipes | ExecFiles
    ) -> None:
        request = tasks_pb2.ExecProcessRequest(
            container_id=self.id,
            exec_id=exec_id,
            stdin=pipes.stdin_path,
            stdout=pipes.stdout_path,
            stderr=pipes.stderr_path,
            terminal=False,
            spec=any_pb2.Any(type_url=PROCESS_TYPE_URL, value=json.dumps(process).encode()),
        )
        try:
            await self._conn.tasks.Exec(request, metadata=self._conn.md())
        except grpc.aio.AioRpcError as err:
            raise await self._exec_error(err) from err

    async def _exec_error(self, err: grpc.aio.AioRpcError) -> SandboxError:
        mapped = map_grpc_error(err, f"exec in sandbox {self.id!r}")
        if not isinstance(mapped, SandboxPaused) and await self._is_paused():
            return SandboxPaused(f"exec in sandbox {self.id!r}: sandbox is paused; resume it first")
        return mapped

    async def _start_and_wait(
        self,
        exec_id: str,
        pipes: ExecPipes | ExecFiles,
        stdin: bytes | None,
        timeout_s: float | None,
    ) -> tuple[int, bool]:
        # Wait before Start, or a fast process's exit could be missed.
        wait = self._wait_for(exec_id)
        try:
            try:
                started = await self._conn.tasks.Start(
                    tasks_pb2.StartRequest(container_id=self.id, exec_id=exec_id),
                    metadata=self._conn.md(),
                )
            except grpc.aio.AioRpcError as err:
                raise await self._exec_error(err) from err
            _raise_oom_score(started.pid)
            pipes.feed_stdin(stdin or b"", lambda: self._close_stdin(exec_id))
            return await self._exit_of(wait, exec_id, started.pid, timeout_s)
        finally:
            await _cancel(wait)

    def _wait_for(self, exec_id: str) -> asyncio.Future[Any]:
        return asyncio.ensure_future(
            self._conn.tasks.Wait(
                tasks_pb2.WaitRequest(container_id=self.id, exec_id=exec_id),
                metadata=self._conn.md(),
            )
        )

    async def _exit_of(
        self, wait: asyncio.Future[Any], exec_id: str, pid: int, timeout_s: float | None
    ) -> tuple[int, bool]:
        """(exit code, timed out): the exec's end, killing it after ``timeout_s``."""
        try:
            done = await asyncio.wait_for(asyncio.shield(wait), timeout_s)
            return done.exit_status, False
        except TimeoutError:
            await self._kill_exec(exec_id, pid)
            with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError):
                done = await asyncio.wait_for(asyncio.shield(wait), KILL_WAIT_S)
                return (done.exit_status or 128 + SIGKILL), True
            return 128 + SIGKILL, True

    async def _close_stdin(self, exec_id: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._conn.tasks.CloseIO(
                tasks_pb2.CloseIORequest(container_id=self.id, exec_id=exec_id, stdin=True),
                metadata=self._conn.md(),
            )

    async def _kill_exec(self, exec_id: str, pid: int) -> None:
        # The exec's children are not in a process group of their own (runc
        # does not setsid without a terminal): kill the whole host-side tree,
        # then let containerd signal the exec itself too.
        kill_process_tree(pid)
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._conn.tasks.Kill(
                tasks_pb2.KillRequest(container_id=self.id, exec_id=exec_id, signal=SIGKILL),
                metadata=self._conn.md(),
            )

    async def _delete_exec(self, exec_id: str) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self._conn.tasks.DeleteProcess(
                tasks_pb2.DeleteProcessRequest(container_id=self.id, exec_id=exec_id),
                metadata=self._conn.md(),
            )

    # -- files -----------------------------------------------------------------
    async def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        channel = await self._agent_for(None)
        if channel is not None:
            await channel.put_file(path, data, mode)
            return
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"'
        result = await self.exec_raw(["/bin/sh", "-c", script, "sh", path, f"{mode:o}"], stdin=data)
        if result.exit_code != 0:
            raise SandboxError(f"write {path!r} in sandbox {self.id!r}: {_first_line(result)}")

    async def read_file(self, path: str, max_bytes: int = DEFAULT_READ_LIMIT) -> bytes:
        channel = await self._agent_for(None)
        if channel is not None:
            from sandbox.agent import AgentError

            try:
                return await channel.get_file(path, max_bytes)
            except FileNotFound as err:
                raise FileNotFound(f"no file {path!r} in sandbox {self.id!r}") from err
            except AgentError:
                raise
            except SandboxError as err:
                raise SandboxError(f"read {path!r} in sandbox {self.id!r}: {err}") from err
        script = 'test -f "$1" || { echo "no such file" >&2; exit 2; }; cat -- "$1"'
        return await self._read_out("read", path, script, max_bytes)

    async def _read_out(self, what: str, path: str, script: str, max_bytes: int) -> bytes:
        """Run `script` with `path` as $1; its stdout, whole, or a one-line error."""
        result = await self.exec_raw(
            ["/bin/sh", "-c", script, "sh", path], output_limit_bytes=max_bytes
        )
        if result.exit_code == _NO_SUCH_FILE and what == "read":
            raise FileNotFound(f"no file {path!r} in sandbox {self.id!r}")
        if result.exit_code != 0:
            raise SandboxError(f"{what} {path!r} in sandbox {self.id!r}: {_first_line(result)}")
        if result.truncated:
            raise SandboxError(f"{what} {path!r} in sandbox {self.id!r}: larger than {max_bytes} B")
        return result.stdout

    async def put_tar(self, dest_dir: str, tar_bytes: bytes) -> None:
        result = await self.exec_raw(
            ["/bin/sh", "-c", 'mkdir -p "$1" && tar -x -C "$1" -f -', "sh", dest_dir],
            stdin=tar_bytes,
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"untar into {dest_dir!r} in sandbox {self.id!r}: {_first_line(result)}"
            )

    async def get_tar(self, path: str, max_bytes: int = DEFAULT_READ_LIMIT) -> bytes:
        script = 'cd "$(dirname "$1")" && tar -c -f - "$(basename "$1")"'
        return await self._read_out("tar", path, script, max_bytes)

    # -- state -----------------------------------------------------------------
    async def pause(self) -> None:
        await self._task_call(
            "pause", self._conn.tasks.Pause, tasks_pb2.PauseTaskRequest(container_id=self.id)
        )

    async def resume(self) -> None:
        await self._task_call(
            "resume", self._conn.tasks.Resume, tasks_pb2.ResumeTaskRequest(container_id=self.id)
        )

    async def status(self) -> str:
        """ "running", "paused", "stopped" (also when the task is gone), "created", "pausing"."""
        try:
            resp = await self._conn.tasks.Get(
                tasks_pb2.GetRequest(container_id=self.id), metadata=self._conn.md()
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return "stopped"
            raise map_grpc_error(err, f"status of sandbox {self.id!r}") from err
        return STATUS_NAMES.get(resp.process.status, "unknown")

    async def pid(self) -> int:
        """The host pid of the sandbox's PID 1 (its namespaces are reached through it)."""
        resp = await self._task_call(
            "pid", self._conn.tasks.Get, tasks_pb2.GetRequest(container_id=self.id)
        )
        return int(resp.process.pid)

    async def root_path(self) -> Path:
        """The sandbox's root filesystem as the host can reach it: through its PID 1,
        because the rootfs is mounted in its shim's mount namespace (sandbox/shimns.py)."""
        return Path(f"/proc/{await self.pid()}/root")

    async def _is_paused(self) -> bool:
        frozen = is_frozen(self.id)
        if frozen is not None:
            return frozen
        try:
            return await self.status() in ("paused", "pausing")
        except SandboxError:
            return False

    async def metrics(self) -> SandboxMetrics:
        request = tasks_pb2.MetricsRequest(filters=[f"id=={self.id}"])
        resp = await self._task_call("metrics", self._conn.tasks.Metrics, request)
        if not resp.metrics:
            raise SandboxError(f"metrics of sandbox {self.id!r}: containerd returned none")
        stats = cgroup_metrics_pb2.Metrics()
        stats.ParseFromString(resp.metrics[0].data.value)
        return SandboxMetrics(
            cpu_usage_ns=stats.cpu.usage.total,
            memory_bytes=stats.memory.usage.usage,
            memory_limit_bytes=stats.memory.usage.limit,
            pids=stats.pids.current,
            oom_kills=stats.memory_oom_control.oom_kill,
        )

    async def destroy(self) -> bool:
        return await self._client.destroy_sandbox(self.id)

    # -- network (quarantine) ----------------------------------------------------
    async def network_attachment(self) -> NetworkAttachment | None:
        """The sandbox's egress attachment, or None (network "none": loopback only)."""
        for att in await network.list_attachments(self._client.network_state_dir):
            if att.sandbox_id == self.id:
                return att
        return None

    async def cut_network(self) -> bool:
        """Quarantine: drop every packet to or from the sandbox, established flows too.

        Returns False when there is nothing to cut (no allowlist attached: the
        sandbox has loopback only). Idempotent; veth and rules stay in place.
        """
        if await self.network_attachment() is None:
            return False
        await network.cut_network(self.id, self._client.network_state_dir)
        return True

    async def restore_network(self) -> bool:
        """Undo cut_network; False when the sandbox has no allowlist attached."""
        if await self.network_attachment() is None:
            return False
        await network.restore_network(self.id, self._client.network_state_dir)
        return True

    async def _task_call(self, action: str, rpc: Any, request: Any) -> Any:
        try:
            return await rpc(request, metadata=self._conn.md())
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, f"{action} sandbox {self.id!r}") from err


async def _cancel(wait: asyncio.Future[Any]) -> None:
    if not wait.done():
        wait.cancel()
        with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
            await wait


def _raw_of(result: AgentResult) -> RawExecResult:
    return RawExecResult(
        exit_code=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
        duration_s=result.duration_s,
        timed_out=result.timed_out,
        truncated=result.truncated,
    )


def _durable_result(files: ExecFiles, output_limit_bytes: int) -> RawExecResult:
    end = files.end()
    assert end is not None, "recorded before"
    exit_code, timed_out, duration_s = end
    stdout, stderr, truncated = files.output(output_limit_bytes)
    return RawExecResult(
        exit_code=exit_code,
        stdout=stdout,
        stderr=stderr,
        duration_s=duration_s,
        timed_out=timed_out,
        truncated=truncated,
    )


def _check_exec_args(
    args: list[str], user: str | None, timeout_s: float | None, output_limit_bytes: int
) -> None:
    from contract.errors import InvalidSpec

    if not args or not all(isinstance(arg, str) for arg in args):
        raise InvalidSpec(f"exec cmd must be a non-empty list of strings, got {args!r}")
    if timeout_s is not None and timeout_s <= 0:
        raise InvalidSpec(f"exec timeout_s must be positive, got {timeout_s}")
    if output_limit_bytes < 0:
        raise InvalidSpec(f"exec output_limit_bytes must be >= 0, got {output_limit_bytes}")
    if user is not None:
        try:
            parse_user(user)
        except ValueError as exc:
            raise InvalidSpec(f"exec {exc}") from exc


def _raise_oom_score(pid: int) -> None:
    """Make an exec (and what it forks) the OOM killer's first choice, before PID 1.

    runc 1.1 ignores oomScoreAdj in an exec's process spec (execs inherit PID
    1's value), and lowering a score needs CAP_SYS_RESOURCE, which this host
    lacks; raising it from the host right after Start is allowed and cheap.
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(EXEC_OOM_SCORE_ADJ))


def _first_line(result: RawExecResult) -> str:
    text = (result.stderr or result.stdout).decode("utf-8", errors="replace").strip()
    line = text.splitlines()[0] if text else ""
    return f"exit {result.exit_code}" + (f": {line}" if line else "")
