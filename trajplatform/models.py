"""Models of the shared infrastructure (the app label is `trajplatform`)."""
from trajplatform.audit import AuditEvent

__all__ = ["AuditEvent"]
