"""Exec stdio through FIFOs, driven by the asyncio loop (no thread per stream).

The shim opens the write end of each output FIFO when the exec starts, and
the read end of the stdin FIFO. Two traps (FIELD-NOTES):
  * a non-blocking read end sees EOF before the shim connects. We hold a
    write end of our own (the *keeper*) until the process has exited, so the
    only EOF we can see is the one after the shim's last write;
  * data put in a FIFO that no one holds open is lost. The stdin FIFO is
    opened O_RDWR by us before Exec, written after Start, and closed to send
    EOF.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

OutputCallback = Callable[[str, bytes], Awaitable[None] | None]
READ_SIZE = 65536
FIFO_ROOT = Path(tempfile.gettempdir()) / "corral-exec-fifos"


class OutputCollector:
    """Keeps the first ``limit`` bytes of stdout and stderr together; drops the rest."""

    def __init__(self, limit: int, on_output: OutputCallback | None) -> None:
        self.limit = limit
        self.kept = 0
        self.truncated = False
        self.chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
        self._queue: asyncio.Queue[tuple[str, bytes] | None] | None = None
        self._pump: asyncio.Task[None] | None = None
        if on_output is not None:
            self._queue = asyncio.Queue()
            self._pump = asyncio.ensure_future(self._deliver(on_output))

    def add(self, stream: str, data: bytes) -> None:
        room = self.limit - self.kept
        if len(data) > room:
            self.truncated = True
            data = data[: max(room, 0)]
        if not data:
            return
        self.kept += len(data)
        self.chunks[stream].append(data)
        if self._queue is not None:
            self._queue.put_nowait((stream, data))

    def text(self, stream: str) -> bytes:
        return b"".join(self.chunks[stream])

    async def _deliver(self, on_output: OutputCallback) -> None:
        assert self._queue is not None
        while (item := await self._queue.get()) is not None:
            result = on_output(*item)
            if inspect.isawaitable(result):
                await result

    async def close(self) -> None:
        if self._queue is not None and self._pump is not None:
            self._queue.put_nowait(None)
            await self._pump


class OutputFifo:
    """The read end of one output FIFO, read by the event loop."""

    def __init__(self, path: Path, stream: str, sink: OutputCollector) -> None:
        self.path, self.stream, self.sink = path, stream, sink
        os.mkfifo(path, 0o600)
        self._loop = asyncio.get_running_loop()
        self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self._keeper: int | None = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        self.eof = self._loop.create_future()
        self._loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        while True:
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return
            if not data:
                self._loop.remove_reader(self._fd)
                if not self.eof.done():
                    self.eof.set_result(None)
                return
            self.sink.add(self.stream, data)

    def release_keeper(self) -> None:
        if self._keeper is not None:
            os.close(self._keeper)
            self._keeper = None

    def close(self) -> None:
        self.release_keeper()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            with contextlib.suppress(BlockingIOError):
                self._on_readable()  # last bytes already in the pipe
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


class StdinFifo:
    """The write end of the stdin FIFO (held O_RDWR so nothing is lost before the shim opens)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path, 0o600)
        self._fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
        self._loop = asyncio.get_running_loop()

    async def send(self, data: bytes) -> None:
        """Write all of ``data`` (waiting while the pipe is full), then close for EOF."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._fd, view[:READ_SIZE])
            except BlockingIOError:
                await self._writable()
                continue
            view = view[written:]
        self.close()

    async def _writable(self) -> None:
        ready: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(self._fd, wake)
        try:
            await ready
        finally:
            self._loop.remove_writer(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _StdinFeeder:
    """An exec's stdin FIFO (if it has one) and the task that writes it."""

    def __init__(self, stdin: StdinFifo | None) -> None:
        self.stdin = stdin
        self._stdin_task: asyncio.Task[None] | None = None

    @property
    def stdin_path(self) -> str:
        return str(self.stdin.path) if self.stdin else ""

    def feed_stdin(self, data: bytes, then: Callable[[], Awaitable[None]]) -> None:
        """Send ``data`` in the background, then call ``then`` (which closes the shim's side).

        The shim holds a write end of the stdin FIFO itself (so a client may
        reconnect); EOF reaches the process only after CloseIO, which must
        come after our bytes are in the FIFO.
        """
        if self.stdin is None:
            return
        stdin = self.stdin

        async def send_then_close() -> None:
            await stdin.send(data)
            await then()

        self._stdin_task = asyncio.ensure_future(send_then_close())

    async def _close_stdin(self) -> None:
        if self._stdin_task is not None and not self._stdin_task.done():
            self._stdin_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await self._stdin_task
        if self.stdin is not None:
            self.stdin.close()


class ExecPipes(_StdinFeeder):
    """The FIFOs of one exec, in a private directory removed on close."""

    def __init__(self, exec_id: str, with_stdin: bool, collector: OutputCollector) -> None:
        FIFO_ROOT.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f"{exec_id}-", dir=FIFO_ROOT))
        self.collector = collector
        self.stdout = OutputFifo(self.dir / "stdout", "stdout", collector)
        self.stderr = OutputFifo(self.dir / "stderr", "stderr", collector)
        super().__init__(StdinFifo(self.dir / "stdin") if with_stdin else None)

    @property
    def stdout_path(self) -> str:
        return str(self.stdout.path)

    @property
    def stderr_path(self) -> str:
        return str(self.stderr.path)

    async def drain(self, grace_s: float) -> bool:
        """After the process exited: wait up to ``grace_s`` for both EOFs; False if cut short.

        An EOF can be late or never come when a background child of the
        process still holds the pipe; we then stop reading rather than hang.
        """
        self.stdout.release_keeper()
        self.stderr.release_keeper()
        try:
            await asyncio.wait_for(asyncio.gather(self.stdout.eof, self.stderr.eof), grace_s)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        await self._close_stdin()
        self.stdout.close()
        self.stderr.close()
        await self.collector.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ExecFiles(_StdinFeeder):
    """An exec's stdout and stderr as regular files the shim appends to, and its end as a file.

    The shim, not this process, holds the output: a worker that dies while
    the exec runs loses nothing, and the next one finds the output and (once
    recorded) the exit code here. The interface matches ExecPipes where the
    sandbox drives an exec (paths, stdin, drain, close).
    """

    def __init__(self, directory: Path) -> None:
        super().__init__(None)
        self.dir = directory

    @classmethod
    def create(cls, directory: Path, with_stdin: bool) -> ExecFiles:
        files = cls(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("stdout", "stderr", "stdin", "end.json"):
            (directory / name).unlink(missing_ok=True)  # an attempt that never started
        # The shim opens the files O_APPEND without O_CREAT: they must exist.
        (directory / "stdout").touch(0o600)
        (directory / "stderr").touch(0o600)
        (directory / "started").write_text(str(time.time()))
        if with_stdin:
            files.stdin = StdinFifo(directory / "stdin")
        return files

    @property
    def started(self) -> bool:
        return (self.dir / "stdout").exists()

    @property
    def stdout_path(self) -> str:
        return str(self.dir / "stdout")

    @property
    def stderr_path(self) -> str:
        return str(self.dir / "stderr")

    async def drain(self, grace_s: float) -> bool:
        return True  # the shim flushes the files before DeleteProcess returns

    async def close(self) -> None:
        await self._close_stdin()
        if self.stdin is not None:
            self.stdin.path.unlink(missing_ok=True)

    def record_end(self, exit_code: int, timed_out: bool) -> None:
        """Written before the exec is deleted: afterwards only this file knows the exit code."""
        end = {"exit_code": exit_code, "timed_out": timed_out, "ended": time.time()}
        tmp = self.dir / "end.json.tmp"
        tmp.write_text(json.dumps(end))
        tmp.replace(self.dir / "end.json")

    def end(self) -> tuple[int, bool, float] | None:
        """(exit code, timed out, seconds it ran), once recorded."""
        try:
            end = json.loads((self.dir / "end.json").read_text())
            started = float((self.dir / "started").read_text())
        except (OSError, ValueError):
            return None
        return int(end["exit_code"]), bool(end["timed_out"]), float(end["ended"]) - started

    def output(self, limit: int) -> tuple[bytes, bytes, bool]:
        """(stdout, stderr, truncated): at most ``limit`` bytes of both, stdout first."""
        with open(self.dir / "stdout", "rb") as out:
            stdout = out.read(limit + 1)
        room = max(limit - len(stdout), 0)
        with open(self.dir / "stderr", "rb") as err:
            stderr = err.read(room + 1)
        truncated = len(stdout) > limit or len(stderr) > room
        return stdout[:limit], stderr[:room], truncated


def kill_process_tree(root_pid: int) -> int:
    """SIGKILL ``root_pid`` and all its descendants (host pids); return how many."""
    victims = [root_pid, *_descendants(root_pid)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return len(victims)


def _descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(b")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
