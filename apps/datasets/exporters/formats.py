"""One renderer and one validator per export format (the DPO pairing lives in dpo.py).

A renderer turns a canonical record into the line a consumer reads, or raises RenderError
with the reason it cannot; a validator lists what is wrong with a line by the consumer's
rules ([] = valid). Validators check the lines, not the records, so they also judge files
written by anything else.
"""
from __future__ import annotations

from typing import Any

import orjson

from apps.datasets.record_schema import key_problems as _keys

from .chat import (
    RenderError,
    dumps_compact,
    function_specs,
    render_messages,
    validate_messages,
    validate_tools,
)
from .records import RAW_SCHEMA_VERSION

Line = dict[str, Any]


def _nonempty(obj: dict[str, Any], *keys: str) -> list[str]:
    return [f"line.{k}: must be a non-empty string" for k in keys if not isinstance(obj.get(k), str) or not obj[k]]


def ends_on_a_call(messages: Any) -> bool:
    """The conversation ends on an assistant turn's tool call(s) with no result: a next-action sample
    (the turn is the target). TRL trains it and its chat templates render it; OpenAI's fine-tuning
    guide's tool-calling example ends so."""
    last = messages[-1] if isinstance(messages, list) and messages else None
    return isinstance(last, dict) and last.get("role") == "assistant" and bool(last.get("tool_calls"))


def _parallel(messages: list[dict[str, Any]]) -> bool:
    return any(len(m.get("tool_calls") or ()) > 1 for m in messages)


def _tools(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": fn} for fn in function_specs(record.get("tools") or [])]


def prompt_prefix(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages before the first assistant turn (system and the task), which must end on a user turn."""
    prefix = []
    for msg in messages:
        if msg["role"] == "assistant":
            break
        prefix.append(msg)
    if not prefix or prefix[-1]["role"] != "user":
        raise RenderError("the conversation does not start with a user prompt")
    return prefix


def _first_user_text(messages: list[dict[str, Any]]) -> str:
    for msg in messages:
        if msg["role"] == "user":
            return msg["content"]
    raise RenderError("no user message")


# -- sft-openai / sft-trl -----------------------------------------------------------------


def render_sft_openai(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    messages = render_messages(record, arguments="string", include_system=ctx["include_system"])
    return {"messages": messages, "tools": _tools(record), "parallel_tool_calls": _parallel(messages)}


def validate_sft_openai(obj: Any) -> list[str]:
    problems = _keys(obj, {"messages", "tools"}, {"parallel_tool_calls"})
    if problems and not isinstance(obj, dict):
        return problems
    tool_problems, names = validate_tools(obj.get("tools", []))
    problems += tool_problems
    messages = obj.get("messages")
    problems += validate_messages(messages, names, arguments="string", allow_open_calls=ends_on_a_call(messages))
    parallel = obj.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        problems.append("line.parallel_tool_calls: must be a boolean")
    elif not parallel and isinstance(messages, list) and _parallel([m for m in messages if isinstance(m, dict)]):
        problems.append("line.parallel_tool_calls: false, but a turn makes several tool calls")
    problems += _openai_message_keys(messages)
    return problems


_OPENAI_KEYS = {
    "system": {"role", "content", "name"},
    "user": {"role", "content", "name"},
    "assistant": {"role", "content", "tool_calls", "name", "weight", "refusal"},
    "tool": {"role", "content", "tool_call_id"},
}


def _openai_message_keys(messages: Any, where: str = "messages") -> list[str]:
    problems = []
    for i, msg in enumerate(messages if isinstance(messages, list) else []):
        if isinstance(msg, dict) and msg.get("role") in _OPENAI_KEYS:
            extra = msg.keys() - _OPENAI_KEYS[msg["role"]]
            if extra:
                problems.append(f"{where}[{i}]: fields OpenAI does not accept: {', '.join(sorted(extra))}")
            if "weight" in msg and msg["weight"] not in (0, 1):
                problems.append(f"{where}[{i}].weight: must be 0 or 1")
    return problems


def render_sft_trl(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    messages = render_messages(
        record, arguments="object", include_system=ctx["include_system"], tool_name=True, reasoning=True
    )
    return {"messages": messages, "tools": _tools(record)}


def validate_sft_trl(obj: Any) -> list[str]:
    problems = _keys(obj, {"messages", "tools"})
    if problems and not isinstance(obj, dict):
        return problems
    tool_problems, names = validate_tools(obj.get("tools", []))
    messages = obj.get("messages")
    return problems + tool_problems + validate_messages(messages, names, arguments="object",
                                                        allow_open_calls=ends_on_a_call(messages))


# -- rl (platform-native), rl-verl, rl-agentjet -------------------------------------------


def step_success(step: dict[str, Any]) -> bool:
    """A tool step succeeded: no error, no timeout, and exit code 0 where a process ran."""
    return not step.get("error") and not step.get("timed_out") and step.get("exit_code") in (0, None)


def render_rl(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    messages = render_messages(record, arguments="string", include_system=ctx["include_system"])
    steps = []
    for step in record.get("steps") or []:
        if not isinstance(step, dict):
            raise RenderError("steps: a step is not an object")
        steps.append({
            "index": step.get("index"), "tool": step.get("tool") or "", "tool_call_id": step.get("tool_call_id") or "",
            "success": step_success(step), "exit_code": step.get("exit_code"),
            "timed_out": bool(step.get("timed_out")), "truncated": bool(step.get("truncated")),
            "duration_ms": step.get("duration_ms") or 0, "error": step.get("error") or "",
        })
    auto = (record.get("reviews") or {}).get("auto")
    human = (record.get("reviews") or {}).get("human")
    judge = None
    if auto:
        scores = {}
        for dim, value in sorted((auto.get("scores") or {}).items()):
            score = value.get("score") if isinstance(value, dict) else value
            if isinstance(score, (int, float)) and not isinstance(score, bool):
                scores[dim] = float(score)
        judge = {"overall": auto.get("overall"), "scores": scores, "judge_model": auto.get("judge_model") or "",
                 "rubric_version": auto.get("rubric_version") or ""}
    task = record.get("task") or {}
    return {
        "trajectory_id": record["trajectory_id"], "task_id": record["task_id"],
        "external_id": task.get("external_id") or "", "scene": task.get("scene") or "",
        "prompt": prompt_prefix(messages), "tools": _tools(record), "messages": messages,
        "reward": record.get("reward"), "outcome": record.get("outcome") or "",
        "final_answer": record.get("final_answer") or "", "steps": steps,
        "verifier_output": dumps_compact(record.get("verifier_output") or {}),
        "judge": judge, "human_verdict": (human or {}).get("verdict") or "",
        "model": record.get("model") or "", "content_sha256": record.get("content_sha256") or "",
        "pass_rate": task_pass_rate(record),
    }


def task_pass_rate(record: dict[str, Any]) -> dict[str, Any]:
    """The task's pass rate over its rollouts, {rate, passed, rollouts} (records.task_pass_rates)."""
    return (record.get("task") or {}).get("pass_rate") or {"rate": None, "passed": 0, "rollouts": 0}


def validate_rl(obj: Any) -> list[str]:
    required = {"trajectory_id", "task_id", "external_id", "scene", "prompt", "tools", "messages", "reward",
                "outcome", "final_answer", "steps", "verifier_output", "judge", "human_verdict", "model",
                "content_sha256", "pass_rate"}
    problems = _keys(obj, required)
    if problems and not isinstance(obj, dict):
        return problems
    tool_problems, names = validate_tools(obj.get("tools", []))
    problems += tool_problems + validate_messages(obj.get("messages"), names, arguments="string")
    prompt = obj.get("prompt")
    messages = obj.get("messages")
    if not isinstance(prompt, list) or not prompt or not isinstance(messages, list) \
            or messages[: len(prompt)] != prompt:
        problems.append("line.prompt: must be the leading messages of line.messages")
    elif prompt[-1].get("role") != "user":
        problems.append("line.prompt: must end with the user's task")
    reward = obj.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        problems.append("line.reward: must be a number or null")
    if obj.get("outcome") not in ("success", "failure", "error"):
        problems.append("line.outcome: must be success, failure or error")
    steps = obj.get("steps")
    if not isinstance(steps, list) or any(
            not isinstance(s, dict) or not isinstance(s.get("success"), bool) for s in steps):
        problems.append("line.steps: each step needs a boolean success")
    if not isinstance(obj.get("verifier_output"), str) or not isinstance(_loads(obj["verifier_output"]), dict):
        problems.append("line.verifier_output: must be a JSON object encoded as a string")
    judge = obj.get("judge")
    if judge is not None and (not isinstance(judge, dict) or not isinstance(judge.get("scores"), dict)):
        problems.append("line.judge: must be null or an object with scores")
    rate = obj.get("pass_rate")
    if not isinstance(rate, dict) or not isinstance(rate.get("rollouts"), int) or not isinstance(rate.get("passed"), int) \
            or not (rate.get("rate") is None or isinstance(rate["rate"], (int, float))):
        problems.append("line.pass_rate: must be {rate: number or null, passed: int, rollouts: int}")
    return problems


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def ground_truth(record: dict[str, Any]) -> str:
    """What an RL reward function checks against: the task's verifier, else a verified answer."""
    config = (record.get("task") or {}).get("scene_config") or {}
    if isinstance(config, dict) and config.get("verifier"):
        return dumps_compact(config["verifier"])
    if record.get("outcome") == "success" and record.get("final_answer"):
        return record["final_answer"]
    raise RenderError("no ground truth: the task has no verifier and this trajectory did not succeed")


def _task_prompt(record: dict[str, Any], ctx: dict[str, Any]) -> list[dict[str, Any]]:
    messages = render_messages(record, arguments="string", include_system=ctx["include_system"])
    return prompt_prefix(messages)


def render_verl(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    task = record.get("task") or {}
    scene = task.get("scene") or "unknown"
    return {
        "data_source": f"trajplatform/{scene}", "prompt": _task_prompt(record, ctx), "ability": scene,
        "reward_model": {"style": "rule", "ground_truth": ground_truth(record)},
        "extra_info": {
            "split": ctx["split"], "index": ctx["index"], "task_id": record["task_id"],
            "external_id": task.get("external_id") or "", "trajectory_id": record["trajectory_id"],
            "tools": dumps_compact(_tools(record)),
            # difficulty for dynamic sampling (DAPO-style): the task's pass rate over its rollouts
            "pass_rate": task_pass_rate(record)["rate"], "pass_count": task_pass_rate(record)["passed"],
            "rollouts": task_pass_rate(record)["rollouts"],
        },
    }


def _check_prompt(prompt: Any, where: str) -> list[str]:
    if not isinstance(prompt, list) or not prompt:
        return [f"{where}: must be a non-empty list of messages"]
    problems = []
    for i, msg in enumerate(prompt):
        if not isinstance(msg, dict) or msg.get("role") not in ("system", "user", "assistant", "tool") \
                or not isinstance(msg.get("content"), str):
            problems.append(f"{where}[{i}]: must be a message with a role and string content")
    if not problems and prompt[-1]["role"] != "user":
        problems.append(f"{where}: must end with a user message")
    return problems


def validate_verl(obj: Any) -> list[str]:
    problems = _keys(obj, {"data_source", "prompt", "ability", "reward_model", "extra_info"})
    if problems and not isinstance(obj, dict):
        return problems
    problems += _nonempty(obj, "data_source", "ability")
    problems += _check_prompt(obj.get("prompt"), "line.prompt")
    rm = obj.get("reward_model")
    if not isinstance(rm, dict) or rm.get("style") not in ("rule", "model"):
        problems.append("line.reward_model.style: must be rule or model")
    elif rm.get("style") == "rule" and (not isinstance(rm.get("ground_truth"), str) or not rm["ground_truth"]):
        problems.append("line.reward_model.ground_truth: a rule reward needs a non-empty string")
    extra = obj.get("extra_info")
    if not isinstance(extra, dict) or not isinstance(extra.get("index"), int) \
            or not isinstance(extra.get("split"), str):
        problems.append("line.extra_info: needs an integer index and a split")
    return problems


def render_agentjet(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    task = record.get("task") or {}
    prompt = _task_prompt(record, ctx)
    return {
        "main_query": _first_user_text(prompt), "init_messages": prompt, "task_id": str(record["task_id"]),
        "env_type": task.get("scene") or "unknown",
        "metadata": {
            "answer": ground_truth(record), "external_id": task.get("external_id") or "",
            "trajectory_id": record["trajectory_id"], "reward": record.get("reward"),
            "tools": dumps_compact(_tools(record)),
        },
    }


def validate_agentjet(obj: Any) -> list[str]:
    problems = _keys(obj, {"main_query", "init_messages", "task_id", "env_type", "metadata"})
    if problems and not isinstance(obj, dict):
        return problems
    problems += _nonempty(obj, "main_query", "task_id", "env_type")
    prompt_problems = _check_prompt(obj.get("init_messages"), "line.init_messages")
    problems += prompt_problems
    if not prompt_problems and obj["init_messages"][-1]["content"] != obj.get("main_query"):
        problems.append("line.init_messages: must end with main_query")
    if not isinstance(obj.get("metadata"), dict):
        problems.append("line.metadata: must be an object")
    return problems


# -- sharegpt (LLaMA-Factory) -----------------------------------------------------------

# LLaMA-Factory's default thought words (Template.thought_words, used by qwen, llama3, qwen3,
# deepseekr1 and most templates): its FunctionFormatter finds the thought with exactly these
# strings and parses the rest of a function_call value as JSON, so a thought written without
# the newlines makes the whole load fail ("Invalid JSON format in function message").
THINK_OPEN, THINK_CLOSE = "<think>\n", "\n</think>\n\n"
_HUMAN_SIDE = ("human", "observation")
_MODEL_SIDE = ("gpt", "function_call")


def render_sharegpt(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    messages = render_messages(record, arguments="object", include_system=True, reasoning=True)
    system = [m["content"] for m in messages if m["role"] == "system"]
    turns: list[dict[str, str]] = []
    results: list[str] = []

    def flush_results() -> None:
        if results:
            # Parallel calls: one observation turn holding every result in call order, because
            # LLaMA-Factory wants human/observation and gpt/function_call to alternate.
            turns.append({"from": "observation", "value": results[0] if len(results) == 1 else dumps_compact(results)})
            results.clear()

    for i, msg in enumerate(messages):
        role = msg["role"]
        if role == "system":
            if turns or results:
                raise RenderError(f"messages[{i}]: a system message after the conversation started")
            continue
        if role == "tool":
            results.append(msg["content"])
            continue
        flush_results()
        if role == "user":
            if turns and turns[-1]["from"] in _HUMAN_SIDE:
                _finish_as_answer(turns, i)  # final_answer tool: a follow-up request after the model's finish
            turns.append({"from": "human", "value": msg["content"]})
        elif msg.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in msg["tool_calls"]]
            value = dumps_compact(calls[0] if len(calls) == 1 else calls)
            # Text beside tool calls has no turn of its own in ShareGPT; LLaMA-Factory's
            # function formatter keeps text wrapped in the template's thought words.
            turns.append({"from": "function_call", "value": with_thought(i, msg.get("content") or "", value)})
        else:
            turns.append({"from": "gpt", "value": with_thought(i, msg.get("reasoning_content") or "",
                                                                 msg.get("content") or "")})
    flush_results()
    while turns and turns[-1]["from"] in _HUMAN_SIDE:
        turns.pop()  # a conversation must end on the model's turn (final_answer tool: finish's acknowledgement)
    line: Line = {"conversations": turns, "tools": dumps_compact(_sharegpt_tools(record))}
    if system and ctx["include_system"]:
        line["system"] = "\n\n".join(system)
    return line


def with_thought(i: int, thought: str, value: str) -> str:
    """A model turn's value with its thought first, in LLaMA-Factory's thought words: the text beside
    a function_call's calls, a gpt answer's reasoning (its ReasoningTemplate reads them there)."""
    if not thought:
        return value
    out = f"{THINK_OPEN}{thought}{THINK_CLOSE}{value}"
    if split_thought(out)[0] != thought:
        raise RenderError(f"messages[{i}]: a thought contains LLaMA-Factory's thought end {THINK_CLOSE!r}, "
                          "which would end the thought early")
    return out


def _finish_as_answer(turns: list[dict[str, str]], i: int) -> None:
    """A user turn after a finish call and its acknowledgement (a multi-turn episode): the finish
    call becomes the model's `gpt` answer, so human and model turns keep alternating."""
    call = turns[-2]["value"] if len(turns) >= 2 and turns[-2]["from"] == "function_call" else ""
    thought, rest = split_thought(call)
    try:
        parsed = orjson.loads(rest) if rest else None
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict) or parsed.get("name") != "finish" or turns[-1]["from"] != "observation":
        raise RenderError(f"messages[{i}]: a user message after tool results that no finish call ended")
    answer = str((parsed.get("arguments") or {}).get("answer") or "")
    del turns[-2:]
    turns.append({"from": "gpt", "value": answer or thought})


def _sharegpt_tools(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The function specs, each with a `parameters.properties` object: LLaMA-Factory's default
    tool format (deepseekr1 and others) reads it from every tool. A function without parameters
    takes none, which is an object schema with no properties."""
    specs = []
    for fn in function_specs(record.get("tools") or []):
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        elif not isinstance(params, dict) or not isinstance(params.get("properties", {}), dict):
            raise RenderError(f"tools: {fn['name']}: parameters are not an object schema")
        elif "properties" not in params:
            params = {**params, "properties": {}}
        specs.append({**fn, "parameters": params})
    return specs


def split_thought(value: str) -> tuple[str, str]:
    """(thought, rest) of a function_call value that may start with THINK_OPEN...THINK_CLOSE,
    split where LLaMA-Factory splits it (the first THINK_CLOSE)."""
    end = value.find(THINK_CLOSE, len(THINK_OPEN)) if value.startswith(THINK_OPEN) else -1
    if end < 0:
        return "", value
    return value[len(THINK_OPEN):end], value[end + len(THINK_CLOSE):]


def validate_sharegpt(obj: Any) -> list[str]:
    problems = _keys(obj, {"conversations", "tools"}, {"system"})
    if problems and not isinstance(obj, dict):
        return problems
    names: set[str] = set()
    tools = _loads(obj["tools"]) if isinstance(obj.get("tools"), str) else None
    if not isinstance(tools, list):
        problems.append("line.tools: must be a JSON list encoded as a string")
    else:
        for i, fn in enumerate(tools):
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
                problems.append(f"line.tools[{i}]: must be a function spec with a name")
                continue
            names.add(fn["name"])
            params = fn.get("parameters")
            if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
                problems.append(f"line.tools[{i}].parameters: must be an object schema with properties "
                                "(LLaMA-Factory's default tool format reads them)")
                continue
            problems += _default_tool_format_problems(f"line.tools[{i}].parameters.properties", params["properties"])
    if "system" in obj and not isinstance(obj["system"], str):
        problems.append("line.system: must be a string")
    turns = obj.get("conversations")
    if not isinstance(turns, list) or not turns:
        return problems + ["line.conversations: must be a non-empty list"]
    if len(turns) % 2:
        problems.append("line.conversations: must have an even number of turns (end on gpt or function_call)")
    for i, turn in enumerate(turns):
        at = f"line.conversations[{i}]"
        if not isinstance(turn, dict) or set(turn) != {"from", "value"} or not isinstance(turn.get("value"), str):
            problems.append(f"{at}: must be {{\"from\": ..., \"value\": string}}")
            continue
        side = _HUMAN_SIDE if i % 2 == 0 else _MODEL_SIDE
        if turn["from"] not in side:
            problems.append(f"{at}.from: {turn['from']!r} at position {i + 1}; "
                            f"position {i + 1} takes {' or '.join(side)}")
        if turn["from"] == "human" and not turn["value"]:
            problems.append(f"{at}.value: a human turn must not be empty")
        if turn["from"] == "observation" and (i == 0 or not isinstance(turns[i - 1], dict)
                                               or turns[i - 1].get("from") != "function_call"):
            problems.append(f"{at}: an observation must follow a function_call")
        if turn["from"] == "function_call":
            problems += _check_function_call(at, turn["value"], names)
            nxt = turns[i + 1] if i + 1 < len(turns) else None
            if nxt is not None and (not isinstance(nxt, dict) or nxt.get("from") != "observation"):
                problems.append(f"{at}: a function_call must be followed by its observation")
    return problems


def _default_tool_format_problems(where: str, properties: dict[str, Any]) -> list[str]:
    """What LLaMA-Factory's default tool format (DefaultToolUtils.tool_formatter: deepseekr1 and
    other templates) cannot describe: it reads each property as an object, joins `enum` as text
    and reads the `type` of `items`; anything else aborts the whole load."""
    problems = []
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            problems.append(f"{where}.{name}: must be an object schema")
            continue
        enum, items = prop.get("enum"), prop.get("items")
        if enum and (not isinstance(enum, list) or not all(isinstance(v, str) for v in enum)):
            problems.append(f"{where}.{name}.enum: LLaMA-Factory's default tool format needs a list of strings")
        if items and not isinstance(items, dict):
            problems.append(f"{where}.{name}.items: LLaMA-Factory's default tool format needs one object schema")
    return problems


def _check_function_call(at: str, value: str, names: set[str]) -> list[str]:
    _, body = split_thought(value)
    calls = _loads(body)
    calls = [calls] if isinstance(calls, dict) else calls
    if not isinstance(calls, list) or not calls:
        if value.startswith("<think>"):
            return [f"{at}.value: a thought must be written {THINK_OPEN!r} text {THINK_CLOSE!r} "
                    "(LLaMA-Factory's thought words), then the JSON calls"]
        return [f"{at}.value: must be a JSON object {{name, arguments}} or a list of them"]
    problems = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
            problems.append(f"{at}.value: each call needs a name and an arguments object")
        elif call.get("name") not in names:
            problems.append(f"{at}.value: tool {call.get('name')!r} is not in tools")
    return problems


# -- alpaca ------------------------------------------------------------------------------


def _assistant_text(msg: dict[str, Any]) -> str:
    parts = [msg["content"]] if msg.get("content") else []
    for call in msg.get("tool_calls") or []:
        fn = call["function"]
        parts.append(f"<tool_call>\n{dumps_compact({'name': fn['name'], 'arguments': fn['arguments']})}\n</tool_call>")
    return "\n".join(parts)


def render_alpaca(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    """Each model turn paired with what came before it; tool calls and results become tagged text."""
    messages = render_messages(record, arguments="object", include_system=True)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    pairs: list[list[str]] = []
    incoming: list[str] = []
    for msg in messages:
        if msg["role"] == "user":
            incoming.append(msg["content"])
        elif msg["role"] == "tool":
            incoming.append(f"<tool_response>\n{msg['content']}\n</tool_response>")
        elif msg["role"] == "assistant":
            if not incoming:
                raise RenderError("an assistant turn without a preceding user or tool turn")
            pairs.append(["\n".join(incoming), _assistant_text(msg)])
            incoming = []
    if not pairs:
        raise RenderError("no assistant turn")
    instruction, output = pairs.pop()
    line: Line = {"instruction": instruction, "input": "", "output": output, "history": pairs}
    if system and ctx["include_system"]:
        line["system"] = system
    return line


def validate_alpaca(obj: Any) -> list[str]:
    problems = _keys(obj, {"instruction", "input", "output"}, {"system", "history"})
    if problems and not isinstance(obj, dict):
        return problems
    problems += _nonempty(obj, "instruction", "output")
    for key in ("input", "system"):
        if key in obj and not isinstance(obj[key], str):
            problems.append(f"line.{key}: must be a string")
    history = obj.get("history", [])
    if not isinstance(history, list) or any(
        not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, str) and x for x in p) for p in history
    ):
        problems.append("line.history: must be a list of [instruction, response] pairs of non-empty strings")
    return problems


# -- raw -----------------------------------------------------------------------------------

RAW_REQUIRED = {
    "schema_version": str, "trajectory_id": int, "task_id": int, "task": dict, "reviews": dict, "iteration": int,
    "sample_index": int, "status": str, "messages": list, "tools": list, "steps": list, "final_answer": str,
    "outcome": str, "outcome_reason": str, "verifier_output": dict, "model": str, "config_snapshot": dict,
    "prompt_tokens": int, "completion_tokens": int, "total_tokens": int, "cost_usd": str, "content_sha256": str,
    "error": str,
}
RAW_NULLABLE = {"reward": (int, float), "started_at": str, "finished_at": str}


def render_raw(record: dict[str, Any], ctx: dict[str, Any]) -> Line:
    return record


def validate_raw(obj: Any) -> list[str]:
    """The canonical record's shape (lossless: content is not judged, only its types)."""
    problems = _keys(obj, set(RAW_REQUIRED) | set(RAW_NULLABLE), {"subtrajectories"})
    if problems and not isinstance(obj, dict):
        return problems
    for key, kind in RAW_REQUIRED.items():
        value = obj.get(key)
        if key in obj and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            problems.append(f"line.{key}: must be {kind.__name__}")
    for key, kinds in RAW_NULLABLE.items():
        value = obj.get(key)
        if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
            problems.append(f"line.{key}: wrong type {type(value).__name__}")
    if obj.get("schema_version") != RAW_SCHEMA_VERSION:
        problems.append(f"line.schema_version: must be {RAW_SCHEMA_VERSION!r}")
    if "subtrajectories" in obj and not isinstance(obj["subtrajectories"], list):
        problems.append("line.subtrajectories: must be a list (a multi_agent episode's sub-episodes)")
    for i, msg in enumerate(obj.get("messages") or []):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            problems.append(f"line.messages[{i}]: must be an object with a role")
    task = obj.get("task")
    if isinstance(task, dict) and (not isinstance(task.get("scene"), str) or not isinstance(task.get("prompt"), str)):
        problems.append("line.task: needs scene and prompt strings")
    return problems

