"""Roles: the four groups and the model permissions each one holds.

Roles are cumulative: viewer < reviewer < approver < admin. The permission sets are
rules over the permission table, so a model added later is covered without editing this
file; `sync_role_groups` applies them (from the data migration and after every `migrate`).
"""
from __future__ import annotations

from typing import Any

from django.apps import apps as global_apps
from django.contrib.auth import get_user_model, password_validation
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction

from trajplatform.audit import audit_record

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
    "reviews.assign_review",
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


def grant_role(*, user: Any, role: str, actor: Any) -> Any:
    """Give `user` staff access and exactly one role group (other groups kept); needs auth.change_user."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if actor is None or not actor.has_perm("auth.change_user"):
        raise PermissionDenied("granting a role needs the auth.change_user permission")
    User = get_user_model()
    with transaction.atomic():
        user = User.objects.select_for_update().get(pk=user.pk)
        role_groups = {g.name: g for g in Group.objects.filter(name__in=ROLES)}
        if role not in role_groups:
            raise RuntimeError(f"the {role!r} group does not exist; run `manage.py migrate` first")
        previous = [r for r in ROLES if r in set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))]
        if previous == [role] and user.is_staff:
            return user  # repeat grant: no-op, no audit row
        was_staff = user.is_staff
        user.groups.remove(*[g for name, g in role_groups.items() if name != role])
        user.groups.add(role_groups[role])
        if not user.is_staff:
            user.is_staff = True
            user.save(update_fields=["is_staff"])
        audit_record(
            "auth.role_grant",
            actor=actor,
            target=user,
            data={"role": role, "previous_roles": previous, "was_staff": was_staff, "is_superuser": user.is_superuser},
        )
    return user


def user_account_save(*, user: Any, actor: Any, created: bool, changed: list[str]) -> Any:
    """Save an account edited in the admin (a new one, or its name, email, active flag or
    password) and write its audit row; no-op for an unchanged existing account. Roles, staff
    and superuser status change only through `grant_role`."""
    if actor is None or not actor.has_perm("auth.add_user" if created else "auth.change_user"):
        raise PermissionDenied("editing accounts needs the auth.change_user permission")
    if not created and not changed:
        return user
    with transaction.atomic():
        user.save()
        # The password's hash is never recorded, only that it changed.
        audit_record("auth.user_create" if created else "auth.user_change", actor=actor, target=user,
                     data={"fields": sorted(set(changed)), "is_active": user.is_active})
    return user


ROLE_DESCRIPTIONS = {
    "viewer": "view every platform model in the console",
    "reviewer": "+ create batches and tasks, cancel/re-queue tasks, write human reviews, decide yellow proposals",
    "approver": "+ sign off red proposals, create and publish dataset versions",
    "admin": "+ everything, including users, roles and the queue",
}


def _checked_account(User: Any, username: str, password: str, email: str | None) -> str:
    """The normalized username, after refusing an empty one, an empty password, a bad email."""
    username = User.normalize_username((username or "").strip())
    if not username:
        raise ValidationError("a username is required")
    if not password:
        raise ValidationError("a non-empty password is required")
    if email:
        validate_email(email)
    return username


def _role_group(role: str) -> Group:
    try:
        return Group.objects.get(name=role)
    except Group.DoesNotExist:
        raise RuntimeError(f"the {role!r} group does not exist; run `manage.py migrate` first") from None


class UserExists(Exception):
    """An account of this username exists; user_create never changes one."""


def user_create(*, username: str, role: str, password: str, email: str | None = None,
                actor_repr: str = "manage.py create_user") -> Any:
    """Create a new active staff account in exactly one role group with this password (validated
    by AUTH_PASSWORD_VALIDATORS); refuses an existing username, an unknown role, a bad email."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    User = get_user_model()
    username = _checked_account(User, username, password, email)
    taken = UserExists(f"a user named {username!r} exists; change its role with the admin's Grant role action, "
                       "its password in the admin")
    try:
        with transaction.atomic():
            group = _role_group(role)
            if User.objects.filter(username=username).exists():
                raise taken
            user = User(username=username, email=User.objects.normalize_email(email or ""), is_staff=True)
            password_validation.validate_password(password, user)
            user.set_password(password)
            user.save()
            user.groups.add(group)
            # Never the password, nor its hash.
            audit_record("auth.user_create", target=user, actor_repr=actor_repr,
                         data={"role": role, "email": user.email, "is_staff": True, "password_set": True})
    except IntegrityError:
        raise taken from None  # created meanwhile by another process
    return user


def bootstrap_admin(*, username: str, email: str | None = None, password: str) -> tuple[Any, bool]:
    """Create or update a superuser in the admin group with this password; returns (user, created)."""
    User = get_user_model()
    username = _checked_account(User, username, password, email)
    with transaction.atomic():
        group = _role_group("admin")
        user = User.objects.select_for_update().filter(username=username).first()
        created = user is None
        if created:
            user = User(username=username, email=User.objects.normalize_email(email or ""))
        elif email:
            user.email = User.objects.normalize_email(email)
        password_validation.validate_password(password, user)
        changed = [flag for flag in ("is_staff", "is_superuser", "is_active") if not getattr(user, flag)]
        user.is_staff = user.is_superuser = user.is_active = True
        user.set_password(password)
        user.save()
        user.groups.add(group)
        # Never the password, nor its hash.
        audit_record(
            "auth.bootstrap_admin",
            target=user,
            actor_repr="manage.py bootstrap_admin",
            data={
                "created": created,
                "email": user.email,
                "flags_set": [] if created else changed,
                "password_set": True,
            },
        )
    return user, created
