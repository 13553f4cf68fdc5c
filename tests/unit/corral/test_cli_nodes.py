"""Fleet commands and their plumbing, without services: one-line errors, the
stack file's overrides, rig names and addresses, Temporal TLS options, the
intake's TLS rule and how it names the episode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.client import TLSConfig
from test_corral_cli import assert_one_line_error, run_cli

from contract.config import load_config
from policies.alert import make_alert
from policies.responses import Decision
from sandbox.network import SANDBOX_RANGE
from workers.directory import WORKFLOW_ID_FIELD, EpisodeDirectory
from workers.intake import IntakeConfigError, IntakeSettings, TemporalDelivery, _ssl
from workers.netns import RIG_RANGE, Rig, node_host_number
from workers.stack import StackError, check_node_name
from workers.temporal import TemporalUnavailable, describe_connect_error, tls_config
from workers.tls import is_loopback, make_dev_certificate

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "temporal-dev.yaml"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("node", "up", "--name", "Bad_Name"), "node name 'Bad_Name'"),
        (("node", "kill", "node-9"), "unknown node 'node-9'"),
        (("node", "down", "node-9"), "unknown node 'node-9'"),
        (("node", "list"), "cannot reach Temporal at 127.0.0.1:1"),
        (("node", "drain", "node-1"), "cannot reach Temporal at 127.0.0.1:1"),
        (("node", "forget", "node-1"), "cannot reach Temporal at 127.0.0.1:1"),
        (("up", "--role", "nodes"), "'nodes' is not one of 'all', 'control'"),
    ],
)
def test_bad_node_input_gets_a_one_line_error(
    args: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    assert_one_line_error(run_cli(*args, tmp_path=tmp_path), message)
    assert not (tmp_path / "nodes").exists(), "a refused command left state behind"


def test_node_names_must_be_plain() -> None:
    check_node_name("node-12")
    check_node_name("gpu-a")
    for bad in ("", "-x", "a/b", "x" * 33, "Node"):
        with pytest.raises(StackError, match="node name"):
            check_node_name(bad)


def _write_stack_file(state: Path, data: dict[str, Any]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "stack.json").write_text(json.dumps(data))


def test_stack_file_overrides_the_yaml_and_environment_overrides_both(tmp_path: Path) -> None:
    _write_stack_file(
        tmp_path,
        {
            "nodes": 3,
            "overrides": {
                "nodes": {"extra": ["gpu-a"], "isolated": True},
                "intake": {"host": "100.72.1.1", "tls_cert": "/x/cert.pem", "port": 9000},
            },
        },
    )
    env = {"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_INTAKE_PORT": "9100"}
    config = load_config(CONFIG, env=env)
    assert config.node_names() == ["node-1", "node-2", "node-3", "gpu-a"]
    assert config.nodes.isolated
    assert config.intake_url == "https://100.72.1.1:9100/alerts"
    # A joined node gets a metrics port pair of its own.
    assert config.metrics_ports("gpu-a")[0] not in {
        config.metrics_ports(n)[0] for n in ["node-1", "node-2", "node-3"]
    }


def test_intake_url_from_config_or_environment(tmp_path: Path) -> None:
    env = {"CORRAL_STATE_DIR": str(tmp_path), "CORRAL_INTAKE_URL": "https://control:8765/alerts"}
    assert load_config(CONFIG, env=env).intake_url == "https://control:8765/alerts"
    plain = load_config(CONFIG, env={"CORRAL_STATE_DIR": str(tmp_path)})
    assert plain.intake_url.startswith("http://127.0.0.1:")


def test_rig_names_fit_interfaces_and_differ_between_stacks(tmp_path: Path) -> None:
    one, two = Rig.for_state(tmp_path / "a"), Rig.for_state(tmp_path / "b")
    assert one.bridge != two.bridge and one.netns("node-1") != two.netns("node-1")
    for name in (one.bridge, one.host_veth("node-1"), one.host_veth("a-very-long-node-name")):
        assert len(name) <= 15  # IFNAMSIZ - 1
    assert one.host_veth("node-1") != one.host_veth("node-2")
    assert one.enter("node-1", ["containerd"])[:2] == [
        "nsenter",
        f"--net=/run/netns/{one.netns('node-1')}",
    ]


def test_node_addresses_stay_in_their_subnet() -> None:
    assert node_host_number("node-1") == 11
    assert node_host_number("node-16") == 26
    assert 100 <= node_host_number("gpu-a") < 250
    assert not RIG_RANGE.overlaps(SANDBOX_RANGE)


def test_temporal_tls_options(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    make_dev_certificate(cert, key, "127.0.0.1")
    base = {"CORRAL_STATE_DIR": str(tmp_path)}
    assert tls_config(load_config(CONFIG, env=base)) is False
    assert tls_config(load_config(CONFIG, env={**base, "CORRAL_TEMPORAL_TLS": "1"})) is True
    mtls = tls_config(
        load_config(
            CONFIG,
            env={
                **base,
                "CORRAL_TEMPORAL_TLS": "1",
                "CORRAL_TEMPORAL_TLS_CERT": str(cert),
                "CORRAL_TEMPORAL_TLS_KEY": str(key),
                "CORRAL_TEMPORAL_TLS_CA": str(cert),
                "CORRAL_TEMPORAL_TLS_SERVER_NAME": "temporal.internal",
            },
        )
    )
    assert isinstance(mtls, TLSConfig)
    assert mtls.client_cert == cert.read_bytes() and mtls.server_root_ca_cert == cert.read_bytes()
    assert mtls.domain == "temporal.internal"
    half = {**base, "CORRAL_TEMPORAL_TLS": "1", "CORRAL_TEMPORAL_TLS_CERT": str(cert)}
    with pytest.raises(TemporalUnavailable, match="go together"):
        tls_config(load_config(CONFIG, env=half))


# The SDK's own words for each failure (tests/e2e/test_temporal_tls.py meets them for real).
_REFUSED = (
    "Failed client connect: `get_system_info` call error after connection: Status { code: "
    'Unauthenticated, message: "missing or wrong API key", metadata: MetadataMap { } }'
)
_UNKNOWN_CA = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
    "ConnectError(Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }))"
)
_CA_AS_SERVER = (
    "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
    "ConnectError(Custom { kind: InvalidData, error: "
    "InvalidCertificate(Other(OtherError(CaUsedAsEndEntity))) }))"
)
_PLAIN_TO_TLS = (
    "Failed client connect: `get_system_info` call error after connection: Status { code: "
    'Cancelled, message: "operation was canceled", source: Some(tonic::transport::Error('
    'Transport, hyper::Error(Canceled, "connection closed"))) }'
)


@pytest.mark.parametrize(
    ("tls", "error", "says"),
    [
        ("1", _REFUSED, "refused the credentials (Unauthenticated: missing or wrong API key)"),
        ("1", _UNKNOWN_CA, "TLS with Temporal at 127.0.0.1:7443 (namespace corral) failed"),
        ("1", _UNKNOWN_CA, "failed (InvalidCertificate UnknownIssuer); check temporal.tls_ca"),
        ("1", _CA_AS_SERVER, "failed (InvalidCertificate CaUsedAsEndEntity)"),
        ("0", _PLAIN_TO_TLS, "closed the connection; does it require TLS"),
        ("1", _PLAIN_TO_TLS, "cannot reach Temporal at 127.0.0.1:7443"),
        ("0", "Connection refused", "is the stack up? try `corral up`"),
    ],
)
def test_a_failed_connect_names_the_setting_to_check(
    tmp_path: Path, tls: str, error: str, says: str
) -> None:
    env = {
        "CORRAL_STATE_DIR": str(tmp_path),
        "CORRAL_TEMPORAL_ADDRESS": "127.0.0.1:7443",
        "CORRAL_TEMPORAL_TLS": tls,
    }
    line = describe_connect_error(RuntimeError(error), load_config(CONFIG, env=env).temporal)
    assert says in line and "\n" not in line


def test_intake_beyond_loopback_needs_a_certificate(tmp_path: Path) -> None:
    token = [SecretStr("t")]
    assert _ssl(IntakeSettings(host="127.0.0.1", tokens=token)) is None
    with pytest.raises(IntakeConfigError, match="beyond loopback"):
        _ssl(IntakeSettings(host="100.72.0.1", tokens=token))
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    make_dev_certificate(cert, key, "100.72.0.1")
    assert _ssl(IntakeSettings(host="100.72.0.1", tokens=token, tls_cert=cert, tls_key=key))
    assert is_loopback("localhost") and is_loopback("::1") and not is_loopback("0.0.0.0")


class _RecordingClient:
    """Records the signals TemporalDelivery sends (the workflow id is what matters)."""

    def __init__(self) -> None:
        self.signalled: list[str] = []

    def get_workflow_handle(self, workflow_id: str) -> Any:
        client = self

        class _Handle:
            async def signal(self, *_: Any) -> None:
                client.signalled.append(workflow_id)

        return _Handle()


async def test_delivery_trusts_the_sensors_workflow_id_before_searching() -> None:
    searched: list[str] = []

    async def resolve(container_id: str) -> str | None:
        searched.append(container_id)
        return "ep-by-search"

    client = _RecordingClient()
    delivery = TemporalDelivery(client, resolve)  # type: ignore[arg-type]
    fields = {"container.id": "abcdef012345", "proc.cmdline": "x", "proc.pid": 1}
    decision = Decision(action="kill", rule="r")
    named = make_alert(
        rule="r",
        priority="Warning",
        output="o",
        output_fields={**fields, WORKFLOW_ID_FIELD: "ep-1"},
    )
    assert (await delivery(named, decision)).workflow_id == "ep-1"
    assert searched == []
    anonymous = make_alert(rule="r", priority="Warning", output="o", output_fields=fields)
    assert (await delivery(anonymous, decision)).workflow_id == "ep-by-search"
    assert searched == ["abcdef012345"] and client.signalled == ["ep-1", "ep-by-search"]


async def test_directory_refuses_non_hex_ids_without_asking_temporal() -> None:
    directory = EpisodeDirectory(object())  # type: ignore[arg-type]
    assert await directory.workflow_for('abc" OR 1=1') is None
