"""`GET /health` (is every part the platform needs working?) and `GET /metrics` (Prometheus).

/health checks, each with its own status and detail, overall "ok" (HTTP 200) only when all
are ok, else "down" (HTTP 503) naming the failing parts:

* database: `SELECT 1`;
* queue: the django-q2 broker answers (ping, queue depth) and a worker cluster is alive: with
  Redis, a cluster's stats are present; in any case the periodic schedules (the reaper, the
  webhook sweep) are not overdue by more than HEALTH_QUEUE_STALE_S (a cluster runs them);
* sandbox: the configured backend's `check()` (bubblewrap usable and the root writable, or the
  OpenSandbox server listing sandboxes); nothing is created;
* llm: GET {base_url}/models of the primary provider with HEALTH_LLM_TIMEOUT_S; with the offline
  scripted model configured the mode is reported as "offline stand-in" (it must still answer).

Both are unauthenticated and reveal no secrets (URLs are redacted) and no data.

/metrics is the Prometheus text format (0.0.4), written by prometheus-client from the database
at scrape time: trajplatform/metrics.py lists the metrics.
"""
from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Any, Callable

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from django_q.brokers import get_broker
from django_q.models import Schedule
from django_q.status import Stat

from apps.engines.llm import resolve_providers
from apps.engines.sandboxes import get_backend
from apps.engines.sandboxes.cgroups import CONTROLLERS

# /metrics: prometheus-client, every value read from the database at scrape time (metrics.py);
# METRICS_WINDOW_S and render_metrics are re-exported for their callers here.
from trajplatform.metrics import CONTENT_TYPE, METRICS_WINDOW_S, render_metrics  # noqa: F401
from trajplatform.redaction import redact

logger = logging.getLogger(__name__)



def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"status": "ok", "vendor": connection.vendor}


def _overdue_schedules(stale_s: float) -> tuple[int, Any]:
    """(how many repeating schedules are overdue by more than stale_s, the oldest next_run)."""
    cutoff = timezone.now() - timedelta(seconds=stale_s)
    repeating = Schedule.objects.exclude(schedule_type=Schedule.ONCE).exclude(repeats=0)
    overdue = repeating.filter(next_run__lt=cutoff)
    oldest = overdue.order_by("next_run").values_list("next_run", flat=True).first()
    return overdue.count(), oldest


def check_queue() -> dict[str, Any]:
    broker = get_broker()
    if not broker.ping():
        return {"status": "down", "detail": f"the django-q2 broker ({broker.info()}) does not answer"}
    depth = broker.queue_size()
    clusters = len(Stat.get_all(broker)) if settings.REDIS_URL else None
    overdue, oldest = _overdue_schedules(settings.HEALTH_QUEUE_STALE_S)
    result: dict[str, Any] = {"broker": redact(broker.info()), "depth": depth}
    if clusters is not None:
        result["clusters"] = clusters
    if overdue:
        result.update(
            status="down",
            detail=f"no worker cluster is running: {overdue} periodic job(s) overdue since {oldest:%Y-%m-%d %H:%M:%S %Z} "
                   "(start one with `make worker` / `manage.py qcluster`)",
        )
    elif clusters == 0:
        result.update(status="down", detail="no worker cluster has reported to the Redis broker")
    else:
        result["status"] = "ok"
    return result


def check_sandbox() -> dict[str, Any]:
    problems = get_backend().check()
    # A missing cgroup controller is a recorded downgrade (rlimits still apply), not an outage.
    downgrades = tuple(f"{c}:" for c in CONTROLLERS) if settings.SANDBOX_BACKEND == "local" else ()
    fatal = [p for p in problems if "create will refuse" in p or not (downgrades and p.startswith(downgrades))]
    result: dict[str, Any] = {"backend": settings.SANDBOX_BACKEND, "problems": redact(problems)}
    result["status"] = "down" if fatal else "ok"
    if fatal:
        result["detail"] = redact("; ".join(fatal))
    return result


def check_llm() -> dict[str, Any]:
    import httpx  # deferred: heavy (httpx), only for this check

    provider = resolve_providers()[0]
    offline = provider.name == "offline"
    result: dict[str, Any] = {
        "provider": provider.name,
        "model": provider.model,
        "mode": "offline stand-in (scripted-reference replays bundled solutions; not an LLM)" if offline else "live",
        "url": redact(provider.base_url),
    }
    headers = {"Authorization": f"Bearer {provider.api_key}"} if provider.api_key else {}
    url = provider.base_url.rstrip("/") + "/models"
    started = time.monotonic()
    try:
        response = httpx.get(url, headers=headers, timeout=settings.HEALTH_LLM_TIMEOUT_S, follow_redirects=False)
    except httpx.HTTPError as exc:
        return {**result, "status": "down", "detail": redact(f"{type(exc).__name__}: {exc}")}
    result["latency_ms"] = round((time.monotonic() - started) * 1000)
    if response.status_code >= 500 or response.status_code in (401, 403):
        return {**result, "status": "down", "detail": f"GET /models answered HTTP {response.status_code}"}
    return {**result, "status": "ok", "http_status": response.status_code}


CHECKS: dict[str, Callable[[], dict[str, Any]]] = {
    "database": check_database,
    "queue": check_queue,
    "sandbox": check_sandbox,
    "llm": check_llm,
}


def run_checks() -> tuple[bool, dict[str, Any]]:
    """Every check, each isolated from the others' failures; (all ok, report)."""
    report: dict[str, Any] = {}
    for name, check in CHECKS.items():
        started = time.monotonic()
        try:
            outcome = check()
        except Exception as exc:  # a failing part is reported, never a 500
            logger.warning("health check %s failed: %s", name, exc)
            outcome = {"status": "down", "detail": redact(f"{type(exc).__name__}: {exc}")}
        outcome["duration_ms"] = round((time.monotonic() - started) * 1000)
        report[name] = outcome
    healthy = all(part["status"] == "ok" for part in report.values())
    return healthy, report


@require_GET
def health(request: HttpRequest) -> JsonResponse:
    healthy, report = run_checks()
    down = [name for name, part in report.items() if part["status"] != "ok"]
    body = {"status": "ok" if healthy else "down", "down": down, "checks": report, "time": timezone.now().isoformat()}
    response = JsonResponse(body, status=200 if healthy else 503)
    response["Cache-Control"] = "no-store"
    return response


# --- metrics -------------------------------------------------------------------------------------


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(render_metrics(), content_type=CONTENT_TYPE)
    response["Cache-Control"] = "no-store"
    return response
