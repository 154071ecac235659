from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import include, path


def home(request: HttpRequest) -> HttpResponse:
    return redirect("admin:index")


admin.site.site_header = "trajplatform console"
admin.site.site_title = "trajplatform"
admin.site.index_title = "Operator console"

urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    path("", include("apps.tasks.urls")),
    path("review/", include("apps.reviews.urls")),
    path("datasets/", include("apps.datasets.urls")),
    path("engines/", include("apps.engines.urls")),
]
