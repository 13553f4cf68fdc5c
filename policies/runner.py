"""Run policy test cases in real sandboxes with the real sensor: ``corral policy test``.

For each case (see :mod:`policies.testcases`) a fresh sandbox is created on
one node of the running stack, straight through that node's containerd (no
episode, no Temporal). An in-process bpftrace ``Sensor`` and ``RuleEngine``
loaded with the rule files under test watch it; the case's commands run in
the sandbox one after another with ``sh -c``; after ``settle_s`` the rules
that matched events of *that* sandbox are compared with the expectation.
The sandbox is destroyed in ``finally``.

The in-process sensor is independent of the stack's own sensors and of the
intake: it evaluates exactly the rule files given (the ones being written),
which may not be the ones the stack runs. The stack's node sensors see the
test sandboxes too and may post alerts for them; the intake answers 404
(no episode owns them), which changes nothing.

Matching uses Falco's ``rule_matching: first``, so a case sees the alert a
production Falco would raise for each event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.errors import CorralError
from contract.labels import POLICY_TEST_LABEL
from policies.falco.engine import Match, RuleEngine
from policies.falco.event import ContainerInfo, Event
from policies.falco.fields import default_registry
from policies.testcases import CaseResult, PolicyTestCase, compare, load_test_cases

log = logging.getLogger("corral.policy.runner")

Say = Callable[[str], None]

SENSOR_READY_TIMEOUT_S = 180.0  # bpftrace compiles its program for seconds; cap, not a target
COMMAND_TIMEOUT_S = 60.0


def new_sandbox_id() -> str:
    """64 hex digits like Corral's episode sandboxes, so container.id is Falco-shaped."""
    return uuid.uuid4().hex + uuid.uuid4().hex


@dataclass
class Watch:
    """Matches per watched sandbox, from a sensor callback."""

    engine: RuleEngine
    matches: dict[str, list[Match]] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    errors: int = 0

    def on_event(self, evt: Event) -> None:
        container = evt.container
        if container is None or container.full_id not in self.matches:
            return
        self.events[container.full_id] += 1
        self.matches[container.full_id].extend(self.engine.evaluate(evt))

    def add(self, full_id: str) -> None:
        self.matches[full_id] = []
        self.events[full_id] = 0

    def pop(self, full_id: str) -> tuple[list[Match], int]:
        return self.matches.pop(full_id, []), self.events.pop(full_id, 0)


class SandboxResolver:
    """A ``ContainerResolver`` over the sandboxes this runner made."""

    def __init__(self) -> None:
        self.containers: dict[str, ContainerInfo] = {}

    def __call__(self, full_id: str) -> ContainerInfo | None:
        return self.containers.get(full_id)


async def start_sensor(
    engine: RuleEngine, resolver: SandboxResolver, on_event: Callable[[Event], None], say: Say
) -> Any:
    """An in-process bpftrace sensor for the engine's event types, ready to use."""
    from policies.sensor.prefilter import sensor_for

    # The node sensor's own path (prefilter included), so a test case proves
    # what production runs.
    sensor = sensor_for(engine, resolver)
    sensor.add_callback(on_event)
    say(f"starting the sensor ({len(engine.event_types())} event types; bpftrace compiles)")
    await sensor.start()
    try:
        await sensor.wait_ready(timeout=SENSOR_READY_TIMEOUT_S)
    except BaseException:
        await sensor.stop()
        raise
    return sensor


async def run_case(
    client: Any,
    case: PolicyTestCase,
    watch: Watch,
    resolver: SandboxResolver,
    say: Say,
) -> CaseResult:
    """One case in one fresh sandbox; the sandbox is always destroyed."""
    from sandbox import SandboxSpec

    sandbox_id = new_sandbox_id()
    resolver.containers[sandbox_id] = ContainerInfo(
        full_id=sandbox_id, name=f"policy-test-{sandbox_id[:12]}", image=case.image,
        labels={POLICY_TEST_LABEL: case.name},
    )  # fmt: skip
    watch.add(sandbox_id)
    notes: list[str] = []
    try:
        sandbox = await client.create_sandbox(
            sandbox_id, SandboxSpec(image=case.image), labels={POLICY_TEST_LABEL: "1"}
        )
        for cmd in case.commands:
            result = await sandbox.exec(cmd, timeout_s=COMMAND_TIMEOUT_S)
            if result.exit_code != 0:
                notes.append(f"`{cmd}` exited {result.exit_code}: {result.stderr.strip()[:200]}")
        await asyncio.sleep(case.settle_s)
    finally:
        with contextlib.suppress(CorralError):
            await client.destroy_sandbox(sandbox_id)
        resolver.containers.pop(sandbox_id, None)
        matches, n_events = watch.pop(sandbox_id)
    result = compare(case.expect, [m.rule for m in matches], name=case.name)
    if not result.passed or notes:
        for m in matches:
            say(f"  {case.name}: {m.rule}: {m.output}")
        for note in notes:
            say(f"  {case.name}: note: {note}")
    if n_events == 0:
        say(f"  {case.name}: warning: the sensor saw no event from the sandbox")
    return result


async def run_cases(
    config: Any,
    directory: str | Path,
    rule_paths: Sequence[str | Path],
    say: Say = lambda _m: None,
    *,
    node: str | None = None,
) -> list[CaseResult]:
    """Run every case in ``directory`` against ``rule_paths`` on a node of the stack.

    ``config`` is the stack's ``StackConfig`` (``containerd_socket(node)``,
    ``node_names()``, ``nodes.containerd_namespace``).
    """
    from sandbox import Containerd

    cases = load_test_cases(directory)
    engine = RuleEngine.from_files(
        [Path(p) for p in rule_paths], default_registry(), strict=True, rule_matching="first"
    )
    node = node or config.node_names()[0]
    client = await Containerd.connect(
        str(config.containerd_socket(node)), namespace=config.nodes.containerd_namespace
    )
    resolver = SandboxResolver()
    watch = Watch(engine)
    results: list[CaseResult] = []
    try:
        sensor = await start_sensor(engine, resolver, watch.on_event, say)
        try:
            for i, case in enumerate(cases, 1):
                started = time.monotonic()
                result = await run_case(client, case, watch, resolver, say)
                verdict = "pass" if result.passed else "FAIL"
                say(f"[{i}/{len(cases)}] {verdict} {case.name} "
                    f"({time.monotonic() - started:.1f} s on {node})")  # fmt: skip
                results.append(result)
        finally:
            await sensor.stop()
    finally:
        await client.close()
    return results
