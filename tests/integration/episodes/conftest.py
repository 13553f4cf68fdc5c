"""Episode tests share the session stack of tests/integration/conftest.py.

This machine is shared: other test sessions may already hold the session
stack's fixed ports (17233, ...), and `Stack.up` then refuses to start. When
they are busy at collection time, shift every test port of the session stack
by a fixed offset to a free set, so these tests run beside the others instead
of failing on a port that is not theirs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.net import listening

_INTEGRATION_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"
_PORT_KEYS = (
    "CORRAL_TEMPORAL_ADDRESS",
    "CORRAL_TEMPORAL_UI_PORT",
    "CORRAL_TEMPORAL_METRICS_PORT",
    "CORRAL_METRICS_PORT_BASE",
    "CORRAL_INTAKE_PORT",
)


def _ports(env: dict[str, str]) -> list[int]:
    ports = [int(env[k].rsplit(":", 1)[-1]) for k in _PORT_KEYS]
    base = int(env["CORRAL_METRICS_PORT_BASE"])
    return ports + list(range(base, base + 2 * 17))


def _shift_ports_iflistening(config: pytest.Config) -> None:
    module = next(
        (
            m
            for m in config.pluginmanager.get_plugins()
            if getattr(m, "__file__", None) and Path(m.__file__).resolve() == _INTEGRATION_CONFTEST
        ),
        None,
    )
    env = getattr(module, "TEST_ENV", None)
    if env is None or not any(listening(p) for p in _ports(env)):
        return
    for shift in (30000, 40000, 41000):
        shifted = {
            key: (
                f"127.0.0.1:{int(env[key].rsplit(':', 1)[1]) + shift}"
                if key == "CORRAL_TEMPORAL_ADDRESS"
                else str(int(env[key]) + shift)
            )
            for key in _PORT_KEYS
        }
        if not any(listening(p) for p in _ports(shifted)):
            env.update(shifted)
            return


@pytest.fixture(scope="session", autouse=True)
def _free_test_ports(request: pytest.FixtureRequest) -> None:
    """Runs before the session stack is made (session autouse fixtures come first)."""
    _shift_ports_iflistening(request.config)
