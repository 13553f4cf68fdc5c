"""corral.adapters.swerex: SWE-ReX's deployment and runtime API over real episodes."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
from swerex.exceptions import NonZeroExitCodeError, SessionDoesNotExistError
from swerex.runtime.abstract import (
    BashAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

from corral import Corral
from corral.adapters.swerex import CorralDeployment

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

FIXED = {
    "image": "busybox",
    "files": [
        {"path": "/workspace/calc.sh", "content": "echo $((2 + 2 + 1))\n"},
        {"path": "/workspace/.env.sh", "content": "export GREETING=hi\n"},
    ],
    "reward": 'test "$(sh /workspace/calc.sh)" = 4 && echo 1 || echo 0',
}


async def _agent_fixes_the_bug(deployment: CorralDeployment) -> list[str]:
    """What a SWE-agent-style loop does: a session, commands, file edits, stop."""
    await deployment.start()
    runtime = deployment.runtime
    try:
        assert await deployment.is_alive()
        # A startup file that is missing is skipped, as bash would.
        startup = ["/workspace/.env.sh", "/root/.missing-bashrc"]
        session = CreateBashSessionRequest(session="main", startup_source=startup)
        await runtime.create_session(session)
        outputs = []
        for command in ["cd /workspace && export N=2", "pwd; echo $N $GREETING", "sh calc.sh"]:
            action = BashAction(command=command, session="main")
            outputs.append((await runtime.run_in_session(action)).output)
        source = await runtime.read_file(ReadFileRequest(path="/workspace/calc.sh"))
        fixed = source.content.replace(" + 1", "")
        await runtime.write_file(WriteFileRequest(path="/workspace/calc.sh", content=fixed))
    finally:
        await deployment.stop()  # finishes the episode, even when a check above failed
    return outputs


async def test_a_session_keeps_its_directory_and_exports_and_the_reward_scores(
    corral: Corral,
) -> None:
    deployment = CorralDeployment(FIXED, corral=corral)
    outputs = await _agent_fixes_the_bug(deployment)
    assert outputs == ["", "/workspace\n2 hi\n", "5\n"]
    assert deployment.result is not None and deployment.result.outcome == "completed"
    assert deployment.result.reward is not None
    assert deployment.result.reward.stdout.strip() == "1"
    assert not await deployment.is_alive()


async def test_execute_checks_and_sessions_report_errors(corral: Corral, tmp_path: Path) -> None:
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "run.sh").write_text("#!/bin/sh\necho uploaded\n")
    (tmp_path / "pkg" / "sub" / "run.sh").chmod(0o755)
    deployment = CorralDeployment({"image": "busybox", "reward": "echo 0"}, corral=corral)
    await deployment.start()
    runtime = deployment.runtime
    try:
        await runtime.upload(UploadRequest(source_path=str(tmp_path / "pkg"), target_path="/opt/p"))
        ran = await runtime.execute(Command(command=["/opt/p/sub/run.sh"]))
        assert (ran.stdout, ran.exit_code) == ("uploaded\n", 0)
        merged = await runtime.execute(
            Command(command="echo e >&2; echo o; exit 3", shell=True, merge_output_streams=True)
        )
        assert (merged.stdout, merged.stderr, merged.exit_code) == ("e\no\n", "", 3)
        with pytest.raises(NonZeroExitCodeError, match="exit code 3"):
            await runtime.execute(Command(command="exit 3", shell=True, check=True))
        with pytest.raises(SessionDoesNotExistError):
            await runtime.run_in_session(BashAction(command="true", session="none"))
        await runtime.create_session(CreateBashSessionRequest(session="s"))
        with pytest.raises(NonZeroExitCodeError, match="exit code 1"):
            await runtime.run_in_session(BashAction(command="false", session="s"))
        silent = await runtime.run_in_session(
            BashAction(command="false", session="s", check="silent")
        )
        assert silent.exit_code == 1
        await runtime.close_session(CloseBashSessionRequest(session="s"))
        with pytest.raises(FileNotFoundError):
            await runtime.read_file(ReadFileRequest(path="/workspace/missing"))
    finally:
        await deployment.stop()
    assert deployment.result is not None and deployment.result.outcome == "completed"


async def test_the_example_fixes_its_script(corral: Corral) -> None:
    solve = runpy.run_path(str(EXAMPLES / "adapter_swerex.py"))["solve"]
    assert await solve(corral) == 1.0
