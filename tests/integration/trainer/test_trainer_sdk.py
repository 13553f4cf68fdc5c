"""The SDK as a new trainer meets it, against the real stack."""

from __future__ import annotations

import asyncio

import pytest

from corral import (
    Corral,
    EpisodeCancelled,
    EpisodeEnded,
    EpisodeFileNotFound,
    EpisodeRejected,
    EpisodeWaitTimedOut,
)

pytestmark = pytest.mark.integration


async def test_an_episode_without_steps_waits_for_requests(corral: Corral) -> None:
    async with await corral.start_episode({"image": "busybox"}) as episode:
        step = await episode.exec("echo interactive")
        assert step.stdout == "interactive\n"
    result = await episode.result()
    assert result.outcome == "completed"


async def test_a_missing_file_names_the_path_and_the_episode_goes_on(corral: Corral) -> None:
    async with await corral.start_episode({"image": "busybox"}) as episode:
        with pytest.raises(EpisodeFileNotFound, match="/workspace/nope"):
            await episode.read_file("/workspace/nope")
        with pytest.raises(FileNotFoundError):
            await episode.read_file("/etc")  # a directory is not a file either
        assert (await episode.exec("true")).exit_code == 0


async def test_a_request_to_an_ended_episode_says_how_it_ended(corral: Corral) -> None:
    episode = await corral.start_episode({"image": "busybox", "reward": "echo 1"})
    final = await episode.finish()
    assert final.outcome == "completed"
    with pytest.raises(EpisodeEnded) as ended:
        await episode.exec("true")
    assert ended.value.outcome == "completed"
    assert isinstance(ended.value, EpisodeRejected)
    assert f"episode {episode.id} has ended: completed" in str(ended.value)


async def test_leaving_async_with_on_an_exception_cancels_the_episode(corral: Corral) -> None:
    with pytest.raises(RuntimeError, match="policy crashed"):
        async with await corral.start_episode({"image": "busybox"}) as episode:
            await episode.exec("true")
            raise RuntimeError("policy crashed")
    with pytest.raises(EpisodeCancelled, match=f"episode {episode.id} was cancelled"):
        await episode.result()


async def test_result_with_a_timeout_leaves_the_episode_running(corral: Corral) -> None:
    async with await corral.start_episode({"image": "busybox"}) as episode:
        with pytest.raises(EpisodeWaitTimedOut) as waited:
            await episode.result(timeout_s=0.2)
        assert isinstance(waited.value, TimeoutError)
        assert await corral.is_running(episode.id)


async def test_the_update_of_a_cancelled_episode_is_refused_with_its_outcome(
    corral: Corral,
) -> None:
    episode = await corral.start_episode({"image": "busybox"})
    await episode.exec("true")
    await episode.cancel()
    with pytest.raises(EpisodeCancelled):
        await episode.result()
    with pytest.raises(EpisodeEnded) as ended:
        await asyncio.wait_for(episode.exec("true"), 60)
    assert ended.value.outcome == "cancelled"
