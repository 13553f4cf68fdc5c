"""The README's trainer quickstart, runnable: `.venv/bin/python examples/quickstart.py`."""

import asyncio
import os

from corral import Corral, EpisodeFileNotFound


async def main() -> None:
    async with await Corral.connect() as corral:
        # No steps: the episode waits for requests. Leaving `async with` finishes
        # it (runs the reward); an exception in the block cancels it instead.
        spec = {"image": "busybox", "reward": "cat /workspace/score"}  # or an EpisodeSpec
        async with await corral.start_episode(spec) as episode:
            result = await episode.exec(["sh", "-c", "echo 0.75 > /workspace/score"])
            print(result.exit_code, result.stdout)
            await episode.write_file("/workspace/notes.txt", "hello")
            print(await episode.read_file("/workspace/notes.txt"))
            try:
                await episode.read_file("/workspace/missing.txt")
            except EpisodeFileNotFound as err:
                print("as expected:", err)
        final = await episode.result()
        print(final.outcome, final.reward.stdout if final.reward else None)

        # A batch: results stream back as episodes end.
        batch = {"image": "busybox", "steps": ["echo hi"]}
        async for r in corral.run_batch(batch, n=20, concurrency=4):
            print(r.episode_id, r.outcome)


if __name__ == "__main__":
    asyncio.run(main())
    os._exit(0)  # temporalio/sdk-python#300: a client-only process can abort at exit
