"""Every label Corral puts on containerd objects, in one place.

Labels are the contract between the layers that write them (the episode
workflow, the node's activities, the sandbox layer) and those that read them
back (the reaper, the sensor, snapshot collection, the CLI); every layer
imports them from here.
"""

from __future__ import annotations

# --------------------------------------------------------- on containers
OWNER_LABEL = "corral.workflow_id"  # the episode that owns the sandbox; the sensor's container name
RUN_ID_LABEL = "corral.run_id"  # the owner's workflow run at provisioning
SANDBOX_LABEL = "corral.sandbox"  # marks a container as a Corral sandbox
NODE_LABEL = "corral.node"  # the node that made it
TENANT_LABEL = "corral.tenant"  # set by the episode workflow; the shim-sharing key
IMAGE_LABEL = "corral.image"
RUNTIME_LABEL = "corral.runtime"
NETWORK_LABEL = "corral.network"
AGENT_LABEL = "corral.agent"  # on sandboxes whose PID 1 is the exec agent
CPU_MODE_LABEL = "corral.cpu"  # elastic CPU: idle or busy shares
POOL_LABEL = "corral.pool"  # a warm pool's sandbox, until an episode claims it
SERVICE_OF_LABEL = "corral.service_of"  # an episode's service: the sandbox it serves
SERVICE_NAME_LABEL = "corral.service"  # its name in the spec's `services:`
USER_LABEL_PREFIX = "corral.label."  # an episode spec's own `labels`, under this prefix
BENCH_LABEL = "corral.bench"  # made by `corral bench` outside any episode
POLICY_TEST_LABEL = "corral.policy_test"  # made by `corral policy test`

# ------------------------------------------------------------- on images
CHAIN_ID_LABEL = "corral.chain_id"
LAST_USED_LABEL = "corral.last_used"  # unix seconds; prune removes the oldest first
PARENT_EPISODE_LABEL = "corral.snapshot.parent_episode"  # the episode a snapshot was taken of
BASE_IMAGE_LABEL = "corral.snapshot.base_image"
SNAPSHOT_SANDBOX_LABEL = "corral.snapshot.sandbox"
SNAPSHOT_NODE_LABEL = "corral.snapshot.node"
LAYER_BYTES_LABEL = "corral.snapshot.layer_bytes"
# A staged snapshot (sandbox/snapshot.py): its children start from this committed
# copy of the sandbox's writable layer while its layer blob is still being made;
# gone once the image is whole. The lease keeps that copy alive meanwhile.
STAGED_LABEL = "corral.snapshot.staged"
STAGED_LEASE_LABEL = "corral.snapshot.staged_lease"

# ---------------------------------------------------------- on snapshots
REMAP_LABEL = "corral.userns"  # a rootfs shifted into a user namespace's ids
