"""Where the SDK sends a tool call: the calls workflow while it runs, else the
episode; a just-started episode's first call goes to the episode directly."""

from __future__ import annotations

from typing import Any

import pytest

from corral.errors import EpisodeRequestFailed
from corral.sdk import _HANDED_OVER, _NOT_THERE, Episode


class FakeHandle:
    id = "ep-1"


class Routed(Episode):
    """An episode whose two destinations are recorded instead of called."""

    def __init__(self, *, fresh: bool, calls_running: bool, episode_refuses: int = 0) -> None:
        super().__init__(FakeHandle(), fresh=fresh)  # type: ignore[arg-type]
        self.sent: list[str] = []
        self.calls_running = calls_running
        self.episode_refuses = episode_refuses

    async def _calls_update(self, name: str, arg: Any, result_type: type | None) -> Any:
        self.sent.append("calls")
        return "from calls" if self.calls_running else _NOT_THERE

    async def _episode_update(self, name: str, arg: Any, result_type: type | None) -> Any:
        self.sent.append("episode")
        if self.episode_refuses:
            self.episode_refuses -= 1
            raise EpisodeRequestFailed("handed over", next(iter(_HANDED_OVER)))
        return "from episode"


async def test_a_fresh_episodes_first_call_skips_the_calls_workflow() -> None:
    episode = Routed(fresh=True, calls_running=False)
    assert await episode._update("exec", None, None) == "from episode"
    assert episode.sent == ["episode"]
    episode.calls_running = True  # it starts after the first call
    assert await episode._update("exec", None, None) == "from calls"
    assert episode.sent == ["episode", "calls"]


async def test_a_fresh_episode_that_handed_its_calls_over_is_asked_through_them() -> None:
    episode = Routed(fresh=True, calls_running=True, episode_refuses=1)
    assert await episode._update("exec", None, None) == "from calls"
    assert episode.sent == ["episode", "calls"]


@pytest.mark.parametrize("running", [True, False])
async def test_a_handle_on_an_existing_episode_asks_the_calls_workflow_first(
    running: bool,
) -> None:
    episode = Routed(fresh=False, calls_running=running)
    answer = await episode._update("exec", None, None)
    assert answer == ("from calls" if running else "from episode")
    assert episode.sent == (["calls"] if running else ["calls", "episode"])
