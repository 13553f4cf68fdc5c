"""The compiled libbpf backend against bpftrace: its loader's lifecycle, the
auto fallback, and every policy test case in real sandboxes on both backends."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from sensor_helpers import FakeSandbox

from policies.falco.event import ContainerInfo
from policies.runner import run_cases
from policies.sensor import binparser as bp
from policies.sensor import cgroups as cg
from policies.sensor import libbpf as lb
from policies.sensor import program as pg
from policies.sensor.cgroups import DictResolver
from policies.sensor.sensor import Sensor
from workers.stack import Stack

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bpftrace"), reason="root+bpftrace"),
]
REPO = Path(__file__).resolve().parents[3]
# Caps so that a broken loader fails the test instead of hanging it; not timings.
CAP_S = 60.0


def _loader() -> Path:
    path = lb.loader_path()
    if path is None:
        pytest.skip(f"the compiled sensor is not built in {lb.build_dir()} (scripts/setup.sh)")
    return path


def _start_loader(loader: Path) -> subprocess.Popen[bytes]:
    cfg = pg.FilterConfig(cg.ensure_parent(), cg.subsys_index(cg.DEFAULT_CONTROLLER))
    args = lb.loader_args(["openat", "execve"], cfg)
    proc = subprocess.Popen([str(loader), *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.read(bp.HDR_SIZE)  # the loader's "attached" record
    assert len(first) == bp.HDR_SIZE and first[2] == bp.REC_ATTACHED, proc.stderr
    return proc


def test_loader_exits_cleanly_on_stdin_eof_and_on_sigterm() -> None:
    loader = _loader()
    proc = _start_loader(loader)
    assert proc.stdin is not None
    proc.stdin.close()  # the sensor is gone
    assert proc.wait(CAP_S) == 0
    proc = _start_loader(loader)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(CAP_S) == 0
    assert proc.stdin is not None
    proc.stdin.close()


def test_loader_failure_is_one_line() -> None:
    loader = _loader()
    out = subprocess.run([str(loader), "--parent-id", "1", "--trace", "nosuch=0:"],
                         capture_output=True, text=True, timeout=CAP_S, check=False)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip() == "corral-sensor-bpf: unknown syscall nosuch"


async def test_auto_falls_back_to_bpftrace_when_libbpf_does_not_load() -> None:
    box = FakeSandbox()
    info = ContainerInfo(full_id=box.full_id, name="sb", image="busybox:1")
    sensor = Sensor({"openat"}, resolver=DictResolver({box.full_id: info}), backend="auto",
                    loader=Path("/bin/false"))  # fmt: skip
    try:
        assert sensor.active_backend == "libbpf"
        await sensor.start()
        await sensor.wait_ready(timeout=240)  # under the test timeout: a clear failure
        assert sensor.active_backend == "bpftrace"
        await asyncio.to_thread(box.run, "cat /etc/hostname > /dev/null")
        got = []
        while not got:
            evt = await asyncio.wait_for(sensor._queue.get(), CAP_S)
            if evt.args.get("name") == "/etc/hostname":
                got.append(evt)
    finally:
        await sensor.stop()
        box.remove()


async def test_policy_cases_raise_the_same_alerts_on_both_backends(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral policy test`'s cases, each in a fresh real sandbox (removed by the
    runner), with an in-process sensor of each backend: the same rules match."""
    _loader()
    rules = [REPO / "policies/rules/corral_rules.yaml"]
    got: dict[str, dict[str, list[str]]] = {}
    for backend in ("bpftrace", "libbpf"):
        monkeypatch.setenv("CORRAL_SENSOR_BACKEND", backend)
        results = await run_cases(stack.config, REPO / "policies/tests", rules)
        assert results and all(r.passed for r in results), [r.summary() for r in results]
        got[backend] = {r.name: sorted(r.got) for r in results}
    assert got["libbpf"] == got["bpftrace"]
