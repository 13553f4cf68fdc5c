"""Config loading: defaults, env overrides, errors naming the field, node count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "temporal-dev.yaml"
    path.write_text(text)
    return path


def test_repository_config_loads_with_its_documented_values() -> None:
    config = load_config(REPO / "temporal-dev.yaml", env={})
    assert config.temporal.namespace == "corral"
    assert config.temporal.dev_server.search_attributes["AnomalyRule"] == "KeywordList"
    assert config.node_task_queue("node-1") == "corral-node-node-1"
    assert config.state == (REPO / ".state/stack").resolve()


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "state_dir: s\n")
    env = {
        "CORRAL_TEMPORAL_ADDRESS": "10.1.2.3:7233",
        "CORRAL_NODES": "3",
        "CORRAL_STATE_DIR": str(tmp_path / "elsewhere"),
    }
    config = load_config(path, env=env)
    assert config.temporal.address == "10.1.2.3:7233"
    assert config.node_names() == ["node-1", "node-2", "node-3"]
    assert config.state == tmp_path / "elsewhere"


def test_dev_server_may_listen_behind_the_address_clients_use(tmp_path: Path) -> None:
    """A TLS proxy at `temporal.address` in front of a dev server on another port."""
    path = write(tmp_path, "temporal:\n  dev_server:\n    ui_port: 8300\n")
    plain = load_config(path, env={}).temporal
    assert plain.dev_server_address == plain.address == "127.0.0.1:7233"
    env = {
        "CORRAL_TEMPORAL_ADDRESS": "10.0.0.5:7443",
        "CORRAL_TEMPORAL_DEV_LISTEN": "127.0.0.1:7300",
    }
    config = load_config(path, env=env)
    assert config.temporal.address == "10.0.0.5:7443"
    assert config.temporal.dev_server_address == "127.0.0.1:7300"
    assert config.ui_url.startswith("http://127.0.0.1:8300/")  # the UI is the dev server's
    with pytest.raises(ConfigError, match=r"temporal\.dev_server\.listen: .*HOST:PORT"):
        load_config(path, env={"CORRAL_TEMPORAL_DEV_LISTEN": "7300"})


def test_unknown_key_is_rejected_with_its_path(tmp_path: Path) -> None:
    path = write(tmp_path, "temporal:\n  adress: x\n")
    with pytest.raises(ConfigError, match=r"temporal\.adress: Extra inputs are not permitted"):
        load_config(path, env={})


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes: [unclosed\n")
    with pytest.raises(ConfigError, match=r"temporal-dev\.yaml: cannot read"):
        load_config(path, env={})


def test_node_count_of_the_running_stack_is_used(tmp_path: Path) -> None:
    path = write(tmp_path, f"state_dir: {tmp_path / 'state'}\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "stack.json").write_text(json.dumps({"nodes": 3}))
    assert load_config(path, env={}).nodes.count == 3
    assert load_config(path, env={"CORRAL_NODES": "1"}).nodes.count == 1


def test_metrics_ports_do_not_collide(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "nodes: {count: 4}\n"), env={})
    ports = [p for n in [None, *config.node_names()] for p in config.metrics_ports(n)]
    assert len(ports) == len(set(ports)) == 10
