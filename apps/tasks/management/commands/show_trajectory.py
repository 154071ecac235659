"""`manage.py show_trajectory ID`: a readable, step-by-step dump of one trajectory."""
from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.datasets.selectors import trajectories_with_reviews
from apps.tasks.models import Trajectory
from apps.tasks.episode import episode_from

DEFAULT_MAX_CHARS = 2000


class Command(BaseCommand):
    help = "Print one trajectory step by step: the task, then per step the observation, thought, " \
           "tool call with arguments and its result, then the outcome, reward and reviews."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("trajectory_id", type=int, metavar="ID")
        parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS, metavar="N",
                            help=f"cut each text block at N characters (default {DEFAULT_MAX_CHARS}; 0: no limit)")
        parser.add_argument("--messages", action="store_true", help="also print the raw conversation")

    def _cut(self, text: str, limit: int) -> str:
        if limit and len(text) > limit:
            return text[:limit] + f"\n… [{len(text) - limit} more characters; --max-chars 0 shows all]"
        return text

    def _block(self, label: str, text: str, limit: int) -> None:
        if not text:
            return
        body = self._cut(text, limit).replace("\n", "\n      ")
        self.stdout.write(f"  {label}: {body}")

    def handle(self, *args: Any, **options: Any) -> None:
        pk, limit = options["trajectory_id"], max(0, options["max_chars"])
        t = trajectories_with_reviews(Trajectory.objects.select_related("task", "task__batch")).filter(pk=pk).first()
        if t is None:
            raise CommandError(f"no trajectory #{pk}")
        w = self.stdout.write
        task = t.task
        w(self.style.MIGRATE_HEADING(f"trajectory #{t.pk} — task #{task.pk} {task} (iteration {t.iteration}, "
                                     f"sample {t.sample_index})"))
        w(f"status {t.status}; outcome {t.outcome or '-'}; reward {t.reward if t.reward is not None else '-'}; "
          f"model {t.model or '-'}; tokens {t.total_tokens}; batch {task.batch.name if task.batch else '-'}")
        if t.outcome_reason:
            w(f"outcome reason: {t.outcome_reason}")
        score = "-" if t.review_overall is None else f"{t.review_overall:g}"
        w(f"latest automatic review score: {score}; latest human verdict: {t.human_verdict or '-'}")
        w(f"content sha256 {t.content_sha256}")
        w("")
        w(self.style.HTTP_INFO("task:"))
        w("  " + self._cut(task.prompt, limit).replace("\n", "\n  "))
        episode = episode_from(t.messages, t.steps)
        w("")
        w(self.style.HTTP_INFO(f"{len(episode.steps)} steps (from the {episode.source}):"))
        for step in episode.steps:
            turn = f" (turn {step.turn})" if step.turn is not None else ""
            w(self.style.MIGRATE_LABEL(f"step {step.number}{turn}"))
            for label, text in step.observations:
                self._block(f"observation{f' [{label}]' if label else ''}", text, limit)
            self._block("reasoning", step.reasoning, limit)
            self._block("thought", step.thought, limit)
            for action in step.actions:
                call_id = f" [{action.call_id}]" if action.call_id else ""
                self._block(f"action{call_id}", f"{action.name}({action.arguments})", limit)
                if action.meta:
                    w(f"  meta: {'; '.join(action.meta)}")
                if action.result is not None:
                    self._block("result", action.result or "(empty)", limit)
        for label, text in episode.trailing:
            self._block(label, text, limit)
        if t.final_answer:
            w("")
            self._block("final answer", t.final_answer, limit)
        if t.error:
            self._block("error", t.error, limit)
        if options["messages"]:
            w("")
            w(self.style.HTTP_INFO("conversation:"))
            for m in episode.conversation:
                calls = "".join(f"\n      -> {name}({args})" for name, args in m.calls)
                self._block(m.role + (f" [{m.call_id}]" if m.call_id else ""), m.text + calls, limit)
