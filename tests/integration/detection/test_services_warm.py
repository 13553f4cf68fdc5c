"""`services:` on the paths users get: the agent's sandbox claimed from the warm
pool (lean and interactive), a web service beside it reached by name, the
sensor watching both. The session-stack tests (cold, a database service,
fork, readiness failures) are tests/integration/episodes/test_services.py.
"""

from __future__ import annotations

import pytest

from contract.ids import sandbox_id_for
from corral.sdk import Corral

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WEB = {
    "name": "web",
    "image": "busybox",
    "command": "mkdir -p /www; echo web-ok > /www/index.html; exec httpd -f -p 80 -h /www",
    "ready": {"tcp_port": 80},
}
FETCH = "wget -qO- http://web/"


async def test_a_warm_lean_episode_reaches_its_service(warm_corral: Corral) -> None:
    episode = await warm_corral.start_episode(
        {"image": "busybox", "services": [WEB], "steps": [FETCH]}
    )
    result = await episode.result()
    assert result.outcome == "completed", result.reason
    assert result.sandbox_id != sandbox_id_for(episode.id), "expected a warm pool sandbox"
    assert result.steps[0].stdout == "web-ok\n" and result.steps[0].sensor == "ok"


async def test_a_warm_interactive_episode_reaches_its_service(warm_corral: Corral) -> None:
    async with await warm_corral.start_episode({"image": "busybox", "services": [WEB]}) as episode:
        step = await episode.exec(FETCH)
        assert (step.exit_code, step.stdout, step.sensor) == (0, "web-ok\n", "ok"), step.stderr
        result = await episode.finish()
    assert result.sandbox_id != sandbox_id_for(episode.id), "expected a warm pool sandbox"
    assert result.alerts == []
