"""SWE-ReX on Corral: the calls SWE-agent makes, against an episode instead of a container.

Run it with the stack up: `.venv/bin/python examples/adapter_swerex.py` (needs
`corral[swerex]`, which `make setup` installs). The "agent" here is a fixed list of
commands; SWE-agent hands the same `CorralDeployment` its model's commands.
"""

from __future__ import annotations

import asyncio
import os

from swerex.runtime.abstract import BashAction, CreateBashSessionRequest

from corral import Corral
from corral.adapters.swerex import CorralDeployment

TASK = {
    "image": "busybox",
    "files": [{"path": "/workspace/greet.sh", "content": "echo helo\n"}],
    "reward": 'test "$(sh /workspace/greet.sh)" = hello && echo 1 || echo 0',
}
COMMANDS = ["cd /workspace", "cat greet.sh", "sed -i 's/helo/hello/' greet.sh", "sh greet.sh"]


async def solve(corral: Corral) -> float:
    deployment = CorralDeployment(TASK, corral=corral)
    await deployment.start()
    try:
        await deployment.runtime.create_session(CreateBashSessionRequest())
        for command in COMMANDS:
            observation = await deployment.runtime.run_in_session(BashAction(command=command))
            print(f"$ {command}\n{observation.output}", end="")
    finally:
        await deployment.stop()  # finishes the episode: the reward command runs
    assert deployment.result is not None and deployment.result.reward is not None
    return float(deployment.result.reward.stdout.strip())


async def main() -> None:
    async with await Corral.connect() as corral:
        print("reward:", await solve(corral))


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)  # temporalio/sdk-python#300: a client-only process can abort at exit
