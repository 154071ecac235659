import uuid

from django.db import migrations, models


def fill_uuids(apps, schema_editor):
    Trajectory = apps.get_model("tasks", "Trajectory")
    for pk in Trajectory.objects.values_list("pk", flat=True).iterator():
        Trajectory.objects.filter(pk=pk).update(uuid=uuid.uuid4())


def rename_duplicate_batches(apps, schema_editor):
    """Batch names become unique: a later batch that shares its name with an earlier one is
    renamed '<name> (#<id>)' (the earliest keeps its name)."""
    Batch = apps.get_model("tasks", "Batch")
    seen = set()
    for pk, name in Batch.objects.order_by("id").values_list("pk", "name"):
        if name in seen:
            Batch.objects.filter(pk=pk).update(name=f"{name[:180]} (#{pk})")
        seen.add(name)


class Migration(migrations.Migration):

    dependencies = [
        ("tasks", "0003_trajectory_claim_attempts"),
    ]

    operations = [
        migrations.AddField(
            model_name="trajectory",
            name="uuid",
            field=models.UUIDField(editable=False, null=True),
        ),
        migrations.RunPython(fill_uuids, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="trajectory",
            name="uuid",
            field=models.UUIDField(default=uuid.uuid4, editable=False, unique=True),
        ),
        migrations.AddField(
            model_name="trajectory",
            name="worker_losses",
            field=models.PositiveSmallIntegerField(
                default=0, help_text="claims that ended because their worker died (not counted against the attempts)"
            ),
        ),
        migrations.RunPython(rename_duplicate_batches, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="batch",
            name="name",
            field=models.CharField(max_length=200, unique=True),
        ),
    ]
