"""Trajectory pages for signed-in users with tasks.view_trajectory: list, detail, log backfill.

The detail page renders the episode server-side and carries an empty live-log panel that
static/tasks/livelog.js fills: backfill from `trajectory_log` by seq, then follow the
websocket served by `apps.tasks.consumers.TrajectoryLogConsumer`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from apps.engines.scenes import SCENE_CHOICES
from apps.tasks.consumers import MAX_ID, MAX_SEQ
from apps.tasks.models import Trajectory, TrajectoryLog
from trajplatform import json_limits

VIEW_PERMISSION = "tasks.view_trajectory"
LIST_PAGE_SIZE = 50
BACKFILL_DEFAULT_LIMIT = 500
BACKFILL_MAX_LIMIT = 1000
_DIGITS = re.compile(r"[0-9]{1,10}")


# --- the episode, readable --------------------------------------------------------------

@dataclass
class Action:
    name: str
    arguments: str
    call_id: str = ""
    result: str | None = None
    meta: list[str] = field(default_factory=list)


@dataclass
class Step:
    number: int
    observations: list[tuple[str, str]]
    thought: str
    actions: list[Action]
    reasoning: str = ""
    turn: int | None = None


@dataclass
class Message:
    role: str
    text: str
    calls: list[tuple[str, str]] = field(default_factory=list)
    call_id: str = ""


@dataclass
class Episode:
    steps: list[Step]
    # where the steps came from: the agent's per-step records, or the messages when there are none
    source: str
    conversation: list[Message]
    # user/tool messages after the last assistant turn (messages source only)
    trailing: list[tuple[str, str]] = field(default_factory=list)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, cls=DjangoJSONEncoder)


def _text(content: Any) -> str:
    """Message content as plain text: a string, OpenAI content parts, or anything else as JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) for p in content):
        return "\n".join(p["text"] if isinstance(p.get("text"), str) else _json(p) for p in content)
    return _json(content)


def _arguments(raw: Any) -> str:
    """Tool-call arguments indented when they are JSON; left as sent when they are not."""
    if isinstance(raw, str):
        try:
            return _json(json_limits.loads(raw))
        except ValueError:  # not JSON, or nested too deep to parse safely
            return raw
    return _json(raw)


def _step_meta(record: dict[str, Any]) -> list[str]:
    """The facts of one executed step worth a glance: exit code, time, cut-offs, errors, model call."""
    meta = []
    if "exit_code" in record:
        meta.append(f"exit code {record['exit_code']}" if record["exit_code"] is not None else "no exit code")
    if record.get("duration_ms") is not None:
        meta.append(f"{record['duration_ms']} ms")
    if record.get("truncated"):
        meta.append("output truncated")
    if record.get("timed_out"):
        meta.append("timed out")
    if record.get("error"):
        meta.append(f"error: {_text(record['error'])}")
    llm = record.get("llm")
    if isinstance(llm, dict):
        usage = llm.get("usage") if isinstance(llm.get("usage"), dict) else {}
        parts = [str(llm["model"])] if llm.get("model") else []
        if llm.get("latency_ms") is not None:
            parts.append(f"{llm['latency_ms']} ms")
        if usage.get("total_tokens") is not None:
            parts.append(f"{usage['total_tokens']} tokens")
        if llm.get("cached"):
            parts.append("cached")
        if parts:
            meta.append("model call: " + ", ".join(parts))
    return meta


def _conversation(messages: list[Any]) -> list[Message]:
    conversation = []
    for message in messages:
        if not isinstance(message, dict):
            conversation.append(Message(role="?", text=_text(message)))
            continue
        calls = []
        raw_calls = message.get("tool_calls")
        for call in raw_calls if isinstance(raw_calls, list) else []:
            function = call.get("function") if isinstance(call, dict) and isinstance(call.get("function"), dict) else {}
            if function:
                calls.append((str(function.get("name") or "?"), _arguments(function.get("arguments", ""))))
            else:
                calls.append(("?", _text(call)))
        conversation.append(Message(
            role=str(message.get("role") or "?"), text=_text(message.get("content")), calls=calls,
            call_id=str(message.get("tool_call_id") or ""),
        ))
    return conversation


def _steps_from_records(records: list[Any]) -> list[Step]:
    """One step per record the agent loop wrote (observation, thought, tool, arguments, output, ...)."""
    steps: list[Step] = []
    previous_turn: Any = object()
    for n, record in enumerate(records, start=1):
        if not isinstance(record, dict):
            steps.append(Step(number=n, observations=[], thought="", actions=[Action("?", "", result=_text(record))]))
            continue
        turn = record.get("turn")
        reasoning = record.get("reasoning_content")
        # Calls of one model reply share its observation; show it once, on the first of them.
        observation = _text(record.get("observation")) if turn != previous_turn or turn is None else ""
        previous_turn = turn
        steps.append(Step(
            number=n,
            turn=turn if isinstance(turn, int) else None,
            observations=[("", observation)] if observation else [],
            thought=_text(record.get("thought")),
            # The loop records reasoning as the thought when the reply had no other text.
            reasoning=_text(reasoning) if reasoning and reasoning != record.get("thought") else "",
            actions=[Action(
                name=str(record.get("tool") or "?"),
                arguments=_arguments(record.get("arguments", "")),
                call_id=str(record.get("tool_call_id") or ""),
                result=_text(record["output"]) if "output" in record else None,
                meta=_step_meta(record),
            )],
        ))
    return steps


def _steps_from_messages(messages: list[Any]) -> tuple[list[Step], list[tuple[str, str]]]:
    """Each assistant message starts a step; role=tool messages are matched to calls by id."""
    steps: list[Step] = []
    pending: list[tuple[str, str]] = []
    by_call_id: dict[str, Action] = {}
    for message in messages:
        if not isinstance(message, dict):
            pending.append(("message", _text(message)))
            continue
        role = message.get("role")
        if role == "system":
            continue  # shown in the conversation
        if role == "assistant":
            actions = []
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                call = call if isinstance(call, dict) else {"function": {"arguments": call}}
                function = call.get("function") if isinstance(call.get("function"), dict) else {}
                action = Action(
                    name=str(function.get("name") or call.get("type") or "call"),
                    arguments=_arguments(function.get("arguments", "")),
                    call_id=str(call.get("id") or ""),
                )
                actions.append(action)
                if action.call_id:
                    by_call_id[action.call_id] = action
            steps.append(Step(number=len(steps) + 1, observations=pending, thought=_text(message.get("content")),
                              actions=actions))
            pending = []
        elif role == "tool" and (action := by_call_id.get(str(message.get("tool_call_id") or ""))) \
                and action.result is None:
            action.result = _text(message.get("content"))
        else:
            label = "task" if role == "user" and not steps and not pending else str(role or "message")
            pending.append((label, _text(message.get("content"))))
    return steps, pending


def episode_from(messages: Any, steps: Any) -> Episode:
    """The episode as observation -> thought -> action -> result steps, plus the conversation.

    The agent loop's `steps` records are the source when there are any; otherwise steps are
    rebuilt from the chat-format `messages`. Malformed entries are shown as text, never
    dropped or raised on.
    """
    messages = messages if isinstance(messages, list) else [messages] if messages else []
    records = steps if isinstance(steps, list) else [steps] if steps else []
    conversation = _conversation(messages)
    if records:
        return Episode(steps=_steps_from_records(records), source="steps", conversation=conversation)
    built, trailing = _steps_from_messages(messages)
    return Episode(steps=built, source="messages", conversation=conversation, trailing=trailing)


# --- pages --------------------------------------------------------------------------------

class TrajectoryFilterForm(forms.Form):
    status = forms.ChoiceField(choices=[("", "any status"), *Trajectory.Status.choices], required=False)
    outcome = forms.ChoiceField(choices=[("", "any outcome"), *Trajectory.Outcome.choices], required=False)
    scene = forms.ChoiceField(choices=[("", "any scene"), *SCENE_CHOICES], required=False)
    task = forms.IntegerField(required=False, min_value=1, max_value=2**63 - 1, label="task id")


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def trajectory_list(request: HttpRequest) -> HttpResponse:
    form = TrajectoryFilterForm(request.GET or None)
    trajectories = Trajectory.objects.select_related("task").order_by("-created_at", "-id")
    if form.is_bound:
        form.is_valid()
        # Apply the filters that parsed; the form shows the errors of the others.
        data = getattr(form, "cleaned_data", {})
        if data.get("status"):
            trajectories = trajectories.filter(status=data["status"])
        if data.get("outcome"):
            trajectories = trajectories.filter(outcome=data["outcome"])
        if data.get("scene"):
            trajectories = trajectories.filter(task__scene=data["scene"])
        if data.get("task"):
            trajectories = trajectories.filter(task_id=data["task"])
    page = Paginator(trajectories, LIST_PAGE_SIZE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "tasks/trajectory_list.html",
        {"nav": "trajectories", "form": form, "page": page, "filter_query": query.urlencode()},
    )


def _tool_names(tools: Any) -> list[str]:
    names = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name"):
            names.append(str(function["name"]))
        elif isinstance(tool, dict) and tool.get("name"):
            names.append(str(tool["name"]))
        else:
            names.append(_text(tool))
    return names


@login_required
@permission_required(VIEW_PERMISSION, raise_exception=True)
@require_GET
def trajectory_detail(request: HttpRequest, trajectory_id: int) -> HttpResponse:
    if trajectory_id > MAX_ID:
        raise Http404("no such trajectory")
    trajectory = get_object_or_404(Trajectory.objects.select_related("task", "task__batch"), pk=trajectory_id)
    return render(
        request,
        "tasks/trajectory_detail.html",
        {
            "nav": "trajectories",
            "trajectory": trajectory,
            "task": trajectory.task,
            "episode": episode_from(trajectory.messages, trajectory.steps),
            "tool_names": _tool_names(trajectory.tools),
            "verifier_output": _json(trajectory.verifier_output) if trajectory.verifier_output else "",
            "is_final": trajectory.status in Trajectory.FINAL,
        },
    )


def _json_error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def _int_param(request: HttpRequest, name: str, default: int, minimum: int, maximum: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not minimum <= int(raw) <= maximum:
        raise ValueError(f"{name} must be an integer from {minimum} to {maximum}")
    return int(raw)


@never_cache
@require_GET
def trajectory_log(request: HttpRequest, trajectory_id: int) -> JsonResponse:
    """Log lines with seq > `after`, oldest first, at most `limit` (capped) per call.

    JSON errors, never a login redirect: the caller is a script that cannot follow one.
    """
    if not request.user.is_authenticated:
        return _json_error("sign in to read this log", 403)
    if not request.user.has_perm(VIEW_PERMISSION):
        return _json_error("you do not have permission to view trajectories", 403)
    try:
        after = _int_param(request, "after", 0, 0, MAX_SEQ)
        # Asking for more than the cap is not an error: the reply says `more` and the
        # client asks again from its last seq.
        limit = min(_int_param(request, "limit", BACKFILL_DEFAULT_LIMIT, 1, MAX_SEQ), BACKFILL_MAX_LIMIT)
    except ValueError as exc:
        return _json_error(str(exc), 400)
    status = (
        Trajectory.objects.filter(pk=trajectory_id).values_list("status", flat=True).first()
        if trajectory_id <= MAX_ID else None
    )
    if status is None:
        return _json_error("no such trajectory", 404)
    rows = list(TrajectoryLog.objects.filter(trajectory_id=trajectory_id, seq__gt=after).order_by("seq")[: limit + 1])
    more = len(rows) > limit
    lines = [row.as_message() for row in rows[:limit]]
    return JsonResponse(
        {
            "trajectory": trajectory_id,
            "status": status,
            "after": after,
            "limit": limit,
            "lines": lines,
            "last_seq": lines[-1]["seq"] if lines else after,
            "more": more,
        },
        encoder=DjangoJSONEncoder,
    )
