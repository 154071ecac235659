from django.urls import path

from apps.datasets import views

app_name = "datasets"

urlpatterns = [
    path("", views.dataset_list, name="dataset_list"),
    path("new/", views.builder, name="builder"),
    path("new/preview", views.builder_preview, name="builder_preview"),
    path("exports/<int:job_id>/download/", views.export_download, name="export_download"),
    path("builds/<int:build_id>/", views.build_detail, name="build_detail"),
    path("<slug:name>/", views.dataset_detail, name="dataset_detail"),
    path("<slug:name>/compare/", views.version_compare, name="version_compare"),
    path("<slug:name>/v<int:number>/", views.version_detail, name="version_detail"),
    path("<slug:name>/v<int:number>/publish/", views.version_publish, name="version_publish"),
    path("<slug:name>/v<int:number>/export/", views.version_export, name="version_export"),
]
