"""The sensor: supervises the tracer and turns its output into ``Event`` objects.

Two backends trace the same syscalls with the same kernel-side filter:
``bpftrace`` (a generated script, ``program.py``; JSON lines read by
``parser.Parser``) and ``libbpf`` (the compiled ``bpf/`` program and its
loader, ``libbpf.py``; binary records read by ``binparser.BinaryParser``).
``backend="auto"`` takes libbpf when its loader is built and loads, else
bpftrace, and logs why.

    sensor = Sensor({"openat", "execve", "connect"}, resolver=labels_from_containerd)
    await sensor.start()
    await sensor.wait_ready()
    async for evt in sensor.events(): ...
    await sensor.stop()

or ``await sensor.run(engine.on_event)``. Kernel-side filtering is described
in ``policies.sensor.program``.

The watermark: ``await sensor.tick(timeout_s)`` is "ok" once every record the
kernel wrote before the call has been parsed and its events delivered to the
callbacks (the loader answers a ``tick N`` line on its stdin after its next
full drain of the ring buffer, in order with the records; concurrent callers
share one tick), "behind" when that takes longer than ``timeout_s``, "down"
when the tracer is not running (or dies before answering), "unsupported" on
the bpftrace backend. ``stats.gaps`` counts what may have gone unseen: each
tracer exit (a restart) and each report of records the kernel had no room
for; compare it before and after a step.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import resource
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from policies.falco.event import Event
from policies.sensor import cgroups as cg
from policies.sensor import libbpf as lb
from policies.sensor import program as pg
from policies.sensor.binparser import BinaryParser
from policies.sensor.parser import Parser
from policies.sensor.proctable import ProcessTable

log = logging.getLogger("corral.sensor")

TRACEFS = Path("/sys/kernel/tracing")
MEMLOCK = 8 << 20  # the machine's hard cap; bpftrace wants it raised explicitly
STREAM_LIMIT = 1 << 20
READ_CHUNK = 1 << 16
BATCH_WAIT_S = 0.01  # alert latency it adds is at most this; the budget is 1 s
PIPE_SIZE = 1 << 20  # Linux's default pipe-max-size
BINARY_CHUNK = 1 << 20  # the loader writes what its ring held every 10 ms, in one go


def _enlarge_pipe(stream: asyncio.StreamReader) -> None:
    transport = getattr(stream, "_transport", None)
    pipe = transport.get_extra_info("pipe") if transport is not None else None
    if pipe is not None:
        # ValueError: the tracer already exited and its pipe is closed (a loader
        # that fails at once); the read then sees EOF and the supervisor decides.
        with contextlib.suppress(OSError, ValueError):
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)


@dataclass(slots=True)
class SensorStats:
    events: int = 0  # delivered to callbacks / the queue
    dropped: int = 0  # queue full: the consumer is too slow
    lost: int = 0  # lost in the kernel (perf buffer full), reported by bpftrace
    records: int = 0
    bad_lines: int = 0
    restarts: int = 0
    callback_errors: int = 0
    gaps: int = 0  # tracer exits and loss reports: events may be missing around them
    ticks: int = 0  # watermark ticks answered "ok"
    ticks_behind: int = 0  # tick() calls that timed out


def ensure_tracefs(path: Path = TRACEFS) -> None:
    if (path / "events").is_dir():
        return
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tracefs", "nodev", str(path)], check=True)


def kn_parent_field() -> str:
    """``kernfs_node.parent`` became ``__parent`` in Linux 6.15."""
    out = subprocess.run(
        ["bpftrace", "-lv", "struct kernfs_node"], capture_output=True, text=True, check=False
    ).stdout
    return "__parent" if "__parent" in out else "parent"


CANARY_PREFIX = "corral-sensor-canary-"
CANARY_TIMEOUT_S = 60.0


def _from_canary(evt: Event) -> bool:
    return evt.container is not None and evt.container.full_id.startswith(CANARY_PREFIX)


def _limit_memlock() -> None:
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        want = MEMLOCK if hard == resource.RLIM_INFINITY else min(MEMLOCK, hard)
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (want, hard))


class Sensor:
    def __init__(
        self,
        event_types: Iterable[str],
        *,
        resolver: cg.ContainerResolver | None = None,
        controller: str = cg.DEFAULT_CONTROLLER,
        bpftrace: str = "bpftrace",
        queue_size: int = 65536,
        backoff: tuple[float, float] = (0.5, 30.0),
        map_keys: int = 16384,
        perf_pages: int = 256,
        prefilter: Callable[[Event], bool] | None = None,
        exe_details: bool = True,
        backend: str = "auto",
        loader: Path | None = None,
    ) -> None:
        if backend not in lb.BACKENDS:
            raise ValueError(f"sensor backend {backend!r} is not one of {', '.join(lb.BACKENDS)}")
        self.event_types = frozenset(event_types)
        self.backend = backend
        self.loader = loader or lb.loader_path()
        self.active_backend = self._choose_backend()
        self.controller = controller
        self.bpftrace = shutil.which(bpftrace) or bpftrace
        self.cgroups = cg.CgroupMap(resolver, controller)
        self.table = ProcessTable()
        self._prefilter = prefilter
        self.parser: Parser = self._new_parser()
        self.exe_details = exe_details
        self.stats = SensorStats()
        self.program: pg.Program | None = None
        self._callbacks: list[Callable[[Event], None]] = []
        self._queue: asyncio.Queue[Event] = asyncio.Queue(queue_size)
        self._backoff = backoff
        self._env = {
            "BPFTRACE_MAP_KEYS_MAX": str(map_keys),
            "BPFTRACE_PERF_RB_PAGES": str(perf_pages),
            "BPFTRACE_STRLEN": str(pg.STRLEN),
        }
        self._task: asyncio.Task[None] | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._canary_cgid: int | None = None
        self._canary: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stopping = False
        self._parent_id = 0
        self._attached_once = False  # the libbpf loader attached at least once
        self._last_error = ""
        self._tmp = tempfile.TemporaryDirectory(prefix="corral-sensor-")
        # The watermark: tick numbers asked of the loader, and who waits for which.
        self._tick_seq = 0
        self._tick_unsent: int | None = None  # allocated, written on the next loop turn
        self._tick_waiters: dict[int, asyncio.Future[str]] = {}
        self._lost_seen = 0
        self._dropped_seen = 0

    # ------------------------------------------------------------ public

    def add_callback(self, cb: Callable[[Event], None]) -> None:
        self._callbacks.append(cb)

    async def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.create_task(self._supervise(), name="corral-sensor")

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Until the syscall probes are proven live (compiling takes seconds).

        bpftrace reports "attached_probes" before this kernel fires the syscall
        tracepoints (seconds later, seen here), so readiness waits for the
        exec of a canary process in a cgroup of its own under the sandbox
        parent; the canary's events are never delivered.
        """
        await asyncio.wait_for(self._ready.wait(), timeout)

    async def stop(self) -> None:
        self._stopping = True
        await self._kill()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._ready.clear()

    def attached(self) -> bool:
        """The tracer is attached and proven live (its probes fire)."""
        return self._ready.is_set()

    async def tick(self, timeout_s: float) -> str:
        """The watermark: "ok" once every record the kernel wrote before this
        call has been parsed and its events delivered to the callbacks;
        "behind" if that did not happen in ``timeout_s``; "down" if the tracer
        is not running (or exits first); "unsupported" on the bpftrace backend."""
        if self.active_backend != "libbpf":
            return "unsupported"
        proc = self._proc
        if proc is None or proc.returncode is not None or proc.stdin is None:
            return "down"
        if not self._ready.is_set():
            return "down"
        n = self._tick_unsent
        if n is None:
            # Callers in the same loop turn share it: it is written after them all.
            self._tick_seq += 1
            n = self._tick_unsent = self._tick_seq
            self._tick_waiters[n] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._send_tick, proc)
        fut = self._tick_waiters[n]
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            self.stats.ticks_behind += 1
            return "behind"

    def _send_tick(self, proc: asyncio.subprocess.Process) -> None:
        n, self._tick_unsent = self._tick_unsent, None
        if n is None:
            return
        if proc is not self._proc or proc.returncode is not None or proc.stdin is None:
            self._end_ticks("down")
            return
        try:
            proc.stdin.write(f"tick {n}\n".encode())
        except (OSError, RuntimeError):  # the loader is gone: its reader ends the ticks
            self._end_ticks("down")

    def _answer_ticks(self, upto: int) -> None:
        for n in [n for n in self._tick_waiters if n <= upto]:
            fut = self._tick_waiters.pop(n)
            if not fut.done():
                fut.set_result("ok")
            self.stats.ticks += 1

    def _end_ticks(self, result: str) -> None:
        """The tracer is gone: nobody will answer the ticks asked of it."""
        waiters, self._tick_waiters = self._tick_waiters, {}
        self._tick_unsent = None
        for fut in waiters.values():
            if not fut.done():
                fut.set_result(result)

    def forget(self, full_id: str) -> None:
        """A sandbox went away: drop what was cached for it (its cgroup id may be reused)."""
        self.cgroups.forget(full_id)
        self.parser.forget_container(full_id)

    async def events(self) -> AsyncIterator[Event]:
        while True:
            yield await self._queue.get()

    async def run(self, on_event: Callable[[Event], None]) -> None:
        """Start, deliver every event to ``on_event`` until cancelled, then stop."""
        self.add_callback(on_event)
        self._queue = asyncio.Queue(1)  # callbacks only: do not buffer
        await self.start()
        try:
            assert self._task is not None
            await asyncio.shield(self._task)
        finally:
            await self.stop()

    # ------------------------------------------------------------ backend

    def _choose_backend(self) -> str:
        if self.backend == "bpftrace":
            return "bpftrace"
        if self.loader is None:
            if self.backend == "libbpf":
                return "libbpf"  # fails at start with the reason, retried like bpftrace
            log.info("sensor: backend bpftrace (no %s built in %s; scripts/setup.sh builds it)",
                     lb.LOADER, lb.build_dir())  # fmt: skip
            return "bpftrace"
        if self.backend == "auto":
            log.info("sensor: backend libbpf (%s)", self.loader)
        return "libbpf"

    def _new_parser(self) -> Parser:
        kind = BinaryParser if self.active_backend == "libbpf" else Parser
        return kind(self.cgroups, self.table, self.event_types, self._prefilter)

    def _fall_back(self, why: str) -> None:
        log.warning("sensor: backend bpftrace (libbpf did not load: %s)", why)
        self.active_backend = "bpftrace"
        self.parser = self._new_parser()
        self._lost_seen = 0

    # ------------------------------------------------------------ supervision

    def _generate(self) -> Path:
        ensure_tracefs()
        self._parent_id = cg.ensure_parent(self.controller)
        cfg = pg.FilterConfig(self._parent_id, cg.subsys_index(self.controller), kn_parent_field())
        self.program = pg.generate(self.event_types, cfg, exe_details=self.exe_details)
        if self.program.unavailable:
            log.warning("sensor: no tracepoint for %s", ", ".join(self.program.unavailable))
        path = Path(self._tmp.name) / "sensor.bt"
        path.write_text(self.program.text)
        return path

    async def _supervise(self) -> None:
        delay = self._backoff[0]
        while not self._stopping:
            name = self.active_backend
            try:
                if name == "libbpf":
                    rc = await self._run_libbpf()
                    if self.backend == "auto" and not self._attached_once and not self._stopping:
                        self._fall_back(self._last_error or f"exit status {rc}")
                        continue
                else:
                    rc = await self._run_once(self._generate())
                log.warning("sensor: %s exited with %s", name, rc)
                if not self._stopping:
                    self._gap(f"{name} exited with {rc}")
            except (OSError, subprocess.CalledProcessError) as exc:
                log.error("sensor: cannot start %s: %s", name, exc)
                if name == "libbpf" and self.backend == "auto" and not self._attached_once:
                    self._fall_back(str(exc))
                    continue
            if self._stopping:
                break
            self.stats.restarts += 1
            self._ready.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _run_once(self, script: Path) -> int | None:
        proc = self._proc = await asyncio.create_subprocess_exec(
            self.bpftrace, "-f", "json", "-B", "none", str(script),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **self._env}, preexec_fn=_limit_memlock,
            limit=STREAM_LIMIT, start_new_session=True,
        )  # fmt: skip
        return await self._drain(proc, self._read_stdout)

    async def _run_libbpf(self) -> int | None:
        if self.loader is None:
            raise OSError(f"{lb.LOADER} is not built in {lb.build_dir()} (scripts/setup.sh)")
        ensure_tracefs()
        self._parent_id = cg.ensure_parent(self.controller)
        cfg = pg.FilterConfig(self._parent_id, cg.subsys_index(self.controller))
        syscalls, unavailable = pg.select_syscalls(self.event_types, lb.available)
        self.program = pg.Program("", tuple(syscalls), tuple(unavailable))
        if unavailable:
            log.warning("sensor: no tracepoint for %s", ", ".join(unavailable))
        args = lb.loader_args(syscalls, cfg, exe_details=self.exe_details)
        self._last_error = ""
        proc = self._proc = await asyncio.create_subprocess_exec(
            str(self.loader), *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        return await self._drain(proc, self._read_binary)

    async def _drain(
        self,
        proc: asyncio.subprocess.Process,
        read: Callable[[asyncio.subprocess.Process], Awaitable[None]],
    ) -> int | None:
        """Read the tracer's records until it exits (logging its stderr, and
        stopping it if this process's parent dies); its exit status."""
        watch = asyncio.create_task(self._watch_parent())
        errs = asyncio.create_task(self._log_stderr(proc))
        try:
            await read(proc)
            return await proc.wait()
        finally:
            watch.cancel()
            await errs

    async def _read_binary(self, proc: asyncio.subprocess.Process) -> None:
        # The loader drains the ring buffer every 10 ms and writes it at once:
        # one read serves a batch of records, no extra wait is needed.
        assert proc.stdout is not None
        _enlarge_pipe(proc.stdout)
        parser = self.parser
        assert isinstance(parser, BinaryParser)
        rest = b""
        out: list[Event] = []
        try:
            while chunk := await proc.stdout.read(BINARY_CHUNK):
                data = rest + chunk if rest else chunk
                used = parser.feed_bytes(data, out)
                rest = data[used:]
                if not self._ready.is_set():
                    self._check_binary_ready(parser)
                for evt in out:
                    if not _from_canary(evt):
                        self._deliver(evt)
                out.clear()
                self._sync_stats()
                if self._tick_waiters:
                    self._answer_ticks(parser.tick)  # after the events before them
        finally:
            self._end_ticks("down")
            if self._canary is not None:
                self._canary.cancel()
                self._canary = None

    def _gap(self, why: str) -> None:
        self.stats.gaps += 1
        log.warning("sensor: gap %d: %s", self.stats.gaps, why)

    def _check_binary_ready(self, parser: BinaryParser) -> None:
        if parser.attached and self._canary is None:
            self._attached_once = True
            self._canary = asyncio.create_task(self._prove_live())
        if self._canary_cgid is not None:
            parser.watch_cgid = self._canary_cgid
        if parser.watch_seen:
            self._ready.set()

    async def _read_stdout(self, proc: asyncio.subprocess.Process) -> None:
        # Whole chunks, split here: a readline per record cost more than the parse.
        # After a short chunk, wait a moment for more: bpftrace writes each record
        # on its own, and one event-loop wake-up per few records cost more CPU
        # than parsing them (the pipe is enlarged so that the wait never blocks it).
        assert proc.stdout is not None
        _enlarge_pipe(proc.stdout)
        rest = b""
        try:
            while chunk := await proc.stdout.read(READ_CHUNK):
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    self._on_line(line)
                self._sync_stats()
                if len(chunk) < READ_CHUNK:
                    await asyncio.sleep(BATCH_WAIT_S)
        finally:
            if self._canary is not None:
                self._canary.cancel()
                self._canary = None

    def _on_line(self, line: bytes) -> None:
        if not self._ready.is_set():
            if self._canary is None and b'"attached_probes"' in line:
                self._canary = asyncio.create_task(self._prove_live())
                return
            if self._is_canary_syscall(line):
                self._ready.set()
                return
        evt = self.parser.feed(line)
        if evt is not None and not _from_canary(evt):
            self._deliver(evt)

    async def _prove_live(self) -> None:
        """Run a canary in its own cgroup until its exec comes through."""
        path = cg.parent_dir(self.controller) / f"{CANARY_PREFIX}{os.getpid()}"
        path.mkdir(exist_ok=True)
        self._canary_cgid = path.stat().st_ino
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANARY_TIMEOUT_S
        try:
            while not self._ready.is_set():
                if loop.time() > deadline:
                    log.error(
                        "sensor: no canary event in %.0f s; syscall probes may be dead",
                        CANARY_TIMEOUT_S,
                    )
                    self._ready.set()
                    break
                child = await asyncio.create_subprocess_exec(
                    "sh", "-c", f"echo $$ > {path}/cgroup.procs && exec true",
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                await child.wait()
                await asyncio.sleep(0.1)
        finally:
            for _ in range(50):  # the canary's exit may lag a moment
                try:
                    path.rmdir()
                    break
                except OSError:
                    await asyncio.sleep(0.05)

    def _is_canary_syscall(self, line: bytes) -> bool:
        """A syscall or exec record (not fork/exit) from the canary's cgroup."""
        if self._canary_cgid is None or b'"value"' not in line:
            return False
        try:
            data = json.loads(line)["data"]
            return data[0] in (pg.REC_SYSCALL, pg.REC_EXEC_ENTER) and data[4] == self._canary_cgid
        except (ValueError, KeyError, IndexError, TypeError):
            return False

    def _deliver(self, evt: Event) -> None:
        self.stats.events += 1
        for cb in self._callbacks:
            try:
                cb(evt)
            except Exception:  # one bad consumer must not stop the sensor
                self.stats.callback_errors += 1
                log.exception("sensor: callback failed")
        if not self._callbacks:
            try:
                self._queue.put_nowait(evt)
            except asyncio.QueueFull:
                self.stats.dropped += 1

    def _sync_stats(self) -> None:
        ps = self.parser.stats
        if ps.lost != self._lost_seen:
            self._gap(f"{ps.lost - self._lost_seen} records lost in the kernel")
            self._lost_seen = ps.lost
        if self.stats.dropped != self._dropped_seen:
            self._gap(f"{self.stats.dropped - self._dropped_seen} events dropped (queue full)")
            self._dropped_seen = self.stats.dropped
        self.stats.lost, self.stats.records, self.stats.bad_lines = (
            ps.lost,
            ps.records,
            ps.bad_lines,
        )

    async def _log_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        name = self.active_backend
        while line := await proc.stderr.readline():
            text = line.decode(errors="replace").rstrip()
            if "RLIMIT_MEMLOCK" not in text:  # bpftrace always tries to lift it
                log.warning("%s: %s", name, text)
                self._last_error = text

    async def _watch_parent(self) -> None:
        """Restart if /corral was re-created: its id is compiled into the filter."""
        path = cg.parent_dir(self.controller)
        while True:
            await asyncio.sleep(2.0)
            try:
                ino = path.stat().st_ino
            except OSError:
                ino = -1
            if ino != self._parent_id:
                log.warning("sensor: %s changed; restarting %s", path, self.active_backend)
                await self._kill()
                return

    async def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
