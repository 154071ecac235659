"""Models of the shared infrastructure (the app label is `trajplatform`)."""
from trajplatform.activity import ActivityDay
from trajplatform.api_models import ApiToken, IdempotencyRecord
from trajplatform.artifacts import Artifact, ArtifactUse
from trajplatform.audit import AuditEvent
from trajplatform.webhooks import WebhookDelivery, WebhookEndpoint

__all__ = ["ActivityDay", "ApiToken", "Artifact", "ArtifactUse", "AuditEvent", "IdempotencyRecord", "WebhookDelivery", "WebhookEndpoint"]
