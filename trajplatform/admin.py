"""The console's shared pieces (readable JSON, the audit section), the audit log and user roles.

The app admins import `ReadableJSONMixin` and `AuditTrailMixin` from here.
"""
from __future__ import annotations

import json
import operator
from typing import Any, Callable
from urllib.parse import urlencode

from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from trajplatform.audit import ACTIONS, AuditEvent, audit_events_for
from trajplatform.permissions import ROLES, grant_role, user_account_save

RECENT_AUDIT_EVENTS = 20


def pretty_json(value: Any) -> SafeString:
    """JSON indented inside <pre>, HTML-escaped."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)
    return format_html('<pre class="json" style="white-space: pre-wrap; margin: 0">{}</pre>', text)


def truncated(value: Any, length: int = 40) -> SafeString | str:
    """Text for a list column: at most `length` characters, the whole value in the tooltip."""
    text = "" if value is None else str(value)
    if len(text) <= length:
        return text
    return format_html('<span title="{}">{}…</span>', text, text[: length - 1])


def truncated_column(attr: str, description: str, length: int = 40, ordering: str | None = None) -> Callable:
    """A list_display column showing `obj.<attr>` (dotted; "" for the object itself) truncated."""
    getter = operator.attrgetter(attr) if attr else (lambda obj: obj)

    @admin.display(description=description, ordering=ordering)
    def column(self: Any, obj: Any) -> SafeString | str:
        return truncated(getter(obj), length)

    column.__name__ = f"{(attr or 'object').replace('.', '_')}_short"
    return column


READABLE_DEPTH = 4


def readable_json(value: Any, depth: int = 0) -> SafeString | str:
    """A JSON value as HTML a person reads: objects as two-column tables, lists of objects as
    tables with a column per key, lists of scalars joined; every value escaped."""
    if depth >= READABLE_DEPTH:
        return pretty_json(value)
    if isinstance(value, dict):
        if not value:
            return "—"
        rows = format_html_join("", "<tr><th>{}</th><td>{}</td></tr>",
                                ((key, readable_json(item, depth + 1)) for key, item in value.items()))
        return format_html('<table class="readable-json">{}</table>', rows)
    if isinstance(value, list):
        if not value:
            return "—"
        if all(isinstance(item, dict) for item in value):
            keys = list(dict.fromkeys(k for item in value for k in item))
            head = format_html_join("", "<th>{}</th>", ((k,) for k in keys))
            body = format_html_join("", "<tr>{}</tr>", (
                (format_html_join("", "<td>{}</td>", ((readable_json(item.get(k, ""), depth + 1),) for k in keys)),)
                for item in value))
            return format_html('<table class="readable-json"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>',
                               head, body)
        if all(not isinstance(item, (dict, list)) for item in value):
            return ", ".join(readable_json(item, depth + 1) for item in value)
        return format_html("<ol>{}</ol>", format_html_join("", "<li>{}</li>",
                                                           ((readable_json(item, depth + 1),) for item in value)))
    if isinstance(value, bool):
        return "yes" if value else "no"
    if value is None:
        return "—"
    if isinstance(value, str) and "\n" in value:
        return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', value)
    return str(value)


class ViewOnlyMixin:
    """Rows that nobody edits in the console (not even superusers): no add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ActionsOnlyMixin:
    """Change pages are view-only and nothing is deleted: every write is an admin action (or an
    add page) that calls a service, which checks the rules and writes the audit row."""

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Without an object Django asks whether the user may run the "change" actions.
        return obj is None and super().has_change_permission(request)  # type: ignore[misc]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """A collapsed, read-only list of child rows with links to their own pages."""

    show_change_link = True
    can_delete = False
    extra = 0
    classes = ["collapse"]

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class IndentedJSONFormField(forms.JSONField):
    """An editable JSON field whose textarea starts indented."""

    def prepare_value(self, value: Any) -> Any:
        if isinstance(value, forms.fields.InvalidJSONInput):
            return value
        return json.dumps(value, indent=2, ensure_ascii=False, cls=self.encoder)


def _pretty_display(field_name: str, description: str, render: Callable[[Any], Any] = pretty_json) -> Callable:
    @admin.display(description=description)
    def display(self: Any, obj: Any) -> SafeString:
        return render(getattr(obj, field_name))

    display.__name__ = f"{field_name}_pretty"
    return display


class ReadableJSONMixin:
    """JSON fields in `json_fields` show as indented <pre> blocks wherever they are read-only.

    List the raw field names in `fieldsets`; where the field cannot be edited (it is in
    readonly_fields, or the user may only view) it is swapped for its `<name>_pretty` display.
    Editable JSON fields get an indented textarea. The read-only ones also in `json_tables`
    (data cards, checks) render as tables (`readable_json`) instead.
    """

    json_fields: tuple[str, ...] = ()
    json_tables: tuple[str, ...] = ()
    formfield_overrides = {
        models.JSONField: {
            "form_class": IndentedJSONFormField,
            "widget": forms.Textarea(attrs={"rows": 10, "cols": 90, "class": "vLargeTextField"}),
        }
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.json_fields:
            if not hasattr(cls, f"{name}_pretty"):
                render = readable_json if name in cls.json_tables else pretty_json
                setattr(cls, f"{name}_pretty", _pretty_display(name, name.replace("_", " "), render))

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        readonly = super().get_readonly_fields(request, obj)  # type: ignore[misc]
        return (*readonly, *(f"{n}_pretty" for n in self.json_fields))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> list[tuple[Any, dict[str, Any]]]:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        readonly = set(super().get_readonly_fields(request, obj))  # type: ignore[misc]
        if obj is None:
            can_edit = self.has_add_permission(request)  # type: ignore[attr-defined]
        else:
            can_edit = self.has_change_permission(request, obj)  # type: ignore[attr-defined]

        def shown(name: Any) -> Any:
            if isinstance(name, (list, tuple)):
                return tuple(shown(n) for n in name)
            if name in self.json_fields and (name in readonly or not can_edit):
                return f"{name}_pretty"
            return name

        return [(title, {**opts, "fields": [shown(f) for f in opts["fields"]]}) for title, opts in fieldsets]


class IdSearchMixin:
    """A search term that is a whole number also matches these integer fields exactly (indexed)."""

    id_search_fields: tuple[str, ...] = ("pk",)

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str) -> tuple[QuerySet, bool]:
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)  # type: ignore[misc]
        term = search_term.strip()
        if term.isdigit() and len(term) <= 18:  # beyond that it overflows a bigint
            by_id = models.Q.create([(name, int(term)) for name in self.id_search_fields], connector=models.Q.OR)
            results = results | queryset.filter(by_id)
        return results, may_have_duplicates


class AuditTrailMixin:
    """Adds a read-only `recent_audit_events` table: put it in a (collapsed) fieldset."""

    @admin.display(description="recent audit events")
    def recent_audit_events(self, obj: Any) -> SafeString | str:
        if obj is None or obj.pk is None:
            return "-"
        events = list(audit_events_for(obj)[:RECENT_AUDIT_EVENTS])
        if not events:
            return "No audit events."
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            (
                (
                    f"{timezone.localtime(e.created_at):%Y-%m-%d %H:%M:%S}",
                    e.actor_repr,
                    e.action,
                    json.dumps(e.data, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder),
                )
                for e in events
            ),
        )
        query = urlencode({"target_type": events[0].target_type, "target_id": events[0].target_id})
        link = f"{reverse('admin:trajplatform_auditevent_changelist')}?{query}"
        return format_html(
            '<table class="audit-events"><thead><tr><th>when</th><th>actor</th><th>action</th><th>data</th></tr>'
            '</thead><tbody>{}</tbody></table><p><a href="{}">All audit events for this object</a></p>',
            rows,
            link,
        )


def change_link(target_type: str, target_id: Any, text: str) -> SafeString | str:
    """A link to an object's change page built from its id alone (no query for the related row)."""
    url = admin_change_url(target_type, str(target_id)) if target_id is not None else None
    return format_html('<a href="{}">{}</a>', url, text) if url else text


def admin_change_url(target_type: str, target_id: str) -> str | None:
    """The admin change page of a `app_label.model` + pk, or None if it has none."""
    try:
        model = apps.get_model(target_type)
        return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[target_id])
    except (LookupError, ValueError, NoReverseMatch):
        return None


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


def _grant_role_action(role: str) -> Callable[[Any, HttpRequest, QuerySet], None]:
    def action(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet) -> None:
        granted = 0
        for user in queryset:
            try:
                grant_role(user=user, role=role, actor=request.user)
            except PermissionDenied as exc:
                modeladmin.message_user(request, f"{user}: {exc}", messages.ERROR)
                return
            granted += 1
        modeladmin.message_user(request, f"Granted role {role} to {granted}")

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
        from django.db import transaction

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
    from django_q import admin as q_admin
    from django_q.models import Failure, OrmQ, Schedule, Success

    for model, base in ((Schedule, q_admin.ScheduleAdmin), (Success, q_admin.TaskAdmin),
                        (Failure, q_admin.FailAdmin), (OrmQ, getattr(q_admin, "QueueAdmin", None))):
        if base is None or not admin.site.is_registered(model):
            continue
        admin.site.unregister(model)
        admin.site.register(model, type(base.__name__, (ViewOnlyMixin, base), {"actions": []}))


_view_only_django_q_admins()

from trajplatform import api_admin  # noqa: E402,F401  (API tokens, webhooks)
