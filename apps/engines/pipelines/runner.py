"""Runs a claimed PipelineRun: every stage for every live item, storing each as a StageRun.

A StageRun that finished (succeeded, or dropped its item) is reused as it is: its stage is not
called again, so a run resumed after a crash pays for nothing twice. One that was running when
the worker died, or failed on an infrastructure error, runs again. The runner is called by the
job (`apps.engines.pipelines.jobs.run_pipeline`) after its compare-and-swap claim; `beat()` is
its heartbeat, cancel and time-budget check, called before each stage run it starts.
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from decimal import Decimal
from typing import Any, Callable

from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from apps.engines import agent
from apps.engines.generation import (
    TASK_STAGE,
    CodeStage,
    Drop,
    EpisodeStage,
    LLMStage,
    Pipeline,
    PipelineError,
    Stage,
    stage_route,
)
from apps.engines.llm import canonical_json, get_llm_client, llm_route
from apps.engines.models import PipelineRun, StageRun
from apps.tasks.services import TaskCreateError, tasks_create

DEFAULT_CONCURRENCY = 8  # model calls / episodes of one stage at once (run config "concurrency")
ALL_ITEMS = "*"  # the item key of a scope="all" stage's one StageRun
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)

REPAIR_TEXT = (
    "Your previous answer was rejected: {error}\n"
    "Answer again with only the corrected JSON, nothing else."
)


class StageFailed(Exception):
    """A stage could not run (an LLM or sandbox error, an exception in a code stage): the run
    fails and can be resumed; its StageRun is FAILED and runs again then."""


class Stopped(Exception):
    """Cancel was requested, or this worker lost its claim: stop between stage runs."""


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False))


def parse_json_output(raw: str) -> Any:
    """The JSON value in a model's answer (bare, in a ``` fence, or the outermost {...}/[...]);
    ValueError when there is none."""
    text = (raw or "").strip()
    candidates = [text]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    for open_, close in (("{", "}"), ("[", "]")):
        start, end = text.find(open_), text.rfind(close)
        if 0 <= start < end:
            candidates.append(text[start:end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            continue
    raise ValueError(f"the answer is not JSON: {text[:200]!r}")


def _validator_error(validator: Callable[..., Any] | None, value: Any, inputs: dict[str, Any]) -> str | None:
    if validator is None:
        return None
    try:
        error = validator(value, inputs)
    except Drop as exc:
        return str(exc) or "rejected by the validator"
    return str(error) if error else None


def check_output(stage: LLMStage, raw: str, inputs: dict[str, Any]) -> tuple[Any, str | None]:
    """(parsed, None) for a valid answer; (parsed or None, reason) for an invalid one."""
    try:
        parsed = parse_json_output(raw)
    except ValueError as exc:
        return None, str(exc)
    if stage.schema:
        error = best_match(Draft202012Validator(stage.schema).iter_errors(parsed))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            return parsed, f"schema: at {where}: {error.message}"
    return parsed, _validator_error(stage.validator, parsed, inputs)


@dataclasses.dataclass
class Item:
    key: str
    state: dict[str, Any]


class Runner:
    """One pass of a pipeline over a run's seeds. `llm` is an LLMClient (the worker's by
    default); `beat` raises Stopped when the run must stop (called between stage runs)."""

    def __init__(self, run: PipelineRun, pipeline: Pipeline, *, llm: Any = None,
                 beat: Callable[[], None] = lambda: None):
        self.run, self.pipeline, self.beat = run, pipeline, beat
        self._llm = llm

    @property
    def llm(self) -> Any:
        if self._llm is None:
            self._llm = get_llm_client()
        return self._llm

    # -- the pass

    def items(self) -> list[Item]:
        items, seen = [], set()
        for i, seed in enumerate(self.run.seeds):
            if self.pipeline.seed_key is not None:
                key = self.pipeline.seed_key(seed, i)
            else:
                key = seed.get("id", i) if isinstance(seed, dict) else i
            key = str(key)
            if not key or key in seen or key == ALL_ITEMS or len(key) > 150:
                raise PipelineError(f"seed {i}: its key {key!r} is empty, repeated, '*' or too long")
            seen.add(key)
            items.append(Item(key, {"seed": seed}))
        return items

    def execute(self) -> None:
        """Run every stage, then turn each surviving item into a task; raises StageFailed or Stopped."""
        items = self.items()
        done = {(s.stage, s.item_key): s for s in StageRun.objects.filter(run=self.run, status__in=StageRun.FINISHED)}
        for index, stage in enumerate(self.pipeline.stages):
            if isinstance(stage, CodeStage) and stage.scope == "all":
                items = self._all_items(stage, index, items, done)
                continue
            rows = self._run_items(stage, index, [item for item in items if (stage.name, item.key) not in done])
            survivors: list[Item] = []
            for item in items:
                row = done.get((stage.name, item.key)) or rows[item.key]
                if row.status == StageRun.Status.SUCCEEDED:
                    survivors.extend(self._next_items(stage, item, row.parsed_output))
            items = survivors
        for item in items:
            if (TASK_STAGE, item.key) not in done:
                self.beat()
                self._guarded(_TASK_STAGE_SPEC, item.key, lambda: self._emit_task(item))

    def _run_items(self, stage: Stage, index: int, items: list[Item]) -> dict[str, StageRun]:
        """Run a stage for these items: code in this thread; model calls and episodes up to
        `concurrency` at once (run config, default DEFAULT_CONCURRENCY) in threads that never
        touch the database: every StageRun is written here, so a crash leaves each either
        finished and stored or still `running` (run again on resume)."""
        rows: dict[str, StageRun] = {}
        if isinstance(stage, CodeStage):
            for item in items:
                self.beat()
                rows[item.key] = self._guarded(stage, item.key, lambda: self._code_item(stage, index, item))
            return rows
        work = self._llm_work if isinstance(stage, LLMStage) else self._episode_work
        limit = max(1, int(self.run.config.get("concurrency") or DEFAULT_CONCURRENCY))
        pool = ThreadPoolExecutor(limit, thread_name_prefix=f"pipeline-{self.run.pk}")
        waiting, running = list(reversed(items)), {}
        failure: StageFailed | None = None
        try:
            while waiting or running:
                # A row becomes `running` only when its call starts: a slot is free for it.
                while waiting and len(running) < limit and failure is None:
                    self.beat()
                    item = waiting.pop()
                    row = self._start(stage, index, item.key, stage.inputs(item.state))
                    running[pool.submit(work, stage, row)] = row
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    row = running.pop(future)
                    try:
                        rows[row.item_key] = self._guarded(stage, row.item_key,
                                                           lambda: self._finish(row, *future.result()))
                    except StageFailed as exc:  # the answers in flight are stored all the same
                        failure = failure or exc
            if failure is not None:
                raise failure
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        return rows

    def _guarded(self, stage: Stage, key: str, step: Callable[[], StageRun]) -> StageRun:
        """Run one stage step; an exception (not a validation problem) fails its StageRun and the run."""
        try:
            return step()
        except Stopped:
            raise
        except Exception as exc:
            failed = exc if isinstance(exc, StageFailed) else StageFailed(
                f"stage {stage.name!r} for item {key!r}: {type(exc).__name__}: {exc}")
            row = StageRun.objects.filter(run=self.run, stage=stage.name, item_key=key).first()
            if row is not None:
                self._finish(row, StageRun.Status.FAILED, str(failed))
            raise failed from exc

    def _next_items(self, stage: Stage, item: Item, output: Any) -> list[Item]:
        if not stage.fan_out:
            return [Item(item.key, {**item.state, stage.name: output})]
        elements = list((output.get("items") if isinstance(output, dict) else output) or [])
        # The elements' own ids name the children when every element has a distinct short one.
        ids = [e.get("id") if isinstance(e, dict) and isinstance(e.get("id"), (str, int)) else None for e in elements]
        suffixes = [str(i) for i in ids]
        if None in ids or len(set(suffixes)) != len(suffixes) or any(len(f"{item.key}.{x}") > 200 for x in suffixes):
            suffixes = [str(i) for i in range(len(elements))]
        return [Item(f"{item.key}.{suffix}", {**item.state, stage.name: element})
                for suffix, element in zip(suffixes, elements)]

    # -- one stage run

    def _start(self, stage: Stage, index: int, key: str, inputs: Any) -> StageRun:
        row, _ = StageRun.objects.get_or_create(
            run=self.run, stage=stage.name, item_key=key,
            defaults={"index": index, "kind": stage.kind},
        )
        row.index, row.kind, row.inputs = index, stage.kind, _json_safe(inputs)
        row.status, row.error, row.started_at, row.finished_at = StageRun.Status.RUNNING, "", timezone.now(), None
        row.attempts += 1
        row.llm_calls = row.prompt_tokens = row.completion_tokens = row.total_tokens = row.repair_attempts = 0
        row.cost_usd = Decimal(0)
        row.save()
        return row

    def _finish(self, row: StageRun, status: str, error: str = "", fields: dict[str, Any] | None = None) -> StageRun:
        for name, value in (fields or {}).items():
            setattr(row, name, _json_safe(value) if name in ("parsed_output", "validator_result") else value)
        row.status, row.error, row.finished_at = status, error[:10_000], timezone.now()
        row.save()
        return row

    # The work of a stage run, in a pool thread: no database access; returns what _finish stores.
    Outcome = tuple[str, str, dict[str, Any]]

    def _chat(self, stage: LLMStage, row: StageRun, messages: list[dict[str, Any]], turn: int) -> str:
        result = self.llm.chat(
            messages, temperature=stage.temperature, max_tokens=stage.max_tokens,
            model=self.run.config.get("model") or None,
            # The run's identity (a UUID), so no other run is served these answers; a stage
            # that crashed after its answer came back is answered from the cache on resume.
            cache_key_extra={"pipeline_run": str(self.run.uuid), "stage": stage.name, "item": row.item_key,
                             "turn": turn},
        )
        usage = result.usage or {}
        row.llm_calls += 1
        row.prompt_tokens += int(usage.get("prompt_tokens") or 0)
        row.completion_tokens += int(usage.get("completion_tokens") or 0)
        row.total_tokens += int(usage.get("total_tokens") or 0)
        row.cost_usd += Decimal(result.cost_usd or 0)
        return result.content or ""

    def _llm_work(self, stage: LLMStage, row: StageRun) -> Outcome:
        template, inputs = stage.template, row.inputs
        assert template is not None
        messages = [{"role": "system", "content": template.system}] if template.system else []
        messages.append({"role": "user", "content": template.user(inputs)})
        row.template_id, row.template_version = template.id, template.version
        row.prompt_hash = hashlib.sha256(canonical_json(messages).encode("utf-8")).hexdigest()
        turns: list[dict[str, Any]] = []
        for turn in range(stage.repairs + 1):
            with llm_route(stage_route(template.id, row.item_key, repair=turn)):
                raw = self._chat(stage, row, messages, turn)
            parsed, error = check_output(stage, raw, inputs)
            turns.append({"raw": raw, "error": error})
            row.raw_output, row.repair_attempts = raw, turn
            if error is None:
                return StageRun.Status.SUCCEEDED, "", {"parsed_output": parsed,
                                                       "validator_result": {"valid": True, "turns": turns}}
            if turn < stage.repairs:
                messages = messages + [
                    {"role": "assistant", "content": raw},
                    {"role": "user", "content": REPAIR_TEXT.format(error=error)},
                ]
        reason = f"invalid output after {stage.repairs} repair(s): {turns[-1]['error']}"
        return StageRun.Status.DROPPED, reason, {
            "parsed_output": None, "validator_result": {"valid": False, "error": turns[-1]["error"], "turns": turns}}

    def _episode_work(self, stage: EpisodeStage, row: StageRun) -> Outcome:
        assert stage.config is not None
        result = asyncio.run(agent.run_episode(
            config=stage.config(row.inputs), llm=self.llm,
            cache_key_extra={"pipeline_run": str(self.run.uuid), "stage": stage.name, "item": row.item_key},
        ))
        output = dataclasses.asdict(result)
        row.llm_calls, row.total_tokens = result.llm_calls, result.total_tokens
        row.prompt_tokens, row.completion_tokens, row.cost_usd = result.prompt_tokens, result.completion_tokens, result.cost_usd
        row.raw_output = result.final_answer
        if result.outcome == "error" and (result.retryable or result.error_kind in ("infrastructure", "llm")):
            raise StageFailed(f"stage {stage.name!r} for item {row.item_key!r}: episode error "
                              f"({result.error_kind}): {result.outcome_reason}")
        error = _validator_error(stage.validator, _json_safe(output), row.inputs)
        if error:
            return StageRun.Status.DROPPED, error, {"parsed_output": output,
                                                    "validator_result": {"valid": False, "error": error}}
        return StageRun.Status.SUCCEEDED, "", {"parsed_output": output, "validator_result": {"valid": True}}

    def _code_item(self, stage: CodeStage, index: int, item: Item) -> StageRun:
        assert stage.fn is not None
        row = self._start(stage, index, item.key, stage.inputs(item.state))
        try:
            output = stage.fn(row.inputs)
        except Drop as exc:
            return self._finish(row, StageRun.Status.DROPPED, str(exc) or "dropped by the gate",
                                {"validator_result": {"valid": False, "error": str(exc)}})
        return self._finish(row, StageRun.Status.SUCCEEDED, "",
                            {"parsed_output": output, "validator_result": {"valid": True}})

    def _all_items(self, stage: CodeStage, index: int, items: list[Item],
                   done: dict[tuple[str, str], StageRun]) -> list[Item]:
        """A scope="all" stage: one StageRun over every live item (its output: kept and dropped)."""
        row = done.get((stage.name, ALL_ITEMS))
        if row is None:
            assert stage.fn is not None
            self.beat()
            row = self._start(stage, index, ALL_ITEMS, {item.key: stage.inputs(item.state) for item in items})
            try:
                answer = stage.fn(row.inputs)
                kept = {k: v for k, v in answer.items() if not isinstance(v, Drop)}
                dropped = {k: str(v) or "dropped by the gate" for k, v in answer.items() if isinstance(v, Drop)}
            except Exception as exc:
                self._finish(row, StageRun.Status.FAILED, f"{type(exc).__name__}: {exc}")
                raise StageFailed(f"stage {stage.name!r}: {type(exc).__name__}: {exc}") from exc
            for item in items:
                if item.key not in kept and item.key not in dropped:
                    dropped[item.key] = "not in the gate's answer"
            row = self._finish(row, StageRun.Status.SUCCEEDED, "", {
                "parsed_output": {"kept": kept, "dropped": dropped},
                "validator_result": {"valid": True, "kept": len(kept), "dropped": len(dropped)}})
        kept = (row.parsed_output or {}).get("kept", {})
        return [Item(item.key, {**item.state, stage.name: kept[item.key]}) for item in items if item.key in kept]

    def _emit_task(self, item: Item) -> StageRun:
        """Create the item's task through the task service, linked to this StageRun."""
        task_item = dict(self.pipeline.task(item.key, item.state))
        task_item.setdefault("external_id", f"{self.pipeline.name}-{item.key}")
        row = self._start(_TASK_STAGE_SPEC, len(self.pipeline.stages), item.key, {"task": task_item})
        try:
            with transaction.atomic():
                result = tasks_create(items=[row.inputs["task"]], actor=self.run.created_by,
                                      batch_name=self.run.batch_name, source="pipeline")
                task = result.tasks[0]
                self._finish(row, StageRun.Status.SUCCEEDED, "", {
                    "parsed_output": {"task_id": task.pk}, "task": task, "validator_result": {"valid": True}})
                if self.run.batch_id != result.batch.pk:
                    self.run.batch = result.batch
                    PipelineRun.objects.filter(pk=self.run.pk).update(batch=result.batch)
            return row
        except TaskCreateError as exc:
            return self._finish(row, StageRun.Status.DROPPED, f"the task is invalid: {exc}",
                         {"validator_result": {"valid": False, "errors": [list(e) for e in exc.errors]}})


_TASK_STAGE_SPEC = CodeStage(name=TASK_STAGE, fn=lambda inputs: inputs)


def run_counts(run: PipelineRun) -> dict[str, Any]:
    """The run's counters, from its StageRuns (what the run row and the progress bar show)."""
    rows = StageRun.objects.filter(run=run)
    stats = rows.aggregate(
        done=Count("id", filter=Q(stage=TASK_STAGE, status=StageRun.Status.SUCCEEDED)),
        dropped=Count("id", filter=Q(status=StageRun.Status.DROPPED)),
        calls=Sum("llm_calls"), tokens=Sum("total_tokens"), cost=Sum("cost_usd"),
        finished=Count("id", filter=Q(status__in=StageRun.FINISHED)),
    )
    gated = rows.filter(item_key=ALL_ITEMS, status=StageRun.Status.SUCCEEDED).values_list("parsed_output", flat=True)
    stats["dropped"] += sum(len((out or {}).get("dropped") or {}) for out in gated)
    return {
        "items_done": stats["done"], "tasks_created": rows.filter(task__isnull=False).count(),
        "items_dropped": stats["dropped"], "llm_calls": stats["calls"] or 0,
        "total_tokens": stats["tokens"] or 0, "cost_usd": stats["cost"] or Decimal(0),
        "stages_finished": stats["finished"],
    }
