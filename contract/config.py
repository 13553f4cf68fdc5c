"""Loading `temporal-dev.yaml` into one typed `StackConfig`.

Every Corral process (CLI, workers, sensor, intake, tests) reads its settings
through `load_config()`, so pointing a node at a Temporal cluster is a change
of configuration or environment, never of code. Environment variables named
in the YAML's comments override the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.errors import CorralError
from contract.models import TenantConfig

CONFIG_ENV = "CORRAL_CONFIG"
DEFAULT_CONFIG_NAME = "temporal-dev.yaml"
SERVICE_METRICS_OFFSET = 50  # intake and sensor ports start here above metrics_port_base
# Registries reached over plain HTTP unless the config says otherwise, and the
# environment variables credentials come from (secrets stay out of the file).
DEFAULT_INSECURE = ("localhost", "127.0.0.1", "[::1]")
USERNAME_ENV = "CORRAL_REGISTRY_USERNAME"
PASSWORD_ENV = "CORRAL_REGISTRY_PASSWORD"
DEFAULT_OVERCOMMIT = 50.0  # a node admits sandboxes' requested CPU up to this many times its cores


class ConfigError(CorralError):
    """The stack configuration file is missing or malformed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DevServerConfig(_Strict):
    enabled: bool = True
    # HOST:PORT the dev server listens on when clients reach it at `temporal.address`
    # through something else (a TLS, API-key-checking proxy); None: at that address.
    listen: str | None = None
    ui_port: int = 8233
    metrics_port: int = 9233
    db_file: str = "temporal.sqlite"
    search_attributes: dict[str, str] = Field(default_factory=dict)
    # Server dynamic config (`--dynamic-config-value KEY=VALUE`, the value as JSON).
    dynamic_config: dict[str, Any] = Field(default_factory=dict)

    @field_validator("listen")
    @classmethod
    def _has_port(cls, value: str | None) -> str | None:
        return None if value is None else _host_port(value)


class TemporalConfig(_Strict):
    address: str = "127.0.0.1:7233"
    namespace: str = "corral"
    tls: bool = False
    tls_cert: str | None = None
    tls_key: str | None = None
    api_key: str | None = None
    tls_ca: str | None = None  # a private CA for the frontend's certificate
    tls_server_name: str | None = None  # when the address is not the certificate's name
    dev_server: DevServerConfig = Field(default_factory=DevServerConfig)

    @property
    def dev_server_address(self) -> str:
        """Where `corral up` runs the dev server: `dev_server.listen`, else `address`."""
        return self.dev_server.listen or self.address


def _host_port(value: str) -> str:
    """HOST:PORT, checked here so a typo fails at load with the field's name."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return value


class UidPoolConfig(_Strict):
    """Host ids for sandboxes' user namespaces (sandbox/userns.py): 1,024 ranges of `size`
    ids from `start`; keep them clear of host users and /etc/subuid allocations."""

    start: int = Field(default=1_000_000_000, ge=65536)
    size: int = Field(default=65536, ge=65536)


class NodeBudgetConfig(_Strict):
    """`nodes.budget` in temporal-dev.yaml; every unset value comes from the machine."""

    cores: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=64)
    pids: int | None = Field(default=None, ge=64)
    max_sandboxes: int | None = Field(default=None, ge=0)
    overcommit: float = Field(default=DEFAULT_OVERCOMMIT, ge=1)
    cpu_pressure_high: float = Field(default=90.0, gt=0, le=100)
    cpu_pressure_low: float = Field(default=60.0, ge=0, le=100)
    hysteresis: float = Field(default=0.05, ge=0, lt=1)
    disk_min_free_mb: int = Field(default=256, ge=0)


class NodesConfig(_Strict):
    count: int = Field(default=1, ge=1, le=16)
    containerd_namespace: str = "corral"
    snapshotter: str = "overlayfs"
    runtime: str = "io.containerd.runc.v2"
    # Sandboxes of one tenant per runc shim (sandbox/shimgroups.py); 1: a shim each.
    shim_group_size: int = Field(default=20, ge=1, le=100)
    # Nodes joined by name (`corral node up --name N`) besides node-1..node-<count>.
    extra: list[str] = Field(default_factory=list)
    # Each node in its own network namespace (`corral up --isolated`).
    isolated: bool = False
    # What each node may hold (activities/capacity.py); unset values come from the machine.
    budget: NodeBudgetConfig = Field(default_factory=NodeBudgetConfig)
    userns: UidPoolConfig = Field(default_factory=UidPoolConfig)
    # Fork and user snapshot images nothing used for this long are collected
    # (sandbox/snapshot_gc.py, every few minutes per node); 0: never.
    snapshot_retention_s: float = Field(default=3600.0, ge=0)


class WorkersConfig(_Strict):
    workflow_task_queue: str = "corral-episodes"
    node_task_queue_prefix: str = "corral-node-"
    metrics_port_base: int = 9460
    # image -> ready sandboxes each node keeps (see activities/pool.py)
    warm_pool: dict[str, int] = Field(default_factory=dict)
    # The exec agent as every new sandbox's PID 1, steps and files through it
    # (docs/agent.md). On by default: sessions, jobs, streaming and PTYs need it,
    # and a call through it costs a tenth of a runc exec. Off: runc exec only.
    exec_agent: bool = True

    @field_validator("warm_pool", mode="before")
    @classmethod
    def _pool_from_text(cls, value: Any) -> Any:
        """`busybox=8,debian=2` (the CORRAL_WARM_POOL form); empty for none."""
        if isinstance(value, str):
            pairs = [item.split("=", 1) for item in value.split(",") if item.strip()]
            return {name.strip(): int(size) for name, size in pairs}
        return value


class IntakeConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = 8765
    token_env: str = "CORRAL_INTAKE_TOKEN"
    url: str | None = None  # where sensors post (a remote node); default from host and port
    tls_cert: str | None = None  # served when set (required beyond loopback)
    tls_key: str | None = None
    tls_ca: str | None = None  # what sensors trust for the intake's certificate


class SensorConfig(_Strict):
    enabled: bool = True
    rules: list[str] = Field(default_factory=lambda: ["policies/rules/corral_rules.yaml"])
    responses: str = "policies/responses.yaml"
    # auto: the compiled libbpf sensor when scripts/setup.sh built it and it loads,
    # else bpftrace (policies/sensor/sensor.py logs which and why)
    backend: Literal["auto", "bpftrace", "libbpf"] = "auto"
    # A node whose sensor is down starts no agent command (`corral up --allow-unwatched`).
    required: bool = True
    # How long a step waits for the sensor to judge its events (the watermark).
    settle_timeout_s: float = Field(default=10.0, gt=0)


class ObservabilityConfig(_Strict):
    traces: str = "file"
    otlp_endpoint: str | None = None
    records_dir: str = "records"


class RegistryConfig(_Strict):
    """Image registries (`corral image pull|push`, episodes whose image is `host/repo:tag`)."""

    default: str | None = None  # host[:port] snapshots are shared through, if any
    insecure: list[str] = Field(default_factory=lambda: list(DEFAULT_INSECURE))  # plain HTTP
    username_env: str = USERNAME_ENV
    password_env: str = PASSWORD_ENV

    @field_validator("insecure", mode="before")
    @classmethod
    def _hosts_from_text(cls, value: Any) -> Any:
        """`localhost,registry.lan:5000` (the CORRAL_REGISTRY_INSECURE form)."""
        if isinstance(value, str):
            return [host.strip() for host in value.split(",") if host.strip()]
        return value


class StackConfig(_Strict):
    """The whole local stack; paths are resolved against `root`."""

    root: Path = Field(default_factory=Path.cwd, exclude=True)
    state_dir: Path = Path(".state/stack")
    temporal: TemporalConfig = Field(default_factory=TemporalConfig)
    nodes: NodesConfig = Field(default_factory=NodesConfig)
    workers: WorkersConfig = Field(default_factory=WorkersConfig)
    intake: IntakeConfig = Field(default_factory=IntakeConfig)
    sensor: SensorConfig = Field(default_factory=SensorConfig)
    observability: ObservabilityConfig = Field(default_factory=ObservabilityConfig)
    registry: RegistryConfig = Field(default_factory=RegistryConfig)
    # Tenant name -> rules and quota (docs/tenants.md); undeclared tenants run unrestricted.
    tenants: dict[str, TenantConfig] = Field(default_factory=dict)

    # --- derived locations, all under the state directory -----------------
    @property
    def state(self) -> Path:
        path = self.state_dir if self.state_dir.is_absolute() else self.root / self.state_dir
        return path.resolve()

    def node_names(self) -> list[str]:
        numbered = [f"node-{i}" for i in range(1, self.nodes.count + 1)]
        return numbered + [n for n in self.nodes.extra if n not in numbered]

    def node_dir(self, node: str) -> Path:
        return self.state / "nodes" / node

    # --- the node's sensor: its socket and the records on-call reads --------
    def sensor_socket(self, node: str) -> Path:
        return self.state / "run" / f"sensor-{node}.sock"

    def sensor_enforced_record(self, node: str) -> Path:
        """Alerts the node enforced itself (the intake could not take them)."""
        return self.state / "run" / f"enforced-{node}.jsonl"

    def sensor_frozen_record(self, node: str) -> Path:
        """Sandboxes the node's sensor froze in place the moment a rule matched."""
        return self.state / "run" / f"frozen-{node}.jsonl"

    def containerd_socket(self, node: str) -> Path:
        return self.node_dir(node) / "containerd" / "containerd.sock"

    def node_task_queue(self, node: str) -> str:
        return f"{self.workers.node_task_queue_prefix}{node}"

    def metrics_ports(self, node: str | None = None) -> tuple[int, int]:
        """(Corral's OpenTelemetry port, Temporal SDK port) of one process.

        The workflow worker takes the first pair, node N the pair after N-1 others.
        """
        base = self.workers.metrics_port_base + 2 * self._process_index(node)
        return base, base + 1

    def service_metrics_port(self, node: str | None = None) -> int:
        """The Prometheus port of the intake (no node) or of a node's sensor:
        a block above the workers' pairs, so adding nodes never moves it."""
        return self.workers.metrics_port_base + SERVICE_METRICS_OFFSET + self._process_index(node)

    def _process_index(self, node: str | None) -> int:
        names = self.node_names()
        return 0 if node is None else names.index(node) + 1 if node in names else len(names) + 1

    @property
    def records_dir(self) -> Path:
        return self.state / self.observability.records_dir

    @property
    def traces_file(self) -> Path:
        return self.state / "traces.jsonl"

    @property
    def intake_url(self) -> str:
        """Where sensors post alerts: https when the intake serves a certificate."""
        if self.intake.url:
            return self.intake.url
        scheme = "https" if self.intake.tls_cert else "http"
        return f"{scheme}://{self.intake.host}:{self.intake.port}/alerts"

    @property
    def intake_token_file(self) -> Path:
        return self.state / "intake.token"

    @property
    def ui_url(self) -> str:
        # The dev server serves its UI beside its gRPC port, not behind a proxy.
        host = self.temporal.dev_server_address.rsplit(":", 1)[0]
        return f"http://{host}:{self.temporal.dev_server.ui_port}/namespaces/{self.temporal.namespace}/workflows"

    def resolve(self, path: str | Path) -> Path:
        """A path from the config file, relative to the repository root."""
        p = Path(path)
        return p if p.is_absolute() else (self.root / p).resolve()

    def intake_token(self) -> str | None:
        token = os.environ.get(self.intake.token_env)
        if token:
            return token
        if self.intake_token_file.exists():
            return self.intake_token_file.read_text().strip() or None
        return None


_ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "CORRAL_STATE_DIR": ("state_dir",),
    "CORRAL_TEMPORAL_ADDRESS": ("temporal", "address"),
    "CORRAL_TEMPORAL_NAMESPACE": ("temporal", "namespace"),
    "CORRAL_TEMPORAL_TLS": ("temporal", "tls"),
    "CORRAL_TEMPORAL_TLS_CERT": ("temporal", "tls_cert"),
    "CORRAL_TEMPORAL_TLS_KEY": ("temporal", "tls_key"),
    "CORRAL_TEMPORAL_API_KEY": ("temporal", "api_key"),
    "CORRAL_TEMPORAL_TLS_CA": ("temporal", "tls_ca"),
    "CORRAL_TEMPORAL_TLS_SERVER_NAME": ("temporal", "tls_server_name"),
    "CORRAL_TEMPORAL_DEV_LISTEN": ("temporal", "dev_server", "listen"),
    "CORRAL_TEMPORAL_UI_PORT": ("temporal", "dev_server", "ui_port"),
    "CORRAL_TEMPORAL_METRICS_PORT": ("temporal", "dev_server", "metrics_port"),
    "CORRAL_METRICS_PORT_BASE": ("workers", "metrics_port_base"),
    "CORRAL_WORKFLOW_TASK_QUEUE": ("workers", "workflow_task_queue"),
    "CORRAL_WARM_POOL": ("workers", "warm_pool"),
    "CORRAL_EXEC_AGENT": ("workers", "exec_agent"),
    "CORRAL_NODES": ("nodes", "count"),
    "CORRAL_SHIM_GROUP_SIZE": ("nodes", "shim_group_size"),
    "CORRAL_SNAPSHOT_RETENTION_S": ("nodes", "snapshot_retention_s"),
    "CORRAL_INTAKE_PORT": ("intake", "port"),
    "CORRAL_INTAKE_HOST": ("intake", "host"),
    "CORRAL_INTAKE_URL": ("intake", "url"),
    "CORRAL_INTAKE_TLS_CERT": ("intake", "tls_cert"),
    "CORRAL_INTAKE_TLS_KEY": ("intake", "tls_key"),
    "CORRAL_INTAKE_TLS_CA": ("intake", "tls_ca"),
    "CORRAL_SENSOR_BACKEND": ("sensor", "backend"),
    "CORRAL_SENSOR_REQUIRED": ("sensor", "required"),
    "CORRAL_TRACES": ("observability", "traces"),
    "CORRAL_OTLP_ENDPOINT": ("observability", "otlp_endpoint"),
    "CORRAL_REGISTRY": ("registry", "default"),
    "CORRAL_REGISTRY_INSECURE": ("registry", "insecure"),
}


def _apply_env(data: dict[str, Any], env: dict[str, str]) -> None:
    for var, path in _ENV_OVERRIDES.items():
        if var not in env:
            continue
        node = data
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = env[var]


def find_config(start: Path | None = None) -> Path:
    """`$CORRAL_CONFIG`, else the nearest `temporal-dev.yaml` upwards from `start`."""
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]).resolve()
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / DEFAULT_CONFIG_NAME
        if candidate.exists():
            return candidate
    # Fall back to the repository this package was installed from (editable install).
    repo = Path(__file__).resolve().parents[1] / DEFAULT_CONFIG_NAME
    if repo.exists():
        return repo
    raise ConfigError(f"no {DEFAULT_CONFIG_NAME} found from {here} upwards; set {CONFIG_ENV}")


def load_config(path: Path | None = None, env: dict[str, str] | None = None) -> StackConfig:
    config_path = path or find_config()
    try:
        data = yaml.safe_load(config_path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{config_path}: cannot read: {_one_line(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{config_path}: expected a mapping at the top level")
    _apply_env(data, dict(os.environ) if env is None else env)
    try:
        config = StackConfig(root=config_path.parent, **data)
    except ValidationError as exc:
        raise ConfigError(f"{config_path}: {describe_validation_error(exc)}") from exc
    return _with_running_node_count(config, env)


def _with_running_node_count(config: StackConfig, env: dict[str, str] | None) -> StackConfig:
    """`corral up --nodes N` records N; later commands talk to those N nodes.

    The stack file's `overrides` (written by `corral up --isolated` and
    `corral node up`) say where the running stack really listens and which
    nodes joined by name; they win over the file, the environment over them
    (the stack passes each child its settings explicitly).
    """
    stack_file = config.state / "stack.json"
    try:
        recorded = json.loads(stack_file.read_text())
        count = int(recorded["nodes"])
    except (OSError, ValueError, KeyError, TypeError):
        return config
    env_map = dict(os.environ) if env is None else env
    overrides = recorded.get("overrides") or {}
    if overrides:
        merged = _deep_merge(config.model_dump(), overrides)
        _apply_env(merged, env_map)
        config = StackConfig(root=config.root, **merged)
    if "CORRAL_NODES" in env_map:
        return config
    return config.model_copy(update={"nodes": config.nodes.model_copy(update={"count": count})})


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def describe_validation_error(exc: ValidationError) -> str:
    """One line naming each bad field and why, from a pydantic error."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())
