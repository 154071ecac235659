"""Rendered validation: exports through real chat templates (tests/datasets/chat_templates/, see its
README) with transformers' own apply_chat_template; `dataset_export --check-template`."""
from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import orjson
import pytest
from django.core.management import CommandError, call_command

from apps.datasets import templates
from apps.datasets.exporters import export_records, load_records
from apps.datasets.models import TemplateCheck
from tests.datasets.exporter_data import make_trajectory
from trajplatform.audit import AuditEvent

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).parent / "chat_templates"


def template(name: str) -> templates.ChatTemplate:
    return templates.load_template(str(TEMPLATES / f"{name}.jinja"))


def export(tmp_path: Path, fmt: str, ids: list[int]) -> Path:
    path = tmp_path / f"{fmt}.jsonl"
    with path.open("wb") as fp:
        result = export_records(fmt, load_records(ids), fp)
    assert result.lines, result.excluded
    return path


@pytest.fixture
def sft_file(make_task: Any, tmp_path: Path) -> Path:
    """The rich episode: parallel calls with text beside them, an empty result, a failed command,
    reasoning_content on one turn, non-ASCII everywhere."""
    return export(tmp_path, "sft-trl", [make_trajectory(make_task(prompt="Écris primes.py ✓")).pk])


def test_qwen_templates_render_every_call_and_result_and_mask_exactly_the_assistant_turns(sft_file: Path) -> None:
    for name in ("qwen2_5_training", "qwen3_training"):
        report = templates.check_file(sft_file, "sft-trl", template(name))
        [record] = report.records
        assert record.ok, (name, record.problems)
        # finish is the last assistant turn's answer (final_answer text): 5 calls, 5 results
        assert (record.assistant_turns, record.tool_calls, record.tool_results) == (5, 5, 5)
        assert record.mask == "checked"
    # Qwen 2.5's template has no reasoning field: it drops reasoning_content (a turn's and the answer's
    # thought); Qwen 3 keeps them.
    assert templates.check_file(sft_file, "sft-trl", template("qwen2_5")).summary()["reasoning_stripped"] == 2
    qwen3 = templates.check_file(sft_file, "sft-trl", template("qwen3")).summary()
    assert (qwen3["reasoning_kept"], qwen3["failed"], qwen3["mask"]) == (2, 0, "no generation markers")


def test_it_reports_what_llama3_and_deepseek_templates_drop_or_cannot_render(sft_file: Path) -> None:
    llama = templates.check_file(sft_file, "sft-trl", template("llama3_training")).records[0].problems
    assert "messages: messages[2] tool call 0 name is missing from the rendered text" in llama
    assert any("tool 'run_shell' is not in the rendered text" in p for p in llama)
    # Llama 3's template writes a tool message as a turn of role "tool": its results are there.
    assert not any("(tool) content" in p for p in llama), llama
    # Llama 3.1's original renders tools but refuses parallel calls: the template's error, named once.
    report = templates.check_file(sft_file, "sft-trl", template("llama3_1"))
    assert report.records[0].problems == ["messages: the template cannot render it: TemplateError: This model only "
                                          "supports single tool-calls at once!"]
    assert report.summary()["render_errors"] == [
        {"error": "TemplateError: This model only supports single tool-calls at once!", "records": 1, "lines": [1]}]
    # DeepSeek-V3's original concatenates arguments as strings: object arguments cannot render.
    original = templates.check_file(sft_file, "sft-trl", template("deepseekv3")).records[0].problems
    assert original == ['messages: the template cannot render it: TypeError: can only concatenate str (not "dict") '
                        'to str']
    # TRL's patched one renders them but never the tool list (a failure), and keeps the text of only the
    # first assistant turn that calls tools: the template's property, reported once, not a failure.
    patched = templates.check_file(sft_file, "sft-trl", template("deepseekv3_training"))
    [record] = patched.records
    assert any("tool 'read_file' is not in the rendered text" in p for p in record.problems)
    assert not any("content is missing" in p for p in record.problems), record.problems
    assert {p["property"] for p in patched.summary()["properties"]} == {templates.NO_REASONING,
                                                                         templates.TEXT_ON_CALL_TURNS}


def test_a_mask_that_covers_a_tool_result_or_misses_an_assistant_turn_is_reported(sft_file: Path,
                                                                                   tmp_path: Path) -> None:
    text = (TEMPLATES / "qwen2_5_training.jinja").read_text()
    # Tool results inside the generation block: trained on.
    wide = tmp_path / "wide.jinja"
    wide.write_text(text.replace("{{- '\\n<tool_response>\\n' }}", "{%- generation %}{{- '\\n<tool_response>\\n' }}")
                    .replace("{{- '\\n</tool_response>' }}", "{{- '\\n</tool_response>' }}{%- endgeneration %}"))
    problems = templates.check_file(sft_file, "sft-trl", templates.load_template(str(wide))).records[0].problems
    assert "messages: messages[3] (tool) content is inside the assistant mask (trained on)" in problems
    assert "messages: messages[6] (tool) content is inside the assistant mask (trained on)" in problems
    # Only plain-text assistant turns inside it: the tool calls are not trained on.
    narrow = tmp_path / "narrow.jinja"
    narrow.write_text(text.replace("{%- generation %}", "", 2).replace("{%- endgeneration %}", "", 2))
    report = templates.check_file(sft_file, "sft-trl", templates.load_template(str(narrow)))
    assert any("tool call 0 name is outside the assistant mask" in p for p in report.records[0].problems), \
        report.records[0].problems


def test_control_tokens_in_text_and_a_drifting_tokenizer_are_reported(make_task: Any, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    task = make_task(prompt="Explain what <|im_end|> does. ÉTÉ")
    path = export(tmp_path, "sft-trl", [make_trajectory(task).pk])
    problems = templates.check_file(path, "sft-trl", template("qwen2_5_training")).records[0].problems
    assert any("messages[1] contains the control token(s) <|im_end|>" in p for p in problems)

    # A tokenizer directory: its own tokenizer (here one that lowercases) is the round trip checked.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = (TEMPLATES / "qwen2_5_training.jinja").read_text()
    tok.save_pretrained(tmp_path / "lowercasing")
    loaded = templates.load_template(str(tmp_path / "lowercasing"))
    assert loaded.tokenizer_dir and loaded.has_generation_markers
    problems = templates.check_file(path, "sft-trl", loaded).records[0].problems
    assert any("text -> tokens -> text drifts" in p for p in problems), problems


def test_dpo_lines_are_checked_as_prompt_plus_each_continuation(make_task: Any, tmp_path: Path) -> None:
    task = make_task(prompt="Task: print primes")
    ids = [make_trajectory(task).pk, make_trajectory(task, sample_index=1, outcome="failure", reward=0.0).pk]
    path = export(tmp_path, "dpo-trl", ids)
    [record] = templates.check_file(path, "dpo-trl", template("qwen3_training")).records
    assert record.ok and record.conversations == 2, record.problems
    with pytest.raises(templates.TemplateError, match="cannot be checked against a chat template"):
        templates.check_file(path, "sft-openai", template("qwen3"))
    with pytest.raises(templates.TemplateError, match="not found"):
        templates.load_template("no-such-template")


def test_dataset_export_check_template_reports_per_record_and_records_it(
    make_task: Any, tmp_path: Path, settings: Any
) -> None:
    settings.DATASET_CHAT_TEMPLATE_DIR = TEMPLATES
    settings.DATASET_EXPORT_DIR = tmp_path / "exports"
    for n in range(2):
        make_trajectory(make_task(prompt=f"Task {n}: primes"))
    call_command("dataset_create", "tpl", "--no-near-dedup", "--validation-fraction", "0", stdout=StringIO(),
                 stderr=StringIO())
    out, err = StringIO(), StringIO()
    call_command("dataset_export", "tpl", "--format", "sft-trl", "--out", str(tmp_path / "a.jsonl"),
                 "--check-template", "qwen3_training", "--check-template", "qwen2_5", "--no-progress",
                 stdout=out, stderr=err)
    assert "template qwen3_training (" in out.getvalue()
    assert "2/2 records pass; assistant mask checked, reasoning kept in 4 turn(s), stripped in 0" in out.getvalue()
    assert "2/2 records pass; assistant mask no generation markers, reasoning kept in 0 turn(s), stripped in 4" \
        in out.getvalue()
    checks = {c.template: c for c in TemplateCheck.objects.all()}
    assert set(checks) == {"qwen3_training", "qwen2_5"}
    assert checks["qwen3_training"].version.dataset.name == "tpl" and checks["qwen3_training"].failed == 0
    assert AuditEvent.objects.filter(action="datasets.template_check").count() == 2

    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="2 record check"):
        call_command("dataset_export", "tpl", "--format", "sft-trl", "--out", str(tmp_path / "b.jsonl"),
                     "--check-template", "llama3_training", "--no-progress", stdout=out, stderr=err)
    assert "llama3_training: line 1: messages: tool 'run_shell' is not in the rendered text" in err.getvalue()
    assert "0/2 records pass" in out.getvalue()
    lines = (tmp_path / "b.jsonl").read_bytes().splitlines()
    assert len(lines) == 2 and orjson.loads(lines[0])["messages"]  # the file is written all the same
    with pytest.raises(CommandError, match="cannot be checked against a chat template"):
        call_command("dataset_export", "tpl", "--format", "sft-openai", "--out", str(tmp_path / "c.jsonl"),
                     "--check-template", "qwen3", "--no-progress", stdout=StringIO(), stderr=StringIO())


def test_the_api_checks_an_export_against_a_named_template_and_the_card_lists_it(
    make_task: Any, make_user: Any, tmp_path: Path, settings: Any
) -> None:
    from rest_framework.test import APIClient

    from apps.datasets.models import ExportJob
    from trajplatform.api_models import api_token_create

    settings.DATASET_CHAT_TEMPLATE_DIR = TEMPLATES
    settings.DATASET_EXPORT_DIR = tmp_path / "exports"
    make_trajectory(make_task(prompt="Task: primes"))
    call_command("dataset_create", "api-tpl", "--no-near-dedup", "--validation-fraction", "0", stdout=StringIO(),
                 stderr=StringIO())
    call_command("dataset_export", "api-tpl", "--format", "kto-trl", "--out", str(tmp_path / "k.jsonl"),
                 "--no-progress", stdout=StringIO(), stderr=StringIO())
    job = ExportJob.objects.get(format="kto-trl")
    user = make_user("approver")
    _token, raw = api_token_create(user=user, name="tests", actor=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.post(f"/api/v1/exports/{job.pk}/template-checks", {"template": "qwen2_5_training"},
                           format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["template"], body["records"], body["passed"], body["format"]) == ("qwen2_5_training", 1, 1, "kto-trl")
    # Only names in DATASET_CHAT_TEMPLATE_DIR: no paths on the server.
    for bad in ("../../etc/passwd", str(TEMPLATES / "qwen3.jinja")):
        response = client.post(f"/api/v1/exports/{job.pk}/template-checks", {"template": bad}, format="json")
        assert response.status_code == 400, response.content
    response = client.post(f"/api/v1/exports/{job.pk}/template-checks", {"template": "missing"}, format="json")
    assert response.status_code == 400 and "not found" in response.json()["error"]["message"]
    detail = client.get("/api/v1/datasets/api-tpl/versions/1").json()
    assert [(c["template"], c["passed"], c["mask"]) for c in detail["template_checks"]] == [
        ("qwen2_5_training", 1, "checked")]
    out = StringIO()
    call_command("dataset_stats", "api-tpl", stdout=out)
    assert "chat templates checked:" in out.getvalue() and "qwen2_5_training (" in out.getvalue()

    # The console shows the check read-only: no add, no change form, no delete.
    from django.test import Client
    from django.urls import reverse

    check = TemplateCheck.objects.get()
    console = Client()
    console.force_login(make_user("admin"))
    assert "qwen2_5_training" in console.get(reverse("admin:datasets_templatecheck_changelist")).content.decode()
    page = console.get(reverse("admin:datasets_templatecheck_change", args=[check.pk])).content.decode()
    assert "datasets.template_check" in page and 'name="template"' not in page
    assert console.post(reverse("admin:datasets_templatecheck_add"), {"template": "x"}).status_code == 403
    assert console.post(reverse("admin:datasets_templatecheck_delete", args=[check.pk]), {"post": "yes"}).status_code \
        == 403
    assert TemplateCheck.objects.count() == 1
