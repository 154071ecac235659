"""The review console (included at /review/)."""
from django.urls import path

from apps.reviews import queue_views, views

app_name = "reviews"

urlpatterns = [
    path("", views.queue, name="queue"),
    path("proposals/<int:proposal_id>/decide", views.decide, name="decide"),
    path("trajectories/<int:trajectory_id>/", views.trajectory, name="trajectory"),
    path("trajectories/<int:trajectory_id>/verdict", views.verdict, name="verdict"),
    path("trajectories/<int:trajectory_id>/claim", queue_views.claim, name="claim"),
    path("trajectories/<int:trajectory_id>/correct", views.correct, name="correct"),
    path("trajectories/<int:trajectory_id>/release", queue_views.release, name="release"),
    path("work/", queue_views.work, name="work"),
    path("work/next", queue_views.work_next, name="work_next"),
    path("work/bulk", queue_views.work_bulk, name="work_bulk"),
    path("work/views", queue_views.saved_view_save, name="saved_view_save"),
    path("work/views/<int:view_id>/delete", queue_views.saved_view_delete, name="saved_view_delete"),
    path("suggest/<slug:kind>", queue_views.suggest, name="suggest"),
    path("team/", queue_views.team, name="team"),
    path("tasks/<int:task_id>/", views.task_history, name="task"),
    path("tasks/<int:task_id>/end", views.task_end, name="task_end"),
    path("tasks/<int:task_id>/compare/", views.compare, name="compare"),
    path("tasks/<int:task_id>/prefer", views.prefer, name="prefer"),
    path("tasks/<int:task_id>/force", views.task_force, name="task_force"),
    path("batches/", views.batches, name="batches"),
    path("batches/<int:batch_id>/", views.batch_detail, name="batch"),
    path("batches/<int:batch_id>/progress", views.batch_progress, name="batch_progress"),
    path("batches/<int:batch_id>/<slug:action>", views.batch_control, name="batch_control"),
    path("tasks/<int:task_id>/control/<slug:action>", views.task_control, name="task_control"),
    path("agreement/", views.agreement, name="agreement"),
]
