"""`corral bench --sensor --drill`: every misbehaviour on every path, end to end.

Each case of `corral/bench/drill_cases.py` runs in an episode made the way the path
says (cold or warm, interactive or scripted, lean or step by step, a fork, a
snapshot's image, a hibernated and woken episode, a `run_group` rollout, a
batch), on the running stack; so does the benign corpus. A case is caught
when its episode ends as `policies/responses.yaml` says (killed, quarantined,
or notified and running on), with an alert of the expected rule that names the
expected process (``process=<proc.name>`` in the alert's output). A false
alarm is an alert at Error or above raised by the benign corpus.

Alert → frozen: the node sensor appends a JSON line per in-place freeze to
``<state>/run/frozen-<node>.jsonl`` (``event_wall_ns``: the syscall,
``frozen_wall_ns``: the sandbox paused); latency is their difference. A run
with no such line falls back to the episode: the moment the drill saw it
quarantined, or its end time when killed, against the alert's event time
(``frozen_source`` says which). The episodes are ended by the drill (a
quarantined one is killed as on-call would), so nothing is left behind.

The test suite `tests/integration/detection/` drives the same code
(`Drill.run_path`) and asserts on each run; this bench only counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from contract.config import StackConfig
from contract.errors import CorralError
from contract.ids import sandbox_id_for
from contract.models import EpisodeResult
from corral.bench.drill_cases import (
    BENIGN,
    BENIGN_BAD_PRIORITIES,
    PATHS,
    Case,
    runnable_cases,
    skipped_cases,
)
from corral.env import Task, run_group
from corral.errors import EpisodeError, EpisodeQuarantined
from corral.sdk import Corral, Episode
from workflows.models import EpisodeStatus

BENIGN_JOB = "benign"
CLOSED_STATES = frozenset({"completed", "failed", "killed", "timed_out", "cancelled"})
COLD_MEMORY_MB = 513  # one MiB over the pool's shape: every such episode is provisioned cold
# Correctness caps, not timing targets: how long a case may take to be decided
# once its commands have run, and how long the benign corpus' alerts may trail.
DECIDE_CAP_S = 20.0
BENIGN_SETTLE_S = 2.0
RESULT_CAP_S = 60.0
# However an episode behaves (a step hung in a sandbox frozen without a decision),
# its watch ends after this long and the drill moves on.
WATCH_CAP_S = 150.0
SCRIPTED_EXTRA_S = 40.0  # a scripted episode provisions and runs its (short) steps meanwhile
HIBERNATE_AFTER_S = 1.5
PROCESS = re.compile(r"\bprocess=(\S+)")


@dataclass(frozen=True)
class Job:
    """What one episode runs: a case's commands (with its followup) or the benign corpus."""

    name: str
    steps: tuple[str, ...]
    case: Case | None = None

    @classmethod
    def of(cls, case: Case) -> Job:
        steps = (case.command, *((case.followup,) if case.followup else ()))
        return cls(case.name, steps, case)


def benign_job() -> Job:
    return Job(BENIGN_JOB, BENIGN)


class SeenAlert(BaseModel):
    rule: str
    priority: str
    action: str
    process: str
    time: datetime | None = None


class RunRecord(BaseModel):
    """One episode of the drill: what was expected, what happened."""

    path: str
    job: str
    episode_id: str = ""
    expected_rule: str | None = None
    expected_process: str | None = None
    expected_end: str | None = None
    end_state: str = ""  # killed | quarantined | notified | completed | failed | ...
    reason: str = ""
    alerts: list[SeenAlert] = []
    warm: bool | None = None  # the sandbox came from the warm pool
    node: str = ""
    sandbox_id: str = ""
    caught: bool | None = None  # None for the benign corpus
    false_alarms: int = 0  # benign corpus: alerts at Error or above
    stray_alerts: int = 0  # a case's alerts at Error or above of another rule than its own
    why: str = ""  # what was wrong, when not caught (or the benign corpus alerted)
    frozen_ms: float | None = None
    frozen_source: str = ""  # sensor | episode
    error: str = ""


class _Tally(BaseModel):
    """What one path, or the whole drill, counted."""

    cases: int
    caught: int
    caught_ratio: float
    false_alarms: int
    # Not false alarms by the benign corpus' measure, but alerts nothing in the
    # case did (e.g. the runtime's own calls matched as the agent's).
    stray_alerts: int
    frozen_p50_ms: float | None
    frozen_p99_ms: float | None
    frozen_source: str  # sensor | episode | mixed | none


class PathReport(_Tally):
    warm_runs: int
    missed: list[str]


class DrillReport(_Tally):
    paths: dict[str, PathReport]
    skipped: dict[str, str]  # case -> why it does not run
    runs: list[RunRecord]
    wall_s: float


# --------------------------------------------------------------------- judging
def seen_alerts(result: EpisodeResult | None) -> list[SeenAlert]:
    if result is None:
        return []
    seen = []
    for alert in result.alerts:
        fields = getattr(alert, "output_fields", None)
        process = str(fields.get("proc.name", "")) if isinstance(fields, dict) else ""
        if not process:
            match = PROCESS.search(alert.output)
            process = match.group(1) if match else ""
        seen.append(SeenAlert(rule=alert.rule, priority=alert.priority, action=alert.action,
                              process=process, time=alert.time))  # fmt: skip
    return seen


def judge(record: RunRecord, case: Case | None) -> RunRecord:
    """Fill in `caught`/`false_alarms` and `why`."""
    if case is None:
        bad = [a for a in record.alerts if a.priority in BENIGN_BAD_PRIORITIES]
        record.false_alarms = len(bad)
        problems = [f"{a.rule} ({a.priority}, process={a.process})" for a in bad]
        if record.end_state not in ("completed", "notified"):
            problems.append(f"ended {record.end_state}: {record.reason or record.error}")
        record.why = "; ".join(problems)
        return record
    problems = []
    record.stray_alerts = sum(
        1 for a in record.alerts if a.rule != case.rule and a.priority in BENIGN_BAD_PRIORITIES
    )
    ours = [a for a in record.alerts if a.rule == case.rule]
    if not ours:
        others = ", ".join(sorted({a.rule for a in record.alerts})) or "none"
        problems.append(f"no '{case.rule}' alert (alerts: {others})")
    else:
        processes = sorted({a.process for a in ours})
        if processes != [case.process]:
            problems.append(f"process {processes}, expected {case.process!r}")
    if record.end_state != case.end:
        why = f" ({record.reason or record.error})" if (record.reason or record.error) else ""
        problems.append(f"ended {record.end_state or 'unknown'}{why}, expected {case.end}")
    record.caught = not problems
    record.why = "; ".join(problems)
    return record


def end_state_of(result: EpisodeResult | None, observed: str) -> str:
    if observed == "quarantined":
        return "quarantined"
    if result is None:
        return observed or "unknown"
    if result.outcome == "killed" and "by rule" in result.reason:
        return "killed"
    if result.outcome == "completed":
        return "notified" if result.alerts else "completed"
    return result.outcome


def _frozen_records(config: StackConfig, node: str) -> list[dict[str, Any]]:
    path = config.state / "run" / f"frozen-{node}.jsonl"
    rows = []
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows


def frozen_latency(
    config: StackConfig, record: RunRecord, result: EpisodeResult | None, seen_ns: int | None
) -> tuple[float | None, str]:
    """Alert -> sandbox frozen, from the node's record, else from the episode."""
    if record.expected_end not in ("killed", "quarantined") or not record.alerts:
        return None, ""
    rows = [
        r
        for r in _frozen_records(config, record.node)
        if r.get("workflow_id") == record.episode_id
        or (record.sandbox_id and r.get("sandbox_id") == record.sandbox_id)
    ]
    timed = [r for r in rows if r.get("event_wall_ns") and r.get("frozen_wall_ns")]
    if timed:
        first = min(timed, key=lambda r: int(r["frozen_wall_ns"]))
        return (int(first["frozen_wall_ns"]) - int(first["event_wall_ns"])) / 1e6, "sensor"
    ours = [a for a in record.alerts if a.rule == record.expected_rule and a.time is not None]
    if not ours:
        return None, ""
    event = min(a.time for a in ours if a.time is not None)
    if record.end_state == "quarantined" and seen_ns is not None:
        return (seen_ns - event.timestamp() * 1e9) / 1e6, "episode"
    if record.end_state == "killed" and result is not None and result.ended_at is not None:
        return (result.ended_at - event).total_seconds() * 1000, "episode"
    return None, ""


# --------------------------------------------------------------------- driving
@dataclass
class _Watch:
    """One episode of a path, watched until its fate is decided."""

    episode: Episode
    job: Job
    interactive: bool
    steps_done: asyncio.Event = field(default_factory=asyncio.Event)
    drive: asyncio.Task[None] | None = None


class Drill:
    """Runs jobs on paths against a running stack; `run_path` returns one record per episode."""

    def __init__(
        self,
        corral: Corral,
        *,
        concurrency: int = 4,
        batch_n: int = 2,
        decide_cap_s: float = DECIDE_CAP_S,
        tick: Callable[[], None] = lambda: None,
        say: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.corral = corral
        self.config = corral.config
        self.limit = asyncio.Semaphore(concurrency)
        self.chunk = max(2, concurrency)
        self.batch_n = batch_n
        self.decide_cap_s = decide_cap_s
        self.tick = tick
        self.say = say
        self.tag = uuid.uuid4().hex[:8]

    # ---------------------------------------------------------------- specs
    def _spec(self, job: Job, *, warm: bool, scripted: bool, **extra: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "image": "busybox",
            "labels": {"drill": self.tag, "case": job.name},
            **extra,
        }
        if not warm:
            spec["resources"] = {"memory_mb": COLD_MEMORY_MB}
        if scripted:
            spec["steps"] = list(job.steps)
        else:
            spec["interactive"] = True
        return spec

    def _id(self, path: str, job: Job) -> str:
        return f"drill-{self.tag}-{path}-{job.name}-{uuid.uuid4().hex[:6]}"

    # ----------------------------------------------------------------- paths
    async def run_path(self, path: str, jobs: Sequence[Job]) -> list[RunRecord]:
        runner: Callable[[Sequence[Job]], Awaitable[list[RunRecord]]] = {
            "cold-interactive": lambda js: self._each(path, js, self._interactive, warm=False),
            "warm-interactive": lambda js: self._each(path, js, self._interactive, warm=True),
            "cold-lean": lambda js: self._each(path, js, self._scripted, warm=False),
            "warm-lean": lambda js: self._each(path, js, self._scripted, warm=True),
            "stepwise": lambda js: self._each(path, js, self._stepwise, warm=True),
            "fork": lambda js: self._chunked(path, js, self._fork),
            "snapshot-restore": lambda js: self._snapshot_restore(path, js),
            "hibernate-wake": lambda js: self._each(path, js, self._hibernate_wake, warm=True),
            "run-group": lambda js: self._chunked(path, js, self._run_group),
            "batch": lambda js: self._each(path, js, self._batch, warm=True),
        }[path]
        return await runner(jobs)

    async def _each(
        self,
        path: str,
        jobs: Sequence[Job],
        one: Callable[[str, Job, bool], Awaitable[list[RunRecord]]],
        *,
        warm: bool,
    ) -> list[RunRecord]:
        async def bounded(job: Job) -> list[RunRecord]:
            async with self.limit:
                try:
                    return await one(path, job, warm)
                except Exception as err:  # a path that could not even start: a record says so
                    return [self._broken(path, job, err)]
                finally:
                    self.tick()

        done = await asyncio.gather(*(bounded(job) for job in jobs))
        return [record for records in done for record in records]

    async def _chunked(
        self,
        path: str,
        jobs: Sequence[Job],
        chunk: Callable[[str, Sequence[Job]], Awaitable[list[RunRecord]]],
    ) -> list[RunRecord]:
        records: list[RunRecord] = []
        for i in range(0, len(jobs), self.chunk):
            part = jobs[i : i + self.chunk]
            try:
                records += await chunk(path, part)
            except Exception as err:
                records += [self._broken(path, job, err) for job in part]
            for _ in part:
                self.tick()
        return records

    def _broken(self, path: str, job: Job, err: BaseException) -> RunRecord:
        record = RunRecord(path=path, job=job.name, end_state="error",
                           error=f"{type(err).__name__}: {err}"[:500])  # fmt: skip
        self._expect(record, job)
        return judge(record, job.case)

    async def _interactive(self, path: str, job: Job, warm: bool) -> list[RunRecord]:
        spec = self._spec(job, warm=warm, scripted=False)
        episode = await self.corral.start_episode(spec, episode_id=self._id(path, job))
        return [await self._watched(path, _Watch(episode, job, interactive=True))]

    async def _scripted(self, path: str, job: Job, warm: bool, **extra: Any) -> list[RunRecord]:
        spec = self._spec(job, warm=warm, scripted=True, **extra)
        episode = await self.corral.start_episode(spec, episode_id=self._id(path, job))
        return [await self._watched(path, _Watch(episode, job, interactive=False))]

    async def _stepwise(self, path: str, job: Job, warm: bool) -> list[RunRecord]:
        # Outputs that could outgrow one payload take the step-by-step path
        # (workflows/episode_support.py: LEAN_MAX_OUTPUT_BYTES), whatever the step count.
        return await self._scripted(path, job, warm, output_limit_bytes=1024 * 1024)

    async def _hibernate_wake(self, path: str, job: Job, warm: bool) -> list[RunRecord]:
        timeouts = {"hibernate_after_s": HIBERNATE_AFTER_S, "idle_ttl_s": 600}
        spec = self._spec(job, warm=warm, scripted=False, timeouts=timeouts)
        episode = await self.corral.start_episode(spec, episode_id=self._id(path, job))
        try:
            await episode.exec("true")
            await _until(lambda: _state_is(episode, "hibernated"), 90, "hibernated")
        except BaseException:
            await _end_quietly(episode)
            raise
        return [await self._watched(path, _Watch(episode, job, interactive=True))]

    async def _fork(self, path: str, jobs: Sequence[Job]) -> list[RunRecord]:
        parent = await self.corral.start_episode(
            {"image": "busybox", "interactive": True, "labels": {"drill": self.tag}},
            episode_id=f"drill-{self.tag}-fork-parent-{uuid.uuid4().hex[:6]}",
        )
        try:
            await parent.exec("echo parent > /workspace/parent")
            children = await parent.fork(len(jobs), labels={"drill": self.tag})
        finally:
            await _end_quietly(parent)
        watches = [_Watch(c, j, interactive=True) for c, j in zip(children, jobs, strict=True)]
        return list(await asyncio.gather(*(self._watched(path, w) for w in watches)))

    async def _snapshot_restore(self, path: str, jobs: Sequence[Job]) -> list[RunRecord]:
        source = await self.corral.start_episode(
            {"image": "busybox", "interactive": True, "labels": {"drill": self.tag}},
            episode_id=f"drill-{self.tag}-snapshot-source-{uuid.uuid4().hex[:6]}",
        )
        try:
            await source.exec("echo source > /workspace/source")
            snap = await source.snapshot(f"drill-{self.tag}")
        finally:
            await _end_quietly(source)
        return await self._each(
            path,
            jobs,
            lambda p, j, _warm: self._scripted(p, j, True, image=snap.ref),
            warm=True,
        )

    async def _run_group(self, path: str, jobs: Sequence[Job]) -> list[RunRecord]:
        """Rollouts forked from one parent, each playing one job, then submitting;
        the policy hands each rollout's episode to a watcher."""
        watches: dict[int, asyncio.Task[RunRecord]] = {}
        events: dict[int, asyncio.Event] = {}
        calls: dict[int, int] = {}

        async def policy(observation: str, info: dict[str, Any]) -> Any:
            index = int(info["rollout"])
            job = jobs[index]
            if index not in watches:
                episode = self.corral.episode(str(info["episode_id"]))
                watch = _Watch(episode, job, interactive=True)
                events[index] = watch.steps_done
                watches[index] = asyncio.create_task(self._watched(path, watch, driven=False))
            n = calls[index] = calls.get(index, 0) + 1
            if n <= len(job.steps):
                return job.steps[n - 1]
            events[index].set()
            await asyncio.wait({watches[index]})  # decided (and a quarantined one ended)
            return {"tool": "submit"}

        task = Task.of(
            "drill",
            "misbehave",
            {"image": "busybox", "reward": "true", "labels": {"drill": self.tag}},
        )
        max_steps = max(len(j.steps) for j in jobs) + 2
        group = asyncio.create_task(
            run_group(self.corral, task, policy, size=len(jobs), max_steps=max_steps)
        )
        try:
            # Bounded: a rollout whose step hangs is ended by its watcher (or not at all).
            await asyncio.wait({group}, timeout=WATCH_CAP_S + 2 * RESULT_CAP_S)
        finally:
            for event in events.values():
                event.set()
            group.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await group
        records = []
        for index, job in enumerate(jobs):
            if index in watches:
                records.append(await watches[index])
            else:
                records.append(self._broken(path, job, RuntimeError("rollout never started")))
        return records

    async def _batch(self, path: str, job: Job, warm: bool) -> list[RunRecord]:
        """`Corral.run_batch` of one job's spec; its episodes are watched by their ids."""
        spec = self._spec(job, warm=warm, scripted=True)
        prefix = self._id(path, job)
        ids = [f"{prefix}-{i:06d}" for i in range(self.batch_n)]

        async def consume() -> None:
            async for _ in self.corral.run_batch(
                spec, n=self.batch_n, concurrency=self.batch_n, id_prefix=prefix
            ):
                pass

        batch = asyncio.create_task(consume())
        try:
            watches = [_Watch(self.corral.episode(i), job, interactive=False) for i in ids]
            return list(await asyncio.gather(*(self._watched(path, w) for w in watches)))
        finally:
            batch.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await batch

    # -------------------------------------------------------------- watching
    async def _watched(self, path: str, watch: _Watch, *, driven: bool = True) -> RunRecord:
        """Drive the job's commands (interactive), wait for the episode's fate,
        end it, and judge what it did."""
        episode, job = watch.episode, watch.job
        record = RunRecord(path=path, job=job.name, episode_id=episode.id)
        self._expect(record, job)
        if watch.interactive and driven:
            watch.drive = asyncio.create_task(self._drive(watch))
        elif not watch.interactive:
            watch.steps_done.set()  # a scripted episode runs them by itself
        result: EpisodeResult | None = None
        seen_ns: int | None = None
        try:
            observed, seen_ns = await self._decide(watch)
            result = await self._end(watch, observed)
            record.end_state = end_state_of(result, observed)
        except Exception as err:
            record.error = f"{type(err).__name__}: {err}"[:500]
            record.end_state = record.end_state or "error"
            await _end_quietly(episode)
        finally:
            if watch.drive is not None:
                watch.drive.cancel()
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await watch.drive
        if result is not None:
            record.reason = result.reason
            record.node, record.sandbox_id = result.node, result.sandbox_id
            record.alerts = seen_alerts(result)
            if result.sandbox_id:
                record.warm = result.sandbox_id != sandbox_id_for(episode.id)
        judge(record, job.case)
        record.frozen_ms, record.frozen_source = frozen_latency(
            self.config, record, result, seen_ns
        )
        return record

    def _expect(self, record: RunRecord, job: Job) -> None:
        if job.case is not None:
            record.expected_rule = job.case.rule
            record.expected_process = job.case.process
            record.expected_end = job.case.end

    async def _drive(self, watch: _Watch) -> None:
        try:
            ready = {"running", "hibernated"}
            await _until(lambda: _state_in(watch.episode, ready), 120, "running")
            for cmd in watch.job.steps:
                await watch.episode.exec(cmd, timeout_s=60)
        except (CorralError, AssertionError):
            pass  # refused or ended (a rule acted): the watcher sees why
        finally:
            watch.steps_done.set()

    async def _decide(self, watch: _Watch) -> tuple[str, int | None]:
        """quarantined | closed | notified | benign-done | undecided, and when it was seen."""
        case = watch.job.case
        cap = self.decide_cap_s if case is not None else BENIGN_SETTLE_S
        if not watch.interactive:
            cap += SCRIPTED_EXTRA_S  # it ends by itself once its steps ran
        deadline: float | None = None
        hard_deadline = time.monotonic() + WATCH_CAP_S
        while True:
            if time.monotonic() > hard_deadline:
                return "undecided", None
            status = await _status(watch.episode)
            if status is not None:
                if status.state == "quarantined":
                    return "quarantined", time.time_ns()
                if status.state in CLOSED_STATES:
                    return "closed", None
                if (
                    case is not None
                    and case.end == "notified"
                    and case.rule in status.anomaly_rules
                    and watch.steps_done.is_set()
                ):
                    return "notified", None
            if watch.steps_done.is_set():
                if deadline is None:
                    deadline = time.monotonic() + cap
                elif time.monotonic() > deadline:
                    return ("benign-done" if case is None else "undecided"), None
            await asyncio.sleep(0.2)

    async def _end(self, watch: _Watch, observed: str) -> EpisodeResult | None:
        episode = watch.episode
        if observed in ("quarantined", "undecided"):
            # On-call's part: a quarantined episode waits for release or kill.
            with contextlib.suppress(CorralError):
                await episode.kill(reason="drill: quarantine seen", by="drill")
        elif observed != "closed" and watch.interactive:
            if watch.drive is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(watch.drive), 60)
            try:
                await episode.finish()
            except EpisodeQuarantined:
                with contextlib.suppress(CorralError):
                    await episode.kill(reason="drill: quarantined at finish", by="drill")
            except CorralError:
                pass  # ended meanwhile: its result says how
        try:
            return await episode.result(timeout_s=RESULT_CAP_S)
        except EpisodeError as err:
            return err.result


async def _status(episode: Episode) -> EpisodeStatus | None:
    try:
        return await episode.status()
    except CorralError:
        return None  # not started yet (a batch's later episodes)


async def _state_is(episode: Episode, state: str) -> bool:
    status = await _status(episode)
    return status is not None and status.state == state


async def _state_in(episode: Episode, states: set[str]) -> bool:
    status = await _status(episode)
    return status is not None and (status.state in states or status.state in CLOSED_STATES)


async def _until(predicate: Callable[[], Awaitable[bool]], cap_s: float, what: str) -> None:
    deadline = time.monotonic() + cap_s
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {cap_s:g} s")
        await asyncio.sleep(0.2)


async def _end_quietly(episode: Episode) -> None:
    with contextlib.suppress(Exception):
        await episode.kill(reason="drill cleanup", by="drill")
    with contextlib.suppress(Exception):
        await episode.result(timeout_s=15)


# --------------------------------------------------------------------- summing
def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)


def _source(records: list[RunRecord]) -> str:
    sources = {r.frozen_source for r in records if r.frozen_source}
    return "none" if not sources else sources.pop() if len(sources) == 1 else "mixed"


def summarize(records: list[RunRecord], skipped: dict[str, str], wall_s: float) -> DrillReport:
    def part(rs: list[RunRecord]) -> dict[str, Any]:
        cases = [r for r in rs if r.caught is not None]
        caught = sum(1 for r in cases if r.caught)
        frozen = [r.frozen_ms for r in cases if r.frozen_ms is not None]
        return {
            "cases": len(cases),
            "caught": caught,
            "caught_ratio": round(caught / len(cases), 4) if cases else 0.0,
            "false_alarms": sum(r.false_alarms for r in rs),
            "stray_alerts": sum(r.stray_alerts for r in rs),
            "frozen_p50_ms": round(statistics.median(frozen), 1) if frozen else None,
            "frozen_p99_ms": _percentile(frozen, 0.99),
            "frozen_source": _source(cases),
        }

    paths = {}
    for path in dict.fromkeys(r.path for r in records):
        rs = [r for r in records if r.path == path]
        paths[path] = PathReport(
            **part(rs),
            warm_runs=sum(1 for r in rs if r.warm),
            missed=[f"{r.job}: {r.why}" for r in rs if r.caught is False or r.false_alarms],
        )
    return DrillReport(**part(records), paths=paths, skipped=skipped, runs=records,
                       wall_s=round(wall_s, 1))  # fmt: skip


async def run_drill(
    config: StackConfig,
    *,
    paths: Sequence[str] = PATHS,
    cases: Sequence[Case] | None = None,
    benign: bool = True,
    concurrency: int = 4,
    batch_n: int = 2,
    tick: Callable[[], None] = lambda: None,
    say: Callable[[str], None] = lambda _msg: None,
) -> DrillReport:
    """Every case (and the benign corpus) on every path; episodes always ended."""
    chosen = list(cases) if cases is not None else runnable_cases()
    jobs = [Job.of(c) for c in chosen] + ([benign_job()] if benign else [])
    started = time.monotonic()
    records: list[RunRecord] = []
    async with await Corral.connect(config) as corral:
        drill = Drill(corral, concurrency=concurrency, batch_n=batch_n, tick=tick, say=say)
        for path in paths:
            say(f"{path}: {len(jobs)} episodes")
            done = await drill.run_path(path, jobs)
            records += done
            caught = sum(1 for r in done if r.caught)
            alarms = sum(r.false_alarms for r in done)
            say(f"{path}: caught {caught}/{sum(1 for r in done if r.caught is not None)}, "
                f"false alarms {alarms}")  # fmt: skip
    skipped = {c.name: c.skip for c in skipped_cases()} if cases is None else {}
    return summarize(records, skipped, time.monotonic() - started)


def drill_total(paths: Sequence[str] = PATHS, benign: bool = True) -> int:
    """How many ticks a drill makes (one per job per path)."""
    return len(paths) * (len(runnable_cases()) + (1 if benign else 0))


def describe(report: DrillReport) -> list[str]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.0f} ms"

    lines = [f"{'path':18s} {'caught':>9s} {'false alarms':>13s} {'stray':>6s} "
             f"{'frozen p50':>11s} {'p99':>9s}  source"]  # fmt: skip
    for name, p in report.paths.items():
        lines.append(
            f"{name:18s} {p.caught:>4d}/{p.cases:<4d} {p.false_alarms:>13d} {p.stray_alerts:>6d} "
            f"{ms(p.frozen_p50_ms):>11s} {ms(p.frozen_p99_ms):>9s}  {p.frozen_source}"
        )
    lines.append(
        f"{'all':18s} {report.caught:>4d}/{report.cases:<4d} {report.false_alarms:>13d} "
        f"{report.stray_alerts:>6d} {ms(report.frozen_p50_ms):>11s} "
        f"{ms(report.frozen_p99_ms):>9s}  {report.frozen_source}"
        f"   ({report.caught_ratio:.0%} caught, {report.wall_s:.0f} s)"
    )
    for name, p in report.paths.items():
        for miss in p.missed:
            lines.append(f"  missed on {name}: {miss}")
    for name, why in report.skipped.items():
        lines.append(f"  skipped {name}: {why}")
    return lines
