"""``Containerd``: the async client the rest of Corral codes against.

Sandbox lifecycle (create is idempotent by id, and rolls back on failure):
lease -> snapshot prepared from the image's chain id -> container record ->
task (rootfs mounts from the snapshot) -> start -> lease released (the
container now holds the snapshot against garbage collection).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import any_pb2, empty_pb2, field_mask_pb2

from contract.errors import (
    ContainerdUnavailable,
    InvalidSpec,
    SandboxAlreadyExists,
    SandboxError,
    SandboxNotFound,
    SandboxStartFailed,
)
from contract.labels import (
    AGENT_LABEL,
    IMAGE_LABEL,
    NETWORK_LABEL,
    REMAP_LABEL,
    RUNTIME_LABEL,
    SANDBOX_LABEL,
    STAGED_LABEL,
    TENANT_LABEL,
)
from sandbox import agent, network, quota, shimns, userns, volumes
from sandbox._gen.containerd.api.services.containers.v1 import containers_pb2
from sandbox._gen.containerd.api.services.leases.v1 import leases_pb2
from sandbox._gen.containerd.api.services.namespaces.v1 import namespace_pb2
from sandbox._gen.containerd.api.services.snapshots.v1 import snapshots_pb2
from sandbox._gen.containerd.api.services.tasks.v1 import tasks_pb2
from sandbox._gen.containerd.api.types.task import task_pb2
from sandbox._gen.containerd.runtime.v2.runc.options import oci_pb2
from sandbox.cgroups import thaw_directly
from sandbox.connection import DEFAULT_SNAPSHOTTER, Connection
from sandbox.events import DEFAULT_TOPICS, subscribe_events
from sandbox.grpc_errors import is_not_found, map_grpc_error, one_line
from sandbox.images import ImageStore
from sandbox.models import (
    ImageInfo,
    SandboxEvent,
    SandboxInfo,
    SandboxSpec,
    parse_user,
    validate_sandbox_id,
)
from sandbox.sandbox import KILL_WAIT_S, SIGKILL, STATUS_NAMES, Sandbox
from sandbox.shimgroups import ShimGroups
from sandbox.spec import DEFAULT_PATH, HOST_INITS, build_oci_spec
from sandbox.transfer import Puller

SPEC_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
# Bare type url: Any.Pack would prefix "type.googleapis.com/", which containerd rejects.
RUNC_OPTIONS_TYPE_URL = "containerd.runc.v1.Options"
SHIM_GROUP_LABEL = "io.containerd.runc.v2.group"
_SHIM_GONE = "ttrpc: closed"  # a Delete whose shim exited meanwhile
SHIM_CLEANUP_CHECKS, SHIM_CLEANUP_WAIT_S = 20, 0.1
ALIVE = {task_pb2.RUNNING, task_pb2.PAUSED, task_pb2.PAUSING}
log = logging.getLogger(__name__)
AGENT_HELLO_TIMEOUT_S = 10.0
# An agent already running answers at once; one that does not is not waited for long.
AGENT_ATTACH_TIMEOUT_S = 3.0

Undo = Callable[[], Awaitable[Any]]


class Containerd:
    """Async client for one containerd namespace. Use ``await Containerd.connect(socket)``."""

    def __init__(
        self,
        conn: Connection,
        *,
        network_state_dir: Path | None = None,
        workspace_root: Path | None = None,
        uid_pool: userns.UidPool | None = None,
        shim_groups: ShimGroups | None = None,
        exec_agent: bool = False,
    ) -> None:
        self._conn = conn
        # New sandboxes get the exec agent as PID 1 (sandbox/agent.py, docs/agent.md).
        self.exec_agent = exec_agent
        # Sandboxes without an explicit shim group share shims by tenant (shimgroups.py).
        self._shim_groups = shim_groups
        self._shim_groups_adopted = False
        self.images = ImageStore(conn)
        self.pulls = Puller(self.images, conn)  # registry images on first use
        self._id_locks = KeyedLocks()
        socket_dir = Path(conn.socket).resolve().parent
        # Node layout (workers.config): <node>/containerd/containerd.sock, <node>/network.
        self.network_state_dir = Path(network_state_dir or socket_dir.parent / "network")
        self.workspace_root = Path(workspace_root or socket_dir / "workspaces")
        self.agent_dir = socket_dir / "agent"  # the agents' channel FIFOs, one dir a sandbox
        self._attaching = asyncio.Lock()
        self._unattachable: set[str] = set()  # agents that did not answer an attach
        # Sandboxes whose agent channel this process holds: a tool call looks its
        # sandbox up without a round trip while the channel lives (it ends with PID 1).
        self._known: dict[str, Sandbox] = {}
        # containerd's root dir in that layout: the snapshotter's quota filesystem is there.
        self._containerd_root = socket_dir / "root"
        # The snapshotter's filesystem, read once: /proc/self/mountinfo grows with
        # every live sandbox, and reading it per create cost O(sandboxes) of CPU.
        self._snapshotter_fs: tuple[bool, tuple[int, int] | None] | None = None
        self._runtime_name = shimns.runtime_name(socket_dir)  # sandbox/shimns.py
        self.uid_pool = uid_pool or userns.UidPool()

    @classmethod
    async def connect(
        cls,
        socket: str,
        namespace: str = "corral",
        *,
        snapshotter: str = DEFAULT_SNAPSHOTTER,
        runc_root: str | None = None,
        network_state_dir: str | Path | None = None,
        workspace_root: str | Path | None = None,
        uid_pool: userns.UidPool | None = None,
        shim_group_size: int = 1,
        timeout_s: float = 5.0,
        exec_agent: bool = False,
    ) -> Containerd:
        """Connect to containerd at ``socket``.

        runc state goes to ``runc_root`` (default: ``runc/`` beside the socket,
        which is what ContainerdDaemon expects); the egress allowlist's state
        (``sandbox.network``'s ``state_dir``) to ``network_state_dir`` (default
        ``<socket dir>/../network``, the node activity's ``<node_dir>/network``);
        workspace volumes to ``workspace_root`` (default ``<socket dir>/workspaces``).
        With ``shim_group_size`` above 1, up to that many sandboxes of one tenant
        share a runc shim (``sandbox.shimgroups``). With ``exec_agent``, new
        sandboxes run the exec agent as PID 1 (``sandbox.agent``).
        """
        conn = Connection(socket, namespace, snapshotter, runc_root)
        try:
            await conn.version.Version(empty_pb2.Empty(), timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            await conn.close()
            raise ContainerdUnavailable(
                f"containerd at {socket}: {one_line(err.details() or str(err.code()))}"
            ) from err
        try:
            await _ensure_namespace(conn)
        except grpc.aio.AioRpcError as err:
            await conn.close()
            raise map_grpc_error(err, f"namespace {namespace!r} at {socket}") from err
        return cls(
            conn,
            network_state_dir=Path(network_state_dir) if network_state_dir else None,
            workspace_root=Path(workspace_root) if workspace_root else None,
            uid_pool=uid_pool,
            shim_groups=ShimGroups(shim_group_size) if shim_group_size > 1 else None,
            exec_agent=exec_agent,
        )

    @property
    def namespace(self) -> str:
        return self._conn.namespace

    @property
    def socket(self) -> str:
        return self._conn.socket

    @property
    def connection(self) -> Connection:
        """The gRPC services, for sandbox modules beside this one (snapshots)."""
        return self._conn

    async def close(self) -> None:
        await self._conn.close()

    async def __aenter__(self) -> Containerd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def version(self) -> str:
        try:
            resp = await self._conn.version.Version(empty_pb2.Empty())
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, f"containerd at {self.socket}") from err
        return str(resp.version)

    # -- create ----------------------------------------------------------------
    async def create_sandbox(
        self, sandbox_id: str, spec: SandboxSpec, labels: dict[str, str] | None = None
    ) -> Sandbox:
        """Create and start a sandbox; return the existing one if it is already alive."""
        validate_sandbox_id(sandbox_id)
        _check_host_support(spec)
        if self._agent_for(spec) and not agent.agent_binary().is_file():
            raise InvalidSpec(
                f"exec agent is on but {agent.agent_binary()} is missing: run scripts/setup.sh"
            )
        self._check_disk_quota(spec)
        # Two concurrent creates of one id in this process: the second waits and
        # then finds the first one's sandbox alive.
        async with self._id_locks.hold(sandbox_id):
            existing = await self._alive_sandbox(sandbox_id, spec)
            if existing is not None:
                return existing
            image = await self.images.get(spec.image)
            if not self._fits_staged(image, spec):
                image = await self.images.whole(spec.image)
            all_labels = {
                **spec.labels,
                **(labels or {}),
                SANDBOX_LABEL: "1",
                IMAGE_LABEL: image.name,
                RUNTIME_LABEL: spec.runtime,
                NETWORK_LABEL: spec.network,
            }
            if self._agent_for(spec):
                all_labels[AGENT_LABEL] = "1"
            groups = self._shim_groups
            if groups is not None and spec.shim_group is None:
                await self._adopt_shim_groups(groups)
                group = groups.join(sandbox_id, all_labels.get(TENANT_LABEL, ""))
                spec = spec.model_copy(update={"shim_group": group})
            if spec.shim_group:
                all_labels[SHIM_GROUP_LABEL] = spec.shim_group
            try:
                return await self._provision(
                    sandbox_id, spec, image.name, image.chain_id or "", all_labels
                )
            except BaseException:
                if groups is not None:
                    groups.leave(sandbox_id)  # rolled back: it holds no place in the shim
                raise
            finally:
                if groups is not None:
                    groups.created(sandbox_id)

    def _fits_staged(self, image: ImageInfo, spec: SandboxSpec) -> bool:
        """False for a staged snapshot (sandbox/snapshot.py) whose copy sits in
        another uid range than this sandbox's: it needs the whole image, whose
        layer can be chowned into its own range. True for every other image."""
        staged = image.labels.get(STAGED_LABEL)
        if staged is None:
            return True
        mapping = self.uid_pool.mapping(spec.userns_range) if spec.user_namespace else None
        return staged == (image.chain_id or "") + (mapping.snapshot_suffix if mapping else "")

    async def _adopt_shim_groups(self, groups: ShimGroups) -> None:
        """Once per client: the groups of the sandboxes made before it (a restarted worker)."""
        if self._shim_groups_adopted:
            return
        self._shim_groups_adopted = True
        for info in await self.list_sandboxes():
            group = info.labels.get(SHIM_GROUP_LABEL)
            if group:
                groups.adopt(info.id, group, info.labels.get(TENANT_LABEL, ""))

    async def _alive_sandbox(self, sandbox_id: str, spec: SandboxSpec) -> Sandbox | None:
        """The sandbox if its task is alive; a half-made one is cleaned up first.

        An alive sandbox whose allowlist was never attached (the creating
        process died between start and attach) is attached now; attaching an
        attached sandbox only re-applies its rules.
        """
        container = await self._get_container(sandbox_id)
        if container is not None:
            task = await self._get_task(sandbox_id)
            if task is not None and task.status in ALIVE:
                if spec.network == "allowlist":
                    try:
                        await self._attach_network(sandbox_id, task.pid, spec)
                    except SandboxError:
                        await self.destroy_sandbox(sandbox_id)
                        raise
                return self._sandbox_from(container)
        await self.destroy_sandbox(sandbox_id)  # half-made, stopped, or a leftover snapshot
        return None

    async def _attach_network(self, sandbox_id: str, pid: int, spec: SandboxSpec) -> None:
        """The spec's egress allowlist and rate on the sandbox's veth (re-applied if attached)."""
        await network.attach_network(
            sandbox_id, pid, spec.egress, self.network_state_dir, rate_mbit=spec.egress_mbit
        )

    async def _provision(
        self, sandbox_id: str, spec: SandboxSpec, image: str, chain_id: str, labels: dict[str, str]
    ) -> Sandbox:
        conn = self._conn
        undo_stack: list[Undo] = []
        step = "lease"
        try:
            lease = await conn.create_lease("sandbox")
            undo_stack.append(lambda: conn.delete_lease(lease))
            step = "snapshot"
            mapping = self.uid_pool.mapping(spec.userns_range) if spec.user_namespace else None
            mounts = await self._prepare_snapshot(sandbox_id, chain_id, image, lease, mapping)
            undo_stack.append(lambda: self._remove_snapshot(sandbox_id))
            step = "disk quota"
            self._own_upper(mounts, spec, mapping)
            workspace = None
            if spec.workspace_mb is not None:
                step = "workspace"
                undo_stack.append(lambda: volumes.remove_workspace(self.workspace_root, sandbox_id))
                uid, gid = userns.host_owner(mapping, parse_user(spec.user))
                workspace = str(
                    await volumes.create_workspace(
                        self.workspace_root, sandbox_id, spec.workspace_mb, uid, gid
                    )
                )
            step = "container"
            channel = None
            if AGENT_LABEL in labels:
                channel_dir = self.agent_dir / sandbox_id
                undo_stack.append(lambda: _forget_agent(channel_dir))
                channel = agent.AgentChannel.prepare(channel_dir)
            oci_spec = build_oci_spec(
                sandbox_id,
                spec,
                workspace_source=workspace,
                userns=mapping,
                io_device=self._snapshotter()[1],
                agent=agent.agent_binary() if channel is not None else None,
            )
            container = _container_record(
                sandbox_id,
                spec,
                image,
                labels,
                oci_spec,
                conn.snapshotter,
                conn.runc_root,
                self._runtime_name,
            )
            await conn.containers.Create(
                containers_pb2.CreateContainerRequest(container=container), metadata=conn.md(lease)
            )
            undo_stack.append(lambda: self._delete_container(sandbox_id))
            step = "task"
            created = await conn.tasks.Create(
                tasks_pb2.CreateTaskRequest(
                    container_id=sandbox_id,
                    rootfs=mounts,
                    # The agent's channel: its stdin and stdout are host FIFOs.
                    stdin=channel.stdin_path if channel is not None else "",
                    stdout=channel.stdout_path if channel is not None else "",
                    # The shim needs all three; PID 1's command writes to this one.
                    stderr=os.devnull if channel is not None else "",
                ),
                metadata=conn.md(),
            )
            undo_stack.append(lambda: self._kill_and_delete_task(sandbox_id))
            if spec.init in HOST_INITS or channel is not None:
                # Under an init a missing command is no runc error: the init starts, fails to
                # exec it and exits. Look for it in the rootfs first instead, as PID 1
                # (created, not started) sees it: the rootfs is mounted in its shim's
                # mount namespace, not necessarily in ours.
                _check_command(sandbox_id, Path(f"/proc/{created.pid}/root"), spec)
            step = "start"
            started = await conn.tasks.Start(
                tasks_pb2.StartRequest(container_id=sandbox_id), metadata=conn.md()
            )
            if channel is not None:
                step = "agent"
                channel.start()
                agent.register(channel)
                await _agent_hello(sandbox_id, channel)
            if spec.network == "allowlist":
                step = "network"
                # Undo before the call: a half-made attachment is removed by detach too.
                undo_stack.append(
                    lambda: network.detach_network(sandbox_id, self.network_state_dir)
                )
                await self._attach_network(sandbox_id, started.pid, spec)
        except (grpc.aio.AioRpcError, SandboxError, OSError) as err:
            await _roll_back(undo_stack)
            if isinstance(err, OSError):
                err = SandboxError(f"create sandbox {sandbox_id!r} ({step}): {err}")
            raise _start_error(sandbox_id, step, err) from err
        except BaseException:
            await asyncio.shield(_roll_back(undo_stack))
            raise
        await conn.delete_lease(lease)  # the container now references the snapshot
        return Sandbox(
            self, conn, sandbox_id, image=image, labels=labels, process=oci_spec["process"]
        )

    async def _prepare_snapshot(
        self,
        sandbox_id: str,
        chain_id: str,
        image: str,
        lease: str,
        mapping: userns.IdMapping | None,
    ) -> Sequence[Any]:
        request = snapshots_pb2.PrepareSnapshotRequest(
            snapshotter=self._conn.snapshotter,
            key=sandbox_id,
            parent=chain_id,
            labels={SANDBOX_LABEL: sandbox_id},
        )
        try:
            if mapping is not None:
                request.parent = await self._remapped_parent(chain_id, image, mapping, lease)
            resp = await self._conn.snapshots.Prepare(request, metadata=self._conn.md(lease))
        except grpc.aio.AioRpcError as err:
            if not is_not_found(err):
                raise
            # parent chain missing: the image was imported without unpacking
            info = await self.images.get(image)
            request.parent = await self.images.ensure_unpacked(info)
            if mapping is not None:
                request.parent = await self._remapped_parent(request.parent, image, mapping, lease)
            resp = await self._conn.snapshots.Prepare(request, metadata=self._conn.md(lease))
        return list(resp.mounts)

    async def _remapped_parent(
        self, chain_id: str, image: str, mapping: userns.IdMapping, lease: str
    ) -> str:
        """The image's chain chowned into ``mapping``'s range, made once (sandbox.userns)."""
        key = chain_id + mapping.snapshot_suffix
        async with self._id_locks.hold(key):
            if await self.images._has_snapshot(key):
                return key
            scratch = self._remap_scratch_dir()
            prepare_key = userns.scratch_key(key)
            with contextlib.suppress(grpc.aio.AioRpcError):  # a crashed earlier attempt
                await self._conn.snapshots.Remove(
                    snapshots_pb2.RemoveSnapshotRequest(
                        snapshotter=self._conn.snapshotter, key=prepare_key
                    ),
                    metadata=self._conn.md(),
                )
            resp = await self._conn.snapshots.Prepare(
                snapshots_pb2.PrepareSnapshotRequest(
                    snapshotter=self._conn.snapshotter, key=prepare_key, parent=chain_id
                ),
                metadata=self._conn.md(lease),
            )
            try:
                await userns.shift_mounted(resp.mounts, mapping, scratch)
                await self._conn.snapshots.Commit(
                    snapshots_pb2.CommitSnapshotRequest(
                        snapshotter=self._conn.snapshotter,
                        name=key,
                        key=prepare_key,
                        labels={REMAP_LABEL: str(mapping.host_id)},
                    ),
                    metadata=self._conn.md(lease),
                )
                await self._tie_to_image(image, key, mapping)
            except BaseException:
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await self._conn.snapshots.Remove(
                        snapshots_pb2.RemoveSnapshotRequest(
                            snapshotter=self._conn.snapshotter, key=prepare_key
                        ),
                        metadata=self._conn.md(),
                    )
                raise
            return key

    def _remap_scratch_dir(self) -> Path:
        return self.workspace_root.parent / "remap"

    async def clear_stale_remaps(self, older_than_s: float) -> list[str]:
        """Remove what a remap killed mid-way left: its scratch snapshot and mount.

        Only those older than ``older_than_s``, so a remap under way is left alone;
        the next remap of that range would remove the snapshot too, but an idle
        node must not hold it (and its lease) forever."""
        if any(userns.is_remapped_key(key) for key in self._id_locks.held()):
            return []  # this process is remapping: its scratch is not stale (next reap)
        await userns.clear_stale_mounts(self._remap_scratch_dir(), older_than_s)
        now = time.time()
        stale = [
            info.name
            for info in await self._snapshot_infos()
            if info.kind != snapshots_pb2.COMMITTED
            and userns.is_scratch_key(info.name)
            and now - info.created_at.ToSeconds() >= older_than_s
        ]
        return [key for key in stale if await self._remove_snapshot(key)]

    async def _tie_to_image(self, image: str, key: str, mapping: userns.IdMapping) -> None:
        """Keep the remapped copy exactly as long as the image."""
        manifest = await self.images._manifest_from_store(await self.images.get(image))
        slot = mapping.snapshot_suffix.removeprefix("@")
        await self.images.keep_snapshot(manifest["config"]["digest"], key, slot)

    def _snapshotter(self) -> tuple[bool, tuple[int, int] | None]:
        """(on the quota filesystem, its block device for blkio limits)."""
        if self._snapshotter_fs is None:
            root = self._containerd_root
            self._snapshotter_fs = (quota.has_quota_fs(root), quota.block_device(root))
        return self._snapshotter_fs

    def _check_disk_quota(self, spec: SandboxSpec) -> None:
        if spec.disk_mb is not None and not self._snapshotter()[0]:
            raise InvalidSpec(
                f"disk_mb {spec.disk_mb}: this node's snapshotter "
                f"({quota.snapshotter_root(self._containerd_root)}) is not on the btrfs quota "
                "filesystem ContainerdDaemon mounts (a state dir from before quotas?); "
                "start the node on a fresh state dir, or set disk_mb to None"
            )

    def _own_upper(
        self, mounts: Sequence[Any], spec: SandboxSpec, mapping: userns.IdMapping | None
    ) -> None:
        """Quota the new writable layer and give it to the sandbox's root."""
        upper = _upper_dir(mounts)
        if upper is None:
            return
        owner = userns.host_owner(mapping, (0, 0))
        if spec.disk_mb is not None:
            quota.limit_upper(upper, spec.disk_mb, owner)
        elif mapping is not None:
            os.chown(upper, *owner)

    # -- get / list --------------------------------------------------------------
    async def update_labels(self, sandbox_id: str, labels: dict[str, str]) -> dict[str, str]:
        """Merge ``labels`` into the sandbox's container labels; returns the result.

        How a warm sandbox is handed to an episode: the labels carry the owner.
        """
        container = await self._get_container(sandbox_id)
        if container is None:
            raise SandboxNotFound(f"sandbox {sandbox_id} not found")
        merged = {**dict(container.labels), **labels}
        record = containers_pb2.Container(id=sandbox_id, labels=merged)
        try:
            await self._conn.containers.Update(
                containers_pb2.UpdateContainerRequest(
                    container=record, update_mask=field_mask_pb2.FieldMask(paths=["labels"])
                ),
                metadata=self._conn.md(),
            )
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, f"sandbox {sandbox_id}") from err
        finally:
            self._known.pop(sandbox_id, None)
        return merged

    async def get_sandbox(self, sandbox_id: str) -> Sandbox:
        known = self._known.get(sandbox_id)
        if known is not None and self.agent_channel(sandbox_id) is not None:
            return known
        container = await self._get_container(sandbox_id)
        if container is None:
            raise SandboxNotFound(f"sandbox {sandbox_id!r} does not exist")
        sandbox = self._sandbox_from(container)
        if self.agent_channel(sandbox_id) is not None:
            self._known[sandbox_id] = sandbox
        else:
            self._known.pop(sandbox_id, None)
        return sandbox

    async def list_sandboxes(self, label_filter: dict[str, str] | None = None) -> list[SandboxInfo]:
        filters = {SANDBOX_LABEL: "1", **(label_filter or {})}
        expr = ",".join(f"labels.{_quote_key(k)}=={_quote_value(v)}" for k, v in filters.items())
        try:
            containers = await self._conn.list_containers([expr])
            tasks = await self._conn.tasks.List(
                tasks_pb2.ListTasksRequest(), metadata=self._conn.md()
            )
        except grpc.aio.AioRpcError as err:
            raise map_grpc_error(err, "list sandboxes") from err
        by_id = {task.id: task for task in tasks.tasks}
        return [_sandbox_info(c, by_id.get(c.id)) for c in containers]

    def _sandbox_from(self, container: Any) -> Sandbox:
        spec = json.loads(container.spec.value or b"{}")
        return Sandbox(
            self,
            self._conn,
            container.id,
            image=container.image,
            labels=dict(container.labels),
            process=spec.get("process", {}),
        )

    # -- destroy -----------------------------------------------------------------
    async def destroy_sandbox(self, sandbox_id: str) -> bool:
        """Detach its network, kill every process, delete task, container, snapshot
        and workspace volume. Idempotent."""
        if self._shim_groups is not None:
            self._shim_groups.leave(sandbox_id)  # before its shim may exit: never joined again
        await network.detach_network(sandbox_id, self.network_state_dir)
        removed = await self._kill_and_delete_task(sandbox_id)
        removed = await self._delete_container(sandbox_id) or removed
        removed = await self._remove_snapshot(sandbox_id) or removed
        removed = await volumes.remove_workspace(self.workspace_root, sandbox_id) or removed
        agent.forget(self.agent_dir / sandbox_id)
        self._unattachable.discard(sandbox_id)
        self._known.pop(sandbox_id, None)
        return removed

    def _agent_for(self, spec: SandboxSpec) -> bool:
        """Whether a new sandbox gets the exec agent: its spec's say, else the client's."""
        return self.exec_agent if spec.exec_agent is None else spec.exec_agent

    def agent_channel(self, sandbox_id: str) -> agent.AgentChannel | None:
        """The live exec-agent channel of a sandbox made by this process, or None."""
        return agent.channel_for(self.agent_dir / sandbox_id)

    async def attach_agent(self, sandbox_id: str) -> agent.AgentChannel | None:
        """The channel of a sandbox whose agent another process started (a node
        worker before a crash, a restart): its FIFOs opened again and the agent
        asked `hello`. None when there is none to attach to or it does not
        answer (then calls go through runc exec, and it is not asked again)."""
        async with self._attaching:
            channel = self.agent_channel(sandbox_id)
            if channel is not None or sandbox_id in self._unattachable:
                return channel
            channel = agent.AgentChannel.attach(self.agent_dir / sandbox_id)
            if channel is None:
                self._unattachable.add(sandbox_id)
                return None
            channel.start()
            try:
                await _attach_hello(sandbox_id, channel)
            except (SandboxError, OSError) as err:
                # An agent older than its resynchronising reader, or one that is stuck:
                # its sandbox still runs, and runc exec it is.
                log.warning("exec agent of %s not attached: %s", sandbox_id, err)
                channel.close()
                self._unattachable.add(sandbox_id)
                return None
            agent.register(channel)
            return channel

    async def _kill_and_delete_task(self, sandbox_id: str) -> bool:
        # First, around the shim: a `runc exec` frozen mid-start blocks it (its
        # processes die right after, so thawing a frozen sandbox here is harmless).
        thaw_directly(sandbox_id)
        task = await self._get_task(sandbox_id)
        if task is None:
            return False
        tasks, md = self._conn.tasks, self._conn.md()
        if task.status != task_pb2.STOPPED:
            await self._kill_all(sandbox_id, task.status)
        try:
            await tasks.Delete(tasks_pb2.DeleteTaskRequest(container_id=sandbox_id), metadata=md)
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return False
            if _SHIM_GONE in (err.details() or "") and await self._task_cleaned_up(sandbox_id):
                return True
            raise map_grpc_error(err, f"delete task of sandbox {sandbox_id!r}") from err
        return True

    async def _task_cleaned_up(self, sandbox_id: str) -> bool:
        """A shared shim that exited under a burst of deletes: containerd cleans
        its tasks up as a dead shim's, this one included, a moment later."""
        for _ in range(SHIM_CLEANUP_CHECKS):
            if await self._get_task(sandbox_id) is None:
                return True
            await asyncio.sleep(SHIM_CLEANUP_WAIT_S)
        return False

    async def _kill_all(self, sandbox_id: str, status: int) -> None:
        tasks, md = self._conn.tasks, self._conn.md()
        wait = asyncio.ensure_future(
            tasks.Wait(tasks_pb2.WaitRequest(container_id=sandbox_id), metadata=md)
        )
        try:
            # PID 1 (sleep) ignores SIGTERM; SIGKILL to every process in the cgroup.
            with contextlib.suppress(grpc.aio.AioRpcError):
                await tasks.Kill(
                    tasks_pb2.KillRequest(container_id=sandbox_id, signal=SIGKILL, all=True),
                    metadata=md,
                )
            if status in (task_pb2.PAUSED, task_pb2.PAUSING):
                # frozen processes only die once thawed
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await tasks.Resume(
                        tasks_pb2.ResumeTaskRequest(container_id=sandbox_id), metadata=md
                    )
            with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                await asyncio.wait_for(asyncio.shield(wait), KILL_WAIT_S)
        finally:
            if not wait.done():
                wait.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await wait

    async def _delete_container(self, sandbox_id: str) -> bool:
        try:
            await self._conn.containers.Delete(
                containers_pb2.DeleteContainerRequest(id=sandbox_id), metadata=self._conn.md()
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return False
            raise map_grpc_error(err, f"delete container of sandbox {sandbox_id!r}") from err
        return True

    async def _remove_snapshot(self, sandbox_id: str) -> bool:
        try:
            await self._conn.snapshots.Remove(
                snapshots_pb2.RemoveSnapshotRequest(
                    snapshotter=self._conn.snapshotter, key=sandbox_id
                ),
                metadata=self._conn.md(),
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return False
            raise map_grpc_error(err, f"remove snapshot of sandbox {sandbox_id!r}") from err
        return True

    # -- lookups -------------------------------------------------------------
    async def _get_container(self, sandbox_id: str) -> Any | None:
        try:
            resp = await self._conn.containers.Get(
                containers_pb2.GetContainerRequest(id=sandbox_id), metadata=self._conn.md()
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return None
            raise map_grpc_error(err, f"sandbox {sandbox_id!r}") from err
        return resp.container

    async def _get_task(self, sandbox_id: str) -> Any | None:
        try:
            resp = await self._conn.tasks.Get(
                tasks_pb2.GetRequest(container_id=sandbox_id), metadata=self._conn.md()
            )
        except grpc.aio.AioRpcError as err:
            if is_not_found(err):
                return None
            raise map_grpc_error(err, f"task of sandbox {sandbox_id!r}") from err
        return resp.process

    # -- inventory helpers (tests assert nothing leaked with these) ------------
    async def container_ids(self) -> list[str]:
        return sorted(c.id for c in await self._conn.list_containers())

    async def task_ids(self) -> list[str]:
        resp = await self._conn.tasks.List(tasks_pb2.ListTasksRequest(), metadata=self._conn.md())
        return sorted(t.id for t in resp.tasks)

    async def snapshot_keys(self, *, active_only: bool = False) -> list[str]:
        """Snapshot keys; ``active_only`` leaves out committed image layers."""
        return sorted(
            info.name
            for info in await self._snapshot_infos()
            if not active_only or info.kind != snapshots_pb2.COMMITTED
        )

    async def orphan_snapshots(self, containers: set[str], older_than_s: float) -> list[str]:
        """Sandbox rootfs snapshots made more than ``older_than_s`` ago whose sandbox
        is not in ``containers`` (listed before this call): a create cut off between
        `Snapshots.Prepare` and `Containers.Create`, the node killed mid-provision.
        Their lease keeps them from the GC until it expires."""
        now = time.time()
        return sorted(
            info.name
            for info in await self._snapshot_infos()
            if info.kind != snapshots_pb2.COMMITTED
            and info.labels.get(SANDBOX_LABEL) == info.name
            and info.name not in containers
            and now - info.created_at.ToSeconds() >= older_than_s
        )

    async def _snapshot_infos(self) -> list[Any]:
        call = self._conn.snapshots.List(
            snapshots_pb2.ListSnapshotsRequest(snapshotter=self._conn.snapshotter),
            metadata=self._conn.md(),
        )
        return [info async for resp in call for info in resp.info]

    async def lease_ids(self) -> list[str]:
        resp = await self._conn.leases.List(leases_pb2.ListRequest(), metadata=self._conn.md())
        return sorted(lease.id for lease in resp.leases)

    # -- events --------------------------------------------------------------
    def events(self, topics: Sequence[str] = DEFAULT_TOPICS) -> AsyncIterator[SandboxEvent]:
        """Task events of this namespace; re-subscribes when containerd restarts."""
        return subscribe_events(self._conn, topics)


class KeyedLocks:
    """One asyncio.Lock per key, forgotten when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def held(self) -> list[str]:
        """Keys someone holds or waits for now."""
        return list(self._locks)


def _check_host_support(spec: SandboxSpec) -> None:
    """What the spec needs from this host, checked before anything is made."""
    binary = HOST_INITS.get(spec.init)
    if binary is not None and not binary.is_file():
        raise InvalidSpec(
            f"init {spec.init!r} needs {binary} on the host (apt-get install {spec.init}), "
            "or set init='none'"
        )
    if spec.runtime == "crun":
        blocker = crun_blocker()
        if blocker:
            raise InvalidSpec(f"runtime 'crun' cannot run on this host: {blocker}")


def _upper_dir(mounts: Sequence[Any]) -> Path | None:
    """The overlay upper dir of a prepared snapshot (None for a bind mount: no parent)."""
    for mount in mounts:
        for option in mount.options:
            if option.startswith("upperdir="):
                return Path(option.removeprefix("upperdir="))
    return None


def _check_command(sandbox_id: str, rootfs: Path, spec: SandboxSpec) -> None:
    """Raise SandboxStartFailed if PID 1's command is not an executable file in ``rootfs``.

    Skipped when the bundle is not where ContainerdDaemon puts it (another
    daemon layout): runc's own error, or tini's exit 127, then tells.
    """
    if not rootfs.is_dir():
        return
    name = spec.command[0]
    path_var = spec.env.get("PATH", DEFAULT_PATH)
    candidates = [name] if "/" in name else [f"{d}/{name}" for d in path_var.split(":") if d]
    for candidate in candidates:
        if not candidate.startswith("/"):
            candidate = f"{spec.workdir}/{candidate}"
        resolved = _resolve_in_root(rootfs, candidate)
        if resolved is not None and resolved.is_file() and os.access(resolved, os.X_OK):
            return
    raise SandboxStartFailed(
        f"create sandbox {sandbox_id!r} (start): command {name!r} is not "
        f"an executable file in image {spec.image!r}"
    )


def _resolve_in_root(rootfs: Path, path: str, depth: int = 0) -> Path | None:
    """``path`` inside ``rootfs`` with symlinks resolved as the sandbox would (chroot-like)."""
    if depth > 40:
        return None
    current = rootfs
    parts = [p for p in path.split("/") if p and p != "."]
    for i, part in enumerate(parts):
        if part == "..":
            current = current.parent if current != rootfs else rootfs
            continue
        nxt = current / part
        if nxt.is_symlink():
            target = os.readlink(nxt)
            rest = "/".join(parts[i + 1 :])
            base = "" if target.startswith("/") else "/" + str(current.relative_to(rootfs))
            return _resolve_in_root(rootfs, f"{base}/{target}/{rest}", depth + 1)
        if not nxt.exists():
            return None
        current = nxt
    return current


def crun_blocker(cgroup_root: Path = Path("/sys/fs/cgroup")) -> str | None:
    """Why crun 1.8 refuses this host's cgroups, or None.

    crun rejects a hybrid layout ("cgroups in hybrid mode not supported") while
    the cgroup2 hierarchy at ``unified`` still holds a controller (hugetlb
    here); mounting hugetlb as a v1 hierarchy moves it out (scripts/setup.sh).
    """
    controllers = cgroup_root / "unified" / "cgroup.controllers"
    try:
        held = controllers.read_text().split()
    except OSError:
        return None  # pure v1 or pure v2: crun copes
    if held:
        return (
            f"the cgroup2 hierarchy at {controllers.parent} holds {', '.join(held)}; "
            f"mount it as cgroup v1 (mkdir -p {cgroup_root}/hugetlb && mount -t cgroup "
            f"-o hugetlb cgroup {cgroup_root}/hugetlb), as scripts/setup.sh does"
        )
    return None


async def _ensure_namespace(conn: Connection) -> None:
    try:
        await conn.namespaces.Create(
            namespace_pb2.CreateNamespaceRequest(
                namespace=namespace_pb2.Namespace(name=conn.namespace)
            ),
            metadata=conn.md(),  # containerd publishes the create event in that namespace
        )
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise


def _container_record(
    sandbox_id: str,
    spec: SandboxSpec,
    image: str,
    labels: dict[str, str],
    oci_spec: dict[str, Any],
    snapshotter: str,
    runc_root: str,
    runtime_name: str,
) -> Any:
    runtime = containers_pb2.Container.Runtime(name=runtime_name)
    if spec.runtime in ("runc", "crun"):
        # No session keyring per sandbox: keyrings are charged to the host uid (a user
        # namespace range shares one, kernel.keys.maxkeys is 200), and seccomp denies
        # keyctl/add_key/request_key inside anyway, so the keyring is unreachable.
        options = oci_pb2.Options(binary_name=spec.runtime, root=runc_root, no_new_keyring=True)
        runtime.options.CopyFrom(
            any_pb2.Any(type_url=RUNC_OPTIONS_TYPE_URL, value=options.SerializeToString())
        )
    else:
        runtime.name = f"io.containerd.{spec.runtime}.v1"
    return containers_pb2.Container(
        id=sandbox_id,
        labels=labels,
        image=image,
        runtime=runtime,
        spec=any_pb2.Any(type_url=SPEC_TYPE_URL, value=json.dumps(oci_spec).encode()),
        snapshotter=snapshotter,
        snapshot_key=sandbox_id,
    )


async def _forget_agent(channel_dir: Path) -> None:
    agent.forget(channel_dir)


async def _attach_hello(sandbox_id: str, channel: agent.AgentChannel) -> None:
    """`hello` to an agent another process started. Unanswered, the old process
    may have died halfway through a frame, whose rest our hello became: fill
    it, and ask again (the agent skips the filling to our next frame)."""
    try:
        await _agent_hello(sandbox_id, channel, AGENT_ATTACH_TIMEOUT_S)
    except SandboxError:
        await channel.fill_partial_frame()
        await _agent_hello(sandbox_id, channel, AGENT_ATTACH_TIMEOUT_S)


async def _agent_hello(
    sandbox_id: str, channel: agent.AgentChannel, timeout_s: float = AGENT_HELLO_TIMEOUT_S
) -> None:
    """The agent answers on its channel, or the sandbox did not start."""
    try:
        reply = await asyncio.wait_for(channel.hello(), timeout_s)
    except TimeoutError as err:
        raise SandboxError(f"the exec agent of {sandbox_id!r} did not answer") from err
    if reply.get("version") != agent.PROTOCOL_VERSION:
        raise SandboxError(f"the exec agent of {sandbox_id!r} speaks {reply}")


async def _roll_back(undo: list[Undo]) -> None:
    for action in reversed(undo):
        with contextlib.suppress(grpc.aio.AioRpcError, SandboxError, OSError):
            await action()


def _start_error(sandbox_id: str, step: str, err: BaseException) -> SandboxError:
    if isinstance(err, grpc.aio.AioRpcError):
        mapped = map_grpc_error(err, f"create sandbox {sandbox_id!r} ({step})")
    else:
        assert isinstance(err, SandboxError)
        mapped = err
    if isinstance(mapped, ContainerdUnavailable | SandboxAlreadyExists):
        return mapped
    return SandboxStartFailed(one_line(str(mapped)))


def _sandbox_info(container: Any, task: Any | None) -> SandboxInfo:
    created = container.created_at.ToDatetime() if container.HasField("created_at") else None
    return SandboxInfo(
        id=container.id,
        image=container.image,
        labels=dict(container.labels),
        status=STATUS_NAMES.get(task.status, "unknown") if task is not None else "stopped",
        pid=task.pid if task is not None and task.pid else None,
        created_at=created,
    )


def _quote_key(key: str) -> str:
    # containerd filter field paths accept [A-Za-z0-9_.] unquoted; quote anything else
    if all(ch.isalnum() or ch in "_." for ch in key):
        return key
    return json.dumps(key)


def _quote_value(value: str) -> str:
    return json.dumps(value)
