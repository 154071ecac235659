"""The bundled multi_agent demo (examples/tasks/multi_agent.jsonl + examples/multi_agent/roles.jsonl,
written by examples/multi_agent/build.py) through `manage.py synthesize --wait`, as `make demo`
runs it: real loop, real sandbox, the offline model replaying the lead's and the roles' scripts,
code_exec's pytest verifier deciding each shared reward, then the review."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from apps.tasks.models import Batch, Trajectory
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_deep_search_demo import corpus_settings, debian_corpus  # noqa: F401 (fixtures)
from tests.tasks.test_synthesize import offline_only, synthesize  # noqa: F401 (fixture)

EXAMPLES = Path(settings.BASE_DIR) / "examples"
TASKS = EXAMPLES / "tasks" / "multi_agent.jsonl"
ROLES = EXAMPLES / "multi_agent" / "roles.jsonl"


def test_the_demo_files_are_what_build_py_writes() -> None:
    result = subprocess.run([sys.executable, str(EXAMPLES / "multi_agent" / "build.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("sandbox_settings", "corpus_settings")
def test_the_demo_batch_runs_every_role_and_the_base_verifier_scores_it(offline_only) -> None:
    output = synthesize("--tasks", str(TASKS), "--batch", "demo-multi-agent", "--wait", "--start-offline-model",
                        "--solutions", str(TASKS), str(ROLES))
    batch = Batch.objects.get(name="demo-multi-agent")
    leads = {t.task.external_id: t for t in Trajectory.objects.filter(task__batch=batch, iteration=1)}
    assert sorted(leads) == ["ma-001", "ma-002", "ma-003", "ma-004", "ma-005", "ma-006"], output
    rewards = {key: t.reward for key, t in leads.items()}
    assert rewards == {"ma-001": 1.0, "ma-002": 1.0, "ma-003": 1.0, "ma-004": 0.0, "ma-005": 1.0, "ma-006": 1.0}, [
        (k, t.outcome_reason) for k, t in leads.items()]
    for key, lead in leads.items():
        roles = [(c.role, c.outcome) for c in lead.subtrajectories()]
        if key == "ma-005":  # round robin: every other role took its turn
            assert roles == [("alice", "success"), ("bob", "success")]
        elif key == "ma-006":  # over deep_search: the pages the researcher opened are the cited sources
            assert roles == [("researcher", "success"), ("verifier", "success")]
            assert lead.verifier_output["sources_ok"] is True
        else:
            assert roles == [("coder", "success"), ("tester", "success")]
        assert lead.verifier_output["multi_agent"]["roles_never_acted"] == []
