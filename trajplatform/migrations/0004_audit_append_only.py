"""The audit table becomes append-only in the database, not only in Python.

`actor` loses its constraint and its ON DELETE SET NULL (deleting a user would UPDATE audit
rows, which the triggers refuse); then triggers refuse UPDATE and DELETE of the table (and
TRUNCATE on PostgreSQL). A later migration that rebuilds this table on SQLite (SQLite alters a
table by copying it) drops the triggers: reinstall them there; tests/test_audit.py checks they
exist after migrating.
"""
import django.db.models.deletion
from django.conf import settings
from django.db import migrations

import trajplatform.audit


def install(apps, schema_editor):
    trajplatform.audit.install_append_only_triggers(schema_editor.connection)


def drop(apps, schema_editor):
    trajplatform.audit.drop_append_only_triggers(schema_editor.connection)


class Migration(migrations.Migration):

    dependencies = [
        ('trajplatform', '0003_api_tokens_webhooks'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='auditevent',
            options={'base_manager_name': 'objects', 'ordering': ['-created_at', '-id']},
        ),
        migrations.AlterField(
            model_name='auditevent',
            name='actor',
            field=trajplatform.audit.ActorField(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to=settings.AUTH_USER_MODEL),
        ),
        migrations.RunPython(install, drop),
    ]
