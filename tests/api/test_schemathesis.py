"""Property-based run of our own OpenAPI schema (schemathesis): no 5xx, and every response
(status code, content type, body) conforms to the schema. Examples per operation are kept
modest so the whole run stays within about a minute."""
from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

pytestmark = pytest.mark.django_db

EXAMPLES = 10
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(autouse=True)
def _hypothesis_home(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Hypothesis keeps caches on disk: in a temporary folder, not in the checkout."""
    from hypothesis import configuration

    configuration.set_hypothesis_home_dir(str(tmp_path_factory.mktemp("hypothesis")))
    yield
    configuration.set_hypothesis_home_dir(None)


@pytest.fixture
def api_schema(db: Any) -> Any:
    """The schema served by our WSGI app, which also answers the generated requests.

    As Django's test client does, requests must not close the test's database connection.
    """
    from django.core import signals
    from django.core.wsgi import get_wsgi_application
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@pytest.fixture
def data(make_task: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.datasets.models import Dataset, DatasetVersion
    from apps.reviews.models import Proposal
    from apps.tasks import services
    from apps.tasks.models import Trajectory

    monkeypatch.setattr(services, "dispatch_rollouts", lambda **kw: None)
    task = make_task(status="waiting_approval", current_iteration=1)
    Trajectory.objects.create(task=task, iteration=1, status="finished", outcome="success", steps=[{"tool": "x"}])
    Proposal.objects.create(task=task, iteration=1, field="temperature", from_value=0.7, to_value=0.3,
                            options=[0.3, 0.5], tier="yellow", proposer="review-agent")
    DatasetVersion.objects.create(dataset=Dataset.objects.create(name="st-ds"), number=1)


def test_the_api_conforms_to_its_schema(api_schema: Any, data: None, make_token: Any, settings: Any) -> None:
    settings.API_THROTTLE_RATE = "100000/min"
    _token, raw = make_token("admin")
    headers = {"Authorization": f"Bearer {raw}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 25
    failures: list[str] = []
    calls: dict[str, int] = {}
    for operation in operations:
        @given(case=operation.as_strategy())
        @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
        def run(case: Any) -> None:
            response = case.call(headers=headers)
            calls[operation.label] = calls.get(operation.label, 0) + 1
            case.validate_response(response, checks=CHECKS)

        try:
            run()
        except (Exception, BaseExceptionGroup) as exc:  # collect every operation's failure, then report them together
            failures.append(f"{operation.method.upper()} {operation.path}: {str(exc)[:1500]}")
    assert not failures, "\n\n".join(failures)
    assert len(calls) == len(operations) and min(calls.values()) >= 2, calls


def test_schema_and_docs_are_public_and_served_locally(client: Any) -> None:
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    body = schema.json()
    assert body["openapi"].startswith("3.") and "/api/v1/tasks" in body["paths"]
    assert body["components"]["securitySchemes"]["apiToken"] == {
        "type": "http", "scheme": "bearer", "description": "a per-user API token (console: API tokens)"}
    docs = client.get("/api/docs/")
    html = docs.content.decode()
    assert docs.status_code == 200 and "swagger-ui" in html
    assert "drf_spectacular_sidecar" in html and "cdn.jsdelivr" not in html
