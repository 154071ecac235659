"""`manage.py import_tasks` and the `batch_import` service: all or nothing, every error reported."""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.engines.registry import SCENES
from apps.tasks import selectors
from apps.tasks.importers import check_file
from apps.tasks.models import Batch, Task
from apps.tasks.services import batch_import
from trajplatform.audit import AuditEvent, audit_events_for

pytestmark = pytest.mark.django_db

EXAMPLES = Path(settings.BASE_DIR) / "examples" / "tasks"
VALID = {"scene": "gui", "prompt": "Open the page and read its title.", "config": {"start_url": "https://example.com/"}}
ALL_SCENES = ", ".join(SCENES)


def write(path: Path, *lines: Any) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def run(path: Path, *args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("import_tasks", str(path), *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def counts() -> tuple[int, int, int]:
    return Batch.objects.count(), Task.objects.count(), AuditEvent.objects.count()


@pytest.fixture
def rejects() -> Callable[..., str]:
    """rejects(path, *args): run the import, assert it fails and wrote nothing; return stderr."""

    def _run(path: Path, *args: str) -> str:
        before = counts()
        err = io.StringIO()
        with pytest.raises(CommandError, match="nothing imported"):
            call_command("import_tasks", str(path), *args, stdout=io.StringIO(), stderr=err)
        assert counts() == before
        return err.getvalue()

    return _run


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"scene": "gui", "prompt": "x"', "json: malformed JSON: Expecting ',' delimiter (column 31)"),
        ('{"scene": "gui", "prompt": "x", "temperature": Infinity}', "json: malformed JSON: Infinity is not valid JSON"),
        ({"scene": "gui"}, "prompt: required field is missing"),
        ({"task_type": "code", "description": "d"}, "task_id: required field is missing"),
        ({**VALID, "colour": "red"}, "colour: unknown field for the trajplatform shape; allowed: external_id, scene, "),
        ({**VALID, "priority": True}, "priority: must be an integer, got boolean"),
        ({**VALID, "max_steps": "10"}, "max_steps: must be an integer, got string"),
        ({**VALID, "temperature": "hot"}, "temperature: must be a number, got string"),
        ({**VALID, "priority": 11}, "priority: must be between 1 and 10, got 11"),
        ({**VALID, "quality_threshold": 101}, "quality_threshold: must be between 0 and 100, got 101"),
        ({**VALID, "temperature": 2.5}, "temperature: must be between 0 and 2, got 2.5"),
        ({"task_id": "a", "task_type": "code", "description": "d", "max_steps": False},
         "max_steps: must be an integer, got boolean"),
        ({"task_id": "a", "task_type": "code", "description": "d", "timeout": 0}, "timeout: must be at least 1, got 0"),
        ({"task_id": "a", "task_type": "code", "description": "d", "priority": 0},
         "priority: must be between 1 and 10, got 0"),
        ({"task_id": "a", "task_type": "poem", "description": "d"},
         "task_type: unknown task_type 'poem'; valid: code, web, reasoning (or set the scene with --scene)"),
        ({"scene": "teleport", "prompt": "x"}, f"scene: unknown scene 'teleport'; valid scenes: {ALL_SCENES}"),
        ({"scene": "code_exec", "prompt": "x", "config": {"verifier": {"files": {"t.py": ""}}}},
         "config.verifier: 'command' is a required property (scene code_exec config schema)"),
        ({"scene": "gui", "prompt": "x", "config": {"start_url": 1}},
         "config.start_url: 1 is not of type 'string' (scene gui config schema)"),
        ({"scene": "gui", "prompt": "x", "config": {"verifier": {}}},
         "config: Additional properties are not allowed ('verifier' was unexpected) (scene gui config schema)"),
        ({"scene": "envscaler", "prompt": "x"}, "config: 'env_name' is a required property (scene envscaler config schema)"),
        ({"scene": "gui", "prompt": "x", "config": []}, "config: must be an object, got array"),
        ({"task_id": "a", "description": "d", "scene": "gui"},
         "shape: mixes agent-data-platform fields (description, task_id) with trajplatform fields (scene); "
         "use one shape per line"),
        ({"max_steps": 3}, "shape: matches neither shape: expected task_id/task_type/description "
                           "(agent-data-platform) or scene/prompt (trajplatform)"),
        ('"just a string"', "line: must be a JSON object, got string"),
    ],
)
def test_an_invalid_line_is_reported_and_nothing_is_written(
    tmp_path: Path, rejects: Callable[..., str], line: Any, message: str
) -> None:
    path = write(tmp_path / "tasks.jsonl", VALID, line, VALID)
    err = rejects(path)
    assert f"{path}:2: {message}" in err
    assert f"{path}:1:" not in err and f"{path}:3:" not in err


def test_a_bad_line_after_fifty_good_ones_writes_nothing(tmp_path: Path, rejects: Callable[..., str]) -> None:
    good = [{**VALID, "external_id": f"t{i}"} for i in range(50)]
    path = write(tmp_path / "late.jsonl", *good, {**VALID, "priority": 0}, {**VALID, "external_id": "z"})
    err = rejects(path)
    assert err.splitlines() == [f"{path}:51: priority: must be between 1 and 10, got 0"]


def test_every_error_is_reported_not_just_the_first(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = write(tmp_path / "many.jsonl", {"scene": "gui"}, VALID, "{", {**VALID, "priority": 0, "top_p": 3})
    before = counts()
    err = io.StringIO()
    with pytest.raises(CommandError) as exc:
        call_command("import_tasks", str(path), stdout=io.StringIO(), stderr=err)
    assert counts() == before
    assert str(exc.value) == f"{path}: 4 error(s) on 3 line(s); nothing imported"
    assert [line.split(": ")[0] for line in err.getvalue().splitlines()] == [
        f"{path}:1", f"{path}:3", f"{path}:4", f"{path}:4"
    ]


def test_the_error_printout_is_capped(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = write(tmp_path / "bad.jsonl", *[{"scene": "gui"}] * 250)
    lines = rejects(path).splitlines()
    assert len(lines) == 201
    assert lines[199] == f"{path}:200: prompt: required field is missing"
    assert lines[200] == "… and 50 more"


def test_a_duplicate_task_id_is_rejected(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = write(
        tmp_path / "dup.jsonl",
        {"task_id": "same", "task_type": "code", "description": "a"},
        {"task_id": "other", "task_type": "code", "description": "b"},
        {"task_id": "same", "task_type": "web", "description": "c"},
    )
    assert rejects(path).splitlines() == [f"{path}:3: task_id: duplicate task_id 'same' (first on line 1)"]


def test_a_duplicate_external_id_is_rejected(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = write(tmp_path / "dup.jsonl", {**VALID, "external_id": "a"}, {**VALID, "external_id": "a"})
    assert rejects(path).splitlines() == [f"{path}:2: external_id: duplicate external_id 'a' (first on line 1)"]


@pytest.mark.parametrize("content", ["", "\n\n", "[]\n"])
def test_an_empty_file_is_rejected(tmp_path: Path, rejects: Callable[..., str], content: str) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    assert rejects(path).splitlines()[0].startswith(f"{path}:1: file: no tasks: ")


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no such file"):
        run(tmp_path / "nope.jsonl")


def test_an_adp_file_imports_with_the_field_mapping(tmp_path: Path) -> None:
    path = write(
        tmp_path / "adp-tasks.jsonl",
        {"task_id": "compute-factorial", "task_type": "code", "description": "Compute 5!",
         "expected_tools": ["python_executor"], "max_steps": 4, "timeout": 60, "priority": 7},
        {"task_id": "search-docs", "task_type": "web", "description": "Search the docs", "expected_tools": ["browser"]},
        {"task_id": "compare", "task_type": "reasoning", "description": "Compare A and B"},
    )
    out, err = run(path)
    assert err == ""
    batch = Batch.objects.get()
    assert (batch.name, batch.source_name, batch.source_format, batch.task_count) == (
        "adp-tasks", "adp-tasks.jsonl", "jsonl/adp", 3
    )
    assert batch.source_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert batch.created_by is None
    code = Task.objects.get(external_id="compute-factorial")
    assert (code.batch, code.scene, code.prompt, code.expected_tools, code.max_steps, code.timeout_s, code.priority) == (
        batch, "code_exec", "Compute 5!", ["python_executor"], 4, 60.0, 7
    )
    assert code.scene_config == {}
    assert code.status == Task.Status.QUEUED and code.queued_at is not None
    web = Task.objects.get(external_id="search-docs")
    assert (web.scene, web.max_steps, web.timeout_s, web.priority) == ("gui", 15, 600.0, 5)  # model defaults
    assert Task.objects.get(external_id="compare").scene == "deep_search"
    assert f"batch #{batch.pk}" in out and f"/admin/tasks/batch/{batch.pk}/change/" in out
    assert "code_exec      1" in out and "deep_search    1" in out and "gui            1" in out


def test_our_own_shape_imports_every_field(tmp_path: Path) -> None:
    line = {
        "external_id": "t-1", "scene": "code_exec", "prompt": "Write primes.py",
        "config": {"verifier": {"files": {"test_p.py": "def test(): pass\n"}, "command": "python3 -m pytest -q"}},
        "expected_tools": ["run_shell"], "model": "gpt-x", "temperature": 0.2, "top_p": 0.9, "max_steps": 30,
        "step_timeout_s": 12.5, "timeout_s": 300, "max_tokens": 50000, "system_prompt_extra": "Be terse.",
        "max_iterations": 2, "quality_threshold": 90, "samples_per_iteration": 4, "priority": 10,
    }
    run(write(tmp_path / "own.jsonl", line))
    task = Task.objects.get()
    assert task.scene_config == line["config"]
    for name in ("external_id", "scene", "prompt", "expected_tools", "model", "temperature", "top_p", "max_steps",
                 "step_timeout_s", "timeout_s", "max_tokens", "system_prompt_extra", "max_iterations",
                 "quality_threshold", "samples_per_iteration", "priority"):
        assert getattr(task, name) == line[name], name
    assert task.batch.source_format == "jsonl/trajplatform"


def test_scene_option_overrides_every_line(tmp_path: Path) -> None:
    path = write(
        tmp_path / "o.jsonl",
        {"task_id": "a", "task_type": "code", "description": "d"},
        {"task_id": "b", "description": "no task_type needed with --scene"},
        {"task_id": "c", "task_type": "something-else", "description": "d"},
    )
    run(path, "--scene", "toucan")
    assert set(Task.objects.values_list("scene", flat=True)) == {"toucan"}


def test_scene_option_validates_configs_against_the_chosen_scene(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = write(tmp_path / "o.jsonl", {"scene": "gui", "prompt": "p", "config": {"start_url": "https://a.test"}})
    err = rejects(path, "--scene", "deep_search")
    assert "config: Additional properties are not allowed ('start_url' was unexpected)" in err


def test_an_unknown_scene_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="invalid choice: 'teleport'"):
        run(write(tmp_path / "o.jsonl", VALID), "--scene", "teleport")


def test_a_json_list_imports(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([VALID, {"task_id": "x", "task_type": "web", "description": "d"}], indent=2))
    run(path)
    batch = Batch.objects.get()
    assert batch.task_count == 2 and batch.source_format == "json/mixed"


def test_json_list_errors_give_the_line_the_item_starts_on(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = tmp_path / "list.json"
    path.write_text(json.dumps([VALID, {**VALID, "priority": 42}, VALID], indent=2))
    start = path.read_text().splitlines().index("  {", 2) + 1  # the second item's "{"
    assert rejects(path).splitlines() == [f"{path}:{start}: priority: must be between 1 and 10, got 42"]


def test_dry_run_validates_and_writes_nothing(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", VALID, {**VALID, "prompt": "another"})
    out, _ = run(path, "--dry-run")
    assert counts() == (0, 0, 0)
    assert "valid, 2 tasks (jsonl/trajplatform); dry run, nothing written" in out


def test_dry_run_still_reports_errors(tmp_path: Path, rejects: Callable[..., str]) -> None:
    path = write(tmp_path / "d.jsonl", {"scene": "gui"})
    assert rejects(path, "--dry-run").splitlines() == [f"{path}:1: prompt: required field is missing"]


def test_success_writes_one_audit_row_for_the_batch(tmp_path: Path) -> None:
    run(write(tmp_path / "a.jsonl", VALID, {**VALID, "scene": "deep_search", "config": {}}, {**VALID}))
    batch = Batch.objects.get()
    (event,) = AuditEvent.objects.all()
    assert event.action == "tasks.batch_import"
    assert list(audit_events_for(batch)) == [event]
    assert event.actor is None and event.actor_repr == "system"
    assert event.data == {
        "task_count": 3, "by_scene": {"deep_search": 1, "gui": 2}, "source_name": "a.jsonl",
        "source_sha256": batch.source_sha256, "source_format": "jsonl/trajplatform",
    }


def test_batch_name_and_user_options(tmp_path: Path, make_user: Callable[..., Any]) -> None:
    user = make_user("admin", username="alice")
    run(write(tmp_path / "a.jsonl", VALID), "--batch", "October run", "--user", "alice")
    batch = Batch.objects.get()
    assert batch.name == "October run" and batch.created_by == user
    assert Task.objects.get().created_by == user
    event = AuditEvent.objects.get()
    assert event.actor == user and event.actor_repr == "alice"


def test_an_unknown_user_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        run(write(tmp_path / "a.jsonl", VALID), "--user", "nobody")
    assert counts() == (0, 0, 0)


def test_the_same_ids_may_be_imported_again_as_another_batch(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", {**VALID, "external_id": "x"})
    run(path)
    run(path)
    assert Task.objects.filter(external_id="x").count() == 2
    assert list(Batch.objects.order_by("pk").values_list("name", flat=True)) == ["a", "a (2)"]


def test_a_file_changed_after_the_check_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.tasks.management.commands import import_tasks

    path = write(tmp_path / "a.jsonl", VALID, VALID)

    def check_then_edit(fp: Any, **kw: Any) -> Any:
        summary = check_file(fp, **kw)
        write(path, VALID, {"scene": "gui"})
        return summary

    monkeypatch.setattr(import_tasks, "check_file", check_then_edit)
    with pytest.raises(CommandError, match="changed while importing"):
        run(path)
    assert counts() == (0, 0, 0)


@pytest.mark.parametrize("name, source_format, expected", [
    ("demo.jsonl", "jsonl/trajplatform", None),
    ("agent-data-platform.jsonl", "jsonl/adp", {"code_exec": 2, "gui": 2, "deep_search": 2}),
])
def test_the_example_files_import(name: str, source_format: str, expected: dict[str, int] | None) -> None:
    run(EXAMPLES / name)
    batch = Batch.objects.get()
    assert batch.source_format == source_format
    assert batch.task_count == Task.objects.count() >= 6
    by_scene = {s: Task.objects.filter(scene=s).count() for s in SCENES}
    if expected is not None:
        assert {s: n for s, n in by_scene.items() if n} == expected
    else:
        assert sum(1 for n in by_scene.values() if n) >= 5
        verified = Task.objects.filter(scene="code_exec", scene_config__has_key="verifier")
        assert verified.count() >= 3
        assert all(t.scene_config["verifier"]["command"] == "python3 -m pytest -q" for t in verified)


def test_the_command_exits_non_zero_from_the_shell(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.jsonl", {"scene": "gui"})
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}"}
    proc = subprocess.run(
        [sys.executable, "manage.py", "import_tasks", str(path)],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert f"{path}:1: prompt: required field is missing" in proc.stderr


# -- the service and the selector, directly --------------------------------------------------


def _service(rows: Any) -> Batch:
    return batch_import(rows=rows, name="n", source_name="f.jsonl", source_sha256="0" * 64,
                        source_format="jsonl/trajplatform", actor=None)


def test_batch_import_rolls_back_when_the_rows_fail_midway() -> None:
    def rows() -> Any:
        for i in range(5000):  # more than one chunk is written before the failure
            yield {"scene": "gui", "prompt": f"p{i}"}
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError):
        _service(rows())
    assert counts() == (0, 0, 0)


def test_batch_import_refuses_no_rows() -> None:
    with pytest.raises(ValueError, match="no tasks"):
        _service([])
    assert counts() == (0, 0, 0)


def test_batch_import_creates_queued_tasks_in_chunks() -> None:
    batch = _service({"scene": "gui", "prompt": f"p{i}"} for i in range(4500))
    assert batch.task_count == 4500
    assert Task.objects.filter(batch=batch, status="queued", queued_at__isnull=False).count() == 4500
    assert AuditEvent.objects.count() == 1


def test_batch_status_counts() -> None:
    batch = _service([{"scene": "gui", "prompt": "a"}, {"scene": "gui", "prompt": "b"}])
    Task.objects.filter(pk=Task.objects.filter(batch=batch).first().pk).update(status="running")
    counts_ = selectors.batch_status_counts(batch)
    assert counts_["queued"] == 1 and counts_["running"] == 1
    assert set(counts_) == set(Task.Status.values) and sum(counts_.values()) == 2


def test_once_skips_a_file_already_imported_under_the_same_name(tmp_path):
    from io import StringIO

    from django.core.management import call_command

    from apps.tasks.models import Batch, Task

    path = tmp_path / "again.jsonl"
    path.write_text('{"scene": "code_exec", "prompt": "Sort a list."}\n')
    call_command("import_tasks", str(path), "--batch", "again", "--once", stdout=StringIO())
    out = StringIO()
    call_command("import_tasks", str(path), "--batch", "again", "--once", stdout=out)
    assert "already imported" in out.getvalue()
    assert Batch.objects.filter(name="again").count() == 1
    assert Task.objects.count() == 1
    # Changed content under a name that is taken is refused (batch names are unique); another name
    # is a new batch, --once or not.
    path.write_text('{"scene": "code_exec", "prompt": "Sort a list, descending."}\n')
    with pytest.raises(CommandError, match="a batch named 'again' already exists"):
        call_command("import_tasks", str(path), "--batch", "again", "--once", stdout=StringIO())
    call_command("import_tasks", str(path), "--batch", "again-2", "--once", stdout=StringIO())
    assert list(Batch.objects.order_by("pk").values_list("name", flat=True)) == ["again", "again-2"]
