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

/metrics is the Prometheus text format (0.0.4): queue depth, tasks and trajectories by status,
steps per second and LLM latency over the last METRICS_WINDOW_S (from the `llm` metadata stored
on each step of trajectories finished in the window), LLM call and error counts, live sandboxes
by backend and webhook deliveries by status.
"""
from __future__ import annotations

import logging
import math
import time
from datetime import timedelta
from typing import Any, Callable

from django.conf import settings
from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from trajplatform.redaction import redact

logger = logging.getLogger(__name__)

METRICS_WINDOW_S = 300
# Trajectories read for the windowed metrics: a bound so /metrics stays cheap at any size.
METRICS_SAMPLE = 2000


def check_database() -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return {"status": "ok", "vendor": connection.vendor}


def _overdue_schedules(stale_s: float) -> tuple[int, Any]:
    """(how many repeating schedules are overdue by more than stale_s, the oldest next_run)."""
    from django_q.models import Schedule

    cutoff = timezone.now() - timedelta(seconds=stale_s)
    repeating = Schedule.objects.exclude(schedule_type=Schedule.ONCE).exclude(repeats=0)
    overdue = repeating.filter(next_run__lt=cutoff)
    oldest = overdue.order_by("next_run").values_list("next_run", flat=True).first()
    return overdue.count(), oldest


def check_queue() -> dict[str, Any]:
    from django_q.brokers import get_broker
    from django_q.status import Stat

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
    from apps.engines.sandboxes import get_backend

    from apps.engines.sandboxes.cgroups import CONTROLLERS

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
    import httpx

    from apps.engines.llm import resolve_providers

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.sample(name, labels, value)

    def sample(self, name: str, labels: dict[str, str], value: float) -> None:
        label_text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
        number = "NaN" if isinstance(value, float) and math.isnan(value) else repr(float(value))
        self.lines.append(f"{name}{{{label_text}}} {number}" if label_text else f"{name} {number}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def _window_stats(now: Any) -> tuple[int, list[float], int]:
    """(steps, LLM latencies in seconds, LLM calls) of trajectories finished in the window."""
    from apps.tasks.models import Trajectory

    since = now - timedelta(seconds=METRICS_WINDOW_S)
    rows = (
        Trajectory.objects.filter(created_at__gte=now - timedelta(days=1), finished_at__gte=since)
        .order_by("-id").values_list("steps", flat=True)[:METRICS_SAMPLE]
    )
    steps = 0
    latencies: list[float] = []
    for trajectory_steps in rows:
        turns: set[str] = set()
        for step in trajectory_steps or []:
            if not isinstance(step, dict):
                continue
            steps += 1
            llm = step.get("llm")
            if isinstance(llm, dict) and isinstance(llm.get("latency_ms"), (int, float)):
                # The steps of one model turn carry the same llm record: count each call once.
                turn = repr(sorted(llm.items()))
                if turn not in turns:
                    turns.add(turn)
                    latencies.append(float(llm["latency_ms"]) / 1000)
    return steps, sorted(latencies), len(latencies)


def render_metrics() -> str:
    from apps.engines.models import SandboxRecord
    from apps.tasks.models import Task, Trajectory
    from trajplatform.webhooks import WebhookDelivery

    now = timezone.now()
    out = _Exposition()
    try:
        from django_q.brokers import get_broker

        depth = float(get_broker().queue_size())
    except Exception as exc:
        logger.warning("metrics: queue depth unavailable: %s", exc)
        depth = float("nan")
    out.family("trajplatform_queue_depth", "gauge", "Jobs waiting in the django-q2 queue.", [({}, depth)])

    def by_status(model: Any, statuses: list[str]) -> list[tuple[dict[str, str], float]]:
        counts = dict(model.objects.order_by().values_list("status").annotate(n=Count("id")))
        return [({"status": s}, float(counts.get(s, 0))) for s in statuses]

    out.family("trajplatform_tasks", "gauge", "Tasks by status.", by_status(Task, list(Task.Status.values)))
    out.family("trajplatform_trajectories", "gauge", "Trajectories by status.",
               by_status(Trajectory, list(Trajectory.Status.values)))
    outcomes = dict(
        Trajectory.objects.filter(status=Trajectory.Status.FINISHED).order_by().values_list("outcome")
        .annotate(n=Count("id"))
    )
    out.family("trajplatform_trajectories_finished", "gauge", "Finished trajectories by outcome.",
               [({"outcome": o}, float(outcomes.get(o, 0))) for o in Trajectory.Outcome.values])

    steps, latencies, calls = _window_stats(now)
    out.family("trajplatform_steps_per_second", "gauge",
               f"Agent steps per second over the last {METRICS_WINDOW_S}s (trajectories finished in the window).",
               [({}, steps / METRICS_WINDOW_S)])
    out.lines.append(f"# HELP trajplatform_llm_latency_seconds LLM call latency over the last {METRICS_WINDOW_S}s.")
    out.lines.append("# TYPE trajplatform_llm_latency_seconds summary")
    for q in (0.5, 0.9, 0.99):
        out.sample("trajplatform_llm_latency_seconds", {"quantile": str(q)}, _quantile(latencies, q))
    out.sample("trajplatform_llm_latency_seconds_sum", {}, sum(latencies))
    out.sample("trajplatform_llm_latency_seconds_count", {}, float(calls))
    llm_errors = Trajectory.objects.filter(
        outcome=Trajectory.Outcome.ERROR, outcome_reason__startswith="LLM error"
    ).count()
    out.family("trajplatform_llm_errors", "gauge",
               "Trajectories that ended in an LLM error (after the client's retries).", [({}, float(llm_errors))])

    live = dict(
        SandboxRecord.objects.filter(state__in=list(SandboxRecord.LIVE)).order_by().values_list("backend")
        .annotate(n=Count("id"))
    )
    backends = sorted(set(live) | {settings.SANDBOX_BACKEND})
    out.family("trajplatform_sandboxes_alive", "gauge", "Sandboxes not yet destroyed, by backend.",
               [({"backend": b}, float(live.get(b, 0))) for b in backends])
    out.family("trajplatform_webhook_deliveries", "gauge", "Webhook deliveries by status.",
               by_status(WebhookDelivery, list(WebhookDelivery.Status.values)))
    return out.text()


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(render_metrics(), content_type="text/plain; version=0.0.4; charset=utf-8")
    response["Cache-Control"] = "no-store"
    return response
