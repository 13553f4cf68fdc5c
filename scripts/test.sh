#!/usr/bin/env bash
# The test suite: lint, unit tests, then integration and end-to-end tests on
# the real services (containerd + runc, Temporal dev server, bpftrace), which
# the test session starts on its own ports and stops at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d /sys/kernel/tracing/events ]] || mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
export CORRAL_CACHE_DIR=${CORRAL_CACHE_DIR:-$PWD/.cache}

echo "== lint"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy --check-untyped-defs

echo "== tests"
.venv/bin/pytest -q -p no:cacheprovider --durations=15 tests "$@"
