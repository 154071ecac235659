# The trajectory search's substring matches (apps.tasks.views._search: UPPER(col) LIKE UPPER('%q%'),
# Django's icontains on PostgreSQL) served by pg_trgm GIN indexes on PostgreSQL, where they scanned
# every prompt and answer (23 s at 1M trajectories). SQLite keeps the scan: no extension there, and
# no model state changes (the indexes are expressions with an operator class the ORM's state need
# not know). pg_trgm is a trusted extension (PostgreSQL 13+): the database's owner may create it.
# Building the indexes locks the two tables against writes while it runs (about a minute at 1M).

from django.db import migrations

INDEXES = (
    ("tasks_task_prompt_trgm", "tasks_task", "prompt"),
    ("tasks_trajectory_final_answer_trgm", "tasks_trajectory", "final_answer"),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for name, table, column in INDEXES:
        schema_editor.execute(
            f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" USING gin (UPPER("{column}") gin_trgm_ops)')


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _table, _column in INDEXES:
        schema_editor.execute(f'DROP INDEX IF EXISTS "{name}"')


class Migration(migrations.Migration):

    dependencies = [
        ('tasks', '0007_task_scene_choices'),
    ]

    operations = [
        migrations.RunPython(create, drop),
    ]
