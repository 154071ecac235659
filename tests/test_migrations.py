"""Migrations match the models, and the role groups hold the intended permissions."""
from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.core.management import call_command

from trajplatform.permissions import ROLES, sync_role_groups

pytestmark = pytest.mark.django_db


def test_models_have_no_unmigrated_changes() -> None:
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits non-zero when a migration is missing
        pytest.fail(f"makemigrations --check found model changes without a migration:\n{out.getvalue()} ({exc})")
    assert "No changes detected" in out.getvalue()


def perms_of(role: str) -> set[str]:
    group = Group.objects.get(name=role)
    return {f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.select_related("content_type")}


def test_the_four_role_groups_exist() -> None:
    assert set(Group.objects.filter(name__in=ROLES).values_list("name", flat=True)) == set(ROLES)


def test_viewer_only_views() -> None:
    perms = perms_of("viewer")
    assert {"tasks.view_task", "tasks.view_trajectory", "reviews.view_proposal", "trajplatform.view_auditevent"} <= perms
    assert all(p.split(".", 1)[1].startswith("view_") for p in perms)
    assert not any(p.startswith("auth.") for p in perms)


def test_reviewer_decides_yellow_but_not_red() -> None:
    perms = perms_of("reviewer")
    assert {"reviews.decide_yellow_proposal", "tasks.change_task", "tasks.add_task"} <= perms
    assert "reviews.decide_red_proposal" not in perms
    assert "auth.change_user" not in perms


def test_approver_signs_off_red_and_publishes() -> None:
    perms = perms_of("approver")
    assert {"reviews.decide_red_proposal", "reviews.decide_yellow_proposal", "datasets.publish_datasetversion"} <= perms
    assert "auth.change_user" not in perms


def test_admin_manages_users() -> None:
    perms = perms_of("admin")
    assert {"auth.change_user", "auth.view_user", "tasks.delete_task", "reviews.decide_red_proposal"} <= perms


def test_roles_are_cumulative() -> None:
    assert perms_of("viewer") < perms_of("reviewer") < perms_of("approver") < perms_of("admin")


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_write_the_audit_log(role: str) -> None:
    perms = perms_of(role)
    assert "trajplatform.view_auditevent" in perms
    assert not {"trajplatform.add_auditevent", "trajplatform.change_auditevent", "trajplatform.delete_auditevent"} & perms


def test_sync_role_groups_is_idempotent_and_repairs_drift() -> None:
    viewer = Group.objects.get(name="viewer")
    before = perms_of("viewer")
    viewer.permissions.add(Permission.objects.get(content_type__app_label="tasks", codename="delete_task"))
    Group.objects.filter(name="approver").delete()

    sync_role_groups()
    sync_role_groups()

    assert perms_of("viewer") == before
    assert "reviews.decide_red_proposal" in perms_of("approver")
    assert Group.objects.filter(name__in=ROLES).count() == 4


def test_the_role_migration_leaves_the_app_registry_intact() -> None:
    """Apps with models keep their models_module, or post_migrate (permissions, role sync) stops firing."""
    broken = [a.label for a in apps.get_app_configs() if list(a.get_models()) and a.models_module is None]
    assert broken == []


def test_role_groups_are_resynced_after_migrate() -> None:
    Group.objects.get(name="reviewer").permissions.clear()
    call_command("migrate", verbosity=0)
    assert "reviews.decide_yellow_proposal" in perms_of("reviewer")


def test_roles_are_resynced_when_the_last_installed_app_has_no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """post_migrate (also sent after a transactional test's flush) skips apps without models;
    the role sync must still run once every app's permissions exist."""
    from django.core.management.sql import emit_post_migrate_signal

    sidecar = apps.get_app_config("drf_spectacular_sidecar")
    assert sidecar.models_module is None
    reordered = [c for c in apps.get_app_configs() if c is not sidecar] + [sidecar]
    monkeypatch.setattr(apps, "get_app_configs", lambda: reordered)
    Group.objects.filter(name__in=ROLES).delete()

    emit_post_migrate_signal(verbosity=0, interactive=False, db="default")

    assert Group.objects.filter(name__in=ROLES).count() == 4
    assert "reviews.decide_red_proposal" in perms_of("approver")


def test_the_policy_migration_replaces_retired_models_and_keeps_an_operators_others() -> None:
    import importlib

    from apps.reviews.models import PolicyRule

    migration = importlib.import_module("apps.reviews.migrations.0007_policy_current_models")
    PolicyRule.objects.filter(field="model").update(
        allowed_values=["deepseek-chat", "my-model", "deepseek-reasoner", "deepseek-flash"])
    migration.forwards(apps, None)
    assert PolicyRule.objects.get(field="model").allowed_values == ["deepseek-flash", "my-model"]
