from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.permissions import AllowAny
from rest_framework.routers import SimpleRouter

from trajplatform import api_views, artifact_views, health, views


admin.site.site_header = "trajplatform console"
admin.site.site_title = "trajplatform"
admin.site.index_title = "Operator console"
admin.site.site_url = "/"  # the role-aware home (trajplatform.views.home)

handler403 = "trajplatform.views.handler403"
handler404 = "trajplatform.views.handler404"
handler500 = "trajplatform.views.handler500"

PUBLIC = {"permission_classes": [AllowAny], "authentication_classes": [], "throttle_classes": []}

platform_router = SimpleRouter(trailing_slash=False)
platform_router.register("webhooks", api_views.WebhookEndpointViewSet, basename="webhook")

api_v1 = [
    path("me", api_views.MeView.as_view(), name="me"),
    path("", include(platform_router.urls)),
    path("", include("apps.engines.api.urls")),
    path("", include("apps.tasks.api.urls")),
    path("", include("apps.reviews.api.urls")),
    path("", include("apps.datasets.api.urls")),
]

urlpatterns = [
    path("", views.home, name="home"),
    path("admin/login/", views.admin_login, name="login"),
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="api")),
    # The schema and its viewer describe the API and hold no data: readable without a token.
    path("api/schema/", SpectacularAPIView.as_view(**PUBLIC), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema", **PUBLIC), name="api-docs"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("health", health.health, name="health"),
    path("metrics", health.metrics, name="metrics"),
    path("artifacts/<str:sha256>", artifact_views.artifact, name="artifact"),
    path("", include("apps.tasks.urls")),
    path("review/", include("apps.reviews.urls")),
    path("datasets/", include("apps.datasets.urls")),
    path("engines/", include("apps.engines.urls")),
]
