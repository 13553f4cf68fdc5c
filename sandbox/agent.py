"""The host side of the exec agent (``agent/``, docs/agent.md).

With the agent on, a sandbox's PID 1 is ``corral-agent`` (bind-mounted
read-only at ``/.corral/agent``), and its stdin and stdout are two FIFOs on the
host that containerd's shim connects to the task: a channel no process in the
sandbox can reach (no socket, no port, no file inside). ``AgentChannel`` speaks
the agent's framed protocol over them, many calls at once:

    header (20 bytes, big-endian): b"CRA1" | call id u32 | meta length u32 |
    data length u32 | crc32 of the first 16 bytes; then the JSON meta object,
    then the raw data.

The FIFOs are made (and opened) before the task is created; the channel is
kept per sandbox in this process (``channel_for``). The shim keeps a writer of
the stdin FIFO and a reader of the stdout FIFO of its own, so the agent outlives
the process that made its channel: a later process (a node worker after a
crash) attaches to the same FIFOs (``AgentChannel.attach``), skips what the
old reader left half-read, and numbers its calls away from the old ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import random
import select
import shutil
import stat
import struct
import zlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.errors import ExecFailed, FileNotFound, SandboxError, SandboxNotFound
from sandbox.exec_io import OutputCallback, OutputCollector
from sandbox.spec import AGENT_PATH  # where sandboxes see it (read-only bind mount)

__all__ = ["AGENT_PATH", "AgentChannel", "AgentError", "AgentResult", "agent_binary"]

BINARY_NAME = "corral-agent"
MAGIC = b"CRA1"
HEADER = struct.Struct(">4sIIII")
MAX_META = 1 << 20
MAX_DATA = 8 << 20
CHUNK = 1 << 20  # file data per frame
READ_SIZE = 1 << 20
PROTOCOL_VERSION = 1
REPO = Path(__file__).resolve().parents[1]


class AgentError(SandboxError):
    """The agent channel failed (gone, or a malformed frame)."""


class AgentGone(AgentError):
    """The channel ended: PID 1 (the agent) exited, or the sandbox was destroyed."""


class AgentProtocolError(AgentError):
    """A frame that does not follow the protocol: the stream cannot be trusted past it."""


def agent_binary() -> Path:
    """Where scripts/setup.sh builds the agent: ``$CORRAL_CACHE_DIR/agent/corral-agent``."""
    cache = os.environ.get("CORRAL_CACHE_DIR")
    return (Path(cache) if cache else REPO / ".cache") / "agent" / BINARY_NAME


# -- framing -----------------------------------------------------------------------
def encode_frame(call_id: int, meta: dict[str, Any], data: bytes = b"") -> bytes:
    body = json.dumps(meta, separators=(",", ":")).encode()
    if len(body) > MAX_META or len(data) > MAX_DATA:
        raise ValueError(f"frame too large: meta {len(body)} B, data {len(data)} B")
    head = struct.pack(">4sIII", MAGIC, call_id, len(body), len(data))
    return head + struct.pack(">I", zlib.crc32(head)) + body + data


@dataclass
class Frame:
    call_id: int
    meta: dict[str, Any]
    data: bytes = b""


class FrameDecoder:
    """Bytes in (any split), whole frames out.

    With ``resync`` (a channel attached to a running agent, whose earlier reader
    may have stopped mid-frame) bytes before the first valid header are skipped;
    after that frame, a bad header ends the stream as usual."""

    def __init__(self, resync: bool = False) -> None:
        self._buf = bytearray()
        self._resync = resync
        self.skipped = 0  # bytes dropped while resynchronising

    def feed(self, chunk: bytes) -> list[Frame]:
        self._buf += chunk
        frames = []
        while len(self._buf) >= HEADER.size:
            magic, call_id, meta_len, data_len, crc = HEADER.unpack_from(self._buf)
            if magic != MAGIC or zlib.crc32(bytes(self._buf[:16])) != crc:
                if self._resync:
                    self._skip_to_next_magic()
                    continue
                raise AgentProtocolError(f"bad frame header {bytes(self._buf[: HEADER.size])!r}")
            if meta_len > MAX_META or data_len > MAX_DATA:
                raise AgentProtocolError(f"frame too large: meta {meta_len}, data {data_len}")
            end = HEADER.size + meta_len + data_len
            if len(self._buf) < end:
                break
            meta_end = HEADER.size + meta_len
            try:
                meta = json.loads(bytes(self._buf[HEADER.size : meta_end]))
            except ValueError as err:
                raise AgentProtocolError(f"frame meta is not JSON: {err}") from err
            frames.append(Frame(call_id, meta, bytes(self._buf[meta_end:end])))
            del self._buf[:end]
            self._resync = False
        return frames

    def _skip_to_next_magic(self) -> None:
        found = self._buf.find(MAGIC, 1)
        drop = found if found > 0 else max(1, len(self._buf) - len(MAGIC) + 1)
        del self._buf[:drop]
        self.skipped += drop


# -- results -----------------------------------------------------------------------
@dataclass
class AgentResult:
    """A finished call, as the agent reports it."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_s: float
    timed_out: bool = False
    truncated: bool = False
    signal: int = 0
    rusage: dict[str, float] = field(default_factory=dict)


@dataclass
class JobStatus:
    running: bool
    exit_code: int | None = None
    timed_out: bool = False
    duration_s: float | None = None
    signal: int = 0


@dataclass
class JobOutput:
    data: bytes
    offset: int  # where data starts (later than asked when the buffer dropped older bytes)
    total: int  # bytes the stream has produced so far
    running: bool


# -- the channel -------------------------------------------------------------------
class AgentChannel:
    """One sandbox's channel: the host ends of the agent's stdin and stdout FIFOs."""

    def __init__(self, directory: Path, *, attached: bool = False) -> None:
        self.dir = directory
        self.stdin_path = str(directory / "in")
        self.stdout_path = str(directory / "out")
        self._in_fd = -1
        self._out_fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._decoder = FrameDecoder(resync=attached)
        self._calls: dict[int, asyncio.Queue[Frame | BaseException]] = {}
        # An attached channel may still receive the old process's replies (its
        # calls were numbered from 1): start far from them.
        self._next_id = random.randrange(1 << 30, 1 << 31) if attached else 0
        self._write_lock: asyncio.Lock | None = None
        self._queued = 0  # frames waiting for the write lock
        self._tasks: set[asyncio.Future[None]] = set()
        self.closed: BaseException | None = None

    @classmethod
    def prepare(cls, directory: Path) -> AgentChannel:
        """Make the FIFOs and open the host's ends: before the task is created
        (the shim's open of the stdout FIFO waits for a reader)."""
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True, mode=0o700)
        channel = cls(directory)
        os.mkfifo(channel.stdin_path, 0o600)
        os.mkfifo(channel.stdout_path, 0o600)
        channel._open_host_ends()
        return channel

    def _open_host_ends(self) -> None:
        self._out_fd = os.open(self.stdout_path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        # Read-write: opening never blocks, and the host holds the writer the shim waits for.
        self._in_fd = os.open(self.stdin_path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)

    @classmethod
    def attach(cls, directory: Path) -> AgentChannel | None:
        """The host's ends of a running agent's FIFOs, opened again by another
        process than the one that made them; None when they are not there."""
        channel = cls(directory, attached=True)
        try:
            if not all(
                stat.S_ISFIFO(os.stat(p).st_mode) for p in (channel.stdin_path, channel.stdout_path)
            ):
                return None
            channel._open_host_ends()
        except OSError:
            channel.close()
            return None
        return channel

    @property
    def alive(self) -> bool:
        return self._in_fd >= 0 and self.closed is None

    def start(self) -> None:
        """Begin reading (after the task started: the shim holds its writer by then)."""
        self._loop = asyncio.get_running_loop()
        self._write_lock = asyncio.Lock()
        self._loop.add_reader(self._out_fd, self._on_readable)

    def _on_readable(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self._out_fd, READ_SIZE)
                except BlockingIOError:
                    return
                if not chunk:
                    self._fail(AgentGone("the agent closed its channel (its task ended)"))
                    return
                for frame in self._decoder.feed(chunk):
                    queue = self._calls.get(frame.call_id)
                    if queue is not None:
                        queue.put_nowait(frame)
        except (AgentProtocolError, OSError) as err:
            self._fail(err if isinstance(err, AgentError) else AgentError(str(err)))

    def _fail(self, err: BaseException) -> None:
        if self.closed is None:
            self.closed = err
        if self._loop is not None and self._out_fd >= 0:
            with contextlib.suppress(ValueError, OSError):
                self._loop.remove_reader(self._out_fd)
        for queue in self._calls.values():
            queue.put_nowait(err)

    def close(self) -> None:
        self._fail(AgentGone("the agent channel was closed"))
        for fd in (self._in_fd, self._out_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._in_fd = self._out_fd = -1

    async def _write(self, buf: bytes) -> None:
        assert self._loop is not None and self._write_lock is not None, "start() first"
        view = memoryview(buf)
        async with self._write_lock:
            while view:
                if self.closed is not None:
                    raise _again(self.closed)
                try:
                    written = os.write(self._in_fd, view)
                    view = view[written:]
                except BlockingIOError:
                    await self._writable()
                except OSError as err:
                    if err.errno in (errno.EPIPE, errno.EBADF):
                        raise AgentError(f"agent channel: {err}") from err
                    raise

    async def _writable(self) -> None:
        assert self._loop is not None
        ready: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(self._in_fd, wake)
        try:
            await ready
        finally:
            self._loop.remove_writer(self._in_fd)

    @contextlib.asynccontextmanager
    async def _call(self) -> AsyncIterator[tuple[int, asyncio.Queue[Frame | BaseException]]]:
        if self.closed is not None:
            raise _again(self.closed)
        self._next_id = self._next_id % 0xFFFFFFFE + 1
        call_id = self._next_id
        queue: asyncio.Queue[Frame | BaseException] = asyncio.Queue()
        self._calls[call_id] = queue
        try:
            yield call_id, queue
        finally:
            self._calls.pop(call_id, None)

    async def _send(self, call_id: int, meta: dict[str, Any], data: bytes = b"") -> None:
        frame = encode_frame(call_id, meta, data)
        if self._write_now(frame):
            return
        # Shielded: a caller cancelled mid-frame must not leave half a frame behind
        # (the agent could not find the next one); the frame is finished regardless.
        self._queued += 1
        writing = asyncio.ensure_future(self._write(frame))
        writing.add_done_callback(self._dequeue)
        await asyncio.shield(writing)

    def _dequeue(self, _: asyncio.Future[None]) -> None:
        self._queued -= 1

    def _write_now(self, frame: bytes) -> bool:
        """A small frame at once, when no other write is under way or queued (a
        call's request, as a rule): a FIFO takes up to PIPE_BUF bytes whole or
        not at all, so nothing is left half-written, and no task is needed (a
        task and its wake-ups per call cost more than the write). False: the
        frame takes the queue."""
        lock = self._write_lock
        if len(frame) > select.PIPE_BUF or lock is None or lock.locked() or self._queued:
            return False
        if self.closed is not None:
            return False  # the queue raises why
        try:
            os.write(self._in_fd, frame)
        except BlockingIOError:
            return False
        except OSError as err:
            if err.errno in (errno.EPIPE, errno.EBADF):
                raise AgentError(f"agent channel: {err}") from err
            raise
        return True

    @staticmethod
    async def _next(queue: asyncio.Queue[Frame | BaseException]) -> Frame:
        item = await queue.get()
        if isinstance(item, BaseException):
            raise item
        if item.meta.get("op") == "error":
            raise _error_of(item.meta)
        return item

    async def request(self, meta: dict[str, Any], data: bytes = b"") -> Frame:
        """One request, one reply."""
        async with self._call() as (call_id, queue):
            await self._send(call_id, meta, data)
            return await self._next(queue)

    # -- calls -----------------------------------------------------------------
    async def hello(self) -> dict[str, Any]:
        return (await self.request({"op": "hello"})).meta

    async def fill_partial_frame(self) -> None:
        """Bytes enough to complete any frame an earlier host left half-written
        on the agent's stdin (which would otherwise swallow ours); the agent
        then skips them to the next whole frame."""
        await self._write(bytes(HEADER.size + MAX_META + MAX_DATA))

    async def run(
        self,
        cmd: list[str] | str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        output_limit_bytes: int = 1 << 20,
        on_output: OutputCallback | None = None,
        session: str | None = None,
        pty: bool = False,
    ) -> AgentResult:
        """Run ``cmd`` (a str runs via /bin/sh -c) to its end; output streams to
        ``on_output`` as it comes. With ``session``, cwd and exported variables
        carry over between calls of that session (a shell is needed)."""
        meta = _command(cmd) | {"op": "run", "max_output": output_limit_bytes + 1}
        meta |= _optional(env=env, cwd=cwd, timeout_s=timeout_s, session=session)
        if pty:
            meta |= {"pty": True, "rows": 24, "cols": 80}
        stdin = stdin or b""
        if len(stdin) > CHUNK:  # more than a frame holds: stdin frames after the call
            meta["stdin_open"] = True
        collector = OutputCollector(output_limit_bytes, on_output)
        feeding: asyncio.Future[None] | None = None
        try:
            async with self._call() as (call_id, queue):
                await self._send(call_id, meta, b"" if meta.get("stdin_open") else stdin)
                if meta.get("stdin_open"):
                    feeding = asyncio.ensure_future(self._feed_stdin(call_id, stdin))
                try:
                    while True:
                        frame = await self._next(queue)
                        if frame.meta.get("op") == "out":
                            collector.add(str(frame.meta.get("stream", "stdout")), frame.data)
                            continue
                        end = frame.meta
                        break
                except asyncio.CancelledError:
                    # Nobody waits for it any more: kill its tree rather than leave it running.
                    self._background(self._send(call_id, {"op": "kill", "job": call_id}))
                    raise
        finally:
            if feeding is not None and not feeding.done():
                feeding.cancel()  # the process ended without reading it all
                with contextlib.suppress(asyncio.CancelledError, AgentError):
                    await feeding
            await collector.close()
        return AgentResult(
            exit_code=int(end["exit_code"]),
            stdout=collector.text("stdout"),
            stderr=collector.text("stderr"),
            duration_s=float(end.get("duration_s", 0.0)),
            timed_out=bool(end.get("timed_out")),
            truncated=collector.truncated,
            signal=int(end.get("signal", 0)),
            rusage=dict(end.get("rusage") or {}),
        )

    def _background(self, work: Awaitable[None]) -> None:
        """Run ``work`` to its end on its own, errors ignored (a channel may be gone)."""

        async def quietly() -> None:
            with contextlib.suppress(AgentError, OSError):
                await work

        task = asyncio.ensure_future(quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _feed_stdin(self, call_id: int, stdin: bytes) -> None:
        view = memoryview(stdin)
        for start in range(0, len(stdin), CHUNK):
            last = start + CHUNK >= len(stdin)
            meta = {"op": "stdin", "job": call_id, "eof": last}
            await self._send(call_id, meta, bytes(view[start : start + CHUNK]))

    async def spawn(
        self,
        cmd: list[str] | str,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        buffer_bytes: int | None = None,
        pty: tuple[int, int] | None = None,
    ) -> int:
        """Start a background job; returns its id. Its output is kept (the last
        ``buffer_bytes`` of each stream, default 4 MiB) for ``output``. With ``pty``
        (rows, cols) it runs on a pseudo-terminal that ``send_stdin`` types into."""
        meta = _command(cmd) | {"op": "spawn"}
        meta |= _optional(env=env, cwd=cwd, timeout_s=timeout_s, buffer=buffer_bytes)
        if pty is not None:
            meta |= {"pty": True, "rows": pty[0], "cols": pty[1]}
        return int((await self.request(meta)).meta["job"])

    async def send_stdin(self, job: int, data: bytes, eof: bool = False) -> None:
        """Bytes for a job's stdin (its terminal, for a PTY job); the agent sends no reply."""
        view = memoryview(data)
        for start in range(0, max(len(data), 1), CHUNK):
            last = start + CHUNK >= len(data)
            meta = {"op": "stdin", "job": job, "eof": eof and last}
            await self._send(job, meta, bytes(view[start : start + CHUNK]))

    async def output(
        self, job: int, stream: str = "stdout", offset: int = 0, max_bytes: int = 0
    ) -> JobOutput:
        reply = await self.request(
            {"op": "output", "job": job, "stream": stream, "offset": offset, "max": max_bytes}
        )
        meta = reply.meta
        return JobOutput(reply.data, int(meta["offset"]), int(meta["total"]), bool(meta["running"]))

    async def wait(self, job: int, timeout_s: float | None = None) -> JobStatus:
        request = {"op": "wait", "job": job} | _optional(timeout_s=timeout_s)
        meta = (await self.request(request)).meta
        if meta.get("running"):
            return JobStatus(running=True)
        return JobStatus(
            running=False,
            exit_code=int(meta["exit_code"]),
            timed_out=bool(meta.get("timed_out")),
            duration_s=float(meta.get("duration_s", 0.0)),
            signal=int(meta.get("signal", 0)),
        )

    async def kill(self, job: int, signal: int = 9) -> None:
        """Signal the job's whole tree (SIGKILL: stopped first, so nothing escapes)."""
        await self.request({"op": "kill", "job": job, "signal": signal})

    async def forget(self, job: int) -> None:
        await self.request({"op": "forget", "job": job})

    async def put_file(self, path: str, data: bytes, mode: int = 0o644) -> str:
        """Write ``data`` to ``path`` (parents made, replaced atomically); its sha256."""
        digest = hashlib.sha256(data).hexdigest()
        async with self._call() as (call_id, queue):
            await self._send(call_id, {"op": "put_begin", "path": path, "mode": mode})
            view = memoryview(data)
            for start in range(0, len(data), CHUNK):
                await self._send(call_id, {"op": "put_data"}, bytes(view[start : start + CHUNK]))
            await self._send(call_id, {"op": "put_end", "sha256": digest})
            reply = await self._next(queue)
        if reply.meta.get("sha256") != digest or int(reply.meta.get("size", -1)) != len(data):
            raise AgentError(f"write {path!r}: the agent wrote {reply.meta}, sent {digest}")
        return digest

    async def get_file(self, path: str, max_bytes: int = 0) -> bytes:
        """The file's bytes, checked against the agent's sha256."""
        parts: list[bytes] = []
        async with self._call() as (call_id, queue):
            await self._send(call_id, {"op": "get", "path": path, "max": max_bytes})
            while True:
                frame = await self._next(queue)
                if frame.meta.get("op") == "data":
                    parts.append(frame.data)
                    continue
                end = frame.meta
                break
        data = b"".join(parts)
        if hashlib.sha256(data).hexdigest() != end.get("sha256"):
            raise AgentError(f"read {path!r}: sha256 mismatch")
        return data


def _again(closed: BaseException) -> AgentError:
    """The error that closed the channel, for a later call."""
    return AgentGone(str(closed)) if isinstance(closed, AgentGone) else AgentError(str(closed))


def _command(cmd: list[str] | str) -> dict[str, Any]:
    if isinstance(cmd, str):
        return {"shell": cmd}
    if not cmd or not all(isinstance(arg, str) for arg in cmd):
        raise ValueError(f"cmd must be a str or a non-empty list of str, got {cmd!r}")
    return {"argv": list(cmd)}


def _optional(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def _error_of(meta: dict[str, Any]) -> SandboxError:
    kind, message = meta.get("kind"), str(meta.get("error", "agent error"))
    if kind == "not_found" and message.startswith("read "):
        return FileNotFound(message)
    if kind == "start_failed":
        return ExecFailed(message)
    if kind == "not_found":
        return SandboxNotFound(message)
    return SandboxError(message)


# -- channels by sandbox, in this process -----------------------------------------
_CHANNELS: dict[str, AgentChannel] = {}


def register(channel: AgentChannel) -> None:
    _CHANNELS[str(channel.dir)] = channel


def channel_for(directory: Path) -> AgentChannel | None:
    """The live channel made in this process for that sandbox, or None."""
    channel = _CHANNELS.get(str(directory))
    if channel is None or not channel.alive:
        return None
    with contextlib.suppress(RuntimeError):
        if channel._loop is not asyncio.get_running_loop():
            return None  # made under another event loop
    return channel


def forget(directory: Path) -> None:
    """Close the sandbox's channel (if any) and remove its FIFOs."""
    channel = _CHANNELS.pop(str(directory), None)
    if channel is not None:
        channel.close()
    with contextlib.suppress(FileNotFoundError):
        for entry in directory.iterdir():
            if stat.S_ISFIFO(entry.lstat().st_mode):
                entry.unlink(missing_ok=True)
        directory.rmdir()
