"""The console's shared pieces every admin page builds on: readable JSON, truncated columns,
view-only and actions-only mixins, read-only inlines, id search, the audit section and links to
an object's change page.

Infrastructure: the apps' admins and trajplatform's own console pages (trajplatform.admin,
api_admin) import these; this module imports no app and no console page.
"""
from __future__ import annotations

import json
import operator
from typing import Any, Callable
from urllib.parse import urlencode

from django import forms
from django.apps import apps
from django.contrib import admin
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from trajplatform.audit import audit_events_for


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
