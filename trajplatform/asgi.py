"""ASGI entry point served by daphne: HTTP through Django, websockets through channels."""
import os

from django.core.asgi import get_asgi_application
from django.urls import path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
django_asgi_app = get_asgi_application()

try:
    from daphne.http_protocol import WebRequest  # noqa: E402
except ImportError:  # another ASGI server
    WebRequest = None


def _leave_request_bodies_to_django() -> None:
    """Twisted (under daphne) parses every multipart/form-data POST body itself, for a
    `request.args` daphne never reads, and answers one it cannot parse with a bare 400 (no
    content type, no body) before Django sees it: the API's JSON errors never got a say. With
    the parse off, Django parses the body and answers a malformed one in the error envelope."""
    if WebRequest is None:  # another ASGI server
        return
    # twisted.web.http.Request.__init__ sets this from its parsePOSTFormSubmission argument.
    WebRequest._parsePOSTFormSubmission = property(lambda self: False, lambda self, value: None)


_leave_request_bodies_to_django()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.datasets.consumers import ExportStatesConsumer, VersionBuildConsumer  # noqa: E402
from apps.tasks.consumers import BatchProgressConsumer, TrajectoryLogConsumer  # noqa: E402

websocket_urlpatterns = [
    path("ws/trajectories/<int:trajectory_id>/", TrajectoryLogConsumer.as_asgi(), name="trajectory-log-ws"),
    path("ws/batches/<int:batch_id>/", BatchProgressConsumer.as_asgi(), name="batch-progress-ws"),
    path("ws/versions/<int:version_id>/exports/", ExportStatesConsumer.as_asgi(), name="version-exports-ws"),
    path("ws/version-builds/<int:build_id>/", VersionBuildConsumer.as_asgi(), name="version-build-ws"),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Origin check first: a page on another site must not ride a signed-in user's cookie.
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
