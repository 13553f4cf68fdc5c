"""A compose file's common subset as an episode spec (`corral spec from-compose`).

Benchmarks ship their worlds as compose files: an agent container and the
services it works against. One compose service becomes the episode's own
sandbox (the one named by `--agent`, else one called `agent`, else the first),
the others its `services:`. Kept: `image`, `command` (and `entrypoint`
before it), `environment` (map or `KEY=VALUE` list) and a `healthcheck`'s
`test` as the readiness command. Everything else (ports, volumes, networks,
depends_on, build, ...) is listed back as dropped: in an episode every
container shares one loopback and reaches the others by name, so ports and
networks have no meaning, and images must already exist.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from pydantic import ValidationError

from contract.config import describe_validation_error
from contract.models import EpisodeSpec

__all__ = ["ComposeError", "spec_from_compose"]

KEPT = {"image", "command", "entrypoint", "environment", "healthcheck"}


class ComposeError(ValueError):
    """The file is not a compose file this subset can read; the message says why."""


def spec_from_compose(compose: Any, agent: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """(episode spec, what was dropped), the spec checked as `EpisodeSpec`."""
    services = compose.get("services") if isinstance(compose, dict) else None
    if not isinstance(services, dict) or not services:
        raise ComposeError("no 'services:' mapping in the compose file")
    chosen = agent or ("agent" if "agent" in services else next(iter(services)))
    if chosen not in services:
        raise ComposeError(f"no service {chosen!r} to run the agent in ({', '.join(services)})")
    dropped: list[str] = []
    for name, body in services.items():
        if not isinstance(body, dict) or not isinstance(body.get("image"), str):
            raise ComposeError(f"service {name!r} has no image (images are not built here)")
        dropped += [f"{name}.{key}" for key in body if key not in KEPT]
    agent_body = services[chosen]
    if "command" in agent_body or "entrypoint" in agent_body or "healthcheck" in agent_body:
        dropped.append(f"{chosen}.command (the agent's container runs the episode's steps)")
    spec: dict[str, Any] = {
        "image": agent_body["image"],
        "env": _environment(chosen, agent_body),
        "services": [_service(n, b) for n, b in services.items() if n != chosen],
    }
    try:
        EpisodeSpec.model_validate(spec)
    except ValidationError as err:
        raise ComposeError(f"not a valid episode: {describe_validation_error(err)}") from err
    return spec, dropped


def _service(name: str, body: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = {
        "name": name,
        "image": body["image"],
        "command": _command(name, body),
        "env": _environment(name, body),
    }
    ready = _readiness(name, body.get("healthcheck"))
    if ready is not None:
        service["ready"] = ready
    return service


def _command(name: str, body: dict[str, Any]) -> str | list[str]:
    entry, command = body.get("entrypoint"), body.get("command")
    if entry is None and command is None:
        raise ComposeError(
            f"service {name!r} has no command (an image's own CMD is not read): add one"
        )
    if isinstance(entry, str) or isinstance(command, str):
        return " ".join(_words(entry) + _words(command))
    return [*_words(entry), *_words(command)]


def _words(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _environment(name: str, body: dict[str, Any]) -> dict[str, str]:
    env = body.get("environment") or {}
    if isinstance(env, list):
        pairs = [str(item).split("=", 1) for item in env]
        if any(len(pair) != 2 for pair in pairs):
            raise ComposeError(f"service {name!r}: environment entries must be KEY=VALUE")
        return {k: v for k, v in pairs}
    if not isinstance(env, dict):
        raise ComposeError(f"service {name!r}: environment must be a map or a list")
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _readiness(name: str, check: Any) -> dict[str, Any] | None:
    """`healthcheck.test`: ["CMD", argv...], ["CMD-SHELL", "cmd"] or a string."""
    if not isinstance(check, dict) or check.get("disable") or "test" not in check:
        return None
    test = check["test"]
    if isinstance(test, str):
        cmd: str | list[str] = test
    elif isinstance(test, list) and test and test[0] == "CMD-SHELL":
        cmd = " ".join(str(t) for t in test[1:])
    elif isinstance(test, list) and test and test[0] == "CMD":
        cmd = [str(t) for t in test[1:]]
    elif isinstance(test, list) and test and test[0] == "NONE":
        return None
    else:
        raise ComposeError(f"service {name!r}: healthcheck test {test!r} is not CMD or CMD-SHELL")
    ready: dict[str, Any] = {"cmd": cmd}
    budget = _seconds(check.get("start_period")) + _seconds(check.get("interval"), 30) * int(
        check.get("retries", 3)
    )
    ready["timeout_s"] = min(max(budget, 10.0), 900.0)
    return ready


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def _seconds(value: Any, default: float = 0.0) -> float:
    """A compose duration ("1m30s", "500ms", or a number of seconds)."""
    if value is None:
        return default
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{text!r} is not a duration (e.g. 30s, 1m30s)")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)
