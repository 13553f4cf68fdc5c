from __future__ import annotations

import json
from typing import Any

CID = "0123456789ab"
FULL = CID + "cd" * 26


def falco_body(**over: Any) -> dict[str, Any]:
    """A body as Falco's http_output sends it (json_output: true)."""
    body: dict[str, Any] = {
        "uuid": "8c4b5d8e-0f6a-4e8b-9b7e-5f2b6c1d2e3f",
        "output": "12:00:00.123456789: Error Binary dir written (file=/bin/sh)",
        "priority": "Error",
        "rule": "Write below binary dir in sandbox",
        "time": "2025-01-02T12:00:00.123456789Z",
        "output_fields": {
            "container.id": CID,
            "container.full_id": FULL,
            "proc.cmdline": "sh -c echo x > /bin/sh",
            "proc.pid": 4242,
            "fd.name": "/bin/sh",
            "evt.time": 1735819200123456789,
        },
        "source": "syscall",
        "tags": ["corral", "corral_tamper", "mitre_persistence"],
        "hostname": "node-1",
    }
    body.update(over)
    return body


def sidekick_body(**over: Any) -> dict[str, Any]:
    """Falcosidekick's webhook body: no uuid/hostname, lowercase priority, null tags."""
    body = falco_body(priority="critical", tags=None, rule="Crypto miner in sandbox")
    del body["uuid"]
    del body["hostname"]
    body.update(over)
    return body


def encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()
