"""Episode logic that needs no services: ids, spec validation, result helpers."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.exceptions import ApplicationError

from activities.reaping import as_utc as _as_utc
from activities.records import episode_records
from activities.records import reward_value as _reward_value
from contract.ids import sandbox_id_for
from contract.models import (
    AlertSummary,
    EpisodeResult,
    EpisodeSpec,
    ExecRequest,
    RecordEpisodeInput,
    StepResult,
)
from corral.cli_episodes import batch_summary
from corral.errors import EpisodeKilled, InvalidEpisodeSpec
from corral.sdk import _result_from_details, parse_spec
from observability.records import EpisodeRecord, StepRecord
from workflows.episode_support import outcome_of as _outcome_of
from workflows.models import EpisodeInput

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_sandbox_id_is_deterministic_64_hex_and_distinct() -> None:
    a, b = sandbox_id_for("ep-1"), sandbox_id_for("ep-2")
    assert a == sandbox_id_for("ep-1") and a != b
    assert re.fullmatch(r"[0-9a-f]{64}", a)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"image": "busybox", "timout_s": 3}, "timout_s"),
        ({"image": "busybox", "timeouts": {"idle_ttl_s": 0}}, "timeouts.idle_ttl_s"),
        ({"image": "busybox", "resources": {"memory_mb": 8}}, "resources.memory_mb"),
        ({"image": "busybox", "steps": ["  "]}, "steps"),
        ({"image": "busybox", "tenant": "Bad Tenant"}, "tenant"),
        ({"image": "busybox", "network": {"egress": [{"cidr": "1.1.1.1/32"}]}}, "network"),
        ({"image": "busybox", "files": [{"path": "rel", "content": ""}]}, "files"),
        ({"image": ""}, "image"),
        ({}, "image"),
        # What the node's SandboxSpec refuses is refused at start (issue 24).
        ({"image": "busybox", "env": {"A B": "1"}}, "env: Value error, env key 'A B'"),
        ({"image": "busybox", "steps": [{"cmd": "ls", "env": {"1X": ""}}]}, "steps.0.env"),
        ({"image": "busybox", "steps": [{"cmd": "ls", "workdir": "tmp"}]}, "steps.0.workdir"),
        ({"image": "busybox", "reward": {"cmd": "ls", "workdir": "."}}, "reward.workdir"),
        ({"image": "busybox", "runtime": "kata"}, "runtime"),
        ({"image": "busybox", "resources": {"memory_mb": 64, "tmpfs_mb": 32}}, "resources"),
        (
            {
                "image": "busybox",
                "network": {"mode": "allowlist", "egress": [{"cidr": "10.0.0.1/8"}]},
            },
            "network.egress.0.cidr",
        ),
        (
            {"image": "busybox", "network": {"mode": "allowlist", "egress": [{"cidr": "::/0"}]}},
            "IPv6",
        ),
        (
            {"image": "busybox", "network": {"mode": "allowlist", "egress": [{"cidr": "example"}]}},
            "network.egress.0.cidr",
        ),
    ],
)
def test_invalid_spec_names_the_field_on_one_line(spec: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidEpisodeSpec) as caught:
        parse_spec(spec)
    message = str(caught.value)
    assert field in message and "\n" not in message, message


def test_a_spec_changed_after_it_was_made_is_checked_again_at_start() -> None:
    spec = parse_spec({"image": "busybox", "steps": ["true"]})
    spec.env["NOT A NAME"] = "x"  # pydantic does not check assignments
    with pytest.raises(InvalidEpisodeSpec, match="env key 'NOT A NAME'"):
        parse_spec(spec)


def test_egress_cidrs_are_kept_in_canonical_form() -> None:
    network = {"mode": "allowlist", "egress": [{"cidr": "10.1.0.0/255.255.0.0", "port": 443}]}
    spec = parse_spec({"image": "busybox", "network": network})
    assert spec.network.egress[0].cidr == "10.1.0.0/16"
    assert parse_spec(spec) == spec


def test_spec_shorthands() -> None:
    spec = parse_spec({"image": "busybox", "steps": ["echo a", ["ls", "/"]], "reward": "echo 1"})
    assert [s.cmd for s in spec.steps] == ["echo a", ["ls", "/"]]
    assert spec.steps[1].display() == "ls /"
    assert spec.reward is not None and spec.reward.cmd == "echo 1"
    assert parse_spec(spec) is spec
    assert ExecRequest(cmd=["id"], env={"A": "1"}).as_step().env == {"A": "1"}


def test_episode_input_max_steps_per_run_is_optional_and_positive() -> None:
    spec = EpisodeSpec(image="busybox")
    assert EpisodeInput(spec=spec).max_steps_per_run is None
    with pytest.raises(ValueError, match="max_steps_per_run"):
        EpisodeInput(spec=spec, max_steps_per_run=0)


def _step(index: int, exit_code: int = 0, **kw: object) -> StepResult:
    return StepResult(index=index, cmd=f"c{index}", exit_code=exit_code, **kw)  # type: ignore[arg-type]


def test_step_result_helpers() -> None:
    assert _step(0).ok and not _step(0, 1).ok and not _step(0, timed_out=True).ok
    full = _step(1, stdout="out", stderr="err", duration_s=1.5)
    summary = full.summary()
    assert (summary.stdout, summary.stderr, summary.duration_s) == ("", "", 1.5)
    assert full.stdout == "out"  # the original is untouched


def test_episode_result_duration_and_round_trip_through_error_details() -> None:
    result = EpisodeResult(
        episode_id="ep", outcome="killed", started_at=T0, ended_at=T0 + timedelta(seconds=2.5)
    )
    assert result.duration_s == 2.5
    assert EpisodeResult(episode_id="ep", outcome="failed").duration_s == 0.0
    err = ApplicationError("x", result.model_dump(mode="json"), type="EpisodeKilled")
    assert _result_from_details(err) == result
    assert _result_from_details(ApplicationError("x", {"bad": 1})) is None


def test_killed_error_names_the_rule() -> None:
    alerts = [
        AlertSummary(rule="noted", priority="Notice", action="notify"),
        AlertSummary(rule="Miner", priority="Critical", action="kill"),
    ]
    killed = EpisodeKilled("x", EpisodeResult(episode_id="e", outcome="killed", alerts=alerts))
    assert killed.rule == "Miner"
    assert EpisodeKilled("x").rule is None


def test_outcome_of_application_errors() -> None:
    assert _outcome_of(ApplicationError("idle", type="IdleTimeout")) == "timed_out"
    assert _outcome_of(ApplicationError("step", type="StepFailed")) == "failed"


def test_reward_value_is_last_numeric_line() -> None:
    assert _reward_value(_step(0, stdout="log\n0.75\n")) == 0.75
    assert _reward_value(_step(0, stdout="not a number\n")) is None
    assert _reward_value(None) is None


def test_containerd_naive_timestamps_are_utc() -> None:
    naive = datetime(2026, 1, 1, 12, 0)
    assert _as_utc(naive) == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert _as_utc(T0) is T0 and _as_utc(None) is None


def test_episode_records_rows() -> None:
    result = EpisodeResult(
        episode_id="ep",
        outcome="completed",
        steps=[_step(0), _step(1, stdout="1\n", source="reward")],
        reward=_step(1, stdout="1\n", source="reward"),
        started_at=T0,
        ended_at=T0 + timedelta(seconds=1),
    )
    rows = episode_records(RecordEpisodeInput(result=result, workflow_id="ep", run_id="r"))
    episodes = [r for r in rows if isinstance(r, EpisodeRecord)]
    assert len(episodes) == 1 and episodes[0].reward == 1.0 and episodes[0].steps == 2
    assert [r.index for r in rows if isinstance(r, StepRecord)] == [0, 1]


def test_batch_summary_counts_and_percentiles() -> None:
    results = [
        EpisodeResult(
            episode_id=f"e{i}",
            outcome="failed" if i % 4 == 0 else "completed",
            reason="step 0 exited 1" if i % 4 == 0 else "",
            started_at=T0,
            ended_at=T0 + timedelta(seconds=i),
        )
        for i in range(1, 9)
    ]
    summary = batch_summary(results, wall_s=4.0)
    assert summary["episodes"] == 8 and summary["per_second"] == 2.0
    assert summary["outcomes"] == {"completed": 6, "failed": 2}
    assert summary["failed_by_reason"] == {"step 0 exited 1": 2}
    assert summary["p50_s"] == 4.5 and summary["p99_s"] == 8.0
    assert batch_summary([], 0.0)["per_second"] == 0.0


def test_the_episodes_sensor_verdict_is_the_first_step_not_judged() -> None:
    from contract.models import StepResult
    from workflows.episode_support import sensor_verdict as _sensor_verdict

    def step(verdict: str) -> StepResult:
        return StepResult(index=0, cmd="true", exit_code=0, sensor=verdict)

    assert _sensor_verdict([step("ok"), step("ok"), "ok"]) == "ok"
    assert _sensor_verdict([step("ok"), step("behind"), "gap"]) == "behind"
    assert _sensor_verdict([step("off"), "off"]) == "off"
    assert _sensor_verdict([step(""), ""]) == ""  # histories from before the watermark
