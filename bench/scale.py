#!/usr/bin/env python
"""Benchmark the platform at 10k, 100k and 1M trajectories (issue 41): how each operation grows.

    tests/tools/with-postgres sh -c '.venv/bin/python bench/scale.py --database-url "$DATABASE_URL"'
    .venv/bin/python bench/scale.py --sizes 2000,8000 --formats rl,raw     # a quick look, on SQLite

Fills one throwaway database step by step to each size (--sizes, default 10000,100000,1000000)
with bench/export.py's synthetic code_exec rollouts (12 messages, 5 tool calls with their full
step records and an `llm` record each, about 6 KB a trajectory; 4 rollouts per task, an automatic
review each, a human verdict on every tenth, a pending proposal on every tenth task: the console's
queues), bulk-inserted in batches of 5,000, and with the dedup embeddings of every new trajectory
stored as the finished-iteration job would store them, then ANALYZEd (as autovacuum would after
a bulk load; without it PostgreSQL plans the version's scan from empty-table statistics: 40 s
instead of 1 s at 10k). On PostgreSQL the rows above --python-fill-max (100k) are the database's
copies of the first 100k (replicate()). bench/review_console.py fills its database with grow() too.
Those vectors are SYNTHETIC (seeded unit vectors with the shape of real ones: tasks that share a
topic, one task in 50 a paraphrase of the one before, the rollouts of a task done one of two ways
with small differences), so that filling 1M takes minutes, not the days MiniLM would take here; the
model's own throughput is measured separately ("embedding throughput", real MiniLM on the
platform's action sequences). Then, at each size, each in a fresh subprocess so peak RSS is its own:

* version through dedup: dataset_version_create with exact and near dedup on (the defaults) over
  every trajectory, stopped when dedup is done (the scan, the member reads, the stored vectors,
  the ANN search and the clustering; the version's writes come last, so nothing is written):
  wall, peak RSS, members/s, the seconds of each stage; at every size;
* whole version: the same to the end (the card and the writes: the version is written, its
  exportability queued), up to --full-version-max (100k); then, in a fresh subprocess of its own,
* exportability: that version's exportability job (services.exportability_measure, as a worker
  runs it: the dry run of every applicable format on every member, in chunks, its tallies saved
  after each), wall and peak RSS apart from the version's;
* export FORMAT: bench/export.py's export of the first N trajectories against its bare
  serialize loop over the same rows (ratio, target >= 0.5), peak RSS; every format up to
  --all-formats-max (100k), --large-formats (rl, sft-openai) above;
* console: each page of bench/review_console.py, 20 requests, p95 and queries (target 300 ms);
* metrics: GET /metrics with its 2,000-trajectory window full (p95 of 10, queries);
* import (at 100k only): trajectories_import of a raw export of 100k trajectories.

The last table gives the exponent b of time ~ n^b fitted over the sizes (target <= 1.2 for
version creation) and the peak RSS of the largest size over the smallest (target <= 1.5).
A benchmark, not a test: it prints numbers and exits 0 (1 only if it cannot run). The machine is
shared: the 1M size takes most of an hour (--largest-not-before HH:MM waits to start it).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import export as export_bench  # bench/export.py: the set-up, the rollouts, the export and bare loops
import review_console  # bench/review_console.py: the console pages

ROOT = Path(__file__).resolve().parent.parent
FILL_BATCH = 5000
PER_TASK = 4
BATCH_NAME = "scale"
PROPOSAL_EVERY = 10  # every tenth task waits for approval of a pending proposal
DIM = 384
TOPICS = 64
VERSION_TARGET_S_AT_1M = 1800
TARGETS = {"version exponent": 1.2, "rss growth": 1.5, "export ratio": 0.5, "console p95 ms": 300.0}


# -- data --------------------------------------------------------------------------------------

def _unit(v: Any) -> Any:
    import numpy as np

    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


_topics: list[Any] = []


def synthetic_vectors(task: int, rollouts: range) -> tuple[Any, Any]:
    """(prompt vector of the task, action vectors of its rollouts), seeded by the task index."""
    import numpy as np

    if not _topics:
        _topics.append(np.random.default_rng(0).standard_normal((TOPICS, DIM)))
    topics = _topics[0]
    rng = np.random.default_rng(task + 1)
    if task % 50 == 1:  # a paraphrase of the task before it (cosine about 0.95)
        before = np.random.default_rng(task)
        base = before.standard_normal(DIM) + 1.2 * topics[before.integers(0, TOPICS)]
        prompt = _unit(_unit(base) + 0.33 * rng.standard_normal(DIM) / math.sqrt(DIM))
    else:
        prompt = _unit(rng.standard_normal(DIM) + 1.2 * topics[rng.integers(0, TOPICS)])
    ways = _unit(rng.standard_normal((2, DIM)))
    actions = [_unit(ways[k % 2] + 0.25 * rng.standard_normal(DIM) / math.sqrt(DIM)) for k in rollouts]
    return prompt, np.stack(actions)


def _proposal(task_id: int) -> Any:
    """A pending yellow proposal of the review agent (the console's approval queue)."""
    from apps.reviews.models import Proposal

    return Proposal(task_id=task_id, iteration=1, field="model", from_value="bench-model", to_value="gpt-4o-mini",
                    options=["gpt-4o-mini", "deepseek-chat"], tier="yellow", proposer="review-agent",
                    rationale="the judge's correctness scores stay below the threshold")


def _steps_with_llm(steps: list[dict[str, Any]], messages: list[dict[str, Any]], i: int) -> list[dict[str, Any]]:
    """The step records with each tool's real output and the model call that chose the step."""
    outputs = [m["content"] for m in messages if m["role"] == "tool"]
    for k, step in enumerate(steps):
        step["output"] = outputs[k] if k < len(outputs) else "ok"
        step["llm"] = {"provider": "bench", "model": "bench-model", "latency_ms": 400 + (i * 7 + k) % 900,
                       "attempts": 1 + (i % 17 == 0), "prompt_tokens": 900, "completion_tokens": 60}
    return steps


class Copier:
    """Rows into one table by PostgreSQL COPY (bulk_create elsewhere): every column from a template
    instance prepared once by Django, the varying ones given per row, ids handed out here."""

    def __init__(self, model: Any, template: Any) -> None:
        from django.db import connection

        self.model, self.connection = model, connection
        self.fields = [f for f in model._meta.concrete_fields]
        # pre_save fills auto_now(_add) columns; a UUID column gets a fresh value per row (add()).
        self.defaults = [None if f.primary_key else f.get_db_prep_save(f.pre_save(template, True), connection)
                         for f in self.fields]
        self.uuids = [k for k, f in enumerate(self.fields) if f.get_internal_type() == "UUIDField"]
        from psycopg.types.json import Jsonb

        import orjson

        # JSON written once as text, not re-encoded by the driver on every row
        self.defaults = [orjson.dumps(v.obj).decode() if isinstance(v, Jsonb) else v for v in self.defaults]
        self.columns = [f.column for f in self.fields]
        self.index = {f.attname: k for k, f in enumerate(self.fields)}
        self.next_id = (model.objects.order_by("-pk").values_list("pk", flat=True).first() or 0) + 1
        self.rows: list[tuple[Any, ...]] = []

    def add(self, **values: Any) -> int:
        """Queue a row (JSON columns as JSON text); returns its id."""
        row = list(self.defaults)
        pk = self.next_id
        self.next_id += 1
        row[self.index["id"]] = pk
        for k in self.uuids:
            row[k] = uuid.uuid4()
        for name, value in values.items():
            row[self.index[name]] = value
        self.rows.append(tuple(row))
        return pk

    def flush(self) -> None:
        if not self.rows:
            return
        table = self.model._meta.db_table
        cols = ", ".join(f'"{c}"' for c in self.columns)
        with self.connection.cursor() as cursor:
            with cursor.cursor.copy(f'COPY "{table}" ({cols}) FROM STDIN') as copy:
                for row in self.rows:
                    copy.write_row(row)
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), {self.next_id - 1})")
        self.rows = []


def fill(start: int, stop: int, batch: Any, reviewer: Any) -> None:
    """Trajectories start..stop-1 (tasks of PER_TASK rollouts), reviews, and their stored embeddings."""
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.datasets import dedup
    from apps.engines.embedding_store import RowStore
    from apps.engines.embeddings import EMBEDDING_MODEL_NAME, text_sha256
    from apps.engines.models import TextEmbedding
    from apps.reviews.models import Proposal, Review
    from apps.tasks.models import Task, Trajectory, content_sha256

    if connection.vendor != "postgresql":
        return _fill_orm(start, stop, batch, reviewer)
    import orjson

    now = timezone.now()
    for first in range(start, stop, FILL_BATCH):
        count = min(FILL_BATCH, stop - first)
        tasks = Copier(Task, Task(batch=batch, scene="code_exec", prompt="", status="completed", current_iteration=1))
        proposals = Copier(Proposal, _proposal(0))
        trajectories = Copier(Trajectory, Trajectory(
            task_id=0, iteration=1, sample_index=0, status="finished", messages=[], tools=export_bench.TOOLS, steps=[],
            finished_at=now, verifier_output={"command": "python3 -m pytest -q", "exit_code": 0, "passed": 3},
            model="bench-model", config_snapshot={"scene": "code_exec", "temperature": 0.7},
            prompt_tokens=900, completion_tokens=300, total_tokens=1200))
        reviews = Copier(Review, Review(trajectory_id=0, kind="auto", status="done", overall=0, judge_model="judge",
                                        rubric_version="v1",
                                        scores={"correctness": {"score": 70, "rationale": "tests pass"}}))
        humans = Copier(Review, Review(trajectory_id=0, kind="human", status="done", verdict="accept", reviewer=reviewer))
        humans.next_id = reviews.next_id + count  # after the automatic reviews of this batch
        vectors = Copier(TextEmbedding, TextEmbedding(sha256="", model=EMBEDDING_MODEL_NAME, dim=DIM, vector=b""))
        task_id = 0
        for k in range(count):
            i = first + k
            messages, steps = export_bench.episode(i)
            if k % PER_TASK == 0:
                prompt = messages[1]["content"]
                pending = (i // PER_TASK) % PROPOSAL_EVERY == 0
                task_id = tasks.add(prompt=prompt, external_id=f"t{i // PER_TASK}",
                                    status="waiting_approval" if pending else "completed")
                if pending:
                    proposals.add(task_id=task_id)
                prompt_vec, action_vecs = synthetic_vectors(i // PER_TASK, range(PER_TASK))
                vectors.add(sha256=text_sha256(prompt), vector=prompt_vec.tobytes())
            success = i % PER_TASK != PER_TASK - 1
            final_answer, outcome, reward = ("done", "success", 1.0) if success else ("", "failure", 0.25)
            sha = content_sha256({"messages": messages, "tools": export_bench.TOOLS, "final_answer": final_answer,
                                  "outcome": outcome, "reward": reward})
            pk = trajectories.add(task_id=task_id, sample_index=k % PER_TASK, messages=orjson.dumps(messages).decode(),
                                  steps=orjson.dumps(_steps_with_llm(steps, messages, i)).decode(),
                                  final_answer=final_answer, outcome=outcome, reward=reward, content_sha256=sha)
            reviews.add(trajectory_id=pk, overall=50 + pk % 50)
            if k % 10 == 0:
                humans.add(trajectory_id=pk)
            vectors.add(sha256=text_sha256(dedup.action_sequence(messages)), vector=action_vecs[k % PER_TASK].tobytes())
        with transaction.atomic():
            for copier in (tasks, proposals, trajectories, reviews, humans, vectors):
                copier.flush()


def grow(filled: int, n: int, batch: Any, reviewer: Any, *, python_fill_max: int) -> None:
    """The database from `filled` to `n` trajectories (fill(); on PostgreSQL above python_fill_max,
    replicate() of the first python_fill_max or more), then ANALYZEd. bench/review_console.py's fill too."""
    from django.db import connection

    if connection.vendor == "postgresql" and n > python_fill_max:
        if filled < python_fill_max:
            fill(filled, python_fill_max, batch, reviewer)
            filled = python_fill_max
        replicate(filled, n)
    else:
        fill(filled, n, batch, reviewer)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # what autovacuum does after a bulk load: plans from real statistics


def _finish_arguments(i: int) -> str:
    return json.dumps({"answer": f"solve() implemented for variant {i}"}, ensure_ascii=False)


def _select(model: Any, overrides: dict[str, str]) -> tuple[str, str]:
    """(column list, SELECT expressions) copying every column of `model` from alias `r`, some overridden."""
    columns = [f.column for f in model._meta.concrete_fields]
    return (", ".join(f'"{c}"' for c in columns),
            ", ".join(overrides.get(c, f'r."{c}"') for c in columns))


def replicate(base: int, stop: int) -> None:
    """Trajectories base..stop-1 as PostgreSQL's copies of the first `base` (made by fill()): each
    copy gets a task of its own (a new prompt, "Task N: ..."), its own finish answer ("... variant
    i"), hence its own normalized hash and action sequence, and its tasks' and rollouts' synthetic
    vectors; the rest of its record (messages, steps, reviews) is the original's, copied in the
    database without passing through Python. content_sha256 of a copy is a digest of the
    original's and the copy's number, not the canonical hash (nothing here re-checks it)."""
    from django.db import connection, transaction

    from apps.datasets import dedup
    from apps.engines.embeddings import EMBEDDING_MODEL_NAME, text_sha256
    from apps.engines.models import TextEmbedding
    from apps.reviews.models import Proposal, Review
    from apps.tasks.models import Task, Trajectory

    if base % PER_TASK or stop % base:
        raise SystemExit(f"replicate: {stop} must be a multiple of the base {base} (itself of {PER_TASK})")
    actions = [dedup.action_sequence(export_bench.episode(i)[0]) for i in range(base)]
    t_table, r_table, v_table = Task._meta.db_table, Trajectory._meta.db_table, Review._meta.db_table
    p_table = Proposal._meta.db_table
    batch_id, first_task = Task.objects.filter(external_id="t0").values_list("batch_id", "id").get()
    first_traj = Trajectory.objects.filter(task_id=first_task, sample_index=0).values_list("id", flat=True).get()
    base_tasks = base // PER_TASK
    for copy in range(1, stop // base):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f'SELECT max(id) FROM "{t_table}"')
            task_off = cursor.fetchone()[0] + 1 - first_task
            cursor.execute(f'SELECT max(id) FROM "{r_table}"')
            traj_off = cursor.fetchone()[0] + 1 - first_traj
            cursor.execute(f'SELECT max(id) FROM "{v_table}"')
            review_off = cursor.fetchone()[0] + 1
            shift_t, shift_i = copy * base_tasks, copy * base
            cols, exprs = _select(Task, {
                "id": f"r.id + {task_off}",
                "external_id": f"'t' || (substr(r.external_id, 2)::int + {shift_t})",
                "prompt": f"regexp_replace(r.prompt, '^Task [0-9]+:', 'Task ' || (substr(r.external_id, 2)::int + "
                          f"{shift_t}) || ':')"})
            cursor.execute(f'INSERT INTO "{t_table}" ({cols}) SELECT {exprs} FROM "{t_table}" r '
                           f"WHERE r.batch_id = %s AND r.id >= %s AND r.id < %s", [batch_id, first_task,
                                                                                  first_task + base_tasks])
            cols, exprs = _select(Proposal, {"id": f"r.id - (SELECT min(id) FROM \"{p_table}\") + "
                                                   f"(SELECT max(id) FROM \"{p_table}\") + 1",
                                             "task_id": f"r.task_id + {task_off}"})
            cursor.execute(f'INSERT INTO "{p_table}" ({cols}) SELECT {exprs} FROM "{p_table}" r '
                           f"WHERE r.task_id >= %s AND r.task_id < %s", [first_task, first_task + base_tasks])
            new_i = f"(substr(t.external_id, 2)::int * {PER_TASK} + r.sample_index + {shift_i})"
            cols, exprs = _select(Trajectory, {
                "id": f"r.id + {traj_off}", "task_id": f"r.task_id + {task_off}", "uuid": "gen_random_uuid()",
                "messages": "jsonb_set(jsonb_set(r.messages, '{1,content}', to_jsonb(regexp_replace("
                            "r.messages->1->>'content', '^Task [0-9]+:', 'Task ' || (substr(t.external_id, 2)::int + "
                            f"{shift_t}) || ':'))), '{{9,tool_calls,0,function,arguments}}', to_jsonb("
                            f"'{{\"answer\": \"solve() implemented for variant ' || {new_i} || '\"}}'))",
                "content_sha256": f"encode(sha256(convert_to(r.content_sha256 || ':{copy}', 'UTF8')), 'hex')"})
            cursor.execute(f'INSERT INTO "{r_table}" ({cols}) SELECT {exprs} FROM "{r_table}" r '
                           f'JOIN "{t_table}" t ON t.id = r.task_id WHERE r.id >= %s AND r.id < %s',
                           [first_traj, first_traj + base])
            cols, exprs = _select(Review, {"id": f"r.id - (SELECT min(id) FROM \"{v_table}\") + {review_off}",
                                           "trajectory_id": f"r.trajectory_id + {traj_off}"})
            cursor.execute(f'INSERT INTO "{v_table}" ({cols}) SELECT {exprs} FROM "{v_table}" r '
                           f"WHERE r.trajectory_id >= %s AND r.trajectory_id < %s", [first_traj, first_traj + base])
            for table in (t_table, p_table, r_table, v_table):
                cursor.execute(f"SELECT setval(pg_get_serial_sequence('\"{table}\"', 'id'), "
                               f'(SELECT max(id) FROM "{table}"))')
            vectors = Copier(TextEmbedding, TextEmbedding(sha256="", model=EMBEDDING_MODEL_NAME, dim=DIM, vector=b""))
            for i in range(base):
                j = i + shift_i
                if j % PER_TASK == 0:
                    prompt = export_bench.episode(j)[0][1]["content"]
                    prompt_vec, action_vecs = synthetic_vectors(j // PER_TASK, range(PER_TASK))
                    vectors.add(sha256=text_sha256(prompt), vector=prompt_vec.tobytes())
                text = actions[i].replace(f"finish(answer=solve() implemented for variant {i})",
                                          f"finish(answer=solve() implemented for variant {j})")
                vectors.add(sha256=text_sha256(text), vector=action_vecs[j % PER_TASK].tobytes())
            vectors.flush()
    _check_copies(stop)


def _check_copies(stop: int, sample: int = 200) -> None:
    """Each sampled copy's dedup texts are stored (else version creation would run MiniLM on them)."""
    from apps.datasets import dedup
    from apps.engines.embeddings import EMBEDDING_MODEL_NAME, text_sha256
    from apps.engines.models import TextEmbedding
    from apps.tasks.models import Trajectory

    rows = Trajectory.objects.order_by("-id").values_list("task__prompt", "messages")[:sample]
    for prompt, messages in rows:
        for text in (prompt, dedup.action_sequence(messages)):
            if not TextEmbedding.objects.filter(sha256=text_sha256(text), model=EMBEDDING_MODEL_NAME).exists():
                raise SystemExit(f"replicate: no stored vector for {text[:80]!r}")
    if Trajectory.objects.count() != stop:
        raise SystemExit(f"replicate: {Trajectory.objects.count()} trajectories, expected {stop}")


def _fill_orm(start: int, stop: int, batch: Any, reviewer: Any) -> None:
    """fill() through bulk_create (SQLite: the quick look)."""
    from django.db import transaction
    from django.utils import timezone

    from apps.datasets import dedup
    from apps.engines.embedding_store import RowStore
    from apps.engines.embeddings import EMBEDDING_MODEL_NAME, text_sha256
    from apps.reviews.models import Proposal, Review
    from apps.tasks.models import Task, Trajectory

    store = RowStore()
    now = timezone.now()
    for first in range(start, stop, FILL_BATCH):
        count = min(FILL_BATCH, stop - first)
        with transaction.atomic():
            episodes = [export_bench.episode(first + k) for k in range(count)]
            tasks = Task.objects.bulk_create([
                Task(batch=batch, scene="code_exec", prompt=episodes[k][0][1]["content"],
                     external_id=f"t{(first + k) // PER_TASK}", current_iteration=1,
                     status="waiting_approval" if ((first + k) // PER_TASK) % PROPOSAL_EVERY == 0 else "completed")
                for k in range(0, count, PER_TASK)])
            Proposal.objects.bulk_create([_proposal(t.pk) for t in tasks if t.status == "waiting_approval"])
            rows, shas, vectors = [], [], []
            for k, (messages, steps) in enumerate(episodes):
                i = first + k
                success = i % PER_TASK != PER_TASK - 1
                t = Trajectory(task=tasks[k // PER_TASK], iteration=1, sample_index=k % PER_TASK, status="finished",
                               messages=messages, tools=export_bench.TOOLS, steps=_steps_with_llm(steps, messages, i),
                               final_answer="done" if success else "", outcome="success" if success else "failure",
                               reward=1.0 if success else 0.25, finished_at=now,
                               verifier_output={"command": "python3 -m pytest -q", "exit_code": 0, "passed": 3},
                               model="bench-model", config_snapshot={"scene": "code_exec", "temperature": 0.7},
                               prompt_tokens=900, completion_tokens=300, total_tokens=1200)
                t.content_sha256 = t.compute_content_sha256()
                rows.append(t)
                if k % PER_TASK == 0:
                    prompt_vec, action_vecs = synthetic_vectors(i // PER_TASK, range(PER_TASK))
                    shas.append(text_sha256(tasks[k // PER_TASK].prompt))
                    vectors.append(prompt_vec)
                shas.append(text_sha256(dedup.action_sequence(messages)))
                vectors.append(action_vecs[k % PER_TASK])
            Trajectory.objects.bulk_create(rows, batch_size=FILL_BATCH)
            reviews = [Review(trajectory=t, kind="auto", status="done", overall=50 + (t.pk % 50),
                              scores={"correctness": {"score": 70, "rationale": "tests pass"}}, judge_model="judge",
                              rubric_version="v1") for t in rows]
            reviews += [Review(trajectory=t, kind="human", status="done", verdict="accept", reviewer=reviewer)
                        for t in rows[::10]]
            Review.objects.bulk_create(reviews, batch_size=FILL_BATCH)
            store.save(shas, vectors, EMBEDDING_MODEL_NAME)


# -- measured children -------------------------------------------------------------------------

class _StopAfterDedup(Exception):
    pass


def child_version(n: int, *, through_dedup: bool) -> dict[str, Any]:
    """dataset_version_create over every trajectory; through_dedup: stopped once dedup is done
    (scan, member reads, dedup: nothing is written, the version's writes come last)."""
    from apps.datasets import dedup
    from apps.datasets.services import dataset_version_create
    from apps.engines.models import TextEmbedding

    stages: dict[str, float] = {}
    peaks: dict[str, float] = {}
    last = [time.perf_counter()]
    results: list[Any] = []
    real_dedup = dedup.dedup_members

    def keep_result(*args: Any, **kwargs: Any) -> Any:
        results.append(real_dedup(*args, **kwargs))
        return results[-1]

    def progress(stage: str, done: int, total: int) -> None:
        now = time.perf_counter()
        stages[stage] = stages.get(stage, 0.0) + now - last[0]
        peaks[stage] = export_bench.rss_mb("VmHWM")  # the peak by the end of each stage: where it grows
        last[0] = now
        if through_dedup and stage == "dedup":
            raise _StopAfterDedup

    dedup.dedup_members = keep_result  # the services call it through the module: the counts are read here
    stored = TextEmbedding.objects.count()
    actor = review_console._user("bench-approver", "approver")
    t0 = last[0] = time.perf_counter()
    try:
        dataset_version_create(dataset_name=f"scale-{n}", filter_spec={}, actor=actor, progress=progress,
                               wait_exportability=False)  # measured by child_exportability, in its own process
    except _StopAfterDedup:
        pass
    elapsed = time.perf_counter() - t0
    if not through_dedup:
        stages["card and writes"] = time.perf_counter() - last[0]
    result = results[0]
    return {"seconds": elapsed, "in_scope": n, "exact_removed": result.exact_removed,
            "near_removed": result.near_removed, "embedded": TextEmbedding.objects.count() - stored,
            "stages": stages, "stage_peaks_mb": peaks}


def child_exportability(n: int) -> dict[str, Any]:
    """The exportability job of the version child_version wrote (scale-N v1), run here as a worker runs it."""
    from apps.datasets.models import ExportabilityRun
    from apps.datasets.services import exportability_measure

    run = ExportabilityRun.objects.get(version__dataset__name=f"scale-{n}", version__number=1)
    t0 = time.perf_counter()
    done = exportability_measure(run.pk)
    elapsed = time.perf_counter() - t0
    if done is None or done.status != "done":
        raise SystemExit(f"exportability of scale-{n} v1 did not finish: {done and done.error}")
    return {"seconds": elapsed, "members": done.total}


def child_console(requests: int) -> dict[str, Any]:
    from apps.tasks.models import Batch

    batch = Batch.objects.get(name=BATCH_NAME)
    review_console.measure(1, batch)  # warm-up: templates compiled, caches filled
    return {"pages": {page: {"p95_ms": review_console.p95(times) * 1000, "queries": queries}
                      for page, (times, queries) in review_console.measure(requests, batch).items()}}


def child_metrics(requests: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from apps.tasks.models import Trajectory

    ids = list(Trajectory.objects.order_by("-id").values_list("id", flat=True)[:3000])
    Trajectory.objects.filter(id__gte=ids[-1]).update(finished_at=timezone.now())  # the window holds a full sample
    client = Client(HTTP_HOST="127.0.0.1")
    times = []
    for _ in range(requests):
        with CaptureQueriesContext(connection) as captured:
            t0 = time.perf_counter()
            response = client.get("/metrics")
            times.append(time.perf_counter() - t0)
        if response.status_code != 200:
            raise SystemExit(f"/metrics: HTTP {response.status_code}")
    return {"p95_ms": review_console.p95(times) * 1000, "median_ms": statistics.median(times) * 1000,
            "queries": len(captured)}


def child_import(path: str) -> dict[str, Any]:
    from apps.datasets.raw_import import trajectories_import

    t0 = time.perf_counter()
    result = trajectories_import(path_or_file=path, actor=None, batch_name="scale-import")
    return {"seconds": time.perf_counter() - t0, "trajectories": result.trajectory_count}


def child_raw_file(n: int, path: str) -> dict[str, Any]:
    from apps.datasets.exporters import export_records, load_records

    with open(path, "wb") as out:
        result = export_records("raw", load_records(export_bench._ids(n), chunk_size=export_bench.CHUNK), out)
    return {"lines": result.lines}


def child_embed(texts: int) -> dict[str, Any]:
    from apps.datasets import dedup
    from apps.engines.embeddings import sentence_embedder

    sample = [dedup.action_sequence(export_bench.episode(i)[0]) for i in range(texts)]
    sentence_embedder(sample[:8])  # load the model; not what is measured
    t0 = time.perf_counter()
    sentence_embedder(sample)
    return {"seconds": time.perf_counter() - t0, "texts": texts}


def _wait_until(hhmm: str) -> None:
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc)
    hour, minute = (int(x) for x in hhmm.split(":"))
    start = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if start > now:
        print(f"(waiting until {hhmm} UTC before the largest size)", flush=True)
        time.sleep((start - now).total_seconds())


def run_child(args: argparse.Namespace, mode: str, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--database-url", args.database_url, "--var-dir", args.var_dir,
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} {extra} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_main(args: argparse.Namespace) -> int:
    export_bench.setup(args.database_url, args.var_dir)
    import apps.datasets.exporters  # noqa: F401  (imports are not what is measured)
    import apps.datasets.services  # noqa: F401

    start = export_bench.rss_mb("VmRSS")
    mode, n = args.child, args.n
    if mode in ("version", "dedup"):
        stats = child_version(n, through_dedup=mode == "dedup")
    elif mode == "exportability":
        stats = child_exportability(n)
    elif mode == "export":
        stats = export_bench.child_export(args.format, n)
    elif mode == "bare":
        stats = export_bench.child_bare(n)
    elif mode == "console":
        stats = child_console(args.requests)
    elif mode == "metrics":
        stats = child_metrics(args.requests)
    elif mode == "raw-file":
        stats = child_raw_file(n, args.path)
    elif mode == "import":
        stats = child_import(args.path)
    else:
        stats = child_embed(n)
    stats.update(start_rss_mb=start, peak_rss_mb=export_bench.rss_mb("VmHWM"))
    print(json.dumps(stats))
    return 0


# -- the run -----------------------------------------------------------------------------------

def exponent(points: list[tuple[int, float]]) -> float | None:
    """b of y ~ n^b, least squares over log-log points (None with fewer than two)."""
    points = [(n, y) for n, y in points if y > 0]
    if len(points) < 2:
        return None
    xs, ys = [math.log(n) for n, _ in points], [math.log(y) for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="trajectories at each step (ascending)")
    parser.add_argument("--formats", default="sft-openai,sft-trl,dpo-trl,rl,rl-verl,sharegpt,raw",
                        help="export formats measured at every size")
    parser.add_argument("--import-size", type=int, default=100_000,
                        help="at the end, import a raw export of this many trajectories (0: no import)")
    parser.add_argument("--requests", type=int, default=20, help="requests per console page and to /metrics")
    parser.add_argument("--embed-texts", type=int, default=512, help="texts for the MiniLM throughput (0: skip)")
    parser.add_argument("--database-url", help="an empty, throwaway database (default: a temporary SQLite file)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--python-fill-max", type=int, default=100_000,
                        help="rows above this size are PostgreSQL's copies of those below (replicate())")
    parser.add_argument("--full-version-max", type=int, default=100_000,
                        help="the whole version (card, writes) and its exportability job only up to this size; "
                             "through dedup at every size")
    parser.add_argument("--large-formats", default="rl,sft-openai",
                        help="the formats measured above --all-formats-max ('': none)")
    parser.add_argument("--all-formats-max", type=int, default=100_000)
    parser.add_argument("--exports-max", type=int, default=10**9, help="no export measured above this size")
    parser.add_argument("--largest-not-before", default="",
                        help="HH:MM (UTC): wait until then before filling the largest size (a shared machine)")
    parser.add_argument("--child", choices=["version", "dedup", "exportability", "export", "bare", "console", "metrics", "raw-file", "import",
                                            "embed"], help=argparse.SUPPRESS)
    parser.add_argument("-n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--format", default="raw", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--var-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child_main(args)

    sizes = sorted(int(s) for s in args.sizes.split(","))
    formats = [f for f in args.formats.split(",") if f]
    tmp = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    args.var_dir = str(tmp / "var")
    Path(args.var_dir).mkdir()
    args.database_url = args.database_url or f"sqlite:///{tmp / 'bench.sqlite3'}"
    export_bench.setup(args.database_url, args.var_dir)
    from django.core.management import call_command
    from django.db import connection

    from apps.tasks.models import Batch

    call_command("migrate", verbosity=0)
    batch = Batch.objects.create(name=BATCH_NAME)
    reviewer = review_console._user("bench-reviewer", "reviewer")
    print(f"database: {connection.vendor}; {os.cpu_count()} cores; sizes {', '.join(f'{n:,}' for n in sizes)}", flush=True)
    results: dict[int, dict[str, Any]] = {}
    filled = 0
    try:
        if args.embed_texts:
            e = run_child(args, "embed", "-n", str(args.embed_texts))
            print(f"embedding throughput (MiniLM, CPU): {e['texts'] / e['seconds']:.0f} texts/s "
                  f"({e['texts']} action sequences in {e['seconds']:.1f}s, peak {e['peak_rss_mb']:.0f} MB)", flush=True)
        for n in sizes:
            if n == sizes[-1] and args.largest_not_before:
                _wait_until(args.largest_not_before)
            t0 = time.perf_counter()
            grow(filled, n, batch, reviewer, python_fill_max=args.python_fill_max)
            fill_s = time.perf_counter() - t0
            print(f"\n== {n:,} trajectories (filled {n - filled:,} in {fill_s:.0f}s, "
                  f"{(n - filled) / fill_s:,.0f}/s)", flush=True)
            filled = n
            connection.close()
            r: dict[str, Any] = {"fill_s": fill_s}
            for mode in ("dedup", "version") if n <= args.full_version_max else ("dedup",):
                r[mode] = v = run_child(args, mode, "-n", str(n))
                stages = ", ".join(f"{k} {s:.1f}s (peak {v['stage_peaks_mb'].get(k, 0):.0f} MB by its end)"
                                   for k, s in v["stages"].items())
                what = "version through dedup" if mode == "dedup" else "whole version"
                print(f"  {what}: {v['seconds']:.1f}s, {n / v['seconds']:,.0f} members/s, peak "
                      f"{v['peak_rss_mb']:.0f} MB; {v['exact_removed']} exact and {v['near_removed']:,} near "
                      f"duplicates removed, {v['embedded']} texts embedded; {stages}", flush=True)
            if "version" in r:
                r["exportability"] = x = run_child(args, "exportability", "-n", str(n))
                print(f"  exportability job: {x['seconds']:.1f}s, {x['members'] / x['seconds']:,.0f} members/s, "
                      f"peak {x['peak_rss_mb']:.0f} MB", flush=True)
            r["exports"] = {}
            for fmt in ([] if n > args.exports_max else formats if n <= args.all_formats_max
                        else [f for f in args.large_formats.split(",") if f]):
                bare = run_child(args, "bare", "-n", str(n))
                ex = run_child(args, "export", "--format", fmt, "-n", str(n))
                r["exports"][fmt] = {"ratio": bare["seconds"] / ex["seconds"], "seconds": ex["seconds"],
                                     "peak_rss_mb": ex["peak_rss_mb"], "bare_peak_rss_mb": bare["peak_rss_mb"]}
                print(f"  export {fmt:<11} {n / ex['seconds']:>7,.0f}/s  ratio {bare['seconds'] / ex['seconds']:.2f}  "
                      f"peak {ex['peak_rss_mb']:.0f} MB (bare {bare['peak_rss_mb']:.0f} MB)", flush=True)
            r["console"] = c = run_child(args, "console", "--requests", str(args.requests))
            worst = max(c["pages"].items(), key=lambda kv: kv[1]["p95_ms"])
            print("  console p95 ms: " + ", ".join(f"{p} {x['p95_ms']:.0f} ({x['queries']}q)"
                                                   for p, x in c["pages"].items()), flush=True)
            print(f"  console worst p95: {worst[0]} {worst[1]['p95_ms']:.0f} ms", flush=True)
            r["metrics"] = m = run_child(args, "metrics", "--requests", str(min(args.requests, 10)))
            print(f"  metrics scrape: p95 {m['p95_ms']:.0f} ms, median {m['median_ms']:.0f} ms, "
                  f"{m['queries']} queries, peak {m['peak_rss_mb']:.0f} MB", flush=True)
            results[n] = r
        report(results, formats)
        if args.import_size:
            # last: the import adds its trajectories to the database the sizes above were measured on
            path = str(tmp / "import.jsonl")
            run_child(args, "raw-file", "-n", str(args.import_size), "--path", path)
            imported = run_child(args, "import", "--path", path)
            print(f"\nimport of {imported['trajectories']:,} trajectories (raw export): {imported['seconds']:.0f}s, "
                  f"{imported['trajectories'] / imported['seconds']:,.0f}/s, peak {imported['peak_rss_mb']:.0f} MB",
                  flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(results: dict[int, dict[str, Any]], formats: list[str]) -> None:
    """The growth table: seconds at each size, the fitted exponent, peak RSS largest/smallest measured."""
    sizes = sorted(results)

    def row(name: str, seconds: dict[int, float], rss: dict[int, float] | None, note: str = "") -> None:
        b = exponent(sorted(seconds.items()))
        measured = sorted(seconds)
        growth = f"{rss[measured[-1]] / rss[measured[0]]:.2f}" if rss and len(measured) > 1 else "-"
        cells = " ".join(f"{seconds[n]:>10.2f}" if n in seconds else f"{'-':>10}" for n in sizes)
        print(f"{name:<24} {cells} {('%.2f' % b) if b is not None else '-':>9} {growth:>9}  {note}")

    def pick(key: str, *path: str) -> dict[int, float]:
        out = {}
        for n in sizes:
            value: Any = results[n].get(key)
            for p in path:
                value = value.get(p) if isinstance(value, dict) else None
            if value is not None:
                out[n] = value
        return out

    print(f"\n{'seconds at':<24} " + " ".join(f"{n:>10,}" for n in sizes) + f" {'exponent':>9} {'RSS hi/lo':>9}")
    row("version through dedup", pick("dedup", "seconds"), pick("dedup", "peak_rss_mb"),
        f"target exponent <= {TARGETS['version exponent']}, RSS <= {TARGETS['rss growth']}")
    row("whole version", pick("version", "seconds"), pick("version", "peak_rss_mb"), "(to written)")
    row("exportability job", pick("exportability", "seconds"), pick("exportability", "peak_rss_mb"),
        "(after it is written, on a worker)")
    for fmt in sorted({f for n in sizes for f in results[n]["exports"]}, key=lambda f: (f not in formats, f)):
        ratios = " ".join(f"{results[n]['exports'][fmt]['ratio']:.2f}" for n in sizes if fmt in results[n]["exports"])
        row(f"export {fmt}", pick("exports", fmt, "seconds"), pick("exports", fmt, "peak_rss_mb"),
            f"ratio to bare {ratios} (target >= {TARGETS['export ratio']})")
    console = {n: max(p["p95_ms"] for p in results[n]["console"]["pages"].values()) / 1000 for n in sizes}
    row("console worst p95", console, None, f"target <= {TARGETS['console p95 ms'] / 1000:g} s")
    row("metrics scrape p95", {n: v / 1000 for n, v in pick("metrics", "p95_ms").items()}, pick("metrics", "peak_rss_mb"))
    hi = sizes[-1]
    if hi >= 1_000_000 and "dedup" in results[hi]:
        took = results[hi]["dedup"]["seconds"]
        verdict = "meets" if took < VERSION_TARGET_S_AT_1M else "misses"
        print(f"version through dedup at {hi:,}: {took / 60:.1f} min ({verdict} the "
              f"{VERSION_TARGET_S_AT_1M // 60} min target)")


if __name__ == "__main__":
    sys.exit(main())
