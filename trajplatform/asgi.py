"""ASGI entry point served by daphne: HTTP through Django, websockets through channels."""
import os

from django.core.asgi import get_asgi_application
from django.urls import path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "trajplatform.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from apps.tasks.consumers import TrajectoryLogConsumer  # noqa: E402

websocket_urlpatterns = [
    path("ws/trajectories/<int:trajectory_id>/", TrajectoryLogConsumer.as_asgi(), name="trajectory-log-ws"),
]

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Origin check first: a page on another site must not ride a signed-in user's cookie.
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
