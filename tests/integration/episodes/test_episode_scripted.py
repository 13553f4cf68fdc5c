"""Scripted episodes through the SDK against the real stack: results and failures."""

from __future__ import annotations

import uuid

import pytest
from episode_helpers import eventually, sandbox_exists
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from contract.config import StackConfig
from contract.ids import sandbox_id_for
from corral.errors import EpisodeFailed, InvalidEpisodeSpec
from corral.sdk import Corral, parse_spec

pytestmark = pytest.mark.integration


async def _gone(config: StackConfig, sandbox_id: str) -> bool:
    """A lean run's node removes the sandbox right after returning the result."""
    return not await sandbox_exists(config, sandbox_id)


async def test_scripted_episode_captures_stdout_stderr_and_exit_codes(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = parse_spec(
        {
            "image": "busybox",
            "env": {"GREETING": "hello"},
            "files": [{"path": "/tmp/in.txt", "content": "from the spec\n"}],
            "steps": [
                "echo $GREETING; echo oops >&2",
                ["cat", "/tmp/in.txt"],
                {"cmd": "sh -c 'exit 0'; echo $X", "env": {"X": "per-step"}},
            ],
            "reward": "echo 0.75",
        }
    )
    result = await corral.run_episode(spec)

    assert result.outcome == "completed", result.reason
    # The step log is the whole trajectory: the reward is its last entry too.
    assert [(s.index, s.source) for s in result.steps] == [
        (0, "scripted"),
        (1, "scripted"),
        (2, "scripted"),
        (3, "reward"),
    ]
    first, second, third, last = result.steps
    assert (first.stdout, first.stderr, first.exit_code) == ("hello\n", "oops\n", 0)
    assert second.stdout == "from the spec\n" and second.cmd == "cat /tmp/in.txt"
    assert third.stdout == "per-step\n"
    assert result.reward is not None and result.reward == last
    assert result.reward.stdout.strip() == "0.75" and result.reward.index == 3
    assert result.node in stack_config.node_names()
    assert result.sandbox_id == sandbox_id_for(result.episode_id)
    assert result.started_at and result.ended_at and result.duration_s > 0
    await eventually(lambda: _gone(stack_config, result.sandbox_id), what="sandbox removed")


async def test_failing_step_fails_the_episode_naming_the_step(
    corral: Corral, stack_config: StackConfig
) -> None:
    spec = parse_spec(
        {"image": "busybox", "steps": ["echo one", "echo bad >&2; exit 3", "echo never"]}
    )
    with pytest.raises(EpisodeFailed) as caught:
        await corral.run_episode(spec)

    err = caught.value
    assert "step 1" in str(err) and "exit 3" in str(err) and "exited 3" in str(err)
    assert err.result is not None and err.result.outcome == "failed"
    assert [s.exit_code for s in err.result.steps] == [0, 3]  # the third never ran
    assert err.result.steps[1].stderr == "bad\n"
    await eventually(lambda: _gone(stack_config, err.result.sandbox_id), what="sandbox removed")


async def test_unknown_image_fails_with_one_line_reason_and_leaves_nothing(
    corral: Corral, stack_config: StackConfig
) -> None:
    before = await _all_ids(stack_config)
    with pytest.raises(EpisodeFailed) as caught:
        await corral.run_episode({"image": "no-such-image:404", "steps": ["true"]})

    message = str(caught.value)
    assert "\n" not in message and "no-such-image" in message
    assert caught.value.result is not None and caught.value.result.steps == []
    assert await _all_ids(stack_config) <= before


async def test_malformed_spec_is_rejected_naming_the_field_before_any_workflow(
    corral: Corral,
) -> None:
    episode_id = f"bad-{uuid.uuid4().hex[:8]}"
    bad_specs: list[tuple[dict[str, object], str]] = [
        ({"image": "busybox", "timeouts": {"idle_tll_s": 5}}, "idle_tll_s"),
        ({"image": "busybox", "resources": {"memory_mb": 1}}, "memory_mb"),
        ({"image": "busybox", "steps": [""]}, "steps"),
        ({"steps": ["true"]}, "image"),
        # Checked by the node's SandboxSpec too; refused here at start (issue 24).
        ({"image": "busybox", "steps": ["true"], "env": {"A B": "1"}}, "env key 'A B'"),
        (
            {
                "image": "busybox",
                "steps": ["true"],
                "network": {"mode": "allowlist", "egress": [{"cidr": "10.0.0.1/8"}]},
            },
            "network.egress.0.cidr",
        ),
        ({"image": "busybox", "steps": ["true"], "runtime": "kata"}, "runtime"),
    ]
    for spec, field in bad_specs:
        with pytest.raises(InvalidEpisodeSpec) as caught:
            await corral.start_episode(spec, episode_id=episode_id)
        assert field in str(caught.value), (field, str(caught.value))
        assert "\n" not in str(caught.value)
    with pytest.raises(RPCError):  # no workflow was ever started under that id
        await corral.client.get_workflow_handle(episode_id).describe()


async def test_unknown_node_is_rejected_before_any_workflow(corral: Corral) -> None:
    with pytest.raises(InvalidEpisodeSpec, match="node-99"):
        await corral.start_episode({"image": "busybox"}, node="node-99")


async def test_pinned_node_is_honoured_and_workflow_closes_completed(corral: Corral) -> None:
    episode = await corral.start_episode({"image": "busybox", "steps": ["true"]}, node="node-2")
    result = await episode.result()
    assert result.node == "node-2"
    desc = await corral.client.get_workflow_handle(episode.id).describe()
    assert desc.status == WorkflowExecutionStatus.COMPLETED


async def _all_ids(config: StackConfig) -> set[str]:
    from episode_helpers import sandbox_ids

    return set().union(*(await sandbox_ids(config)).values())
