# The artifact store (trajplatform/artifacts.py): content-addressed blobs and the trajectories using them.

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0004_trajectory_uuid_worker_losses_batch_name_unique'),
        ('trajplatform', '0004_audit_append_only'),
    ]

    operations = [
        migrations.CreateModel(
            name='Artifact',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('sha256', models.CharField(max_length=64, unique=True)),
                ('mime', models.CharField(max_length=100)),
                ('size', models.PositiveBigIntegerField()),
                ('width', models.PositiveIntegerField(blank=True, null=True)),
                ('height', models.PositiveIntegerField(blank=True, null=True)),
                ('created_at', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
        ),
        migrations.CreateModel(
            name='ArtifactUse',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('artifact', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='uses', to='trajplatform.artifact')),
                ('trajectory', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='artifact_uses', to='tasks.trajectory')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('artifact', 'trajectory'), name='artifact_use_unique')],
            },
        ),
    ]
