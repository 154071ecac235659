"""The three-tier policy: the default table, bounds, escalation, refusal, editing it, applying values."""
from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.urls import reverse

from apps.reviews import policy
from apps.reviews.models import PolicyRule
from apps.reviews.services import policy_rule_save
from trajplatform.audit import audit_events_for

pytestmark = pytest.mark.django_db

TABLE = [
    # field, new value, tier
    ("temperature", 0.3, "green"),
    ("temperature", 1.2, "green"),
    ("temperature", 1.6, "yellow"),          # outside the green bounds: escalated
    ("top_p", 0.9, "green"),
    ("top_p", 0.05, "refuse"),
    ("max_steps", 30, "green"),
    ("max_steps", 60, "green"),
    ("max_steps", 61, "yellow"),
    ("system_prompt_extra", "Check the schema first.", "green"),
    ("system_prompt_extra", "x" * 4001, "yellow"),
    ("prompt", "Write a better task description.", "yellow"),
    ("expected_tools", ["run_shell", "finish"], "yellow"),
    ("model", "gpt-4o-mini", "yellow"),
    ("model", "some-unlisted-model", "refuse"),
    ("quality_threshold", 70, "yellow"),
    ("quality_threshold", 20, "refuse"),
    ("max_tokens", 200_000, "red"),
    ("timeout_s", 1200.0, "red"),
    ("step_timeout_s", 60.0, "red"),
    ("scene_config.image", "python:3.12", "red"),
    ("scene_config.network", "egress", "red"),
    ("scene_config.dependencies", ["numpy"], "red"),
    ("scene_config.side_effect_tools", ["send_email"], "red"),
    ("cancel_requested", True, "refuse"),    # not a config field the policy covers
    ("status", "completed", "refuse"),
]


@pytest.mark.parametrize("field, value, tier", TABLE)
def test_the_default_policy_table(field, value, tier):
    assert policy.classify(field, value) == tier


def test_the_migration_wrote_the_default_rules():
    assert set(PolicyRule.objects.values_list("field", flat=True)) == {r["field"] for r in policy.DEFAULT_RULES}


def test_an_admin_edit_changes_the_tier_and_is_audited(admin_user_role):
    rule = PolicyRule.objects.get(field="temperature")
    rule.tier = "yellow"
    policy_rule_save(rule=rule, actor=admin_user_role, changed=["tier"])
    assert policy.classify("temperature", 0.3) == "yellow"
    event = audit_events_for(rule).get()
    assert event.action == "reviews.policy_change" and event.data["tier"] == "yellow"
    PolicyRule.objects.filter(field="temperature").update(enabled=False)
    assert policy.classify("temperature", 0.3) == "refuse"


def test_only_admins_edit_the_policy(client, approver, admin_user_role):
    rule = PolicyRule.objects.get(field="temperature")
    with pytest.raises(PermissionDenied):
        policy_rule_save(rule=rule, actor=approver, changed=["tier"])
    client.force_login(approver)
    url = reverse("admin:reviews_policyrule_change", args=[rule.pk])
    assert client.post(url, {"field": "temperature", "tier": "red"}).status_code == 403
    client.force_login(admin_user_role)
    response = client.post(url, {"field": "temperature", "tier": "red", "min_value": "0", "max_value": "1",
                                 "allowed_values": "[]", "out_of_bounds_tier": "refuse", "impact_note": "",
                                 "enabled": "on"})
    assert response.status_code == 302
    assert PolicyRule.objects.get(pk=rule.pk).tier == "red" and audit_events_for(rule).count() == 1


def test_bad_bounds_are_refused():
    with pytest.raises(ValidationError):
        policy_rule_save(rule=PolicyRule(field="x", tier="green", min_value=5, max_value=1),
                         actor=type("A", (), {"is_authenticated": True, "has_perm": lambda s, p: True})(),
                         changed=[])


def test_apply_change_validates_and_sets_the_field(make_task):
    task = make_task(scene_config={})
    assert policy.apply_change(task, "max_steps", 30, tier="green") == "max_steps" and task.max_steps == 30
    assert policy.apply_change(task, "scene_config.image", "python:3.12", tier="red") == "scene_config"
    assert task.scene_config == {"image": "python:3.12"}
    with pytest.raises(ValidationError, match="does not accept"):
        policy.apply_change(task, "scene_config.network", "egress", tier="red")  # not in code_exec's schema
    with pytest.raises(ValidationError, match="temperature"):
        policy.apply_change(task, "temperature", 5.0, tier="red")
    with pytest.raises(ValidationError, match="not a task config field"):
        policy.apply_change(task, "status", "completed", tier="red")


@pytest.mark.parametrize("field, value, tier, message", [
    ("model", "unlisted-model-xyz", "yellow", "not one of the allowed values"),
    ("quality_threshold", 5, "yellow", "outside the policy's bounds 50 to 100"),
    ("prompt", "x" * 20001, "yellow", "its length is outside the policy's bounds 1 to 20000"),
    ("max_tokens", 200_000, "yellow", "is a red change; a yellow proposal cannot apply it"),
    ("max_steps", 61, "green", "is a yellow change; a green proposal cannot apply it"),
])
def test_apply_change_refuses_what_the_policy_does_not_allow(make_task, field, value, tier, message):
    task = make_task(quality_threshold=70)
    before = policy.current_value(task, field)
    with pytest.raises(ValidationError, match=message):
        policy.apply_change(task, field, value, tier=tier)
    assert policy.current_value(task, field) == before


def test_apply_change_uses_the_policy_as_it_is_now(make_task):
    task = make_task()
    assert policy.apply_change(task, "model", "gpt-4o-mini", tier="yellow") == "model"
    PolicyRule.objects.filter(field="model").update(allowed_values=["deepseek-chat"])
    with pytest.raises(ValidationError, match="allowed values"):
        policy.apply_change(task, "model", "gemini-2.5-flash", tier="yellow")
    PolicyRule.objects.filter(field="model").update(enabled=False)
    with pytest.raises(ValidationError, match="no enabled policy rule covers model"):
        policy.apply_change(task, "model", "deepseek-chat", tier="red")


def test_validate_proposal_names_the_first_bad_option(make_task):
    task = make_task()
    assert policy.validate_proposal(task, "quality_threshold", 70, [70, 90]) == "yellow"
    assert policy.validate_proposal(task, "max_tokens", 4000) == "red"
    with pytest.raises(ValidationError, match=r"option 1: the policy does not allow changing quality_threshold to 5"):
        policy.validate_proposal(task, "quality_threshold", 70, [70, 5])
    with pytest.raises(ValidationError, match="option 1: changing max_steps to 61 is a yellow change; a green"):
        policy.validate_proposal(task, "max_steps", 30, [30, 61])
    with pytest.raises(ValidationError, match="option 0: max_steps: "):
        policy.validate_proposal(task, "max_steps", 30, ["many"])
    with pytest.raises(ValidationError, match="options must be a list"):
        policy.validate_proposal(task, "model", "deepseek-flash", "deepseek-flash")
