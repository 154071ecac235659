"""`GET /metrics`: the platform's Prometheus metrics, through prometheus-client.

Every value is read from the database (and the broker's queue length) when /metrics is scraped,
by one collector: the rows are the shared state of every web server and worker machine, so one
scrape of any web replica describes the whole platform, with no per-process registries and no
multiprocess directory to share. Gauges only (the counts can go down as rows are pruned).

* queue: jobs waiting in the broker; tasks and trajectories by status; queued trajectories
  due now or waiting out a back-off; rollouts in flight per worker machine (host name);
* windowed (trajectories finished in the last METRICS_WINDOW_S, at most METRICS_SAMPLE of them,
  from the `llm` record on each step): agent steps/s, model latency (overall and per provider),
  model calls and retried attempts per provider (429s, 5xx, timeouts the client retried), and of
  those the 429s;
* errors: trajectories that ended in an LLM error;
* sandboxes: alive by backend; created, failed (last_error set) and taken from the warm pool
  in the window, by backend;
* exports by status; webhook deliveries by status;
* spend: USD recorded on trajectories, in the window, today (UTC, what BUDGET_DAILY_USD caps) and
  in all; the daily cap.
"""
from __future__ import annotations

import logging
import math
from collections import defaultdict
from datetime import timedelta
from typing import Any, Iterator

from django.conf import settings
from django.db import connection
from django.db.models import Count, IntegerField, JSONField, Q, Sum
from django.db.models.expressions import RawSQL
from django.utils import timezone
from django_q.brokers import get_broker
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from apps.datasets.models import ExportJob
from apps.engines.models import SandboxRecord
from apps.tasks.jobs import claimable
from apps.tasks.models import Task, Trajectory
from trajplatform.webhooks import WebhookDelivery

logger = logging.getLogger("trajplatform.metrics")

METRICS_WINDOW_S = 300
# Trajectories read for the windowed metrics: a bound so /metrics stays cheap at any size.
METRICS_SAMPLE = 2000
QUANTILES = (0.5, 0.9, 0.99)
# The text exposition format generate_latest writes.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[index]


def _gauge(name: str, doc: str, label: str | None, values: dict[str, float] | float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label] if label else None)
    if label is None:
        family.add_metric([], float(values))  # type: ignore[arg-type]
    else:
        for key, value in sorted(values.items()):  # type: ignore[union-attr]
            family.add_metric([key], float(value))
    return family


def _summary(name: str, doc: str, by: dict[tuple[str, ...], list[float]], labels: tuple[str, ...] = ()) -> Metric:
    """A summary with the window's quantiles, sum and count (prometheus-client's
    SummaryMetricFamily has no quantiles)."""
    family = Metric(name, doc, "summary")
    if not by and not labels:
        by = {(): []}
    for key, values in sorted(by.items()):
        values = sorted(values)
        base = dict(zip(labels, key))
        for q in QUANTILES:
            family.add_sample(name, {**base, "quantile": str(q)}, _quantile(values, q))
        family.add_sample(f"{name}_sum", base, float(sum(values)))
        family.add_sample(f"{name}_count", base, float(len(values)))
    return family


def _counts(model: Any, field: str, keys: list[str], rows: Any = None) -> dict[str, float]:
    counts = dict((rows if rows is not None else model.objects).order_by().values_list(field).annotate(n=Count("id")))
    return {key: float(counts.get(key, 0)) for key in sorted(set(keys) | set(counts))}


def _json_length(column: str) -> RawSQL:
    fn = "jsonb_array_length" if connection.vendor == "postgresql" else "json_array_length"
    return RawSQL(f"{fn}({_column(column)})", [], output_field=IntegerField())


def _llm_records() -> RawSQL:
    """Each trajectory's steps' `llm` records (steps without one left out), as a JSON list."""
    steps = _column("steps")
    if connection.vendor == "postgresql":
        sql = f"jsonb_path_query_array({steps}, '$[*].llm')"
    else:
        sql = (f"(SELECT json_group_array(json(json_extract(value, '$.llm'))) FROM json_each({steps}) "
               "WHERE json_extract(value, '$.llm') IS NOT NULL)")
    return RawSQL(sql, [], output_field=JSONField())


def _column(name: str) -> str:
    quote = connection.ops.quote_name
    return f"{quote(Trajectory._meta.db_table)}.{quote(name)}"


class LLMWindow:
    """Model calls of the trajectories finished in the window, read from their steps."""

    def __init__(self, now: Any):
        since = now - timedelta(seconds=METRICS_WINDOW_S)
        # Only each step's `llm` record leaves the database, not the steps (their outputs are most
        # of a trajectory's bytes): 2,000 trajectories of 30 steps took 1.2-1.4 s when whole.
        rows = (Trajectory.objects.filter(created_at__gte=now - timedelta(days=1), finished_at__gte=since)
                .annotate(n_steps=_json_length("steps"), llm_records=_llm_records())
                .order_by("-id").values_list("n_steps", "llm_records")[:METRICS_SAMPLE])
        self.steps = 0
        self.latencies: list[float] = []
        self.by_provider: dict[tuple[str], list[float]] = defaultdict(list)
        self.retries: dict[str, float] = defaultdict(float)
        self.rate_limited: dict[str, float] = defaultdict(float)
        for n_steps, records in rows:
            self.steps += n_steps or 0
            turns: set[str] = set()
            for llm in records or []:
                if not (isinstance(llm, dict) and isinstance(llm.get("latency_ms"), (int, float))):
                    continue
                # The steps of one model turn carry the same llm record: count each call once.
                turn = repr(sorted(llm.items()))
                if turn in turns:
                    continue
                turns.add(turn)
                seconds = float(llm["latency_ms"]) / 1000
                provider = str(llm.get("provider") or "unknown")
                self.latencies.append(seconds)
                self.by_provider[(provider,)].append(seconds)
                attempts = llm.get("attempts")
                self.retries[provider] += max(0, int(attempts) - 1) if isinstance(attempts, int) else 0
                limited = llm.get("rate_limited")
                self.rate_limited[provider] += limited if isinstance(limited, int) else 0


class PlatformCollector:
    """Reads every metric from the database when collected (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        since = now - timedelta(seconds=METRICS_WINDOW_S)
        try:
            depth = float(get_broker().queue_size())
        except Exception as exc:
            logger.warning("metrics: queue depth unavailable: %s", exc)
            depth = float("nan")
        yield _gauge("trajplatform_queue_depth", "Jobs waiting in the django-q2 queue.", None, depth)
        yield _gauge("trajplatform_tasks", "Tasks by status.", "status", _counts(Task, "status", list(Task.Status.values)))
        yield _gauge("trajplatform_trajectories", "Trajectories by status.", "status",
                     _counts(Trajectory, "status", list(Trajectory.Status.values)))
        due = claimable().count()
        queued = Trajectory.objects.filter(status=Trajectory.Status.QUEUED).count()
        yield _gauge("trajplatform_trajectories_queued",
                     "Queued trajectories a worker may claim now (due) or that wait out a back-off or their task "
                     "(waiting).", "state", {"due": due, "waiting": max(0, queued - due)})
        in_flight: dict[str, float] = defaultdict(float)
        for worker, n in (Trajectory.objects.filter(status=Trajectory.Status.RUNNING).order_by()
                          .values_list("worker").annotate(n=Count("id"))):
            in_flight[(worker or "unclaimed").split(":", 1)[0]] += n
        yield _gauge("trajplatform_rollouts_in_flight", "Running trajectories per worker machine (host name).",
                     "worker", dict(in_flight))
        yield _gauge("trajplatform_trajectories_finished", "Finished trajectories by outcome.", "outcome",
                     _counts(Trajectory, "outcome", list(Trajectory.Outcome.values),
                             Trajectory.objects.filter(status=Trajectory.Status.FINISHED)))

        window = LLMWindow(now)
        yield _gauge("trajplatform_steps_per_second",
                     f"Agent steps per second over the last {METRICS_WINDOW_S}s (trajectories finished in the window).",
                     None, window.steps / METRICS_WINDOW_S)
        yield _summary("trajplatform_llm_latency_seconds", f"LLM call latency over the last {METRICS_WINDOW_S}s.",
                       {(): window.latencies})
        yield _summary("trajplatform_llm_provider_latency_seconds",
                       f"LLM call latency per provider over the last {METRICS_WINDOW_S}s.",
                       dict(window.by_provider), labels=("provider",))
        yield _gauge("trajplatform_llm_retries",
                     f"Attempts the LLM client retried (429, 5xx, timeouts) per provider over the last "
                     f"{METRICS_WINDOW_S}s.", "provider", dict(window.retries))
        yield _gauge("trajplatform_llm_rate_limited",
                     f"Attempts a provider answered with HTTP 429, per provider over the last {METRICS_WINDOW_S}s "
                     "(of the calls that then succeeded).", "provider", dict(window.rate_limited))
        llm_errors = Trajectory.objects.filter(outcome=Trajectory.Outcome.ERROR,
                                               outcome_reason__startswith="LLM error").count()
        yield _gauge("trajplatform_llm_errors", "Trajectories that ended in an LLM error (after the client's retries).",
                     None, llm_errors)

        backends = sorted(set(SandboxRecord.objects.order_by().values_list("backend", flat=True).distinct())
                          | {settings.SANDBOX_BACKEND})
        alive = _counts(SandboxRecord, "backend", backends,
                        SandboxRecord.objects.filter(state__in=list(SandboxRecord.LIVE)))
        yield _gauge("trajplatform_sandboxes_alive", "Sandboxes not yet destroyed, by backend.", "backend", alive)
        recent = (SandboxRecord.objects.filter(created_at__gte=since).order_by().values("backend")
                  .annotate(created=Count("id"), failed=Count("id", filter=~Q(last_error="")),
                            pooled=Count("id", filter=Q(claimed_at__isnull=False))))
        by_backend = {row["backend"]: row for row in recent}
        for name, key, doc in (
                ("trajplatform_sandbox_creates", "created", "Sandboxes created"),
                ("trajplatform_sandbox_failures", "failed", "Sandboxes created that recorded an error"),
                ("trajplatform_sandbox_pool_hits", "pooled", "Sandboxes created that were taken from the warm pool")):
            yield _gauge(name, f"{doc} in the last {METRICS_WINDOW_S}s, by backend.", "backend",
                         {b: by_backend.get(b, {}).get(key, 0) for b in backends})

        yield _gauge("trajplatform_exports", "Dataset export jobs by status.", "status",
                     _counts(ExportJob, "status", list(ExportJob.Status.values)))
        yield _gauge("trajplatform_webhook_deliveries", "Webhook deliveries by status.", "status",
                     _counts(WebhookDelivery, "status", list(WebhookDelivery.Status.values)))
        midnight = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)  # now() is in UTC
        spend = Trajectory.objects.aggregate(all=Sum("cost_usd"), window=Sum("cost_usd", filter=Q(finished_at__gte=since)),
                                             today=Sum("cost_usd", filter=Q(finished_at__gte=midnight)))
        yield _gauge("trajplatform_llm_spend_usd", f"USD recorded on trajectories: all, those finished in the last "
                     f"{METRICS_WINDOW_S}s (window) and since 00:00 UTC (today).", "scope",
                     {k: float(spend[k] or 0) for k in ("all", "window", "today")})
        yield _gauge("trajplatform_budget_daily_usd", "The platform's daily spend cap, BUDGET_DAILY_USD (0: none).", None,
                     float(getattr(settings, "BUDGET_DAILY_USD", 0) or 0))


def render_metrics() -> str:
    """The exposition text of every platform metric, read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector())
    return generate_latest(registry).decode()
