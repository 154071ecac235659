# The scene field's choices are the scene registry's callable (apps.engines.registry.scene_choices):
# a scene added or removed changes no migration. No schema change.

import apps.engines.registry
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0006_budgets'),
    ]

    operations = [
        migrations.AlterField(
            model_name='task',
            name='scene',
            field=models.CharField(choices=apps.engines.registry.scene_choices, db_index=True, max_length=32),
        ),
    ]
