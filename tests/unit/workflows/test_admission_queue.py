"""The admission queue's logic: quotas, reasons, rejections and weighted fair order."""

from __future__ import annotations

import itertools

from contract.models import (
    AdmissionPolicy,
    ClusterRoom,
    EgressRule,
    EpisodeSpec,
    Network,
    Resources,
    TenantConfig,
    Timeouts,
)
from workflows.admission import (
    AdmissionQueue,
    AdmissionRequest,
    needs_admission,
    tenant_rule_violation,
)

_ids = itertools.count()


def ask(
    tenant: str,
    config: TenantConfig,
    *,
    cpu: float = 1.0,
    memory: int = 512,
    room: ClusterRoom | None = None,
    spec: EpisodeSpec | None = None,
) -> AdmissionRequest:
    return AdmissionRequest(
        episode_id=f"{tenant}-{next(_ids)}",
        tenant=tenant,
        policy=AdmissionPolicy(tenant=config, cluster=room or ClusterRoom()),
        cpu_cores=cpu,
        memory_mb=memory,
        spec=spec,
    )


def statuses(decisions: list) -> dict[str, str]:
    return {episode: d.status for episode, d in decisions}


def test_episodes_beyond_the_quota_wait_with_the_reason_and_start_on_release() -> None:
    queue, quota = AdmissionQueue(), TenantConfig(max_episodes=2)
    first, second, third = (ask("a", quota) for _ in range(3))
    assert statuses(queue.request(first)) == {first.episode_id: "admitted"}
    assert statuses(queue.request(second)) == {second.episode_id: "admitted"}
    [(episode, waiting)] = queue.request(third)
    assert (episode, waiting.status) == (third.episode_id, "waiting")
    assert waiting.reason == "tenant 'a' is at its quota of 2 concurrent episodes"
    assert statuses(queue.release(first.episode_id)) == {third.episode_id: "admitted"}
    assert queue.release(second.episode_id) == []


def test_on_quota_reject_rejects_at_once_naming_the_quota() -> None:
    queue, quota = AdmissionQueue(), TenantConfig(cpu_cores=2, on_quota="reject")
    assert statuses(queue.request(ask("r", quota, cpu=1.5))) != {}
    over = ask("r", quota, cpu=1.0)
    [(_, decision)] = queue.request(over)
    assert decision.status == "rejected"
    assert decision.reason == "tenant 'r' is at its quota of 2 cpu_cores (1.5 in use, 1 asked)"
    assert queue.state.waiting == []


def test_memory_quota_reason() -> None:
    queue, quota = AdmissionQueue(), TenantConfig(memory_mb=1024)
    queue.request(ask("m", quota, memory=768))
    [(_, decision)] = queue.request(ask("m", quota, memory=512))
    assert (
        decision.reason
        == "tenant 'm' is at its quota of 1024 MiB of memory (768 in use, 512 asked)"
    )


def _admission_order(queue: AdmissionQueue, first: str, rounds: int) -> list[str]:
    """Release the running episode `rounds` times; the tenants admitted, in order."""
    order, running = [], first
    for _ in range(rounds):
        [(running, decision)] = queue.release(running)
        assert decision.status == "admitted"
        order.append(running.split("-")[0])
    return order


def test_equal_weights_alternate_under_contention() -> None:
    queue, room = AdmissionQueue(), ClusterRoom(episodes=1)
    a, b = TenantConfig(max_episodes=100), TenantConfig(max_episodes=100)
    first = ask("a", a, room=room)
    queue.request(first)
    for _ in range(4):
        [(_, wait_a)] = queue.request(ask("a", a, room=room))
        queue.request(ask("b", b, room=room))
    assert wait_a.reason == "no room on the nodes: 1 episodes with a quota are running"
    assert _admission_order(queue, first.episode_id, 8) == ["b", "a"] * 4


def test_weights_share_the_room_in_proportion() -> None:
    queue, room = AdmissionQueue(), ClusterRoom(cpu_cores=1)
    light, heavy = TenantConfig(max_episodes=100), TenantConfig(max_episodes=100, weight=2)
    first = ask("light", light, room=room)
    queue.request(first)
    for _ in range(6):
        queue.request(ask("light", light, room=room))
        queue.request(ask("heavy", heavy, room=room))
    order = _admission_order(queue, first.episode_id, 9)
    assert order.count("heavy") == 6 and order.count("light") == 3
    assert order[:3].count("heavy") == 2  # interleaved, not one tenant's batch first


def test_a_tenant_that_was_away_gets_no_backlog_of_credit() -> None:
    queue, room = AdmissionQueue(), ClusterRoom(episodes=1)
    busy, late = TenantConfig(max_episodes=100), TenantConfig(max_episodes=100)
    running = ask("busy", busy, room=room)
    queue.request(running)
    for _ in range(10):  # "busy" runs ten episodes one after the other
        nxt = ask("busy", busy, room=room)
        queue.request(nxt)
        queue.release(running.episode_id)
        running = nxt
    for _ in range(3):
        queue.request(ask("busy", busy, room=room))
        queue.request(ask("late", late, room=room))
    assert _admission_order(queue, running.episode_id, 4) == ["late", "busy", "late", "busy"]


def test_a_repeated_request_is_answered_again_and_a_waiting_release_withdraws() -> None:
    queue, quota = AdmissionQueue(), TenantConfig(max_episodes=1)
    first, second = ask("a", quota), ask("a", quota)
    queue.request(first)
    assert statuses(queue.request(first)) == {first.episode_id: "admitted"}
    queue.request(second)
    assert queue.request(second) == []  # still waiting, already told
    assert queue.release(second.episode_id) == []
    assert queue.release(first.episode_id) == []
    assert queue.state.running == {} and queue.state.waiting == []


def test_usage_shows_each_tenant_against_its_quota() -> None:
    queue, quota = AdmissionQueue(), TenantConfig(max_episodes=1)
    queue.request(ask("a", quota, cpu=0.5, memory=256))
    queue.request(ask("a", quota))
    [row] = queue.usage()
    assert (row.tenant, row.episodes, row.waiting, row.cpu_cores, row.memory_mb) == (
        "a",
        1,
        1,
        0.5,
        256,
    )
    assert row.quota == quota


def test_rules_refuse_image_egress_lifetime_and_oversized_specs() -> None:
    tenant = TenantConfig(
        images=["corral.local/*", "busybox"],
        egress=["10.0.0.0/8"],
        max_lifetime_s=600,
        cpu_cores=2,
        memory_mb=1024,
    )

    def spec(**fields: object) -> EpisodeSpec:
        base = {"image": "busybox", "tenant": "t", "timeouts": {"max_lifetime_s": 600}}
        return EpisodeSpec.model_validate({**base, **fields})

    allowlist = Network(mode="allowlist", egress=[EgressRule(cidr="10.1.0.0/16")])
    assert tenant_rule_violation(spec(network=allowlist), tenant) is None
    cases = {
        "does not allow image 'debian'": spec(image="debian"),
        "does not allow egress to 192.168.0.0/24": spec(
            network=Network(mode="allowlist", egress=[EgressRule(cidr="192.168.0.0/24")])
        ),
        "lifetime of at most 600 s (timeouts.max_lifetime_s is 3600)": spec(
            timeouts=Timeouts(max_lifetime_s=3600)
        ),
        "quota of 2 cpu_cores (the spec asks for 4)": spec(resources=Resources(cpu_cores=4)),
        "quota of 1024 MiB of memory (the spec asks for 2048)": spec(
            resources=Resources(memory_mb=2048)
        ),
    }
    for reason, bad in cases.items():
        violation = tenant_rule_violation(bad, tenant)
        assert violation is not None and reason in violation, (reason, violation)
        assert violation.startswith("tenant 't'")


def test_the_queue_rejects_a_spec_that_breaks_a_rule_before_it_waits() -> None:
    queue, tenant = AdmissionQueue(), TenantConfig(max_episodes=1, images=["busybox"])
    bad = EpisodeSpec(image="debian", tenant="t")
    [(_, decision)] = queue.request(ask("t", tenant, spec=bad))
    assert decision.status == "rejected" and "does not allow image 'debian'" in decision.reason
    assert queue.state.waiting == [] and queue.state.running == {}


def test_only_tenants_with_a_quota_need_admission() -> None:
    assert not needs_admission(None)
    assert not needs_admission(AdmissionPolicy(tenant=TenantConfig(images=["busybox"])))
    assert needs_admission(AdmissionPolicy(tenant=TenantConfig(max_episodes=3)))
