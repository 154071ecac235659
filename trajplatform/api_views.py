"""Platform-level API views: who am I, and the caller's webhook endpoints; and which of the
apps' domain errors the API answers as a client's mistake (status and code), registered here,
above the apps, so trajplatform.api imports none of them."""
from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, serializers, viewsets
from rest_framework.views import APIView
from rest_framework.request import Request
from rest_framework.response import Response

from apps.datasets.models import ImmutableVersionError
from apps.datasets.raw_import import RawImportError
from apps.datasets.selectors import NotFound
from apps.datasets.spec import DatasetError
from apps.engines.llm import ModelConfigError
from apps.engines.registry import SceneConfigError
from apps.engines.scenes.envscaler.importer import EnvScalerImportError
from apps.reviews.services import AlreadyDecided, DecisionError
from apps.tasks.services import BatchNameTaken, TaskCreateError, TransitionError
from trajplatform.api import ErrorSerializer, StrictSerializerMixin, register_domain_errors
from trajplatform.api_models import ApiToken
from trajplatform.permissions import highest_role
from trajplatform.webhooks import (
    EVENTS, WebhookEndpoint, WebhookTargetError, webhook_endpoint_create, webhook_endpoint_delete,
)

# The services' errors for a client's mistake, as API errors; the first match wins.
register_domain_errors(
    (TransitionError, 409, "conflict"),
    (TaskCreateError, 400, "invalid"),
    (BatchNameTaken, 409, "conflict"),
    (ModelConfigError, 409, "llm_config"),  # a retired / unserved model: nothing queued
    (SceneConfigError, 400, "invalid"),
    (ImmutableVersionError, 409, "conflict"),
    (AlreadyDecided, 409, "conflict"),
    (DecisionError, 400, "invalid"),
    (DatasetError, 400, "invalid"),
    (NotFound, 404, "not_found"),
    (EnvScalerImportError, 400, "invalid"),
    (RawImportError, 400, "invalid"),
)

ERRORS = {400: ErrorSerializer, 401: ErrorSerializer, 403: ErrorSerializer, 404: ErrorSerializer, 429: ErrorSerializer}


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(allow_null=True)
    token = serializers.CharField(allow_null=True, help_text="the name of the API token used, if any")


class MeView(APIView):
    """The caller: user name, role and the token in use."""

    read_perms: tuple[str, ...] = ()
    serializer_class = MeSerializer

    @extend_schema(responses={200: MeSerializer, **ERRORS})
    def get(self, request: Request) -> Response:
        token = request.auth.name if isinstance(request.auth, ApiToken) else None
        return Response({"username": request.user.get_username(), "role": highest_role(request.user), "token": token})


class WebhookEndpointSerializer(StrictSerializerMixin, serializers.ModelSerializer):
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=list(EVENTS)), required=False, default=list,
        help_text="events to receive; empty: every event",
    )
    url = serializers.URLField(max_length=500)

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "events", "active", "created_at"]
        read_only_fields = ["id", "active", "created_at"]

    def validate_url(self, value: str) -> str:
        if not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("must be an http(s) URL")
        return value


class WebhookEndpointCreatedSerializer(serializers.ModelSerializer):
    secret = serializers.CharField(help_text="the HMAC-SHA256 signing key; shown only in this response")

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "url", "events", "active", "created_at", "secret"]


class WebhookEndpointViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                             mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """The caller's own callback URLs. Deliveries are signed with the secret returned at creation."""

    serializer_class = WebhookEndpointSerializer
    read_perms: tuple[str, ...] = ()
    write_perms: tuple[str, ...] = ()

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return WebhookEndpoint.objects.none()
        return WebhookEndpoint.objects.filter(owner=self.request.user)

    @extend_schema(responses={201: WebhookEndpointCreatedSerializer, **ERRORS})
    def create(self, request: Request) -> Response:
        body = WebhookEndpointSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token = request.auth if isinstance(request.auth, ApiToken) else None
        if token is None:
            raise exceptions.PermissionDenied("webhook endpoints belong to an API token: call this with one")
        try:
            endpoint = webhook_endpoint_create(
                owner=request.user, token=token, url=body.validated_data["url"], events=body.validated_data["events"]
            )
        except WebhookTargetError as exc:  # resolves to an internal address, or not at all
            raise serializers.ValidationError({"url": [str(exc)]}) from None
        return Response(WebhookEndpointCreatedSerializer(endpoint).data, status=201)

    @extend_schema(responses={204: None, **ERRORS})
    def destroy(self, request: Request, pk: str | None = None) -> Response:
        webhook_endpoint_delete(endpoint=self.get_object(), actor=request.user)
        return Response(status=204)
