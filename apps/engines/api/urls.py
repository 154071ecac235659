"""/api/v1/scenes and /api/v1/envscaler/uploads."""
from django.urls import path

from apps.engines.api import views

urlpatterns = [
    path("scenes", views.SceneListView.as_view(), name="scene-list"),
    path("scenes/<str:scene_id>", views.SceneDetailView.as_view(), name="scene-detail"),
    path("envscaler/uploads", views.EnvScalerUploadView.as_view(), name="envscaler-upload"),
]
