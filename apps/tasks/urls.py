"""Trajectory pages; the live-log websocket route is in trajplatform/asgi.py."""
from django.urls import path

from apps.tasks import views

app_name = "tasks"

urlpatterns = [
    path("tasks/new/", views.task_new, name="task_new"),
    path("trajectories/", views.trajectory_list, name="trajectory_list"),
    path("trajectories/<int:trajectory_id>/", views.trajectory_detail, name="trajectory_detail"),
    path("trajectories/<int:trajectory_id>/log", views.trajectory_log, name="trajectory_log"),
]
