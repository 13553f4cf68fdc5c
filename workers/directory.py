"""Which episode owns a container: container id -> sandbox labels, across nodes.

Falco reports `container.id` as the first 12 hex digits of the container id;
Corral's sandbox ids are 64 hex digits (see `workflows.episode.sandbox_id_for`),
so a prefix match over each node's sandboxes finds the sandbox, and its
`corral.workflow_id` label the episode. Answers are cached; a miss is asked
again each time (a sandbox may be seconds old).
"""

from __future__ import annotations

import contextlib

from sandbox import Containerd
from sandbox.errors import CorralError
from workers.config import StackConfig


class SandboxDirectory:
    def __init__(self, config: StackConfig, nodes: list[str] | None = None) -> None:
        self._config = config
        self._nodes = nodes or config.node_names()
        self._clients: dict[str, Containerd] = {}
        self._labels: dict[str, dict[str, str]] = {}

    async def _client(self, node: str) -> Containerd:
        if node not in self._clients:
            self._clients[node] = await Containerd.connect(
                str(self._config.containerd_socket(node)),
                namespace=self._config.nodes.containerd_namespace,
            )
        return self._clients[node]

    async def labels_for(self, container_id: str) -> dict[str, str] | None:
        """The labels of the sandbox whose id starts with `container_id`, or None."""
        if container_id in self._labels:
            return self._labels[container_id]
        for node in self._nodes:
            with contextlib.suppress(CorralError):
                client = await self._client(node)
                for info in await client.list_sandboxes({"corral.sandbox": "1"}):
                    if info.id.startswith(container_id):
                        labels = {
                            **info.labels,
                            "corral.full_id": info.id,
                            "corral.image": info.image,
                        }
                        if "corral.workflow_id" in labels:  # warm ones change owner
                            self._labels[container_id] = labels
                        return labels
        return None

    async def workflow_for(self, container_id: str) -> str | None:
        labels = await self.labels_for(container_id)
        return labels.get("corral.workflow_id") if labels else None

    def forget(self, container_id: str) -> None:
        self._labels.pop(container_id, None)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
