"""`corral policy validate|explain|test` as a user runs them, against the test stack."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, shared_dir
from workers.stack import Stack

pytestmark = pytest.mark.integration

CORRAL = REPO / ".venv" / "bin" / "corral"


async def corral_cli(*args: str, timeout_s: float = 600) -> tuple[int, str, str]:
    """Run the CLI; the test session's CORRAL_* variables are in os.environ, so it
    talks to the test stack."""
    proc = await asyncio.create_subprocess_exec(
        str(CORRAL), *args, cwd=REPO, env=dict(os.environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_validate_upstream_rules_all_supported(stack: Stack) -> None:
    upstream = shared_dir() / "falco" / "upstream" / "falco_rules.yaml"
    if not upstream.exists():
        pytest.skip(f"{upstream} not present")
    rc, out, err = await corral_cli("policy", "validate", str(upstream), "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["ok"] and report["rules"]
    assert {r["status"] for r in report["rules"]} == {"supported"}, [
        (r["name"], r["reason"]) for r in report["rules"] if r["status"] != "supported"
    ]
    rc, out, err = await corral_cli("policy", "validate", str(upstream))
    assert rc == 0, err
    assert f"supported: {len(report['rules'])}" in out


async def test_explain_prints_the_expanded_condition(stack: Stack) -> None:
    rc, out, err = await corral_cli("policy", "explain", "Write below binary dir in sandbox")
    assert rc == 0, err
    assert "expanded" in out
    # Macros and lists are expanded: the bin dirs list and the open syscalls appear.
    assert "/usr/bin" in out and "openat" in out and "corral_open_write" in out
    rc, _out, err = await corral_cli("policy", "explain", "No such rule at all")
    assert rc != 0 and err.strip()


async def test_policy_test_cases_pass_in_real_sandboxes(stack: Stack) -> None:
    rc, out, err = await corral_cli("policy", "test", str(Path("policies") / "tests"), "--json")
    assert rc == 0, f"{out}\n{err}"
    results = json.loads(out)
    assert results and all(r["passed"] for r in results), results
