"""`manage.py synthesize_pipeline SCENE --seeds FILE [--wait]`: generate a scene's tasks with its pipeline."""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.db import connection
from django.urls import reverse

from apps.engines.generation import PipelineError
from apps.engines.models import PipelineRun, StageRun
from apps.engines.pipelines import PIPELINES, pipeline_for, services
from apps.engines.pipelines import jobs as pipeline_jobs
from apps.engines.pipelines.runner import ALL_ITEMS, run_counts
from apps.tasks.jobs import ensure_schedules
from apps.tasks.management.commands.synthesize import BAR_WIDTH, IDLE_POLL_S, PROGRESS_EVERY_S, SERVE_URL
from apps.tasks.management.commands.synthesize import Command as SynthesizeCommand
from apps.tasks.management.commands.synthesize import quiet_loggers

PIPELINE_SCRIPTS_DIR = "examples/pipelines"  # <scene>/ holds the offline model's scripts for its stages

HELP = f"""\
Generate tasks for SCENE with the scene's generation pipeline (docs/pipelines.md): each seed
of FILE goes through the pipeline's stages (LLM calls with validated, repaired output; agent
episodes; code gates such as dedup), every stage run is stored, and each surviving item
becomes a task of the batch NAME, created through the task service (validated, audited) and
started like any submitted task.

FILE is .jsonl (one seed per line) or .json (a list of seeds); what a seed holds is the
pipeline's business (an object with an "id" names its item).

Without --wait the run is queued for the worker cluster (`make worker`) and the command
returns; the run's admin page shows its stage runs. With --wait it runs in this process with
a progress line, then (unless --generate-only) the batch's rollouts and reviews run here as
with `manage.py synthesize --wait`, and a summary follows. A run that failed or was
interrupted is resumed by the admin's Resume action (or `--resume RUN_ID`): stages that
finished are not run, nor paid for, again.

The model: as for `synthesize`. With no LLM configured, the offline scripted model answers;
--start-offline-model (with --wait) serves it here with the bundled reference solutions and
the scripts in {PIPELINE_SCRIPTS_DIR}/SCENE/ (or --solutions).
"""


def read_seeds(path: Path) -> list[Any]:
    """The seeds of a .jsonl or .json file; CommandError naming the line for bad input."""
    if not path.is_file():
        raise CommandError(f"{path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path}: not UTF-8 text ({exc.reason})") from None
    if path.suffix == ".json":
        try:
            seeds = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
        if not isinstance(seeds, list):
            raise CommandError(f"{path}: a .json seeds file holds a list of seeds")
    elif path.suffix == ".jsonl":
        seeds = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                seeds.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise CommandError(f"{path}:{lineno}: malformed JSON: {exc.msg}") from None
    else:
        raise CommandError(f"{path}: the seeds file must be .jsonl or .json")
    if not seeds:
        raise CommandError(f"{path}: no seeds")
    return seeds


class Command(SynthesizeCommand):
    help = HELP

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("scene", metavar="SCENE", help="the scene whose pipeline generates the tasks "
                            f"(with a pipeline: {', '.join(sorted(PIPELINES)) or 'none yet'})")
        parser.add_argument("--seeds", metavar="FILE", help="the seeds file (.jsonl or .json); required unless --resume")
        parser.add_argument("--batch", metavar="NAME", help="the batch the tasks go into (default: "
                            "'SCENE pipeline DATE TIME'; an existing batch of yours from a pipeline is added to)")
        parser.add_argument("--limit", type=int, metavar="N", help="use only the first N seeds")
        parser.add_argument("--config", metavar="JSON", help="the run's config object, passed to the pipeline "
                            "(e.g. '{\"model\": \"...\"}')")
        parser.add_argument("--user", metavar="USERNAME", help="record this user as the run's and batch's creator")
        parser.add_argument("--resume", type=int, metavar="RUN_ID",
                            help="resume this failed or cancelled run of SCENE instead of starting one")
        parser.add_argument("--wait", action="store_true",
                            help="run the pipeline (and then the batch's rollouts and reviews) in this process")
        parser.add_argument("--generate-only", action="store_true",
                            help="with --wait: stop after the pipeline; the created tasks' rollouts are left "
                                 "to the worker cluster")
        # --concurrency and --start-offline-model mean what they mean for `synthesize`: its own options.
        shared = argparse.ArgumentParser(add_help=False)
        super().add_arguments(shared)
        for action in shared._actions:
            if action.dest in ("concurrency", "start_offline_model"):
                parser._add_action(action)
        parser.add_argument("--solutions", nargs="+", metavar="PATH",
                            help="scripts for --start-offline-model (default: the bundled reference solutions "
                                 f"and {PIPELINE_SCRIPTS_DIR}/SCENE/)")

    def handle(self, *args: Any, **options: Any) -> None:
        scene, wait = options["scene"], options["wait"]
        if options["start_offline_model"] and not wait:
            raise CommandError("--start-offline-model goes with --wait: the model would stop with this command, "
                               "before a worker ran the pipeline; run `make offline-model` instead")
        if (options["generate_only"] or options["concurrency"] is not None) and not wait:
            raise CommandError("--generate-only and --concurrency go with --wait")
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["limit"] is not None and options["limit"] < 1:
            raise CommandError("--limit must be at least 1")
        config = self._config(options)
        try:
            pipeline_for(scene, config)
        except PipelineError as exc:
            raise CommandError(str(exc)) from None
        if options["resume"] is None and not options["seeds"]:
            raise CommandError("--seeds FILE is required (or --resume RUN_ID)")
        seeds = read_seeds(Path(options["seeds"])) if options["resume"] is None else []
        if options["limit"]:
            seeds = seeds[:options["limit"]]
        user = self._user(options["user"])
        if options["solutions"] is None:
            options["solutions"] = [str(p) for p in (Path(settings.BASE_DIR) / d for d in (
                "examples/reference_solutions", "examples/tasks", f"{PIPELINE_SCRIPTS_DIR}/{scene}")) if p.exists()]

        with quiet_loggers(options["verbosity"]):
            server = None
            try:
                if wait:
                    server = self._check_model(options, Path(options["seeds"] or "."))
                run = self._create_or_resume(scene, seeds, config, user, options, start=not wait)
                if not wait:
                    self.stdout.write(f"Pipeline run #{run.pk} queued for the worker cluster (`make worker`); "
                                      f"{len(run.seeds)} seed(s) -> batch {run.batch_name!r}.")
                    self.stdout.write(f"Admin: {_run_admin_path(run.pk)}")
                    return
                run = self._run_pipeline_here(run)
                self._pipeline_summary(run)
                if run.status != PipelineRun.Status.COMPLETED:
                    raise CommandError(f"pipeline run #{run.pk} {run.status}: {run.error or 'no detail'}; resume it "
                                       f"with `manage.py synthesize_pipeline {scene} --resume {run.pk} --wait` or the "
                                       "admin's Resume action")
                if run.batch is not None and not options["generate_only"]:
                    ensure_schedules()  # tasks_create started the tasks; their rollouts run here
                    self._run_here(run.batch, options["concurrency"] or settings.ROLLOUT_CONCURRENCY)
            finally:
                if server is not None:
                    server.stop()

    def _config(self, options: dict[str, Any]) -> dict[str, Any]:
        if not options["config"]:
            return {}
        try:
            config = json.loads(options["config"])
        except json.JSONDecodeError as exc:
            raise CommandError(f"--config: malformed JSON: {exc.msg}") from None
        if not isinstance(config, dict):
            raise CommandError("--config must be a JSON object")
        return config

    def _user(self, username: str | None) -> Any:
        if not username:
            return None
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"--user: no user named {username!r}")
        return user

    def _create_or_resume(self, scene: str, seeds: list[Any], config: dict[str, Any], user: Any,
                          options: dict[str, Any], *, start: bool) -> PipelineRun:
        try:
            if options["resume"] is not None:
                run = PipelineRun.objects.filter(pk=options["resume"], scene=scene).first()
                if run is None:
                    raise CommandError(f"--resume: no pipeline run #{options['resume']} of scene {scene}")
                run = services.pipeline_run_resume(run=run, actor=user)
                self.stdout.write(f"Resuming pipeline run #{run.pk} ({len(run.seeds)} seed(s)).")
                return run
            run = services.pipeline_run_create(scene=scene, seeds=seeds, actor=user, config=config,
                                               batch_name=options["batch"] or "", start=start)
        except (PipelineError, services.TransitionError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Pipeline run #{run.pk}: {run.scene}/{run.name}, {len(seeds)} seed(s) -> batch "
                          f"{run.batch_name!r}.")
        return run

    # -- running here

    def _run_pipeline_here(self, run: PipelineRun) -> PipelineRun:
        services.ensure_pipeline_schedules()
        done, failures = threading.Event(), []

        def drive() -> None:
            try:
                while True:
                    result = pipeline_jobs.run_pipeline(run.pk)  # the module's: tests wrap it
                    if result.get("status") == pipeline_jobs.HANDED_OVER:
                        continue  # the job's time budget ran out: carry on in a fresh job
                    if result["claimed"] or PipelineRun.objects.filter(pk=run.pk, status__in=PipelineRun.FINAL).exists():
                        break
                    time.sleep(IDLE_POLL_S)  # a worker of the cluster holds the run: wait for it to end
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)
            finally:
                connection.close()
                done.set()

        started, tty, last = time.monotonic(), self.stdout.isatty(), ""
        threading.Thread(target=drive, daemon=True, name="synthesize-pipeline").start()
        stages = [s.name for s in pipeline_for(run.scene, run.config).stages]
        try:
            while not done.wait(PROGRESS_EVERY_S):
                last = self._pipeline_progress(run, stages, started, tty, last)
        except KeyboardInterrupt:
            self.stdout.write("")
            self.stdout.write(f"Interrupted: pipeline run #{run.pk} stays running until the reaper re-queues it; "
                              f"`--resume {run.pk} --wait` (after cancelling it in the admin) continues where it was.")
            self.stdout.flush()
            os._exit(130)
        finally:
            connection.close()
        self._pipeline_progress(run, stages, started, tty, last, final=True)
        if failures:
            raise CommandError(f"running the pipeline failed: {failures[0]!r}")
        run.refresh_from_db()
        return run

    def _pipeline_progress(self, run: PipelineRun, stages: list[str], started: float, tty: bool, last: str,
                           final: bool = False) -> str:
        rows = Counter(StageRun.objects.filter(run=run).values_list("stage", "status"))
        reached = max((stages.index(s) for s, _ in rows if s in stages), default=0)
        if any(s == "task" for s, _ in rows):
            reached = len(stages)
        filled = BAR_WIDTH if final else int(BAR_WIDTH * reached / (len(stages) + 1))
        name = stages[reached] if reached < len(stages) else "tasks"
        done = sum(n for (_, status), n in rows.items() if status in StageRun.FINISHED)
        counts = run_counts(run)
        dropped, tasks = counts["items_dropped"], counts["tasks_created"]
        elapsed = int(time.monotonic() - started)
        line = (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] stage {min(reached + 1, len(stages) + 1)}/"
                f"{len(stages) + 1} {name} | {done} stage runs done | {dropped} dropped | {tasks} tasks | "
                f"{elapsed // 60}:{elapsed % 60:02d}")
        if tty:
            self.stdout.write("\r" + line, ending="\n" if final else "")
            self.stdout.flush()
        elif line.split(" | ")[:4] != last.split(" | ")[:4]:
            self.stdout.write(line)
        return line

    def _pipeline_summary(self, run: PipelineRun) -> None:
        style = self.style.SUCCESS if run.status == PipelineRun.Status.COMPLETED else self.style.ERROR
        wall = (run.finished_at - run.started_at).total_seconds() if run.finished_at and run.started_at else 0.0
        self.stdout.write(style(
            f"Pipeline run #{run.pk} {run.scene}/{run.name}: {run.status}; {run.item_count} seed(s) -> "
            f"{run.items_done} item(s) through every stage, {run.items_dropped} dropped; {run.tasks_created} task(s) "
            f"in batch {run.batch_name!r}"
        ))
        per_stage = Counter(StageRun.objects.filter(run=run).values_list("stage", "status"))
        for stage in dict.fromkeys(StageRun.objects.filter(run=run).order_by("index").values_list("stage", flat=True)):
            counts = ", ".join(f"{n} {status}" for (s, status), n in sorted(per_stage.items()) if s == stage)
            self.stdout.write(f"  {stage + ':':<14}{counts}")
        reasons = Counter(StageRun.objects.filter(run=run, status=StageRun.Status.DROPPED)
                          .values_list("stage", "error"))
        for stage, output in StageRun.objects.filter(run=run, item_key=ALL_ITEMS).values_list("stage", "parsed_output"):
            reasons.update((stage, reason) for reason in ((output or {}).get("dropped") or {}).values())
        for (stage, reason), n in reasons.most_common(5):
            self.stdout.write(f"  dropped at {stage} ({n}): {reason[:160]}")
        self.stdout.write(f"  model calls:  {run.llm_calls}; tokens {run.total_tokens:,}; cost ${run.cost_usd:.4f}")
        self.stdout.write(f"  wall time:    {wall:.1f}s")
        if run.error:
            self.stdout.write(f"  error:        {run.error[:500]}")
        path = _run_admin_path(run.pk)
        self.stdout.write(f"  admin:        {path} (with `make serve`: {SERVE_URL}{path})")


def _run_admin_path(pk: int) -> str:
    return reverse("admin:engines_pipelinerun_change", args=[pk])
