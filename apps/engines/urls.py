from django.urls import path

from apps.engines import views

app_name = "engines"

urlpatterns: list = [
    path("envscaler/import/", views.envscaler_upload, name="envscaler_upload"),
]
