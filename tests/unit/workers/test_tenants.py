"""Tenant rules before start: defaults, refusals, and who needs admission."""

from __future__ import annotations

from pathlib import Path

import pytest

from activities.capacity import NodeBudgetConfig
from contract.config import StackConfig, load_config
from contract.models import EpisodeSpec, TenantConfig
from workers.tenants import TenantRuleViolation, cluster_room, prepare_for_tenant


def test_undeclared_tenants_run_unrestricted_and_off_the_admission_path() -> None:
    spec = EpisodeSpec(image="anything", tenant="nobody")
    assert prepare_for_tenant(StackConfig(), spec) == (spec, None)


def test_a_tenant_without_quota_has_rules_but_no_admission() -> None:
    config = StackConfig(tenants={"ci": TenantConfig(images=["busybox"], max_lifetime_s=60)})
    spec, policy = prepare_for_tenant(config, EpisodeSpec(image="busybox", tenant="ci"))
    assert policy is None
    assert spec.timeouts.max_lifetime_s == 60  # filled in: the spec left it unset
    with pytest.raises(TenantRuleViolation, match="tenant 'ci' does not allow image 'debian'"):
        prepare_for_tenant(config, EpisodeSpec(image="debian", tenant="ci"))
    explicit = EpisodeSpec.model_validate(
        {"image": "busybox", "tenant": "ci", "timeouts": {"max_lifetime_s": 120}}
    )
    with pytest.raises(TenantRuleViolation, match="lifetime of at most 60 s"):
        prepare_for_tenant(config, explicit)


def test_a_tenant_with_a_quota_carries_its_policy_and_the_nodes_room() -> None:
    budget = NodeBudgetConfig(cores=2, overcommit=10, max_sandboxes=100)
    config = StackConfig(tenants={"rl": TenantConfig(max_episodes=5, weight=3)})
    config.nodes.budget = budget
    config.nodes.count = 2
    _, policy = prepare_for_tenant(config, EpisodeSpec(image="busybox", tenant="rl"))
    assert policy is not None and policy.tenant.weight == 3
    assert policy.cluster == cluster_room(config)
    assert (policy.cluster.episodes, policy.cluster.cpu_cores) == (200, 40)


def test_tenants_load_from_the_stack_config(tmp_path: Path) -> None:
    path = tmp_path / "corral.yaml"
    path.write_text(
        "tenants:\n"
        "  research: {max_episodes: 4, images: ['corral.local/*'], on_quota: reject}\n"
        "nodes:\n"
        "  budget: {overcommit: 20, max_sandboxes: 3000}\n"
    )
    config = load_config(path, env={})
    assert config.tenants["research"].on_quota == "reject"
    assert config.nodes.budget.max_sandboxes == 3000


def test_a_bad_tenant_entry_is_one_clear_error(tmp_path: Path) -> None:
    from contract.config import ConfigError

    path = tmp_path / "corral.yaml"
    path.write_text("tenants:\n  research: {max_episode: 4}\n")
    with pytest.raises(ConfigError, match=r"tenants\.research\.max_episode: Extra inputs"):
        load_config(path, env={})


def test_dropping_the_user_namespace_needs_a_tenant_that_allows_it() -> None:
    spec = EpisodeSpec(image="busybox", tenant="anyone", user_namespace=False)
    with pytest.raises(TenantRuleViolation, match="tenant 'anyone' requires a user namespace"):
        prepare_for_tenant(StackConfig(), spec)
    allowed = StackConfig(tenants={"anyone": TenantConfig(allow_no_user_namespace=True)})
    checked, _ = prepare_for_tenant(allowed, spec)
    assert checked.user_namespace is False
