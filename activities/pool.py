"""The warm pool: ready sandboxes a node hands to episodes in milliseconds.

A cold provision costs a snapshot, a container, a runc create and start
(100-300 ms here). Most episodes ask for the default shape of a popular
image, so each node keeps `size` such sandboxes running and idle, labelled
`corral.pool=warm`. Acquiring one is a label update that names the owner
(`corral.workflow_id`, ...): from then on it is that episode's sandbox, torn
down like any other (a sandbox is never reused after an episode). A
background task refills the pool, one sandbox at a time so that refilling
never starves the episodes of CPU.

The pool is sized from the arrival rate: `size` is its floor, and it grows to
the largest burst seen in the last `CLAIM_WINDOW_S` - the most episodes that
asked for a sandbox of its shape (served warm or not) within any `BURST_S` -
up to `GROWTH_LIMIT` x `size`. A training step's burst of rollouts comes
again at the next step, so the next burst starts warm; a steady trickle of
episodes does not grow it; when the bursts stop, it shrinks back to `size`.
Growing past `size` waits until the asking pauses for `ASKING_PAUSE_S`: the
sandboxes it adds are for the next burst, and making them while this one is
still being provisioned took CPU from it (a fresh stack's first 128-rollout
burst ran 20 % slower than the next).

Only a spec the pool can serve is served: the pool's template (the default
resources, no network, runc) and the same image. Environment variables
travel with each exec, so they do not disqualify a spec.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque

from activities.foreground import Foreground
from contract.errors import CorralError
from contract.ids import resolve_image_name
from contract.labels import NODE_LABEL, POOL_LABEL
from sandbox import SandboxSpec
from sandbox.cgroups import IDLE_SHARES
from sandbox.runtime import SandboxRuntime

log = logging.getLogger("corral.pool")

REFILL_BACKOFF_S = 5.0
CLAIM_WINDOW_S = 300.0
BURST_S = 10.0
GROWTH_LIMIT = 16
# How often an idle refill task looks whether the pool should shrink.
SHRINK_CHECK_S = 30.0
# Growth past the pool's size starts once no episode asked for this long.
ASKING_PAUSE_S = 2.0


def pool_template(image: str) -> SandboxSpec:
    """The shape of a pooled sandbox: the defaults (elastic CPU), on `image`."""
    return SandboxSpec(image=resolve_image_name(image), cpu_shares=IDLE_SHARES)


def servable(spec: SandboxSpec, template: SandboxSpec) -> bool:
    """A spec that differs from the template only in env and labels."""
    ignore = {"env", "labels", "image", "shim_group"}
    same_image = resolve_image_name(spec.image) == template.image
    return same_image and spec.model_dump(exclude=ignore) == template.model_dump(exclude=ignore)


def asking_paused(asked: deque[float], now: float, pause_s: float) -> bool:
    """No ask within the last `pause_s` (or none at all)."""
    return not asked or now - asked[-1] >= pause_s


def largest_burst(times: deque[float], span_s: float) -> int:
    """The most of the (ascending) `times` that fall within any `span_s`."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] > span_s:
            first += 1
        most = max(most, last - first + 1)
    return most


class WarmPool:
    def __init__(
        self,
        containerd: SandboxRuntime,
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
        self._asked: dict[str, deque[float]] = {image: deque() for image in self._sizes}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Adopt warm sandboxes a previous worker left, then keep the pool full."""
        if not self._sizes:
            return
        for info in await self._containerd.list_sandboxes({POOL_LABEL: "warm"}):
            ready = self._ready.get(info.image)
            # More than the floor (a refill cut off by a crash, a grown pool):
            # the extra ones go, so the pool never holds more than it should.
            if (
                ready is not None
                and info.status == "running"
                and len(ready) < self._sizes[info.image]
            ):
                ready.append(info.id)
            else:
                with contextlib.suppress(CorralError):
                    await self._containerd.destroy_sandbox(info.id)
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

    def target(self, image: str) -> int:
        """How many the pool keeps ready now: its size, or the recent asking."""
        image = resolve_image_name(image)
        size = self._sizes.get(image, 0)
        asked = self._asked.get(image)
        if asked is None:
            return size
        horizon = time.monotonic() - CLAIM_WINDOW_S
        while asked and asked[0] < horizon:
            asked.popleft()
        return min(size * GROWTH_LIMIT, max(size, largest_burst(asked, BURST_S)))

    # -------------------------------------------------------------- acquire
    async def acquire(self, spec: SandboxSpec, labels: dict[str, str]) -> str | None:
        """A warm sandbox now owned by `labels`' episode, or None (provision cold)."""
        image = resolve_image_name(spec.image)
        template = self._templates.get(image)
        ready = self._ready.get(image)
        if template is None or not servable(spec, template):
            return None
        self._asked[image].append(time.monotonic())  # served or not: the pool grows to it
        self._wake.set()
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
            short = [i for i in self._sizes if len(self._ready[i]) < self.target(i)]
            growing = [i for i in short if len(self._ready[i]) >= self._sizes[i]]
            deferred = [i for i in growing if not self._asking_paused(i)]
            short = [i for i in short if i not in deferred]
            over = [i for i in self._sizes if len(self._ready[i]) > self.target(i)]
            if not short and not over:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    wait_s = ASKING_PAUSE_S if deferred else SHRINK_CHECK_S
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                continue
            await self._foreground.quiet()
            image = (short or over)[0]
            try:
                await (self._add(image) if short else self._remove_one(image))
            except CorralError as err:
                log.warning("warm pool resize of %s failed: %s", image, err)
                await asyncio.sleep(REFILL_BACKOFF_S)

    def _asking_paused(self, image: str) -> bool:
        return asking_paused(self._asked[image], time.monotonic(), ASKING_PAUSE_S)

    async def _remove_one(self, image: str) -> None:
        """One warm sandbox fewer: the asking that grew the pool has stopped."""
        ready = self._ready[image]
        if ready:
            await self._containerd.destroy_sandbox(ready.pop(0))

    async def _add(self, image: str) -> None:
        sandbox_id = secrets.token_hex(32)  # hex, like every sandbox id (Falco's container.id)
        labels = {POOL_LABEL: "warm", NODE_LABEL: self._node}
        await self._containerd.create_sandbox(sandbox_id, self._templates[image], labels)
        self._ready[image].append(sandbox_id)
