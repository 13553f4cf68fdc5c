"""`corral spec from-compose`: a compose file's common subset as an episode spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from contract.models import EpisodeSpec
from corral.cli_episodes import spec as spec_group
from corral.compose import ComposeError, spec_from_compose

COMPOSE = """
services:
  agent:
    image: swe-task:latest
    environment: [TASK=fix-42, DEBUG=1]
    volumes: [./repo:/repo]
  db:
    image: postgres:16
    environment: {POSTGRES_PASSWORD: secret}
    command: postgres -c fsync=off
    ports: ["5432:5432"]
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U postgres"]
      interval: 2s
      retries: 5
      start_period: 1m
  api:
    image: mock-api
    entrypoint: ["/bin/mock"]
    command: ["--port", "8080"]
    healthcheck: {test: ["CMD", "wget", "-q", "http://127.0.0.1:8080/health"]}
"""


def test_the_agent_and_its_services_carry_over() -> None:
    spec, dropped = spec_from_compose(yaml.safe_load(COMPOSE))
    assert spec["image"] == "swe-task:latest"
    assert spec["env"] == {"TASK": "fix-42", "DEBUG": "1"}
    db, api = spec["services"]
    assert db == {
        "name": "db",
        "image": "postgres:16",
        "command": "postgres -c fsync=off",
        "env": {"POSTGRES_PASSWORD": "secret"},
        "ready": {"cmd": "pg_isready -U postgres", "timeout_s": 70.0},
    }
    assert api["command"] == ["/bin/mock", "--port", "8080"]
    assert api["ready"]["cmd"] == ["wget", "-q", "http://127.0.0.1:8080/health"]
    assert sorted(dropped) == ["agent.volumes", "db.ports"]
    EpisodeSpec.model_validate(spec)  # what `corral episode start --spec` will read


def test_the_agent_is_chosen_by_name() -> None:
    compose = {"services": {"db": {"image": "db", "command": "serve"}, "me": {"image": "tools"}}}
    spec, _ = spec_from_compose(compose, agent="me")
    assert spec["image"] == "tools" and [s["name"] for s in spec["services"]] == ["db"]
    with pytest.raises(ComposeError, match="no service 'nobody'"):
        spec_from_compose(compose, agent="nobody")


@pytest.mark.parametrize(
    ("compose", "message"),
    [
        ({}, "no 'services:'"),
        ({"services": {"a": {"build": "."}}}, "service 'a' has no image"),
        ({"services": {"a": {"image": "x"}, "b": {"image": "y"}}}, "service 'b' has no command"),
        ({"services": {"a": {"image": "x"}}}, None),
        (
            {"services": {"a": {"image": "x"}, "B!": {"image": "y", "command": "z"}}},
            "services.0.name",
        ),
    ],
)
def test_what_cannot_be_read_is_named(compose: dict[str, object], message: str | None) -> None:
    if message is None:
        assert spec_from_compose(compose)[0] == {"image": "x", "env": {}, "services": []}
        return
    with pytest.raises(ComposeError, match=message.replace("'", ".")):
        spec_from_compose(compose)


def test_the_cli_prints_yaml_and_names_what_it_dropped(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(COMPOSE)
    result = CliRunner().invoke(spec_group, ["from-compose", str(path)])
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.stdout)
    assert printed["services"][0]["name"] == "db"
    assert "not carried over: agent.volumes, db.ports" in result.stderr
    path.write_text("services: [1, 2]")
    failed = CliRunner().invoke(spec_group, ["from-compose", str(path)])
    assert failed.exit_code == 1 and "no 'services:' mapping" in failed.output
