"""What every adapter does with an episode: start it interactive, end it with a result."""

from __future__ import annotations

from typing import Any, cast, get_args

from contract.models import EpisodeResult, EpisodeSpec, Outcome
from corral.env import reward_of
from corral.errors import EpisodeError
from corral.sdk import Episode, parse_spec

__all__ = ["end_episode", "interactive_spec", "reward_of"]


def interactive_spec(spec: EpisodeSpec | dict[str, Any]) -> EpisodeSpec:
    """The spec, checked, made interactive: the framework's agent drives the episode."""
    return parse_spec(spec).model_copy(update={"interactive": True})


async def end_episode(episode: Episode) -> EpisodeResult:
    """Finish the episode (its reward runs) and return its result; an episode that
    ended otherwise (killed, timed out, cancelled) returns how it ended."""
    try:
        return await episode.close()
    except EpisodeError as err:
        if err.result is not None:
            return err.result
        # A terminated workflow has no outcome of its own: it failed, as far as a trainer cares.
        outcome = err.outcome if err.outcome in get_args(Outcome) else "failed"
        return EpisodeResult(episode_id=episode.id, outcome=cast(Outcome, outcome))
