"""How Corral names what it makes: an episode's sandbox and calls workflow
(from the episode's workflow id), images and snapshots.

The SDK, the workflows, the node and the tests derive the same names; this is
the one place that says how.
"""

from __future__ import annotations

import hashlib
import re

CALLS_SUFFIX = ".calls"
LOCAL_REGISTRY = "corral.local"  # the registry host short image names resolve to
SNAPSHOT_REPO = "corral/snapshots"
HIBERNATION_TAG = "hibernate-"  # a hibernated episode's snapshots: kept while it sleeps
_REPO_CHARS = re.compile(r"[^a-z0-9]+")
_TAG_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def sandbox_id_for(workflow_id: str) -> str:
    """Deterministic sandbox id: a retried provision finds the same sandbox.

    64 hex digits, like the container ids Falco's container plugin reports, so
    `container.id` (the first 12) and `container.full_id` mean the same here
    as under real Falco. The workflow id travels in the container's labels.
    """
    return hashlib.sha256(workflow_id.encode()).hexdigest()


def calls_workflow_id(episode_id: str) -> str:
    """The one id of an episode's calls workflow (a new run each time it starts)."""
    return episode_id + CALLS_SUFFIX


def resolve_image_name(name: str) -> str:
    """Short names live in the local registry: "busybox" -> "corral.local/busybox:latest"."""
    first = name.split("/", 1)[0]
    has_host = "/" in name and ("." in first or ":" in first or first == "localhost")
    full = name if has_host else f"{LOCAL_REGISTRY}/{name}"
    last = full.rsplit("/", 1)[1]
    if ":" not in last and "@" not in last:
        full += ":latest"
    return full


def snapshot_ref(episode_id: str, name: str) -> str:
    """`corral/snapshots/<episode>:<name>` with both parts made valid reference text.

    Repository components are lowercase alphanumerics joined by single
    separators; tags are at most 128 word characters, dots and dashes.
    """
    repo = _REPO_CHARS.sub("-", episode_id.lower()).strip("-") or "episode"
    tag = _TAG_CHARS.sub("-", name).lstrip(".-")[:128] or "latest"
    return f"{SNAPSHOT_REPO}/{repo}:{tag}"


def service_snapshot_ref(ref: str, service: str) -> str:
    """The snapshot of an episode's service `service` taken with snapshot `ref`."""
    repo, _, tag = ref.rpartition(":")
    suffix = f".{service}"
    return f"{repo}:{tag[: 128 - len(suffix)]}{suffix}"


def is_local_snapshot(image: str) -> bool:
    """A snapshot named in the local registry (not pushed anywhere): nodes copy it."""
    return resolve_image_name(image).startswith(f"{LOCAL_REGISTRY}/{SNAPSHOT_REPO}/")


def hibernation_tag(next_index: int) -> str:
    """The snapshot tag of an episode hibernated before step `next_index`."""
    return f"{HIBERNATION_TAG}{next_index}"
