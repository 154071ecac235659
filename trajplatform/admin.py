"""The platform's own console pages: the audit log, users and roles, API tokens and webhooks
(api_admin), django-q2's queue view-only, and the console's site settings.

The shared mixins the apps' admins build on live in trajplatform.admin_base.
"""
from __future__ import annotations

from typing import Any, Callable

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django_q import admin as q_admin
from django_q.models import Failure, OrmQ, Schedule, Success

from trajplatform import api_admin  # noqa: F401  (API tokens, webhooks)
from trajplatform.activity import ActivityDay
from trajplatform.admin_base import ReadableJSONMixin, ViewOnlyMixin, admin_change_url, truncated
from trajplatform.audit import ACTIONS, AuditEvent
from trajplatform.permissions import ROLES, grant_role, user_account_save


class ActionFilter(admin.SimpleListFilter):
    """Choices from the ACTIONS registry: no DISTINCT scan over the whole log."""

    title = "action"
    parameter_name = "action"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(name, name) for name in sorted(ACTIONS)]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet | None:
        return queryset.filter(action=self.value()) if self.value() else None


@admin.register(AuditEvent)
class AuditEventAdmin(ViewOnlyMixin, ReadableJSONMixin, admin.ModelAdmin):
    """View-only for everyone, superusers included: history is append-only."""

    list_display = ("when", "actor_name", "action", "target_link", "target_type")
    list_filter = (ActionFilter,)
    search_fields = ("actor_repr", "target_repr", "target_id__exact", "action")
    list_select_related = ("actor",)
    raw_id_fields = ("actor",)
    show_full_result_count = False
    json_fields = ("data",)
    json_tables = ("data",)
    fieldsets = [
        (None, {"fields": ["created_at", "action", "actor", "actor_repr"]}),
        ("target", {"fields": ["target_type", "target_id", "target_repr", "target_link"]}),
        ("data", {"fields": ["data"]}),
    ]
    readonly_fields = (
        "created_at", "action", "actor", "actor_repr", "target_type", "target_id", "target_repr", "target_link", "data",
    )

    @admin.display(description="when", ordering="created_at")
    def when(self, obj: AuditEvent) -> str:
        return f"{timezone.localtime(obj.created_at):%Y-%m-%d %H:%M:%S}"

    @admin.display(description="actor", ordering="actor_repr")
    def actor_name(self, obj: AuditEvent) -> SafeString | str:
        return truncated(obj.actor_repr, 24)

    @admin.display(description="target")
    def target_link(self, obj: AuditEvent) -> SafeString | str:
        url = admin_change_url(obj.target_type, obj.target_id) if obj.target_type else None
        text = obj.target_repr or (f"{obj.target_type} {obj.target_id}" if obj.target_type else "-")
        if url is None:
            return truncated(text, 60)
        return format_html('<a href="{}">{}</a>', url, truncated(text, 60))



# The console's navigation bar links every section; the admin's own side bar of models took
# 300 px from the lists at 1440 px and pushed their key columns behind a horizontal scroll.
admin.site.enable_nav_sidebar = False


# --- users and roles -------------------------------------------------------------------


def _names(usernames: list[str], shown: int = 10) -> str:
    """'alice', 'alice and bob', 'alice, bob and carol', or the first ten 'and 5 more'."""
    if len(usernames) > shown:
        return f"{', '.join(usernames[:shown])} and {len(usernames) - shown} more"
    if len(usernames) > 1:
        return f"{', '.join(usernames[:-1])} and {usernames[-1]}"
    return usernames[0]


def _grant_role_action(role: str) -> Callable[[Any, HttpRequest, QuerySet], None]:
    def action(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
        granted: list[str] = []
        try:
            for user in queryset.order_by("username"):
                grant_role(user=user, role=role, actor=request.user)
                granted.append(user.get_username())
        except PermissionDenied as exc:
            modeladmin.message_user(request, f"{user.get_username()}: {exc}", messages.ERROR)
        if granted:
            modeladmin.message_user(request, f"Granted role {role} to {_names(granted)}")

    action.__name__ = f"grant_role_{role}"
    return admin.action(description=f"Grant role: {role}", permissions=["change"])(action)


User = get_user_model()
if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class RoleUserAdmin(UserAdmin):
    """Django's user admin plus the role column and one "Grant role" action per role.

    Roles, staff and superuser status change only through `grant_role` (the actions, audited),
    so they are read-only on the form; users are deactivated, not deleted (their reviews and
    decisions name them)."""

    list_display = ("username", "email", "roles", "is_staff", "is_superuser", "is_active", "last_login")
    actions = [_grant_role_action(role) for role in ROLES]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        readonly = tuple(super().get_readonly_fields(request, obj))
        return readonly if obj is None else (*readonly, "is_staff", "is_superuser", "groups", "user_permissions")

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        user_account_save(user=obj, actor=request.user, created=not change, changed=list(form.changed_data))

    def user_change_password(self, request: HttpRequest, id: str, form_url: str = "") -> Any:
        """Django's password form, with the account's audit row written in the same transaction."""
        with transaction.atomic():
            response = super().user_change_password(request, id, form_url)
            if request.method == "POST" and response.status_code == 302:
                user = self.get_object(request, id)
                user_account_save(user=user, actor=request.user, created=False, changed=["password"])
        return response

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).prefetch_related("groups")

    @admin.display(description="roles")
    def roles(self, obj: Any) -> str:
        names = {g.name for g in obj.groups.all()}
        return ", ".join(r for r in ROLES if r in names) or "-"


@admin.register(ActivityDay)
class ActivityDayAdmin(ViewOnlyMixin, admin.ModelAdmin):
    """The overview's daily activity: rows the activity job derives and rewrites; view-only."""

    list_display = ("day", "finished", "succeeded", "accepted", "human_reviewed", "cost_usd", "judge_usd",
                    "awaiting_review", "computed_at")
    date_hierarchy = "day"


if admin.site.is_registered(Group):
    admin.site.unregister(Group)


@admin.register(Group)
class RoleGroupAdmin(ViewOnlyMixin, GroupAdmin):
    """The role groups' permissions are set by `sync_role_groups` (after every migrate): view-only."""


# --- django-q2's queue, schedules and task results: view-only ------------------------------------
# The platform's jobs are started, retried and cancelled through its services (task, batch and
# pipeline actions, audited); resubmitting a raw job or editing a schedule here would bypass them.
# The schedules are (re)written by `trajplatform.schedules` after every migrate.


def _view_only_django_q_admins() -> None:
    for model, base in ((Schedule, q_admin.ScheduleAdmin), (Success, q_admin.TaskAdmin),
                        (Failure, q_admin.FailAdmin), (OrmQ, getattr(q_admin, "QueueAdmin", None))):
        if base is None or not admin.site.is_registered(model):
            continue
        admin.site.unregister(model)
        admin.site.register(model, type(base.__name__, (ViewOnlyMixin, base), {"actions": []}))


_view_only_django_q_admins()
