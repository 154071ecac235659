"""`manage.py synthesize --tasks FILE [--wait]`: import a task file, start it, optionally run it here."""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlencode, urlparse

import httpx
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, DjangoHelpFormatter
from django.db import connection
from django.db.models import Avg, Count, Max, Q, Sum
from django.urls import reverse

from apps.engines.llm import resolve_providers
from apps.engines.management.commands.offline_model import DEFAULT_SOLUTION_DIRS
from apps.engines.offline_model import OfflineModelServer, ReferenceSolutionError, ScriptedModel, load_scripts
from apps.engines.registry import SCENES
from apps.reviews.jobs import review_batch, tasks_awaiting_review
from apps.reviews.models import Proposal, Review
from apps.tasks.jobs import ensure_schedules, reap_stale_rollouts, run_rollouts
from apps.tasks.models import Batch, Task, Trajectory
from apps.tasks.selectors import batch_imported_from, batch_status_counts
from apps.tasks.services import tasks_enqueue

HELP = """\
Import FILE as a batch (exactly as `manage.py import_tasks` does: every line checked first,
nothing written on an error), start an iteration of every queued task in it, and enqueue the
rollout jobs for the worker cluster (`make worker`).

With --wait the rollouts and their reviews run in this process instead (no worker cluster
needed): each finished iteration is reviewed (checks + judge), then the task completes, fails,
starts its next iteration with green changes applied, or waits for a person to decide its
yellow/red proposals. The command returns when every task is final or waiting for approval
(or waiting for a failed judge to be retried), with a progress line while it runs and then a
summary (tasks done/failed/waiting, mean reward, review scores, proposals, tokens, wall time,
the batch's admin page).

The model: with no LLM configured (no LLM_BASE_URL, LLM_API_KEY or LLM_PROVIDERS) the
platform uses the offline scripted model at OFFLINE_MODEL_URL, a labelled stand-in that
replays reference solutions. The command checks that it answers before importing anything;
run `make offline-model` in another terminal, or pass --start-offline-model (with --wait) to
serve it from this process on OFFLINE_MODEL_URL's port for the duration.
"""

PROGRESS_EVERY_S = 1.0
IDLE_POLL_S = 0.5
REAP_EVERY_S = 30.0
BAR_WIDTH = 24
SERVE_URL = "http://127.0.0.1:8000"  # `make serve`'s default address
QUIET_LOGGERS = ("httpx", "httpx2", "django-q", "apps.tasks.jobs", "apps.engines.sandboxes")


@contextlib.contextmanager
def quiet_loggers(verbosity: int) -> Iterator[None]:
    """Below -v 2, WARNING and up only from the chatty loggers: an INFO line per model request
    or job drowns the progress line."""
    quieted = {}
    if verbosity < 2:
        for name in QUIET_LOGGERS:
            logger = logging.getLogger(name)
            quieted[logger] = logger.level
            logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in quieted.items():
            logger.setLevel(level)


class _HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _offline_model_answers(base_url: str) -> bool:
    try:
        response = httpx.get(base_url.rstrip("/") + "/models", timeout=2.0)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


class Command(BaseCommand):
    help = HELP

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        return super().create_parser(prog_name, subcommand, **kwargs)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--tasks", required=True, metavar="FILE", help="the .jsonl or .json task file")
        parser.add_argument("--scene", choices=list(SCENES), metavar="SCENE",
                            help=f"use this scene for every task ({', '.join(SCENES)})")
        parser.add_argument("--batch", metavar="NAME", help="batch name (default: the file name without extension)")
        parser.add_argument("--user", metavar="USERNAME", help="record this user as the batch's creator")
        parser.add_argument("--once", action="store_true",
                            help="if a batch of this name was already imported from identical content, resume "
                                 "that batch instead of importing again (used by `make demo`)")
        parser.add_argument("--wait", action="store_true",
                            help="run the rollouts and reviews in this process until every task of the batch is final or "
                                 "waiting for approval")
        parser.add_argument("--concurrency", type=int, metavar="N",
                            help="with --wait: trajectories run at once (default ROLLOUT_CONCURRENCY)")
        parser.add_argument("--start-offline-model", action="store_true",
                            help="with --wait and no LLM configured: serve the offline scripted model from this "
                                 "process on OFFLINE_MODEL_URL's port (unless one already answers there)")
        parser.add_argument("--solutions", nargs="+", metavar="PATH",
                            help="reference solutions for --start-offline-model (default: FILE and the bundled "
                                 "examples)")

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["tasks"])
        if not path.is_file():
            raise CommandError(f"{path}: no such file")
        wait = options["wait"]
        concurrency = options["concurrency"]
        if concurrency is not None and (concurrency < 1 or not wait):
            raise CommandError("--concurrency must be at least 1 and goes with --wait "
                               "(workers use ROLLOUT_CONCURRENCY)")
        if options["start_offline_model"] and not wait:
            raise CommandError("--start-offline-model goes with --wait: the model would stop with this command, "
                               "before a worker picked the jobs up; run `make offline-model` instead")

        with quiet_loggers(options["verbosity"]):
            server = None
            try:
                server = self._check_model(options, path)
                batch = self._import(path, options)
                self._start(batch)
                if wait:
                    self._run_here(batch, concurrency or settings.ROLLOUT_CONCURRENCY)
                else:
                    self.stdout.write("Rollout jobs enqueued; a worker cluster (`make worker`) runs them.")
                    self.stdout.write(f"Admin: {_batch_admin_path(batch.pk)}")
            finally:
                if server is not None:
                    server.stop()

    # -- the model

    def _check_model(self, options: dict[str, Any], path: Path) -> Any:
        """Say which LLM the rollouts use; make sure the offline model answers when it is the one."""
        try:
            providers = resolve_providers()
        except ImproperlyConfigured as exc:
            raise CommandError(f"LLM configuration: {exc}") from None
        primary = providers[0]
        if primary.name != "offline":
            names = ", ".join(f"{p.name}/{p.model}" for p in providers)
            self.stdout.write(f"LLM: {names}")
            if options["start_offline_model"]:
                self.stdout.write("(an LLM is configured, so --start-offline-model is not needed and is ignored)")
            return None
        url = primary.base_url
        label = f"LLM: offline scripted model {primary.model!r} at {url} (a stand-in that replays reference " \
                "solutions, not a language model)"
        if _offline_model_answers(url):
            self.stdout.write(label)
            return None
        if not options["start_offline_model"]:
            raise CommandError(
                f"no LLM is configured and the offline scripted model does not answer at {url}. Start it with "
                "`make offline-model` (or `python manage.py offline_model`) in another terminal, pass "
                "--start-offline-model together with --wait, or configure a real model (LLM_BASE_URL / "
                "LLM_API_KEY / LLM_MODEL, see docs/llm.md)."
            )
        return self._serve_offline_model(url, options["solutions"], path, label)

    def _serve_offline_model(self, url: str, solutions: list[str] | None, path: Path, label: str) -> Any:
        parsed = urlparse(url)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
        if solutions is None:
            solutions = [str(path)] + [str(p) for p in (Path(settings.BASE_DIR) / d for d in DEFAULT_SOLUTION_DIRS)
                                       if p.exists()]
        try:
            model = ScriptedModel(load_scripts(solutions))
        except ReferenceSolutionError as exc:
            raise CommandError(f"--start-offline-model: {exc}") from None
        try:
            server = OfflineModelServer(model, host, port).start()
        except OSError as exc:
            raise CommandError(f"--start-offline-model: cannot listen on {host}:{port}: {exc}") from None
        self.stdout.write(f"{label}; started in this process with {len(model.registry)} reference solution(s)")
        return server

    # -- import and start

    def _import(self, path: Path, options: dict[str, Any]) -> Batch:
        name = options["batch"] if options["batch"] is not None else path.stem
        sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        before = Batch.objects.aggregate(last=Max("id"))["last"] or 0
        argv = [str(path), "--batch", name]
        for flag in ("scene", "user"):
            if options[flag]:
                argv += [f"--{flag}", options[flag]]
        if options["once"]:
            argv.append("--once")
        # The importer command itself: same checks, same error report, same --once rule.
        call_command("import_tasks", *argv, stdout=self.stdout._out, stderr=self.stderr._out)
        batch = Batch.objects.filter(name=name, source_sha256=sha256, pk__gt=before).order_by("-pk").first()
        if batch is None and options["once"]:
            batch = batch_imported_from(name=name, source_sha256=sha256)
        if batch is None:
            raise CommandError(f"{path} changed while it was being imported; run the command again")
        return batch

    def _start(self, batch: Batch) -> None:
        ensure_schedules()
        started = tasks_enqueue(batch=batch, actor=None)
        total = batch.tasks.count()
        self.stdout.write(f"Started {started} of {total} task(s) in batch #{batch.pk} {batch.name!r}.")

    # -- running here

    def _run_here(self, batch: Batch, concurrency: int) -> None:
        if concurrency > settings.LLM_MAX_CONCURRENCY:
            self.stdout.write(
                f"note: --concurrency {concurrency} exceeds LLM_MAX_CONCURRENCY={settings.LLM_MAX_CONCURRENCY}; "
                "model calls beyond that wait for a free slot"
            )
        stop, done = threading.Event(), threading.Event()
        failures: list[BaseException] = []
        runner = threading.Thread(target=_drive, args=(batch.pk, concurrency, stop, done, failures), daemon=True,
                                  name="synthesize-rollouts")
        started = time.monotonic()
        tty = self.stdout.isatty()
        last = ""
        runner.start()
        # Waiting on an Event, not Thread.join(): on Python 3.11 a Ctrl-C that interrupts join()
        # marks the still-running thread as stopped.
        try:
            while not done.wait(PROGRESS_EVERY_S):
                last = self._progress(batch, started, tty, last)
        except KeyboardInterrupt:
            stop.set()
            self.stdout.write("")
            self.stdout.write("Interrupted: no new trajectories start; waiting for the running ones "
                              "(Ctrl-C again leaves now; the reaper re-queues what is left after ROLLOUT_STALE_S).")
            try:
                while not done.wait(PROGRESS_EVERY_S):
                    pass
            except KeyboardInterrupt:
                self.stdout.write("Left with trajectories still running; the reaper re-queues them after "
                                  "ROLLOUT_STALE_S, and `synthesize ... --once --wait` resumes the batch.")
                self.stdout.flush()
                os._exit(130)  # the rollout thread cannot be stopped from here; leave without it
        finally:
            connection.close()
        self._progress(batch, started, tty, last, final=True)
        if failures:
            raise CommandError(f"running the rollouts failed: {failures[0]!r}")
        self._summary(batch, time.monotonic() - started)
        if stop.is_set():
            raise CommandError("interrupted before the batch finished; run the same command with --once --wait "
                               "to resume it, or let a worker cluster (`make worker`) finish it")

    def _progress(self, batch: Batch, started: float, tty: bool, last: str, final: bool = False) -> str:
        counts = batch_status_counts(batch)
        total = sum(counts.values())
        done = sum(counts[s] for s in Task.FINAL)
        filled = int(BAR_WIDTH * done / total) if total else BAR_WIDTH
        elapsed = int(time.monotonic() - started)
        line = (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} done | "
                f"{counts[Task.Status.RUNNING]} running | {counts[Task.Status.FAILED]} failed | "
                f"{elapsed // 60}:{elapsed % 60:02d}")
        if tty:
            self.stdout.write("\r" + line, ending="\n" if final else "")
            self.stdout.flush()
        elif line.split(" | ")[:3] != last.split(" | ")[:3]:
            self.stdout.write(line)  # not a terminal: a line per change, not per second
        return line

    def _summary(self, batch: Batch, wall_s: float) -> None:
        tasks = batch_status_counts(batch)
        trajectories = Trajectory.objects.filter(task__batch=batch)
        stats = trajectories.aggregate(
            n=Count("id"),
            success=Count("id", filter=Q(outcome=Trajectory.Outcome.SUCCESS)),
            failure=Count("id", filter=Q(outcome=Trajectory.Outcome.FAILURE)),
            error=Count("id", filter=Q(outcome=Trajectory.Outcome.ERROR)),
            cancelled=Count("id", filter=Q(status=Trajectory.Status.CANCELLED)),
            rewarded=Count("id", filter=Q(reward__isnull=False)),
            mean_reward=Avg("reward"),
            prompt=Sum("prompt_tokens"),
            completion=Sum("completion_tokens"),
            tokens=Sum("total_tokens"),
            cost=Sum("cost_usd"),
        )
        total = sum(tasks.values())
        unfinished = total - sum(tasks[s] for s in Task.FINAL) - tasks["waiting_approval"]
        self.stdout.write(self.style.SUCCESS(
            f"Batch #{batch.pk} {batch.name!r}: {total} task(s): {tasks['completed']} done, {tasks['failed']} failed"
            + (f", {tasks['cancelled']} cancelled" if tasks["cancelled"] else "")
            + (f", {tasks['waiting_approval']} waiting for approval" if tasks["waiting_approval"] else "")
            + (f", {unfinished} not finished" if unfinished else "")
        ))
        self.stdout.write(
            f"  trajectories: {stats['n']} ({stats['success']} success, {stats['failure']} failure, "
            f"{stats['error']} error, {stats['cancelled']} cancelled)"
        )
        mean = stats["mean_reward"]
        self.stdout.write(
            "  mean reward:  " + (f"{mean:.3f} (over {stats['rewarded']} trajectories with a reward)"
                                  if mean is not None else "- (no trajectory has a reward)")
        )
        self.stdout.write(
            f"  tokens:       {stats['tokens'] or 0:,} (prompt {stats['prompt'] or 0:,}, completion "
            f"{stats['completion'] or 0:,}); cost ${stats['cost'] or 0:.4f}"
        )
        for line in _review_lines(batch, tasks):
            self.stdout.write(line)
        self.stdout.write(f"  wall time:    {wall_s:.1f}s")
        admin_path = _batch_admin_path(batch.pk)
        self.stdout.write(f"  admin:        {admin_path} (with `make serve`: {SERVE_URL}{admin_path}); its tasks: "
                          f"{reverse('admin:tasks_task_changelist')}?batch__id__exact={batch.pk}")


def _review_lines(batch: Batch, tasks: dict[str, int]) -> list[str]:
    """The review part of the summary: scores, judge failures, proposals by tier and status."""
    reviews = Review.objects.filter(trajectory__task__batch=batch, kind=Review.Kind.AUTO).aggregate(
        scored=Count("id", filter=Q(status=Review.Status.DONE)),
        failed=Count("id", filter=Q(status=Review.Status.JUDGE_FAILED)),
        mean=Avg("overall", filter=Q(status=Review.Status.DONE)),
    )
    proposals = Proposal.objects.filter(task__batch=batch).order_by().values_list("tier", "status").annotate(n=Count("id"))
    mean = reviews["mean"]
    lines = [
        f"  reviews:      {reviews['scored']} scored" + (f", mean overall {mean:.1f}" if mean is not None else "")
        + (f", {reviews['failed']} judge failed (retried by the worker's schedule)" if reviews["failed"] else ""),
        "  proposals:    " + (", ".join(f"{n} {tier} {status}" for tier, status, n in sorted(proposals)) or "none"),
    ]
    if tasks[Task.Status.WAITING_APPROVAL]:
        lines.append(f"  waiting:      {tasks[Task.Status.WAITING_APPROVAL]} task(s) wait for a decision at "
                     f"{reverse('reviews:queue')}?{urlencode({'batch': batch.name})}")
    return lines


def _drive(batch_id: int, concurrency: int, stop: threading.Event, done: threading.Event,
           failures: list[BaseException]) -> None:
    """The rollout loop of `--wait`: run this batch's trajectories and reviews until none of its
    tasks is open (queued, running, or reviewing without a failed judge)."""
    open_statuses = (Task.Status.QUEUED, Task.Status.RUNNING)
    last_reap = 0.0
    try:
        while not stop.is_set():
            if time.monotonic() - last_reap >= REAP_EVERY_S:
                # A previous run that was killed left running rows behind: re-queue them.
                reap_stale_rollouts(dispatch=False)
                last_reap = time.monotonic()
            report = run_rollouts(concurrency=concurrency, batch_id=batch_id, stop=stop)
            reviewed = review_batch(batch_id)
            if not (Task.objects.filter(batch_id=batch_id, status__in=open_statuses).exists()
                    or tasks_awaiting_review(batch_id).exists()):
                return
            if not report["claimed"] and not reviewed["tasks"]:
                # Retries waiting out their backoff, or trajectories another worker runs.
                stop.wait(IDLE_POLL_S)
    except BaseException as exc:  # reported by the main thread
        failures.append(exc)
    finally:
        connection.close()
        done.set()


def _batch_admin_path(pk: int) -> str:
    return reverse("admin:tasks_batch_change", args=[pk])

