"""Roles: the four groups and the model permissions each one holds.

Roles are cumulative: viewer < reviewer < approver < admin. The permission sets are
rules over the permission table, so a model added later is covered without editing this
file; `sync_role_groups` applies them (from the data migration and after every `migrate`).
"""
from __future__ import annotations

from typing import Any

ROLES = ("viewer", "reviewer", "approver", "admin")

# Apps whose models the console shows.
DOMAIN_APPS = ("trajplatform", "tasks", "engines", "reviews", "datasets")

# Codenames added on top of the role below (app_label.codename).
REVIEWER_EXTRA = {
    "tasks.add_batch",
    "tasks.add_task",
    "tasks.change_task",
    "reviews.add_review",
    "reviews.change_review",
    "reviews.change_proposal",
    "reviews.decide_yellow_proposal",
}
APPROVER_EXTRA = {
    "reviews.decide_red_proposal",
    "datasets.add_dataset",
    "datasets.change_dataset",
    "datasets.add_datasetversion",
    "datasets.change_datasetversion",
    "datasets.publish_datasetversion",
}
# Never granted to any role: history is append-only for everyone.
NEVER = {"trajplatform.add_auditevent", "trajplatform.change_auditevent", "trajplatform.delete_auditevent"}


def role_permission_keys(role: str, all_keys: set[str]) -> set[str]:
    """The app_label.codename set a role holds, given every permission that exists."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    domain = {k for k in all_keys if k.split(".", 1)[0] in DOMAIN_APPS}
    keys = {k for k in domain if k.split(".", 1)[1].startswith("view_")}
    if role in ("reviewer", "approver", "admin"):
        keys |= REVIEWER_EXTRA
    if role in ("approver", "admin"):
        keys |= APPROVER_EXTRA
    if role == "admin":
        keys |= domain
        keys |= {k for k in all_keys if k.split(".", 1)[0] in ("auth", "django_q")}
    return (keys & all_keys) - NEVER


def sync_role_groups(apps: Any = None) -> None:
    """Create the four groups and set their permissions exactly; safe to run repeatedly."""
    if apps is None:
        from django.apps import apps as global_apps

        apps = global_apps
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    perms = {f"{p.content_type.app_label}.{p.codename}": p for p in Permission.objects.select_related("content_type")}
    for role in ROLES:
        group, _ = Group.objects.get_or_create(name=role)
        group.permissions.set([perms[k] for k in sorted(role_permission_keys(role, set(perms)))])


def user_roles(user: Any) -> list[str]:
    if not getattr(user, "is_authenticated", False):
        return []
    names = set(user.groups.values_list("name", flat=True))
    return [r for r in ROLES if r in names]


def highest_role(user: Any) -> str | None:
    if getattr(user, "is_superuser", False):
        return "admin"
    roles = user_roles(user)
    return roles[-1] if roles else None
