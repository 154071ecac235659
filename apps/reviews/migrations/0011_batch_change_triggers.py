"""BatchChange and the database triggers that write it (apps.reviews.tallies: the incremental batch
tallies). Every insert and delete of a trajectory or review, and every update of a column a batch
tally reads (a trajectory's task, status, iteration, outcome, cost; a review's trajectory, kind,
status, score, verdict, reviewer, cost; a task's batch, current iteration, quality threshold),
marks the batches it touches, whatever wrote it: services, jobs' compare-and-swap updates, the
admin's deletes, bulk loads, raw SQL. On PostgreSQL inserts and deletes mark once per statement
and batch (transition tables: a bulk load of a million rows writes one mark), updates once per
changed row; SQLite has row triggers only."""

from django.db import migrations, models

TRAJECTORY_COLUMNS = ("task_id", "status", "iteration", "outcome", "cost_usd")
REVIEW_COLUMNS = ("trajectory_id", "kind", "status", "overall", "verdict", "reviewer_id", "cost_usd")
TASK_COLUMNS = ("batch_id", "current_iteration", "quality_threshold")

MARK = "INSERT INTO reviews_batchchange (batch_id) "
BY_TASK = "SELECT DISTINCT t.batch_id FROM {rows} c JOIN tasks_task t ON t.id = c.task_id WHERE t.batch_id IS NOT NULL"
BY_TRAJECTORY = ("SELECT DISTINCT t.batch_id FROM {rows} c JOIN tasks_trajectory j ON j.id = c.trajectory_id "
                 "JOIN tasks_task t ON t.id = j.task_id WHERE t.batch_id IS NOT NULL")


def _changed(columns, distinct):
    return " OR ".join(f"OLD.{c} {distinct} NEW.{c}" for c in columns)


def _postgresql():
    """(create, drop) statements: statement triggers with transition tables for inserts and deletes,
    row triggers with a WHEN on the columns read for updates."""
    create, drop = [], []
    for table, by, label in (("tasks_trajectory", BY_TASK, "trajectory"), ("reviews_review", BY_TRAJECTORY, "review")):
        create.append(f"CREATE FUNCTION reviews_mark_{label}_rows() RETURNS trigger LANGUAGE plpgsql AS $$ "
                      f"BEGIN {MARK}{by.format(rows='changed_rows')}; RETURN NULL; END $$")
        for event, which in (("INSERT", "NEW"), ("DELETE", "OLD")):
            create.append(f"CREATE TRIGGER reviews_mark_{label}_{event.lower()} AFTER {event} ON {table} "
                          f"REFERENCING {which} TABLE AS changed_rows FOR EACH STATEMENT "
                          f"EXECUTE FUNCTION reviews_mark_{label}_rows()")
    row_marks = {
        "trajectory": ("tasks_trajectory", TRAJECTORY_COLUMNS,
                       "SELECT DISTINCT batch_id FROM tasks_task WHERE id IN (OLD.task_id, NEW.task_id) "
                       "AND batch_id IS NOT NULL"),
        "review": ("reviews_review", REVIEW_COLUMNS,
                   "SELECT DISTINCT t.batch_id FROM tasks_trajectory j JOIN tasks_task t ON t.id = j.task_id "
                   "WHERE j.id IN (OLD.trajectory_id, NEW.trajectory_id) AND t.batch_id IS NOT NULL"),
        "task": ("tasks_task", TASK_COLUMNS,
                 "SELECT DISTINCT b FROM (VALUES (OLD.batch_id), (NEW.batch_id)) v(b) WHERE b IS NOT NULL"),
    }
    for label, (table, columns, select) in row_marks.items():
        create.append(f"CREATE FUNCTION reviews_mark_{label}_update() RETURNS trigger LANGUAGE plpgsql AS $$ "
                      f"BEGIN {MARK}{select}; RETURN NULL; END $$")
        create.append(f"CREATE TRIGGER reviews_mark_{label}_update AFTER UPDATE OF {', '.join(columns)} ON {table} "
                      f"FOR EACH ROW WHEN ({_changed(columns, 'IS DISTINCT FROM')}) "
                      f"EXECUTE FUNCTION reviews_mark_{label}_update()")
        drop.append(f"DROP TRIGGER IF EXISTS reviews_mark_{label}_update ON {table}")
        drop.append(f"DROP FUNCTION IF EXISTS reviews_mark_{label}_update()")
    create.append("CREATE FUNCTION reviews_mark_task_delete() RETURNS trigger LANGUAGE plpgsql AS $$ "
                  f"BEGIN IF OLD.batch_id IS NOT NULL THEN {MARK}VALUES (OLD.batch_id); END IF; RETURN NULL; END $$")
    create.append("CREATE TRIGGER reviews_mark_task_delete AFTER DELETE ON tasks_task FOR EACH ROW "
                  "EXECUTE FUNCTION reviews_mark_task_delete()")
    drop += ["DROP TRIGGER IF EXISTS reviews_mark_task_delete ON tasks_task",
             "DROP FUNCTION IF EXISTS reviews_mark_task_delete()"]
    for table, label in (("tasks_trajectory", "trajectory"), ("reviews_review", "review")):
        drop += [f"DROP TRIGGER IF EXISTS reviews_mark_{label}_insert ON {table}",
                 f"DROP TRIGGER IF EXISTS reviews_mark_{label}_delete ON {table}",
                 f"DROP FUNCTION IF EXISTS reviews_mark_{label}_rows()"]
    return create, drop


def _sqlite():
    """(create, drop) statements: row triggers (SQLite has no statement triggers)."""
    by_task = "SELECT batch_id FROM tasks_task WHERE id = {row}.task_id AND batch_id IS NOT NULL"
    by_trajectory = ("SELECT t.batch_id FROM tasks_trajectory j JOIN tasks_task t ON t.id = j.task_id "
                     "WHERE j.id = {row}.trajectory_id AND t.batch_id IS NOT NULL")
    triggers = {
        "trajectory_insert": ("AFTER INSERT ON tasks_trajectory", by_task.format(row="NEW")),
        "trajectory_delete": ("AFTER DELETE ON tasks_trajectory", by_task.format(row="OLD")),
        "trajectory_update": (f"AFTER UPDATE OF {', '.join(TRAJECTORY_COLUMNS)} ON tasks_trajectory "
                              f"WHEN {_changed(TRAJECTORY_COLUMNS, 'IS NOT')}",
                              f"{by_task.format(row='OLD')} UNION {by_task.format(row='NEW')}"),
        "review_insert": ("AFTER INSERT ON reviews_review", by_trajectory.format(row="NEW")),
        "review_delete": ("AFTER DELETE ON reviews_review", by_trajectory.format(row="OLD")),
        "review_update": (f"AFTER UPDATE OF {', '.join(REVIEW_COLUMNS)} ON reviews_review "
                          f"WHEN {_changed(REVIEW_COLUMNS, 'IS NOT')}",
                          f"{by_trajectory.format(row='OLD')} UNION {by_trajectory.format(row='NEW')}"),
        "task_update": (f"AFTER UPDATE OF {', '.join(TASK_COLUMNS)} ON tasks_task "
                        f"WHEN {_changed(TASK_COLUMNS, 'IS NOT')}",
                        "SELECT OLD.batch_id WHERE OLD.batch_id IS NOT NULL UNION "
                        "SELECT NEW.batch_id WHERE NEW.batch_id IS NOT NULL"),
        "task_delete": ("AFTER DELETE ON tasks_task", "SELECT OLD.batch_id WHERE OLD.batch_id IS NOT NULL"),
    }
    create = [f"CREATE TRIGGER reviews_mark_{name} {when} BEGIN {MARK}{select}; END"
              for name, (when, select) in triggers.items()]
    return create, [f"DROP TRIGGER IF EXISTS reviews_mark_{name}" for name in triggers]


def _statements(vendor, which):
    if vendor == "postgresql":
        return _postgresql()[which]
    if vendor == "sqlite":
        return _sqlite()[which]
    raise RuntimeError(f"the batch tallies' change triggers support PostgreSQL and SQLite, not {vendor}")


def install(apps, schema_editor):
    for statement in _statements(schema_editor.connection.vendor, 0):
        schema_editor.execute(statement)


def uninstall(apps, schema_editor):
    for statement in _statements(schema_editor.connection.vendor, 1):
        schema_editor.execute(statement)


class Migration(migrations.Migration):

    dependencies = [
        ('reviews', '0010_reviewer_tally'),
        ('tasks', '0008_search_trigram_indexes'),
    ]

    operations = [
        migrations.CreateModel(
            name='BatchChange',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('batch_id', models.BigIntegerField()),
            ],
        ),
        migrations.RunPython(install, uninstall),
    ]
