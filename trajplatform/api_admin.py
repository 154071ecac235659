"""The console's pages for API tokens, webhook endpoints and webhook deliveries."""
from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString

from trajplatform.admin_base import ReadableJSONMixin, ViewOnlyMixin
from trajplatform.api_models import ApiToken, api_token_create, api_token_revoke
from trajplatform.webhooks import (
    EVENTS, WebhookDelivery, WebhookEndpoint, webhook_endpoint_create, webhook_endpoint_delete, webhook_redeliver,
)
from trajplatform.webhooks import WebhookTargetError, check_target


def _sees_everyone(request: HttpRequest, model: Any) -> bool:
    return request.user.has_perm(f"trajplatform.change_{model._meta.model_name}")


class ApiTokenAddForm(forms.ModelForm):
    class Meta:
        model = ApiToken
        fields = ["user", "name"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Tokens are created here (the plain token is shown once) and revoked by an action."""

    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "prefix")
    list_select_related = ("user",)
    raw_id_fields = ("user",)
    actions = ["revoke"]
    readonly_fields = ("user", "name", "prefix", "created_at", "last_used_at", "revoked_at")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        return qs if _sees_everyone(request, ApiToken) else qs.filter(user=request.user)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = ApiTokenAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        return () if obj is None else self.readonly_fields

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Without an object: may the user run the revoke action. A token page is view-only.
        return obj is None and super().has_change_permission(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the row keeps the history of who used what

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        token, raw = api_token_create(user=form.cleaned_data["user"], name=form.cleaned_data["name"], actor=request.user)
        obj.pk = token.pk
        obj.__dict__.update({k: v for k, v in token.__dict__.items() if not k.startswith("_")})
        self.message_user(
            request,
            format_html("API token created. Copy it now, it is not shown again: <code>{}</code>", raw),
            messages.WARNING,
        )

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet) -> None:
        n = 0
        for token in queryset:
            api_token_revoke(token=token, actor=request.user)
            n += 1
        self.message_user(request, f"Revoked {n}")


class WebhookEndpointForm(forms.ModelForm):
    url = forms.URLField(max_length=500, assume_scheme="https")
    events = forms.MultipleChoiceField(
        choices=[(e, f"{e}: {d}") for e, d in EVENTS.items()], required=False,
        widget=forms.CheckboxSelectMultiple, help_text="none ticked: every event",
    )

    class Meta:
        model = WebhookEndpoint
        fields = ["owner", "token", "url", "events", "active"]

    def clean_url(self) -> str:
        try:
            return check_target(self.cleaned_data["url"])  # public addresses only, as in the API
        except WebhookTargetError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    """Added and deleted through the services (audited); a page is view-only: delete and add
    again to change one. The signing secret is never displayed after creation."""

    form = WebhookEndpointForm
    list_display = ("url", "owner", "token", "events", "active", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "owner__username")
    list_select_related = ("owner", "token")
    raw_id_fields = ("owner", "token")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        qs = super().get_queryset(request)
        return qs if _sees_everyone(request, WebhookEndpoint) else qs.filter(owner=request.user)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request)

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        webhook_endpoint_delete(endpoint=obj, actor=request.user)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for endpoint in queryset:
            webhook_endpoint_delete(endpoint=endpoint, actor=request.user)

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        created = webhook_endpoint_create(owner=obj.owner, token=obj.token, url=obj.url, events=obj.events or [],
                                          active=obj.active, actor=request.user)
        obj.pk, obj.secret, obj.created_at = created.pk, created.secret, created.created_at
        self.message_user(
            request, format_html("Signing secret (shown once): <code>{}</code>", obj.secret), messages.WARNING
        )


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ViewOnlyMixin, ReadableJSONMixin, admin.ModelAdmin):
    """Every delivery with its attempts; failed ones can be sent again."""

    list_display = ("created_at", "event", "url", "status", "attempts", "last_status_code", "next_attempt_at")
    list_filter = ("status", "event")
    search_fields = ("url", "uuid")
    list_select_related = ("endpoint",)
    show_full_result_count = False
    json_fields = ("attempt_log",)
    actions = ["resend"]
    fieldsets = [
        (None, {"fields": ["uuid", "event", "endpoint", "url", "status", "attempts", "max_attempts",
                           "next_attempt_at", "delivered_at", "last_status_code", "last_error", "created_at"]}),
        ("body", {"fields": ["body_pretty"]}),
        ("attempts", {"fields": ["attempt_log"]}),
    ]
    readonly_fields = (
        "uuid", "event", "endpoint", "url", "status", "attempts", "max_attempts", "next_attempt_at",
        "delivered_at", "last_status_code", "last_error", "created_at", "attempt_log", "body_pretty",
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        # A delivery's body and the receiver's reply belong to the endpoint's owner; admins see
        # all (the global WEBHOOK_URL's deliveries have no owner: admins only).
        qs = super().get_queryset(request)
        return qs if _sees_everyone(request, WebhookDelivery) else qs.filter(endpoint__owner=request.user)

    @admin.display(description="body")
    def body_pretty(self, obj: WebhookDelivery) -> SafeString:
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', obj.body)

    @admin.action(description="Send again (failed deliveries)", permissions=["view"])
    def resend(self, request: HttpRequest, queryset: QuerySet) -> None:
        if not request.user.has_perm("trajplatform.change_webhookdelivery"):
            self.message_user(request, "Sending again needs the admin role", messages.ERROR)
            return
        n = webhook_redeliver(deliveries=queryset, actor=request.user)
        self.message_user(request, f"Queued {n} again")
