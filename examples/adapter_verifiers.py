"""verifiers on Corral: `vf.Environment.evaluate` with each rollout's tools in an episode.

Run it with the stack up and an OpenAI-compatible model server (vLLM, or any API):
`OPENAI_BASE_URL=http://127.0.0.1:8000/v1 MODEL=Qwen/Qwen3-4B .venv/bin/python
examples/adapter_verifiers.py` (needs `corral[verifiers]`). A trainer (prime-rl,
verifiers' own GRPO trainer) takes the same `env` and uses the rewards.
"""

from __future__ import annotations

import asyncio
import os

from datasets import Dataset
from openai import AsyncOpenAI
from verifiers.clients import OpenAIChatCompletionsClient

from corral.adapters.verifiers import CorralSandboxEnv

SPEC = {
    "image": "busybox",
    "files": [{"path": "/workspace/nums.txt", "content": "3\n14\n15\n92\n"}],
    "reward": 'test "$(cat /workspace/answer)" = 124 && echo 1 || echo 0',
}
QUESTIONS = ["Write the sum of the numbers in /workspace/nums.txt to /workspace/answer."]


async def main() -> None:
    env = CorralSandboxEnv(
        SPEC,
        eval_dataset=Dataset.from_list([{"question": q, "answer": ""} for q in QUESTIONS]),
        system_prompt="Use the tools to act in the sandbox, then reply without a tool call.",
    )
    base_url = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    api_key = os.environ.get("OPENAI_API_KEY", "none")
    client = OpenAIChatCompletionsClient(AsyncOpenAI(base_url=base_url, api_key=api_key))
    model = os.environ.get("MODEL", "Qwen/Qwen3-4B")
    results = await env.evaluate(client, model, num_examples=1, rollouts_per_example=4)
    print("rewards:", [output["reward"] for output in results["outputs"]])


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)  # temporalio/sdk-python#300: a client-only process can abort at exit
