"""`corral demo`: the stack up, a handful of real episodes, their results."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from contract.config import StackConfig
from contract.models import EpisodeResult, EpisodeSpec
from corral.sdk import Corral
from workers.stack import Stack

DEMO_SPECS: list[dict[str, Any]] = [
    {
        "image": "busybox",
        "steps": ["echo hello from a sandbox", "uname -a", "ls /"],
        "labels": {"demo": "hello"},
    },
    {
        "image": "busybox",
        "steps": ["echo 40 > /workspace/x", "expr $(cat /workspace/x) + 2"],
        "reward": "expr $(cat /workspace/x) + 2",
        "labels": {"demo": "reward"},
    },
    {
        "image": "busybox",
        "steps": ["ip addr 2>/dev/null || cat /proc/net/dev"],
        "labels": {"demo": "network-none"},
    },
    {"image": "busybox", "steps": ["echo this step fails; exit 3"], "labels": {"demo": "failure"}},
    {
        "image": "busybox",
        "steps": ["head -c 1000000 /dev/zero | wc -c", "cat /proc/self/status | grep -i cap"],
        "labels": {"demo": "limits"},
    },
]


async def run_demo(
    config: StackConfig, *, episodes: int, say: Callable[..., None], out: Console
) -> list[EpisodeResult]:
    stack = Stack(config)
    status = await stack.status()
    if not status.up:
        say("[dim]bringing the stack up…[/]")
        status = await stack.up(progress=lambda msg: say(f"[dim]starting {msg}…[/]"))
    corral = await Corral.connect(config)
    specs = [EpisodeSpec.model_validate(DEMO_SPECS[i % len(DEMO_SPECS)]) for i in range(episodes)]
    handles = [await corral.start_episode(spec) for spec in specs]
    results = []
    for handle, spec in zip(handles, specs, strict=True):
        try:
            results.append(await handle.result())
        except Exception as err:
            result = getattr(err, "result", None) or EpisodeResult(
                episode_id=handle.id, outcome="failed", reason=str(err), image=spec.image
            )
            results.append(result)
    _print(results, out)
    out.print(f"\nSee them in the Temporal Web UI: {status.ui_url}")
    out.print("Then: corral report   (plots and an HTML page of what ran)")
    return results


def _print(results: list[EpisodeResult], out: Console) -> None:
    table = Table(
        "episode", "outcome", "node", "steps", "last output", "reason", title="Demo episodes"
    )
    for r in results:
        last = next(
            (
                s.stdout.strip().splitlines()[-1]
                for s in reversed(r.steps + ([r.reward] if r.reward else []))
                if s.stdout.strip()
            ),
            "",
        )
        colour = "green" if r.outcome == "completed" else "red"
        table.add_row(
            r.episode_id,
            f"[{colour}]{r.outcome}[/]",
            r.node,
            str(len(r.steps)),
            last[:50],
            r.reason[:60],
        )
    out.print(table)
