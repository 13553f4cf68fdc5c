"""The data Corral's activities take and return, and the spec trainers write.

One model per activity input, as in temporalio/samples-python. They live in
the contract, below every layer, because the SDK, the workflows, the
activities and the workers all pass them; everyone imports them from here.
These travel through Temporal as JSON (pydantic data converter), so they are
plain data: no clients, no paths that only mean something on one host.
`EpisodeSpec` is what trainers write; unknown fields are rejected so that a
typo (`timout_s`) fails loudly instead of being ignored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.checks import check_env_keys, check_runtime_name, check_tmpfs_fits, egress_cidr

# --------------------------------------------------------------------------
# What trainers write
# --------------------------------------------------------------------------


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Resources(_Spec):
    cpu_cores: float = Field(default=1.0, gt=0, le=64)
    memory_mb: int = Field(default=512, ge=16, le=65536)
    pids_limit: int = Field(default=256, ge=8, le=32768)
    nofile: int = Field(default=1024, ge=64, le=1_048_576)
    tmpfs_mb: int = Field(default=64, ge=1, le=65536)
    # Quota on everything the sandbox writes to / (None: unbounded); disk IO limits.
    disk_mb: int | None = Field(default=1024, ge=16, le=1_048_576)
    io_bps_mb: int | None = Field(default=200, ge=1, le=100_000)
    io_iops: int | None = Field(default=4000, ge=10, le=10_000_000)
    # False: `cpu_cores` is a ceiling while a step runs, not a reservation (the
    # sandbox's weight drops to the minimum between steps: sandbox/cgroups.py).
    # True: full weight always, like a fixed reservation.
    hard_cpu_quota: bool = False

    @model_validator(mode="after")
    def _tmpfs_below_memory(self) -> Resources:
        # The node's SandboxSpec refuses it; refusing here fails the spec at start.
        check_tmpfs_fits(self.tmpfs_mb, self.memory_mb)
        return self


class EgressRule(_Spec):
    cidr: str
    port: int | None = Field(default=None, ge=1, le=65535)
    protocol: Literal["tcp", "udp"] = "tcp"

    @field_validator("cidr")
    @classmethod
    def _network_address(cls, value: str) -> str:
        return egress_cidr(value)


class Network(_Spec):
    mode: Literal["none", "allowlist"] = "none"
    egress: list[EgressRule] = Field(default_factory=list)
    # tc rate of the allowlist veth, each direction (None: unshaped).
    egress_mbit: int | None = Field(default=100, ge=1, le=100_000)

    @model_validator(mode="after")
    def _egress_needs_allowlist(self) -> Network:
        if self.egress and self.mode != "allowlist":
            raise ValueError("egress rules need mode 'allowlist'")
        return self


class FileSpec(_Spec):
    path: str = Field(pattern=r"^/")
    content: str
    mode: int = Field(default=0o644, ge=0, le=0o7777)


class Step(_Spec):
    """One command. A string runs under /bin/sh -c; a list is an argv."""

    cmd: str | list[str]
    timeout_s: float | None = Field(default=None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    stdin: str | None = None

    @field_validator("cmd")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        if not value or (isinstance(value, str) and not value.strip()):
            raise ValueError("command is empty")
        return value

    @field_validator("env")
    @classmethod
    def _env_keys(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env_keys(env)

    @field_validator("workdir")
    @classmethod
    def _absolute_workdir(cls, workdir: str | None) -> str | None:
        if workdir is not None and not workdir.startswith("/"):
            raise ValueError(f"workdir {workdir!r} must be an absolute path")
        return workdir

    def display(self) -> str:
        return self.cmd if isinstance(self.cmd, str) else " ".join(self.cmd)


# The model gateway (docs/trainers.md, "Model calls"): every sandbox of an
# episode that asks for it finds the node's OpenAI-compatible endpoint on its
# own loopback at this port, whatever its network mode.
MODEL_GATEWAY_PORT = 8417
MODEL_GATEWAY_BASE_URL = f"http://127.0.0.1:{MODEL_GATEWAY_PORT}/v1"
# The variables the episode's processes get; the key is the episode's own.
BASE_URL_ENV, API_KEY_ENV = "OPENAI_BASE_URL", "OPENAI_API_KEY"


class ModelGateway(_Spec):
    """`model_gateway:` in a spec: the agent's model calls go through the node,
    are recorded in the trajectory and are held to these budgets."""

    # The trainer's OpenAI-compatible server, e.g. http://10.0.0.5:8000/v1.
    upstream: str = Field(pattern=r"^https?://[^/\s]+(/\S*)?$")
    # Sent upstream as the bearer token (the sandbox never sees it).
    upstream_api_key: str = ""
    max_tokens_per_episode: int | None = Field(default=None, ge=1)
    max_calls: int | None = Field(default=None, ge=1)
    upstream_timeout_s: float = Field(default=600, gt=0)


def gateway_env(key: str) -> dict[str, str]:
    """What the episode's processes see: the gateway on their loopback, their key."""
    return {BASE_URL_ENV: MODEL_GATEWAY_BASE_URL, API_KEY_ENV: key}


class Readiness(_Spec):
    """When a service is ready: `cmd` run in it exits 0, or `tcp_port` accepts a
    connection on the episode's loopback (neither: as soon as it started)."""

    cmd: str | list[str] | None = None
    tcp_port: int | None = Field(default=None, ge=1, le=65535)
    timeout_s: float = Field(default=60, gt=0, le=900)


class Service(_Spec):
    """`services:` in a spec: a container beside the agent's (a database, a web
    app under test), sharing its loopback, reached from the agent by `name`."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")  # a host name in /etc/hosts
    image: str = Field(min_length=1)
    command: str | list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    ready: Readiness | None = None
    cpu_cores: float = Field(default=0.5, gt=0, le=64)
    memory_mb: int = Field(default=256, ge=16, le=65536)

    @field_validator("env")
    @classmethod
    def _env_keys(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env_keys(env)

    def argv(self) -> list[str]:
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else self.command


class Timeouts(_Spec):
    step_s: float = Field(default=120, gt=0)
    idle_ttl_s: float = Field(default=600, gt=0)
    max_lifetime_s: float = Field(default=3600, gt=0)
    quarantine_s: float = Field(default=600, gt=0)
    # Interactive episodes idle this long are snapshotted and their sandbox
    # freed; the next request restores them first (docs/fork.md). None: never.
    hibernate_after_s: float | None = Field(default=None, gt=0)


class EpisodeSpec(_Spec):
    image: str = Field(min_length=1)
    resources: Resources = Field(default_factory=Resources)
    network: Network = Field(default_factory=Network)
    env: dict[str, str] = Field(default_factory=dict)
    files: list[FileSpec] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    reward: Step | None = None
    # None: interactive iff there are no steps (resolved below, so the workflow sees a bool).
    interactive: bool | None = None
    timeouts: Timeouts = Field(default_factory=Timeouts)
    tenant: str = Field(default="default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    labels: dict[str, str] = Field(default_factory=dict)
    runtime: str = "runc"
    # False (root in the sandbox is root on the host) only where the tenant allows it.
    user_namespace: bool = True
    # The exec agent as PID 1 (docs/agent.md): None follows the node
    # (workers.exec_agent, on by default); False runs every call through runc exec.
    exec_agent: bool | None = None
    output_limit_bytes: int = Field(default=65536, ge=1024, le=16 * 1024 * 1024)
    # A step lost with its sandbox or node may run again (once) when True.
    idempotent_steps: bool = False
    # Set by `Episode.fork`: the episode this one was forked from (lineage).
    parent_episode: str | None = None
    # The node's model gateway on the sandbox's loopback (None: no model calls).
    model_gateway: ModelGateway | None = None
    # Containers beside the agent's, on its loopback, by name (docs/trainers.md, "Worlds").
    services: list[Service] = Field(default_factory=list, max_length=8)

    @field_validator("steps", mode="before")
    @classmethod
    def _strings_are_steps(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"cmd": v} if isinstance(v, str | list) else v for v in value]
        return value

    @field_validator("reward", mode="before")
    @classmethod
    def _string_is_reward_step(cls, value: Any) -> Any:
        return {"cmd": value} if isinstance(value, str) else value

    # What the node's SandboxSpec would refuse is refused here too, so that a bad
    # spec fails at start (InvalidEpisodeSpec), not as a failed episode.
    @field_validator("env")
    @classmethod
    def _env_keys(cls, env: dict[str, str]) -> dict[str, str]:
        return check_env_keys(env)

    @field_validator("runtime")
    @classmethod
    def _known_runtime(cls, runtime: str) -> str:
        return check_runtime_name(runtime)

    @field_validator("services")
    @classmethod
    def _unique_service_names(cls, services: list[Service]) -> list[Service]:
        names = [s.name for s in services]
        clashes = sorted({n for n in names if names.count(n) > 1} | ({"localhost"} & set(names)))
        if clashes:
            raise ValueError(f"service names must be unique and not 'localhost': {clashes}")
        return services

    def with_gateway_key(self, key: str) -> EpisodeSpec:
        """This spec with the gateway's variables in its environment (the episode
        sets them once, at start): every process of the episode sees them."""
        return self.model_copy(update={"env": {**self.env, **gateway_env(key)}})

    @model_validator(mode="after")
    def _no_steps_means_interactive(self) -> EpisodeSpec:
        # An episode with nothing to run would end at once: users who start one
        # mean to drive it themselves.
        if self.interactive is None:
            self.interactive = not self.steps
        return self


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


class ModelCall(BaseModel):
    """One call the agent made through the model gateway, as the trainer needs it.

    `request_json`/`response_json` are the bodies as sent and received (a
    streamed response is assembled into one completion object); the token
    fields are filled when the upstream returned them (vLLM's `prompt_token_ids`
    and `token_ids`, OpenAI's `logprobs`)."""

    index: int  # the episode's calls in order, from 0
    endpoint: str  # chat/completions, completions, ...
    model: str = ""
    started_at: datetime
    latency_ms: float
    status: int  # the HTTP status the agent got
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    request_json: str = ""
    response_json: str = ""
    # Why the gateway answered instead of the upstream (a budget, a bad key,
    # an unreachable upstream); empty for a forwarded call.
    error: str = ""

    def summary(self) -> ModelCall:
        """The call's usage and timing without its bodies and token lists."""
        return self.model_copy(
            update={
                "request_json": "",
                "response_json": "",
                "prompt_token_ids": None,
                "completion_token_ids": None,
                "logprobs": None,
            }
        )


class StepResult(BaseModel):
    index: int
    cmd: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    truncated: bool = False
    source: Literal["scripted", "interactive", "reward"] = "scripted"
    started_at: datetime | None = None
    # Why the step has no real exit code (sandbox, containerd or node lost
    # mid-step); exit_code is then INTERRUPTED_EXIT_CODE and means nothing.
    interrupted: str = ""
    # The watermark (activities/sensorwatch.py): "ok" when the node's sensor
    # judged every event of the step and its alerts reached the episode before
    # this result; else why not (behind, down, gap, unsupported; off: no sensor).
    sensor: str = ""
    settle_ms: float = 0.0
    # The model gateway's calls that ended while this step ran (or, for the
    # first step after them, since the previous one): the trajectory's LLM turns.
    model_calls: list[ModelCall] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.interrupted

    def summary(self) -> StepResult:
        """The same step without its output: what continue-as-new carries over."""
        calls = [call.summary() for call in self.model_calls]
        return self.model_copy(update={"stdout": "", "stderr": "", "model_calls": calls})


class AlertSummary(BaseModel):
    rule: str
    priority: str
    action: str
    time: datetime | None = None
    output: str = ""


Outcome = Literal["completed", "failed", "killed", "quarantined", "timed_out", "cancelled"]


class EpisodeResult(BaseModel):
    episode_id: str
    outcome: Outcome
    reason: str = ""
    node: str = ""
    sandbox_id: str = ""
    image: str = ""
    tenant: str = ""
    steps: list[StepResult] = Field(default_factory=list)
    reward: StepResult | None = None
    alerts: list[AlertSummary] = Field(default_factory=list)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    provision_s: float = 0.0
    teardown_s: float = 0.0
    # "ok" when the sensor judged every step and the teardown's last events in
    # time; else the first other verdict (StepResult.sensor): not a clean run.
    sensor: str = ""

    @property
    def duration_s(self) -> float:
        if self.started_at and self.ended_at:
            return (self.ended_at - self.started_at).total_seconds()
        return 0.0


# --------------------------------------------------------------------------
# Interactive requests (Update inputs, also activity inputs)
# --------------------------------------------------------------------------


class ExecRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cmd: str | list[str]
    timeout_s: float | None = Field(default=None, gt=0)
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = None
    stdin: str | None = None

    def as_step(self) -> Step:
        return Step(**self.model_dump())


class WriteFileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(pattern=r"^/")
    content_b64: str
    mode: int = Field(default=0o644, ge=0, le=0o7777)


class ReadFileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(pattern=r"^/")
    max_bytes: int = Field(default=1_048_576, ge=1, le=16 * 1024 * 1024)


class FileContent(BaseModel):
    path: str
    content_b64: str
    size: int


# --------------------------------------------------------------------------
# Activity inputs
# --------------------------------------------------------------------------


class ProvisionInput(BaseModel):
    sandbox_id: str
    spec: EpisodeSpec
    labels: dict[str, str]


ProvisionSource = Literal["cold", "warm", "existing"]


class ProvisionResult(BaseModel):
    sandbox_id: str
    node: str
    provision_s: float
    created: bool  # False when an earlier attempt had already made it
    source: ProvisionSource = "cold"


class ExecStepInput(BaseModel):
    sandbox_id: str
    step: Step
    index: int
    source: Literal["scripted", "interactive", "reward"] = "scripted"
    default_timeout_s: float
    output_limit_bytes: int
    base_env: dict[str, str] = Field(default_factory=dict)


class WriteFileInput(BaseModel):
    sandbox_id: str
    request: WriteFileRequest


class ReadFileInput(BaseModel):
    sandbox_id: str
    request: ReadFileRequest


class SandboxRef(BaseModel):
    sandbox_id: str
    # The episode that owns it: a sandbox claimed from the warm pool keeps its
    # own id, which the workflow learns only when a lean run returns.
    workflow_id: str = ""


class TeardownInput(BaseModel):
    sandbox_id: str
    workflow_id: str = ""  # as in SandboxRef
    # The closing episode's run: its lean run on the node is stopped first.
    run_id: str = ""
    record: RecordEpisodeInput | None = None  # written to the store once torn down
    # The episode's hibernation snapshots: removed from this node once the sandbox
    # is gone (a copy pushed to a registry stays there).
    drop_images: list[str] = Field(default_factory=list)


class RunScriptedInput(BaseModel):
    """A whole scripted episode in one node activity: provision, files, steps
    and reward; the sandbox is destroyed right after the result is returned."""

    provision: ProvisionInput
    files: list[WriteFileRequest] = Field(default_factory=list)
    steps: list[Step]
    reward: Step | None = None
    first_index: int = 0
    default_timeout_s: float
    output_limit_bytes: int
    base_env: dict[str, str] = Field(default_factory=dict)
    idempotent_steps: bool = False


class RunScriptedResult(BaseModel):
    provision: ProvisionResult
    steps: list[StepResult]
    reward: StepResult | None = None
    torn_down: bool = True  # the node destroys the sandbox itself, after returning


class TeardownResult(BaseModel):
    sandbox_id: str
    removed: bool
    teardown_s: float
    sensor: str = ""  # the last watermark before the sandbox went (see StepResult.sensor)
    # Model calls that ended after the episode's last step (a background job's).
    model_calls: list[ModelCall] = Field(default_factory=list)


class NodeCapacity(BaseModel):
    """What a node may hold: its budget (activities/capacity.py). Memory, pids
    and disk are measured and admit with hysteresis; CPU pressure counts while
    the sandboxes' steps hold the cores; nominal `cpu_cores` only caps a running
    sandbox, and `overcommit` sizes the nominal CPU tenants' quotas share."""

    cores: float
    memory_mb: int
    pids: int
    max_sandboxes: int
    overcommit: float = 50.0
    cpu_pressure_high: float = 90.0  # PSI some avg10, percent
    cpu_pressure_low: float = 60.0
    hysteresis: float = 0.05  # share of a budget use must fall below to admit again
    disk_min_free_mb: int = 256


class NodeUsage(BaseModel):
    """What the node uses now, and whether it admits another sandbox."""

    sandboxes: int = 0
    busy: int = 0  # sandboxes running a step right now
    cpu_cores: float = 0.0  # nominal ceilings of the live sandboxes (shown, not gated)
    sandbox_cpu: float = 0.0  # cores the sandboxes used over the last interval
    cpu_pressure: float = 0.0  # PSI some avg10, percent
    memory_mb: int = 0
    pids: int = 0
    disk_free_mb: int | None = None
    admitting: bool = True
    closed: str = ""  # the limits that closed the gate, when not admitting


class NodeHeartbeat(BaseModel):
    """A node's announcement, sent to the node registry every few seconds."""

    name: str
    task_queue: str
    version: str
    capacity: NodeCapacity
    use: NodeUsage
    images: list[str] = Field(default_factory=list)  # image refs the node holds
    warm: dict[str, int] = Field(default_factory=dict)  # ready warm sandboxes per image
    load1: float = 0.0
    host: str = ""
    # One node worker process's start (a new one: the worker restarted, so the
    # registry arms its presence again rather than wait out the old one's timeout).
    boot: str = ""


class TenantConfig(_Spec):
    """One tenant's rules and quota (`tenants:` in temporal-dev.yaml; docs/tenants.md).

    Rules (images, egress, lifetime, resource caps) reject a spec before anything
    is made; quotas (None: unlimited) make episodes wait, or with
    `on_quota: reject` fail at once, in the admission workflow."""

    max_episodes: int | None = Field(default=None, ge=1)
    cpu_cores: float | None = Field(default=None, gt=0)
    memory_mb: int | None = Field(default=None, ge=16)
    max_lifetime_s: float | None = Field(default=None, gt=0)
    images: list[str] = Field(default_factory=lambda: ["*"])  # fnmatch globs
    egress: list[str] | None = None  # CIDRs an allowlist may reach; None: any
    weight: float = Field(default=1.0, gt=0)
    on_quota: Literal["wait", "reject"] = "wait"
    # Opting out of the user namespace (root = host root) is a tenant's privilege.
    allow_no_user_namespace: bool = False

    def has_quota(self) -> bool:
        return any(q is not None for q in (self.max_episodes, self.cpu_cores, self.memory_mb))


class ClusterRoom(BaseModel):
    """The nodes' nominal room shared by the tenants with a quota (the sum of the
    node budgets): when it is taken, waiting episodes start in weighted fair order."""

    episodes: int | None = None
    cpu_cores: float | None = None


class AdmissionPolicy(BaseModel):
    """What an episode of a tenant with a quota carries to the admission workflow."""

    tenant: TenantConfig
    cluster: ClusterRoom = Field(default_factory=ClusterRoom)


NodeState = Literal["ready", "draining", "lost"]


class NodeInfo(BaseModel):
    """One node as the registry knows it: its last heartbeat and its state."""

    heartbeat: NodeHeartbeat
    state: NodeState = "ready"
    draining: bool = False
    last_seen: datetime  # its last heartbeat signal (news), or when its presence ended
    joined: datetime
    # Its presence activity (workflows/nodes.py): True running, so alive however
    # long since its last signal (sent only on news); False ended (its worker
    # stopped, or it went quiet); None from a registry that predates presence.
    present: bool | None = None

    @property
    def name(self) -> str:
        return self.heartbeat.name


class NodeRef(BaseModel):
    name: str
    by: str = ""


class NodeLostInput(BaseModel):
    node: str
    reason: str


class PlaceInput(BaseModel):
    """What an episode needs of a node."""

    image: str
    cpu_cores: float
    memory_mb: int
    pids: int
    exclude: list[str] = Field(default_factory=list)  # nodes lost under this episode


class Placement(BaseModel):
    node: str | None  # None: no node has room now; `reason` says why
    reason: str = ""
    position: int = 0  # with no node: the episode's place in the line, 1 = next


class SnapshotRequest(BaseModel):
    """The `snapshot` Update's input; the name defaults to one the episode picks."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class SnapshotInput(BaseModel):
    sandbox_id: str
    ref: str
    episode_id: str
    # The episode's services too, in the same pause (a hibernation restarts them
    # from their images instead: False).
    services: bool = True


class SnapshotResult(BaseModel):
    ref: str  # what EpisodeSpec.image takes
    image: str  # the full image name on the node
    node: str
    sandbox_id: str
    seconds: float = 0.0
    layer_bytes: int = 0  # 0 while the layer is still being written (a staged snapshot)
    # Each service's own snapshot, by name: what its `image` takes in a fork.
    services: dict[str, str] = Field(default_factory=dict)


class FetchImageInput(BaseModel):
    """Bring `image` to this node from `from_node` (same-machine rig) or the registry."""

    image: str
    from_node: str = ""


class RecordEpisodeInput(BaseModel):
    result: EpisodeResult
    workflow_id: str
    run_id: str


class ReapInput(BaseModel):
    grace_s: float = 30.0


class ReapResult(BaseModel):
    node: str
    checked: int
    removed: list[str]


TeardownInput.model_rebuild()


class FileBlob(BaseModel):
    """Where a file's bytes wait: a blob of `repository`, by digest (files over
    the inline limit travel through a registry; the history holds the digest)."""

    repository: str = Field(min_length=1)  # host[:port]/corral/files
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    size: int = Field(ge=0)
