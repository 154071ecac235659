"""Create the four role groups (viewer, reviewer, approver, admin) with their permissions."""
from django.db import migrations


def create_role_groups(apps, schema_editor):
    # Permissions are normally created after migrate finishes; create them now so the
    # groups can reference them on a fresh database.
    from django.apps import apps as global_apps
    from django.contrib.auth.management import create_permissions

    for app_config in global_apps.get_app_configs():
        # create_permissions skips apps whose models_module is unset; restore it afterwards
        # or Django's own post_migrate handling is switched off for the rest of the process.
        previous = app_config.models_module
        app_config.models_module = previous or True
        try:
            create_permissions(app_config, verbosity=0, apps=apps)
        finally:
            app_config.models_module = previous

    from trajplatform.permissions import sync_role_groups

    sync_role_groups(apps)


def remove_role_groups(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name__in=["viewer", "reviewer", "approver", "admin"]).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("trajplatform", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("tasks", "0001_initial"),
        ("reviews", "0001_initial"),
        ("datasets", "0001_initial"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [migrations.RunPython(create_role_groups, remove_role_groups)]
