"""The README's trainer quickstart, runnable: `.venv/bin/python examples/quickstart.py`."""

import asyncio

from corral import Corral, EpisodeSpec


async def main() -> None:
    async with await Corral.connect() as corral:
        episode = await corral.start_episode(
            EpisodeSpec(image="busybox", interactive=True, reward="cat /workspace/score")
        )
        result = await episode.exec(["sh", "-c", "echo 0.75 > /workspace/score"])
        print(result.exit_code, result.stdout)
        await episode.write_file("/workspace/notes.txt", "hello")
        print(await episode.read_file("/workspace/notes.txt"))
        final = await episode.finish()
        print(final.outcome, final.reward.stdout if final.reward else None)

        spec = EpisodeSpec(image="busybox", steps=["echo hi"])
        async for r in corral.run_batch(spec, n=20, concurrency=4):
            print(r.episode_id, r.outcome)


if __name__ == "__main__":
    asyncio.run(main())
