"""Shim groups: which runc v2 shim a new sandbox joins.

containerd starts one `containerd-shim-runc-v2` process per container unless
the container's spec carries the `io.containerd.runc.v2.group` annotation;
containers with the same group share one shim. A shim is a Go process of
5-10 MiB and 10+ threads, and starting one costs 20-25 ms of CPU here
(docs/benchmarks.md): at 2,000 idle sandboxes per node, one shim each is most
of the node's memory. So each node's client puts up to `size` sandboxes of
one *key* (the tenant) in a shim: a shim that fails takes down sandboxes of
one tenant only.

Two rules keep a create from meeting a shim on its way out:
* a group whose last member left is closed for good (a shim exits when its
  last container is deleted; a new group gets a new name);
* a group with a create in flight is not joined (the shim serialises
  `Tasks.Create`; concurrent creates go to different shims).

Counts here only ever over-count members (a sandbox destroyed by another
process still counts), which is safe: the group just fills less.
"""

from __future__ import annotations

import re
import secrets

SHIM_GROUP_SIZE = 20
_SLUG = re.compile(r"[^a-z0-9]+")


class ShimGroups:
    """Membership of this node's shim groups (pure bookkeeping, no I/O)."""

    def __init__(self, size: int = SHIM_GROUP_SIZE) -> None:
        if size < 1:
            raise ValueError(f"shim group size must be at least 1 (got {size})")
        self.size = size
        self._members: dict[str, set[str]] = {}  # open group -> its sandboxes
        self._key: dict[str, str] = {}  # open group -> the key it serves
        self._group_of: dict[str, str] = {}  # sandbox -> its group
        self._in_flight: dict[str, str] = {}  # sandbox being created -> its group

    def join(self, sandbox_id: str, key: str) -> str:
        """The group `sandbox_id` is created in: the fullest open group of
        `key` with room and no create in flight, else a new one."""
        if sandbox_id in self._group_of:
            return self._group_of[sandbox_id]
        busy = set(self._in_flight.values())
        candidates = [
            group
            for group, members in self._members.items()
            if self._key[group] == key and group not in busy and len(members) < self.size
        ]
        group = max(candidates, key=lambda g: len(self._members[g]), default=None)
        if group is None:
            group = f"corral-{_SLUG.sub('-', key.lower()).strip('-')[:24] or 'default'}-"
            group += secrets.token_hex(4)
            self._members[group], self._key[group] = set(), key
        self._members[group].add(sandbox_id)
        self._group_of[sandbox_id] = group
        self._in_flight[sandbox_id] = group
        return group

    def created(self, sandbox_id: str) -> None:
        """The create of `sandbox_id` ended (made or failed): its group may be joined again."""
        self._in_flight.pop(sandbox_id, None)

    def adopt(self, sandbox_id: str, group: str, key: str) -> None:
        """A sandbox made before this process started (read from its labels)."""
        if sandbox_id in self._group_of:
            return
        self._members.setdefault(group, set()).add(sandbox_id)
        self._key.setdefault(group, key)
        self._group_of[sandbox_id] = group

    def leave(self, sandbox_id: str) -> None:
        """`sandbox_id` is being destroyed: it no longer counts, and a group
        left empty is closed (its shim is about to exit)."""
        self._in_flight.pop(sandbox_id, None)
        group = self._group_of.pop(sandbox_id, None)
        if group is None:
            return
        members = self._members.get(group)
        if members is None:
            return
        members.discard(sandbox_id)
        if not members:
            del self._members[group], self._key[group]

    def group_of(self, sandbox_id: str) -> str | None:
        return self._group_of.get(sandbox_id)

    def sizes(self) -> dict[str, int]:
        """Open groups and their member counts (for metrics and tests)."""
        return {group: len(members) for group, members in self._members.items()}
