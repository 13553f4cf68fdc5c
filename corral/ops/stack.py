"""The dev stack on this machine: `corral up`, `corral down`, `corral status`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from contract.config import StackConfig
from corral.headline import headline_figures
from workers.stack import Stack, StackStatus

Say = Callable[[str], None]


def stack_config(
    config: StackConfig,
    *,
    nodes: int | None = None,
    isolated: bool = False,
    allow_unwatched: bool = False,
) -> StackConfig:
    """`config` with `corral up`'s overrides: the node count, a network namespace
    per node (`isolated`), and agent commands allowed while a node's sensor is down
    (`allow_unwatched`)."""
    update: dict[str, Any] = {"count": nodes} if nodes is not None else {}
    if isolated:
        update["isolated"] = True
    config = config.model_copy(update={"nodes": config.nodes.model_copy(update=update)})
    if allow_unwatched:
        sensor = config.sensor.model_copy(update={"required": False})
        config = config.model_copy(update={"sensor": sensor})
    return config


async def stack_up(
    config: StackConfig,
    *,
    nodes: int | None = None,
    role: Literal["all", "control"] = "all",
    isolated: bool = False,
    allow_unwatched: bool = False,
    progress: Say | None = None,
) -> StackStatus:
    """Start the stack in the background (harmless when it is up) and return its status.

    `role="control"` starts Temporal, the workflow worker, the intake and the
    janitor only (nodes join with `nodes.join_node`); `progress` is told what
    starts, one short phrase at a time.
    """
    config = stack_config(config, nodes=nodes, isolated=isolated, allow_unwatched=allow_unwatched)
    return await Stack(config).up(progress=progress, role=role)


async def stack_down(config: StackConfig, *, progress: Say | None = None) -> list[str]:
    """Stop every process the stack started and remove its sandboxes; the names stopped."""
    return await Stack(config).down(progress=progress)


async def stack_status(config: StackConfig, *, headline: bool = True) -> StackStatus:
    """What runs and whether each part is healthy; with `headline`, the headline
    figures summed over the node workers that answer."""
    status = await Stack(config).status()
    if headline:
        status.headline = headline_figures(config)
    return status


async def unhealthy_components(config: StackConfig) -> list[str]:
    """The names of the stack's parts that are not healthy (empty: the stack is up)."""
    status = await Stack(config).status()
    return [c.name for c in status.components if not c.healthy]
