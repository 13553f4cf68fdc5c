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

pytest=(.venv/bin/pytest -q -p no:cacheprovider)
if (($#)); then  # what the caller named, in one session
  echo "== tests"
  "${pytest[@]}" --durations=15 "$@"
  exit
fi
# Unit tests need no service and share nothing: one process a core. A failure
# there still lets the rest run, so one CI run reports every failing test.
echo "== unit tests"
unit=0
"${pytest[@]}" -n auto tests/unit || unit=$?
# The rest share one stack per session (tests/integration/conftest.py): in turn.
echo "== integration and end-to-end tests"
"${pytest[@]}" --durations=15 tests --ignore=tests/unit
if ((unit)); then
  echo "unit tests failed (exit $unit): see '== unit tests' above" >&2
  exit "$unit"
fi
