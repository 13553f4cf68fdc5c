"""The warm pool: ready sandboxes a node hands to episodes in milliseconds.

A cold provision costs a snapshot, a container, a runc create and start
(100-300 ms here). Most episodes ask for the default shape of a popular
image, so each node keeps `size` such sandboxes running and idle, labelled
`corral.pool=warm`. Acquiring one is a label update that names the owner
(`corral.workflow_id`, ...): from then on it is that episode's sandbox, torn
down like any other (a sandbox is never reused after an episode). A
background task refills the pool, one sandbox at a time so that refilling
never starves the episodes of CPU.

Only a spec the pool can serve is served: the pool's template (the default
resources, no network, runc) and the same image. Environment variables
travel with each exec, so they do not disqualify a spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets

from activities.foreground import Foreground
from sandbox import Containerd, SandboxSpec, resolve_image_name
from sandbox.cgroups import IDLE_SHARES
from sandbox.errors import CorralError

log = logging.getLogger("corral.pool")

POOL_LABEL = "corral.pool"
REFILL_BACKOFF_S = 5.0


def pool_template(image: str) -> SandboxSpec:
    """The shape of a pooled sandbox: the defaults (elastic CPU), on `image`."""
    return SandboxSpec(image=resolve_image_name(image), cpu_shares=IDLE_SHARES)


def servable(spec: SandboxSpec, template: SandboxSpec) -> bool:
    """A spec that differs from the template only in env and labels."""
    ignore = {"env", "labels", "image", "shim_group"}
    same_image = resolve_image_name(spec.image) == template.image
    return same_image and spec.model_dump(exclude=ignore) == template.model_dump(exclude=ignore)


class WarmPool:
    def __init__(
        self,
        containerd: Containerd,
        node: str,
        sizes: dict[str, int],
        *,
        foreground: Foreground | None = None,
    ) -> None:
        self._containerd = containerd
        self._node = node
        # Refills wait for the node's steps (activities/foreground.py).
        self._foreground = foreground or Foreground(max_wait_s=0)
        self._templates = {resolve_image_name(i): pool_template(i) for i in sizes}
        self._sizes = {resolve_image_name(i): n for i, n in sizes.items() if n > 0}
        self._ready: dict[str, list[str]] = {image: [] for image in self._sizes}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Adopt warm sandboxes a previous worker left, then keep the pool full."""
        if not self._sizes:
            return
        for info in await self._containerd.list_sandboxes({POOL_LABEL: "warm"}):
            if info.image in self._ready and info.status == "running":
                self._ready[info.image].append(info.id)
        self._task = asyncio.create_task(self._refill_forever(), name="corral-pool-refill")

    async def stop(self, *, drain: bool = False) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if drain:
            for ids in self._ready.values():
                for sandbox_id in ids:
                    with contextlib.suppress(CorralError):
                        await self._containerd.destroy_sandbox(sandbox_id)
                ids.clear()

    def counts(self) -> dict[str, int]:
        return {image: len(ids) for image, ids in self._ready.items()}

    def ready_for(self, image: str) -> int:
        return len(self._ready.get(resolve_image_name(image), ()))

    # -------------------------------------------------------------- acquire
    async def acquire(self, spec: SandboxSpec, labels: dict[str, str]) -> str | None:
        """A warm sandbox now owned by `labels`' episode, or None (provision cold)."""
        image = resolve_image_name(spec.image)
        template = self._templates.get(image)
        ready = self._ready.get(image)
        if template is None or not ready or not servable(spec, template):
            return None
        while ready:
            sandbox_id = ready.pop()
            self._foreground.touch()  # its first step follows: refill after it
            self._wake.set()
            try:
                await self._containerd.update_labels(sandbox_id, {**labels, POOL_LABEL: "taken"})
                return sandbox_id
            except CorralError as err:  # it died while idle: try the next one
                log.warning("warm sandbox %s unusable: %s", sandbox_id, err)
                with contextlib.suppress(CorralError):
                    await self._containerd.destroy_sandbox(sandbox_id)
        return None

    # --------------------------------------------------------------- refill
    async def _refill_forever(self) -> None:
        while True:
            short = [image for image, n in self._sizes.items() if len(self._ready[image]) < n]
            if not short:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._foreground.quiet()
            try:
                await self._add(short[0])
            except CorralError as err:
                log.warning("warm pool refill of %s failed: %s", short[0], err)
                await asyncio.sleep(REFILL_BACKOFF_S)

    async def _add(self, image: str) -> None:
        sandbox_id = secrets.token_hex(32)  # hex, like every sandbox id (Falco's container.id)
        labels = {POOL_LABEL: "warm", "corral.node": self._node}
        await self._containerd.create_sandbox(sandbox_id, self._templates[image], labels)
        self._ready[image].append(sandbox_id)
