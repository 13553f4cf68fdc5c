#!/usr/bin/env bash
# Install what Corral needs on a fresh Debian 12 machine, as root. Idempotent:
# each step checks first and does nothing when its work is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  containerd runc crun catatonit tini busybox-static bpftrace iproute2 nftables debootstrap umoci
  golang-github-containerd-containerd-dev golang-github-gogo-protobuf-dev util-linux procps
  docker-registry apache2-utils
  btrfs-progs gcc libc6-dev golang-go
  clang llvm libbpf-dev libelf-dev zlib1g-dev bpftool make
  chromium prometheus nginx-light
  docker.io  # a peer for `corral bench` (corral/bench/engines.py runs its own private dockerd)
  podman  # a peer for `corral bench --peers` (daemonless; the bench gives it storage of its own)
)
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # nginx-light is for tests/e2e/test_temporal_tls.py, which runs its own nginx with its
  # own config: the distro's service, which the package may just have started, stays off.
  if [[ " ${missing[*]} " == *" nginx-light "* ]]; then
    if [[ -d /run/systemd/system ]]; then
      systemctl disable -q --now nginx || true
    else
      update-rc.d nginx disable >/dev/null 2>&1 || true
      if [[ -s /run/nginx.pid ]]; then nginx -s quit || true; fi
    fi
  fi
  # docker.io: the bench starts a private dockerd with no bridge or iptables;
  # the distro's service (bridge, NAT rules) must not run beside the tests.
  if [[ " ${missing[*]} " == *" docker.io "* ]]; then
    if [[ -d /run/systemd/system ]]; then
      systemctl disable -q --now docker.socket docker.service || true
    else
      update-rc.d docker disable >/dev/null 2>&1 || true
      if [[ -s /var/run/docker.pid ]]; then kill "$(cat /var/run/docker.pid)" || true; fi
    fi
  fi
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.corral-installed
if [[ ! -f $stamp || pyproject.toml -nt $stamp ]]; then
  echo "setup: installing corral with its dev, report and export extras into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[dev,report,export]'
  touch "$stamp"
fi

# The framework adapters' extras (corral/adapters/; their tests are in tests/integration/trainer).
# mini-swe-agent comes without its own dependencies: its agent loop, environment protocol
# and test models need only the few named here, while the rest (litellm with boto3, about
# 250 MB) serve its hosted-model clients. `pip install 'corral[minisweagent]'` brings it all.
adapters_stamp=.venv/.corral-adapters-installed
if [[ ! -f $adapters_stamp || pyproject.toml -nt $adapters_stamp ]]; then
  echo "setup: installing the framework adapters' extras (swerex, skyrl, verifiers, minisweagent)"
  .venv/bin/pip install -q -e '.[swerex,skyrl,verifiers]'
  .venv/bin/pip install -q --no-deps 'mini-swe-agent>=2.4.6,<2.5'
  .venv/bin/pip install -q jinja2 pydantic python-dotenv platformdirs rich tenacity pyyaml
  touch "$adapters_stamp"
fi

# containerd's gRPC stubs: generated from Debian's .proto files, never committed.
.venv/bin/python scripts/gen_stubs.py

# The compiled sensor (policies/sensor/bpf: libbpf CO-RE program + loader), built
# into the cache, never committed; without it the sensor falls back to bpftrace.
sensor_bpf="${CORRAL_CACHE_DIR:-$PWD/.cache}/sensor-bpf"
if ! make -q -C policies/sensor/bpf OUT="$sensor_bpf" >/dev/null 2>&1; then
  echo "setup: building the compiled sensor into $sensor_bpf"
  make -s -C policies/sensor/bpf OUT="$sensor_bpf" ||
    echo "setup: the compiled sensor did not build; the sensor will use bpftrace"
fi

# The exec agent (agent/: static Go, standard library only), built into the cache,
# never committed; every sandbox gets it unless workers.exec_agent is off (docs/agent.md).
agent_bin="${CORRAL_CACHE_DIR:-$PWD/.cache}/agent/corral-agent"
if [[ ! -x $agent_bin || -n $(find agent \( -name '*.go' -o -name go.mod \) -newer "$agent_bin" | head -1) ]]; then
  echo "setup: building the exec agent into $agent_bin"
  mkdir -p "$(dirname "$agent_bin")"
  (cd agent && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$agent_bin.tmp" . &&
    mv "$agent_bin.tmp" "$agent_bin") ||
    { echo "setup: the exec agent did not build; nodes refuse sandboxes without it (CORRAL_EXEC_AGENT=0 runs runc exec only)" >&2; exit 1; }
fi

# bpftrace needs tracefs, which these machines do not mount at boot.
if [[ ! -d /sys/kernel/tracing/events ]]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
# crun refuses a hybrid cgroup layout while the cgroup2 at unified holds a controller
# (hugetlb here); mounting hugetlb as v1 moves it out. runc works either way.
if grep -qw hugetlb /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null; then
  mkdir -p /sys/fs/cgroup/hugetlb
  mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb 2>/dev/null || true
fi
