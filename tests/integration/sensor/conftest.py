"""Every live sensor test runs on both backends: bpftrace and the compiled libbpf one."""

from __future__ import annotations

import pytest

from policies.sensor.libbpf import build_dir, loader_path


@pytest.fixture(params=["bpftrace", "libbpf"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    if name == "libbpf" and loader_path() is None:
        pytest.skip(f"the compiled sensor is not built in {build_dir()} (scripts/setup.sh)")
    return name
