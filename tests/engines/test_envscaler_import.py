"""EnvScaler import: every validation error per item, all or nothing, the command and the upload page.

Validation of the submitted code runs in a real local sandbox (never in this process).
"""
from __future__ import annotations

import copy
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from apps.engines.pipelines.envscaler import envscaler_import
from apps.engines.scenes.envscaler.importer import EnvScalerImportError
from apps.tasks.models import Batch, Task
from trajplatform.audit import AuditEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("sandbox_settings")]

EXAMPLES = Path(settings.BASE_DIR) / "examples" / "envscaler"
METADATA = json.loads((EXAMPLES / "metadata.json").read_text())
SCENARIOS = json.loads((EXAMPLES / "scenarios.json").read_text())


def inputs() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return copy.deepcopy(METADATA), copy.deepcopy(SCENARIOS)


def env(metadata: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(e for e in metadata if e["env_name"] == name)


def errors_of(metadata: Any, scenarios: Any) -> list[str]:
    with pytest.raises(EnvScalerImportError) as info:
        envscaler_import(metadata=metadata, scenarios=scenarios, actor=None)
    assert Batch.objects.count() == 0 and Task.objects.count() == 0
    assert not AuditEvent.objects.filter(action="engines.envscaler_import").exists()
    return [str(e) for e in info.value.errors]


def test_the_bundled_environments_import_as_one_batch_with_audit_rows() -> None:
    batch = envscaler_import(metadata=METADATA, scenarios=SCENARIOS, actor=None, batch_name="bundled")
    tasks = list(batch.tasks.order_by("pk"))
    assert batch.task_count == len(SCENARIOS) == len(tasks) == 15
    assert {t.scene for t in tasks} == {"envscaler"}
    clinic = next(t for t in tasks if t.external_id == "clinic-cancel")
    assert clinic.scene_config["class_name"] == "ClinicScheduler"
    assert clinic.scene_config["init_config"]["appointments"]["A1"]["patient_id"] == "P2"
    assert "def check(env)" in clinic.scene_config["check_func"]
    assert {op["name"] for op in clinic.scene_config["operations"]} == set(clinic.expected_tools)
    assert AuditEvent.objects.filter(action="tasks.batch_import", target_id=str(batch.pk)).count() == 1
    event = AuditEvent.objects.get(action="engines.envscaler_import")
    assert event.data["environments"] == ["ClinicScheduler", "LibraryLoans", "WarehouseInventory"]
    assert event.data["task_count"] == 15


def test_the_class_is_found_by_name_even_after_an_imported_class() -> None:
    # The reference took "the first class in the module" - datetime for its own example.
    metadata, scenarios = inputs()
    clinic = env(metadata, "ClinicScheduler")
    assert clinic["code"].startswith("import datetime")
    clinic["env_name"] = "Clinic"
    clinic["class_name"] = "ClinicScheduler"
    for s in scenarios:
        if s["env_name"] == "ClinicScheduler":
            s["env_name"] = "Clinic"
    rows = envscaler_import(metadata=metadata, scenarios=scenarios, actor=None, dry_run=True)
    assert {r["scene_config"]["class_name"] for r in rows if r["scene_config"]["env_name"] == "Clinic"} == {
        "ClinicScheduler"}


def test_a_class_that_is_not_defined_by_the_code_is_an_error() -> None:
    metadata, scenarios = inputs()
    env(metadata, "ClinicScheduler")["code"] = "from datetime import datetime as ClinicScheduler\nclass Other:\n    pass\n"
    assert errors_of(metadata, scenarios) == [
        "metadata[0] (ClinicScheduler): code: defines no top-level class 'ClinicScheduler' (classes defined: Other); "
        "set class_name if the class is named differently"]


def test_a_declared_operation_missing_from_the_class_is_an_error() -> None:
    metadata, scenarios = inputs()
    env(metadata, "WarehouseInventory")["operations"].append(
        {"name": "audit_stock", "description": "x", "parameters": {"type": "object", "properties": {}}})
    assert errors_of(metadata, scenarios) == [
        "metadata[1] (WarehouseInventory): operations.audit_stock: the class has no method 'audit_stock'"]


def test_an_operation_whose_signature_does_not_match_is_an_error() -> None:
    metadata, scenarios = inputs()
    ops = env(metadata, "LibraryLoans")["operations"]
    search = next(o for o in ops if o["name"] == "search_books")
    search["parameters"]["properties"]["limit"] = {"type": "integer"}
    renew = next(o for o in ops if o["name"] == "renew_loan")
    renew["parameters"] = {"type": "object", "properties": {}}
    assert errors_of(metadata, scenarios) == [
        "metadata[2] (LibraryLoans): operations.search_books: parameter 'limit' is declared but search_books() "
        "does not accept it",
        "metadata[2] (LibraryLoans): operations.renew_loan: renew_loan() requires 'loan_id', which the schema "
        "does not declare",
    ]


def test_check_functions_must_compile_and_define_a_one_argument_check() -> None:
    metadata, scenarios = inputs()
    scenarios[0]["check_func"] = "def check(env):\n    return env.appointments ==\n"
    scenarios[1]["check_func"] = "def verify(env):\n    return True\n"
    scenarios[2]["check_func"] = "def check(env, other):\n    return True\n"
    errors = errors_of(metadata, scenarios)
    assert errors[0] == "scenarios[0] (clinic-book-cardiology): check_func: syntax error at line 2: invalid syntax"
    assert errors[1] == "scenarios[1] (clinic-cancel): check_func: defines no top-level function check(env)"
    assert errors[2] == ("scenarios[2] (clinic-reschedule): check_func: TypeError: check must take exactly one "
                         "argument (env), it takes 2 without defaults")
    assert len(errors) == 3


def test_init_config_keys_must_be_accepted_by_the_constructor() -> None:
    metadata, scenarios = inputs()
    scenarios[5]["init_config"]["warehouses"] = ["north"]
    scenarios[10]["init_config"] = {"books": "not a dict"}
    errors = errors_of(metadata, scenarios)
    assert errors[0].startswith("scenarios[5] (warehouse-receive): init_config: not accepted by WarehouseInventory(): ")
    assert "warehouses" in errors[0]
    assert errors[1].startswith("scenarios[10] (library-checkout): init_config: LibraryLoans(**init_config) failed: "
                                "ValueError")
    assert len(errors) == 2


def test_shape_errors_are_reported_per_item_all_at_once() -> None:
    metadata, scenarios = inputs()
    metadata[0]["code"] = "class ClinicScheduler(:\n"
    metadata[1]["operations"][0]["parameters"] = {"type": "object", "properties": {"sku": {"type": "strng"}}}
    metadata[2]["operations"][0]["name"] = "finish"
    scenarios[3]["env_name"] = "Nowhere"
    scenarios[4]["task_id"] = scenarios[5]["task_id"]
    del scenarios[6]["task_desc"]
    errors = errors_of(metadata, scenarios)
    assert "metadata[0] (ClinicScheduler): code: syntax error at line 1: invalid syntax" in errors
    assert any(e.startswith("metadata[1] (WarehouseInventory): operations[0] (get_stock): parameters is not a valid "
                            "JSON schema") for e in errors)
    assert ("metadata[2] (LibraryLoans): operations[0] (finish): 'finish' is reserved (or private) and cannot be an "
            "operation") in errors
    assert any(e.startswith("scenarios[3] (clinic-book-after-conflict): env_name: 'Nowhere' is not an environment")
               for e in errors)
    assert "scenarios[5] (warehouse-receive): task_id: 'warehouse-receive' appears more than once" in errors
    assert "scenarios[6] (warehouse-fulfill): task_desc: is required (the task the agent receives)" in errors


def test_the_documents_themselves_must_be_lists() -> None:
    assert errors_of({"nothing": 1}, "x") == [
        "metadata: must be a JSON list (or an object with envs / environments)",
        "scenarios: must be a JSON list (or an object with tasks / scenarios)",
    ]


def test_validation_never_executes_the_code_in_this_process(tmp_path: Path) -> None:
    marker = Path("/tmp") / f"envscaler-marker-{os.getpid()}"
    marker.unlink(missing_ok=True)
    metadata, scenarios = inputs()
    clinic = env(metadata, "ClinicScheduler")
    clinic["code"] = f"open({str(marker)!r}, 'w').write('ran')\n" + clinic["code"]
    rows = envscaler_import(metadata=metadata, scenarios=scenarios, actor=None, dry_run=True)
    assert len(rows) == 15  # it ran, in the sandbox, whose /tmp is its own
    assert not marker.exists()


def test_code_that_crashes_at_import_is_an_error_of_its_item() -> None:
    metadata, scenarios = inputs()
    env(metadata, "LibraryLoans")["code"] += "\nraise SystemExit('bye')\n"
    assert errors_of(metadata, scenarios) == ["metadata[2] (LibraryLoans): code: SystemExit: bye"]


# --- the command --------------------------------------------------------------------------------------


def write_inputs(tmp_path: Path, metadata: Any, scenarios: Any) -> tuple[str, str]:
    m, s = tmp_path / "m.json", tmp_path / "s.json"
    m.write_text(json.dumps(metadata))
    s.write_text(json.dumps(scenarios))
    return str(m), str(s)


def test_the_command_dry_run_validates_and_writes_nothing() -> None:
    out = io.StringIO()
    call_command("import_envscaler", "--metadata", str(EXAMPLES / "metadata.json"),
                 "--scenarios", str(EXAMPLES / "scenarios.json"), "--dry-run", stdout=out)
    assert "valid: 3 environment(s), 15 task(s); dry run, nothing written" in out.getvalue()
    assert Batch.objects.count() == 0


def test_the_command_imports_a_batch(tmp_path: Path) -> None:
    out = io.StringIO()
    call_command("import_envscaler", "--metadata", str(EXAMPLES / "metadata.json"),
                 "--scenarios", str(EXAMPLES / "scenarios.json"), "--batch", "cmd", stdout=out)
    batch = Batch.objects.get(name="cmd")
    assert batch.task_count == 15 and batch.source_format == "envscaler"
    assert f"Imported batch #{batch.pk} 'cmd': 15 envscaler task(s)." in out.getvalue()
    assert not Task.objects.filter(status=Task.Status.RUNNING).exists()


def test_the_command_lists_every_error_and_fails(tmp_path: Path) -> None:
    metadata, scenarios = inputs()
    scenarios[0]["env_name"] = "Nowhere"
    scenarios[1]["check_func"] = "nope("
    m, s = write_inputs(tmp_path, metadata, scenarios)
    err = io.StringIO()
    with pytest.raises(CommandError, match=r"2 error\(s\); nothing was imported"):
        call_command("import_envscaler", "--metadata", m, "--scenarios", s, stderr=err)
    assert "scenarios[0] (clinic-book-cardiology): env_name: 'Nowhere'" in err.getvalue()
    assert "scenarios[1] (clinic-cancel): check_func: syntax error" in err.getvalue()
    assert Batch.objects.count() == 0


def test_the_command_rejects_a_file_that_is_not_json(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(CommandError, match="--metadata .*bad.json: not valid JSON"):
        call_command("import_envscaler", "--metadata", str(bad), "--scenarios", str(EXAMPLES / "scenarios.json"))


# --- the upload page ----------------------------------------------------------------------------------

URL = "/engines/envscaler/import/"


def upload(client: Any, metadata: Any, scenarios: Any, **fields: Any) -> Any:
    files = {"metadata": SimpleUploadedFile("m.json", json.dumps(metadata).encode()),
             "scenarios": SimpleUploadedFile("s.json", json.dumps(scenarios).encode())}
    return client.post(URL, {**files, **fields})


def test_the_upload_page_needs_a_role_that_may_create_batches(client: Any, viewer: Any, make_user: Any) -> None:
    assert client.get(URL).status_code == 302  # to the login page
    client.force_login(viewer)
    assert client.get(URL).status_code == 403
    assert upload(client, METADATA, SCENARIOS).status_code == 403
    assert Batch.objects.count() == 0


def test_the_upload_page_imports_and_redirects_to_the_batch(client: Any, reviewer: Any) -> None:
    client.force_login(reviewer)
    page = client.get(URL)
    assert page.status_code == 200 and b"Import EnvScaler environments" in page.content
    response = upload(client, METADATA, SCENARIOS, batch="from the console")
    batch = Batch.objects.get(name="from the console")
    assert response.status_code == 302 and response["Location"] == f"/admin/tasks/batch/{batch.pk}/change/"
    assert batch.created_by == reviewer and batch.task_count == 15
    assert AuditEvent.objects.get(action="engines.envscaler_import").actor == reviewer


def test_the_upload_page_shows_per_item_errors_and_writes_nothing(client: Any, reviewer: Any) -> None:
    client.force_login(reviewer)
    metadata, scenarios = inputs()
    env(metadata, "WarehouseInventory")["operations"][0]["name"] = "get_stok"
    response = upload(client, metadata, scenarios)
    assert response.status_code == 400
    text = response.content.decode()
    assert "1 error; nothing was imported" in text
    assert "operations.get_stok" in text and "the class has no method &#x27;get_stok&#x27;" in text
    assert Batch.objects.count() == 0


def test_the_upload_page_rejects_a_file_that_is_not_json_and_a_dry_run_writes_nothing(client: Any,
                                                                                      reviewer: Any) -> None:
    client.force_login(reviewer)
    response = client.post(URL, {"metadata": SimpleUploadedFile("m.json", b"{"),
                                 "scenarios": SimpleUploadedFile("s.json", b"[]")})
    assert response.status_code == 400 and "is not valid UTF-8 JSON" in response.content.decode()
    response = upload(client, METADATA, SCENARIOS, dry_run="on")
    assert response.status_code == 200
    assert "Valid: 3 environments (ClinicScheduler, LibraryLoans, WarehouseInventory), 15 tasks." in (
        response.content.decode())
    assert Batch.objects.count() == 0


def test_hostile_code_in_an_upload_cannot_read_host_files_while_it_is_validated() -> None:
    metadata, scenarios = inputs()
    env(metadata, "LibraryLoans")["code"] += (
        "\nimport socket\n"
        "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    net = 'NET-OPEN'\n"
        "except OSError as exc:\n    net = 'net-blocked'\n"
        "raise RuntimeError(net + ' ' + open('/work/main/var/secret_key').read())\n"
    )
    errors = errors_of(metadata, scenarios)
    assert len(errors) == 1 and errors[0].startswith("metadata[2] (LibraryLoans): code: FileNotFoundError")
    secret = Path(settings.BASE_DIR, "var", "secret_key")
    if secret.exists():
        assert secret.read_text().strip() not in errors[0]


def test_the_command_with_once_reuses_a_batch_imported_from_the_same_input() -> None:
    args = ["import_envscaler", "--metadata", str(EXAMPLES / "metadata.json"),
            "--scenarios", str(EXAMPLES / "scenarios.json"), "--batch", "again", "--once"]
    call_command(*args, stdout=io.StringIO())
    out = io.StringIO()
    call_command(*args, stdout=out)
    batch = Batch.objects.get(name="again")
    assert f"Batch #{batch.pk} 'again' was already imported from this input; using it." in out.getvalue()
    assert AuditEvent.objects.filter(action="engines.envscaler_import").count() == 1
