"""/api/v1/datasets/..., /api/v1/exports/... and /api/v1/imports/trajectories."""
from django.urls import path

from apps.datasets.api import views

urlpatterns = [
    path("datasets", views.DatasetListView.as_view(), name="dataset-list"),
    path("datasets/<slug:name>/versions", views.VersionListView.as_view(), name="version-list"),
    path("datasets/<slug:name>/versions/<int:number>", views.VersionDetailView.as_view(), name="version-detail"),
    path("datasets/<slug:name>/versions/<int:number>/publish", views.VersionPublishView.as_view(), name="version-publish"),
    path("datasets/<slug:name>/versions/<int:number>/exports", views.ExportStartView.as_view(), name="export-start"),
    path("version-builds/<int:build_id>", views.VersionBuildDetailView.as_view(), name="version-build-detail"),
    path("exports/<int:job_id>", views.ExportDetailView.as_view(), name="export-detail"),
    path("exports/<int:job_id>/download", views.ExportDownloadView.as_view(), name="export-download"),
    path("exports/<int:job_id>/template-checks", views.TemplateCheckView.as_view(), name="export-template-check"),
    path("imports/trajectories", views.TrajectoryImportView.as_view(), name="trajectory-import"),
]
