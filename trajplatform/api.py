"""Shared REST API machinery: token auth, role permissions, throttling, errors, pagination,
idempotent replays.

* **Auth.** `Authorization: Bearer <token>` with a per-user `ApiToken` (hashed at rest, shown
  once, revocable in the console); the token acts with its user's role permissions. Session
  auth serves the browsable API for signed-in console users.
* **Permissions.** Each view names the model permissions a request needs (`read_perms` for
  safe methods, `write_perms` otherwise, or `perms_for(request)`); roles grant them
  (trajplatform/permissions.py). Object rules (proposal tiers) stay in the services.
* **Errors.** Every 4xx/5xx is `{"error": {"code", "message", "details"}}`: DRF's own
  exceptions, Django's Http404/PermissionDenied/ValidationError, and the services' domain
  errors (`DOMAIN_ERRORS`: the site's API views register the apps' ones, so this module,
  which the apps' API modules build on, imports no app). A domain error whose `field` names a
  request field (an export's format, an import's batch) is answered under
  `details.fields.<field>`, as a serializer's error is, so a view checks nothing twice.
* **Input limits.** A body over API_MAX_BODY_BYTES is a 413 before anything reads it
  (`ApiBodyLimitMiddleware`); JSON nested deeper than API_MAX_JSON_DEPTH is a 400 before it is
  parsed (`LimitedJSONParser`, `LimitedJSONField`); id filters are integers in the 64-bit range
  (`IdFilter`); a filter given empty (`?created_before=`) is a 400 (`StrictFilterSet`); string
  fields take strings only (`StrictSerializerMixin`).
* **Pagination.** Cursor pagination on the primary key: each page is one indexed range scan
  (`id < cursor ORDER BY id DESC LIMIT n`), as fast on page 10 000 as on page 1, with no COUNT.
"""
from __future__ import annotations

import hashlib
import io
import json
from datetime import timezone as dt_timezone
from typing import Any, Callable

import django_filters
from django import forms
from django.conf import settings
from django.core.cache import caches
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.http import Http404, HttpRequest, JsonResponse
from django.utils import timezone
from django.views.defaults import page_not_found, server_error
from django_filters.fields import IsoDateTimeField
from rest_framework import exceptions, serializers
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import JSONParser
from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

from trajplatform import json_limits
from trajplatform.api_models import ApiToken, IdempotencyRecord, hash_token
from trajplatform.redaction import redact

# How often last_used_at is written for a busy token (one UPDATE per token per interval).
LAST_USED_RESOLUTION_S = 60


# --- authentication --------------------------------------------------------------------------


class TokenAuthentication(BaseAuthentication):
    """`Authorization: Bearer <token>` (or `Token <token>`) with a per-user ApiToken."""

    keywords = ("bearer", "token")

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].decode("latin-1").lower() not in self.keywords:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw)).first()
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This token has been revoked.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("The token's user is inactive.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > LAST_USED_RESOLUTION_S:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


try:
    from drf_spectacular.extensions import OpenApiAuthenticationExtension

    class TokenAuthenticationScheme(OpenApiAuthenticationExtension):
        target_class = "trajplatform.api.TokenAuthentication"
        name = "apiToken"

        def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
            return {"type": "http", "scheme": "bearer", "description": "a per-user API token (console: API tokens)"}
except ImportError:  # drf-spectacular is only needed for the schema
    pass


# --- permissions ------------------------------------------------------------------------------

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


def _handles(view: Any, method: str) -> bool:
    action_map = getattr(view, "action_map", None)
    if action_map is not None:
        return method.lower() in action_map
    return method.lower() in view.http_method_names and hasattr(view, method.lower())


class RolePermission(BasePermission):
    """Signed in (token or session) and holding every model permission the view asks for."""

    message = "Your role does not allow this."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            raise exceptions.NotAuthenticated()
        if not _handles(view, request.method):
            return True  # the view answers 405 Method Not Allowed
        if hasattr(view, "perms_for"):
            needed = view.perms_for(request)
        elif request.method in SAFE_METHODS:
            needed = getattr(view, "read_perms", ())
        else:
            needed = getattr(view, "write_perms", None)
            if needed is None:
                return False  # a write a view did not declare is refused, never allowed by default
        if not needed and not (user.is_superuser or user.groups.exists()):
            return False  # even a public read needs some role: signed-in outsiders see nothing
        return all(user.has_perm(p) for p in needed)


# --- throttling --------------------------------------------------------------------------------


class TokenRateThrottle(SimpleRateThrottle):
    """API_THROTTLE_RATE per API token (per user for session requests)."""

    scope = "token"

    @property
    def cache(self) -> Any:  # type: ignore[override]
        return caches["api"]

    def get_rate(self) -> str:
        return settings.API_THROTTLE_RATE

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if isinstance(request.auth, ApiToken):
            ident = f"t{request.auth.token_hash[:32]}"
        elif request.user and request.user.is_authenticated:
            ident = f"u{request.user.pk}"
        else:
            return None
        return f"throttle_{self.scope}_{ident}"


# --- errors ---------------------------------------------------------------------------------------

# Domain errors the services raise for a client's mistake: (exception class, HTTP status, code),
# the first match wins. This module imports no app: the site's API views register the apps'
# errors (trajplatform.api_views), this module its own (IdempotencyConflict, below).
DOMAIN_ERRORS: list[tuple[type[Exception], int, str]] = []


def register_domain_errors(*entries: tuple[type[Exception], int, str]) -> None:
    """Answer these exceptions, wherever a view lets one through, with (HTTP status, code); in order."""
    for entry in entries:
        if entry not in DOMAIN_ERRORS:
            DOMAIN_ERRORS.append(entry)


def _domain_error(exc: Exception) -> tuple[int, str] | None:
    for cls, code_status, code in DOMAIN_ERRORS:
        if isinstance(exc, cls):
            return code_status, code
    return None


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": redact(str(message)), "details": redact(details) if details else {}}}


def _details_of(exc: Exception) -> Any:
    errors = getattr(exc, "errors", None)
    if isinstance(errors, dict):
        return {"errors": [{"field": str(k), "reason": str(v)} for k, v in errors.items()]}
    if not isinstance(errors, list):
        return {}
    fields = []
    for error in errors:
        if isinstance(error, tuple) and len(error) == 2:
            fields.append({"field": error[0], "reason": error[1]})
        elif hasattr(error, "as_dict"):
            fields.append(error.as_dict())
        else:
            fields.append({"reason": str(error)})
    return {"errors": fields}


def _field_errors(exc: Exception) -> dict[str, list[str]] | None:
    """{field: [reasons]} for a domain error about one request field (its `field`; its `errors`
    when it lists them, else its message), None for one about no field."""
    field = getattr(exc, "field", "")
    if not field or not isinstance(field, str):
        return None
    errors = getattr(exc, "errors", None)
    return {field: [str(e) for e in errors] if isinstance(errors, list) and errors else [str(exc)]}


def _message_of(detail: Any) -> str:
    if isinstance(detail, dict):
        for key, value in detail.items():
            return f"{key}: {_message_of(value)}" if key != "non_field_errors" else _message_of(value)
        return "Invalid input."
    if isinstance(detail, list):
        return _message_of(detail[0]) if detail else "Invalid input."
    return str(detail)


def error_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every error as {"error": {"code", "message", "details"}}."""
    from rest_framework.views import exception_handler as drf_exception_handler  # deferred: rest_framework.views reads REST_FRAMEWORK, which names this module (import cycle at start-up)

    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or None)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages})
    elif isinstance(exc, RequestDataTooBig):
        return Response(error_body("too_large", body_too_large_message()), status=413)
    elif isinstance(exc, SuspiciousOperation):  # e.g. too many form fields: the client's request, not a bug
        return Response(error_body("bad_request", str(exc) or "Bad request."), status=400)
    else:
        mapped = _domain_error(exc)
        if mapped is not None:
            code_status, code = mapped
            fields = _field_errors(exc)
            if fields is not None:
                return Response(error_body(code, _message_of(fields), {"fields": fields}), status=code_status)
            return Response(error_body(code, str(exc), _details_of(exc)), status=code_status)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # a bug: Django's handler500 (JSON under /api/) answers and logs it
    if isinstance(exc, exceptions.ValidationError):
        body = error_body("invalid", _message_of(exc.detail), {"fields": exc.detail})
    else:
        detail = getattr(exc, "detail", str(exc))
        code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        if not isinstance(code, str):
            code = "error"
        details: dict[str, Any] = {}
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            details["retry_after_s"] = int(exc.wait)
        body = error_body(code, _message_of(detail), details)
    response.data = body
    return response


def json_error_response(request: HttpRequest, status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(error_body(code, message), status=status_code)


def body_too_large_message() -> str:
    return f"The request body is larger than API_MAX_BODY_BYTES ({settings.API_MAX_BODY_BYTES} bytes)."


class ApiBodyLimitMiddleware:
    """Under /api/: a request whose Content-Length exceeds API_MAX_BODY_BYTES gets a JSON 413
    before anything reads the body (Django's own limit would answer an HTML 400 from deep inside
    the view). Bodies without a Content-Length are bounded by DATA_UPLOAD_MAX_MEMORY_SIZE (the
    same value), which error_handler turns into the same 413."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return json_error_response(request, 400, "bad_request", "Invalid Content-Length header.")
            if length > settings.API_MAX_BODY_BYTES:
                return json_error_response(request, 413, "too_large", body_too_large_message())
        return self.get_response(request)


def handler404(request: HttpRequest, exception: Exception | None = None) -> Any:
    """JSON 404 under /api/ and for /health-style endpoints; Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return json_error_response(request, 404, "not_found", "Not found.")
    return page_not_found(request, exception)


def handler500(request: HttpRequest) -> Any:
    if request.path.startswith("/api/"):
        return json_error_response(request, 500, "server_error", "Internal server error; it has been logged.")
    return server_error(request)


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    details = serializers.JSONField()


class ErrorSerializer(serializers.Serializer):
    """The shape of every error response (documented in the schema)."""

    error = ErrorDetailSerializer()


# --- input limits -------------------------------------------------------------------------------


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser behind the non-recursive depth check (API_MAX_JSON_DEPTH)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read() if stream is not None else b""
        try:
            json_limits.check_depth(raw)
        except json_limits.JSONTooDeep as exc:
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        return super().parse(io.BytesIO(raw), media_type, parser_context)


class LimitedJSONField(serializers.JSONField):
    """A JSONField whose JSON text (a form field, a binary field) is depth-checked before parsing."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, (str, bytes)) and (self.binary or getattr(data, "is_json_string", False)):
            try:
                json_limits.check_depth(data)
            except json_limits.JSONTooDeep as exc:
                raise serializers.ValidationError(str(exc)) from None
        return super().to_internal_value(data)


# --- filters --------------------------------------------------------------------------------------

INT64_MAX = 2**63 - 1


class IdFilter(django_filters.NumberFilter):
    """An integer id (or counter) filter: 1e30, 1.5 or 2**70 is a 400, never an overflow in the
    database (SQLite's integers are 64-bit)."""

    field_class = forms.IntegerField

    def __init__(self, *args: Any, min_value: int = 1, **kwargs: Any) -> None:
        kwargs.setdefault("min_value", min_value)
        kwargs.setdefault("max_value", INT64_MAX)
        super().__init__(*args, **kwargs)


try:
    from drf_spectacular.contrib.django_filters import DjangoFilterExtension
    from drf_spectacular.plumbing import build_basic_type
    from drf_spectacular.types import OpenApiTypes

    class StrictFilterExtension(DjangoFilterExtension):
        """The schema of an IdFilter is an integer with its bounds (drf-spectacular would say number);
        a NumberFilter declares django-filter's 1e50 maximum, a CharFilter that it takes no NUL."""

        target_class = "trajplatform.api.StrictFilterBackend"
        priority = 1

        def resolve_filter_field(self, auto_schema: Any, model: Any, filterset_class: Any, field_name: str,
                                 filter_field: Any) -> Any:
            result = super().resolve_filter_field(auto_schema, model, filterset_class, field_name, filter_field)
            if isinstance(filter_field, IdFilter):
                for parameter in result:
                    parameter["schema"] = {
                        **build_basic_type(OpenApiTypes.INT64),
                        "minimum": filter_field.extra["min_value"], "maximum": filter_field.extra["max_value"],
                    }
            elif isinstance(filter_field, django_filters.NumberFilter) and filter_field.get_max_validator():
                for parameter in result:  # django-filter refuses numbers above 1e50
                    parameter["schema"]["maximum"] = filter_field.get_max_validator().limit_value
            elif isinstance(filter_field, django_filters.CharFilter):
                for parameter in result:  # Django's CharField refuses NUL characters
                    parameter["schema"]["pattern"] = NO_NUL_PATTERN
            return result
except ImportError:  # drf-spectacular is only needed for the schema
    pass


class UtcDateTimeField(IsoDateTimeField):
    """An ISO 8601 date-time, converted to UTC: PostgreSQL refuses UTC offsets beyond ±15:59
    (Python allows ±23:59), and a moment that is outside years 1-9999 in UTC is a 400."""

    def to_python(self, value: Any) -> Any:
        moment = super().to_python(value)
        if moment is None:
            return None
        try:
            return moment.astimezone(dt_timezone.utc)
        except OverflowError:
            raise forms.ValidationError("is out of range once converted to UTC") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


class StrictFilterBackend(django_filters.rest_framework.DjangoFilterBackend):
    """The project's filter backend (a subclass so the schema extension above applies to it)."""


class StrictFilterSet(django_filters.FilterSet):
    """A filter that is present must hold a value: `?created_before=` is a 400, not "no filter".
    Text filters (CharFilter) may be empty."""

    def is_valid(self) -> bool:
        valid = super().is_valid()
        for name, filter_ in self.filters.items():
            if isinstance(filter_, django_filters.CharFilter) or name not in self.data:
                continue
            values = self.data.getlist(name) if hasattr(self.data, "getlist") else [self.data[name]]
            if any(value == "" for value in values):
                self.form.add_error(name, "must not be empty")
                valid = False
        return valid


# --- pagination --------------------------------------------------------------------------------


class IdCursorPagination(CursorPagination):
    """Newest first by primary key; `?page_size=` up to API_MAX_PAGE_SIZE; no COUNT(*)."""

    ordering = "-id"
    page_size_query_param = "page_size"

    @property
    def max_page_size(self) -> int:  # type: ignore[override]
        return settings.API_MAX_PAGE_SIZE

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return settings.API_PAGE_SIZE
        try:
            value = int(raw)
        except ValueError:
            raise exceptions.ValidationError({"page_size": ["must be an integer"]}) from None
        if not 1 <= value <= settings.API_MAX_PAGE_SIZE:
            raise exceptions.ValidationError({"page_size": [f"must be between 1 and {settings.API_MAX_PAGE_SIZE}"]})
        return value

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": settings.API_MAX_PAGE_SIZE}
        return parameters


# --- idempotency ----------------------------------------------------------------------------------


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with a different request."""


register_domain_errors((IdempotencyConflict, 409, "idempotency_conflict"))


IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_MAX = 200


def request_fingerprint(request: Request) -> str:
    body = json.dumps(request.data, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder, default=str)
    return hashlib.sha256(f"{request.method} {request.path}\n{body}".encode()).hexdigest()


def idempotency_key(request: Request) -> str:
    key = (request.headers.get(IDEMPOTENCY_HEADER) or "").strip()
    if len(key) > IDEMPOTENCY_KEY_MAX:
        raise exceptions.ValidationError({IDEMPOTENCY_HEADER: [f"must be at most {IDEMPOTENCY_KEY_MAX} characters"]})
    return key


def _replay(record: IdempotencyRecord, fingerprint: str) -> Response:
    if record.request_sha256 != fingerprint:
        raise IdempotencyConflict(
            f"Idempotency-Key {record.key!r} was already used with a different request body; use a new key"
        )
    response = Response(record.response_body, status=record.response_status)
    response["Idempotent-Replayed"] = "true"
    return response


def idempotent(request: Request, scope: str, handler: Callable[[], Response]) -> Response:
    """Run `handler` once per (user, scope, Idempotency-Key); repeats get the stored response.

    The handler's writes and the stored response commit together, so a concurrent repeat
    either replays the committed response or loses on the unique key and replays it then.
    Without the header the handler simply runs. Only 2xx responses are stored.
    """
    key = idempotency_key(request)
    if not key:
        return handler()
    fingerprint = request_fingerprint(request)
    lookup = {"user": request.user, "scope": scope, "key": key}
    try:
        with transaction.atomic():
            record = IdempotencyRecord.objects.filter(**lookup).first()
            if record is not None:
                return _replay(record, fingerprint)
            response = handler()
            if 200 <= response.status_code < 300:
                body = json.loads(json.dumps(response.data, cls=DjangoJSONEncoder))
                IdempotencyRecord.objects.create(
                    **lookup, request_sha256=fingerprint, response_status=response.status_code, response_body=body
                )
            return response
    except IntegrityError:
        record = IdempotencyRecord.objects.filter(**lookup).first()
        if record is None:
            raise
        return _replay(record, fingerprint)


# --- small shared pieces -----------------------------------------------------------------------------


class StrictSerializerMixin:
    """Unknown fields are an error (the reference silently ignored them), and a string field takes
    a string: DRF's CharField would turn `{"reason": 5}` into "5"."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))  # type: ignore[attr-defined]
            if unknown:
                raise exceptions.ValidationError({name: ["unknown field"] for name in unknown})
            not_text = sorted(
                name for name, field in self.fields.items()  # type: ignore[attr-defined]
                if isinstance(field, serializers.CharField) and not field.read_only
                and data.get(name) is not None and not isinstance(data.get(name), str)
            )
            if not_text:
                raise exceptions.ValidationError({name: ["must be a string"] for name in not_text})
        return super().to_internal_value(data)  # type: ignore[misc]


NO_NUL_PATTERN = "^[^\\x00]*$"


try:
    from drf_spectacular.extensions import OpenApiSerializerExtension

    class StrictSerializerScheme(OpenApiSerializerExtension):
        """A strict serializer's request body declares `additionalProperties: false` (an unknown
        field is a 400, so the schema must not allow one) and that its strings hold no NUL."""

        target_class = "trajplatform.api.StrictSerializerMixin"
        match_subclasses = True

        def map_serializer(self, auto_schema: Any, direction: str) -> dict[str, Any]:
            schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
            if direction == "request" and schema.get("type") == "object":
                schema["additionalProperties"] = False
                for name, field in self.target.fields.items():
                    prop = schema.get("properties", {}).get(name)
                    if isinstance(field, serializers.CharField) and prop and prop.get("type") == "string":
                        prop.setdefault("pattern", NO_NUL_PATTERN)  # DRF refuses NUL characters
            return schema
except ImportError:  # drf-spectacular is only needed for the schema
    pass


class BlankChoicesMixin:
    """A ModelSerializer whose read-only choice fields keep `""` in their enum when the model
    allows a blank value (DRF drops allow_blank on read-only fields, so the schema said
    `verdict` is one of accept/reject/revise while an automatic review answers "")."""

    def include_extra_kwargs(self, kwargs: dict[str, Any], extra_kwargs: dict[str, Any]) -> dict[str, Any]:
        blank_choices = "choices" in kwargs and kwargs.get("allow_blank", False)
        kwargs = super().include_extra_kwargs(kwargs, extra_kwargs)  # type: ignore[misc]
        if blank_choices:
            kwargs["allow_blank"] = True
        return kwargs


class RedactedOutputMixin:
    """A serializer whose whole output passes through trajplatform.redaction (API output never
    carries a configured secret or a key-shaped string)."""

    def to_representation(self, instance: Any) -> Any:
        return redact(super().to_representation(instance))  # type: ignore[misc]


def get_object_or_404(queryset: Any, **lookup: Any) -> Any:
    obj = queryset.filter(**lookup).first()
    if obj is None:
        raise exceptions.NotFound(f"No {queryset.model._meta.verbose_name} matches {lookup}.")
    return obj



# --- OpenAPI -----------------------------------------------------------------------------------------

ERROR_STATUSES = {
    "400": "Invalid input (the details name every field).",
    "401": "No credentials, or an invalid or revoked token.",
    "403": "The caller's role does not allow this.",
    "404": "No such object.",
    "405": "Method not allowed.",
    "409": "The object's state does not allow this (or an Idempotency-Key was reused).",
    "429": "Too many requests for this token; see Retry-After.",
}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: every operation documents the shared error body."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault("ErrorDetail", {
        "type": "object",
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {}},
        "required": ["code", "message", "details"],
    })
    schemas["Error"] = {
        "type": "object", "properties": {"error": {"$ref": "#/components/schemas/ErrorDetail"}}, "required": ["error"],
    }
    ref = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            for code, text in ERROR_STATUSES.items():
                operation["responses"].setdefault(code, {"description": text, "content": ref})
    return result
