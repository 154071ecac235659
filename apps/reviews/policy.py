"""The three-tier risk policy: which tier a proposed config change gets, and applying one.

The tier depends on what the change touches, decided here on the server from the PolicyRule
table (editable by admins in the console), never by the judge:

* green, applied automatically: temperature / top_p / max_steps within bounds, a hint
  appended to the system prompt (system_prompt_extra);
* yellow, a reviewer picks one of 2-4 options or rejects: the task description (prompt), the
  tool list (expected_tools), another allowed model, the quality threshold;
* red, an approver signs off after reading the impact note: sandbox image or dependencies,
  network egress, cost and token limits, tools with side effects.

Numbers are checked against [min_value, max_value]; for text the bounds are lengths. A value
outside the bounds (or not among `allowed_values`) gets the rule's `out_of_bounds_tier`;
"refuse" means it is not proposed at all. A field without an enabled rule is never changed
(disable a rule to stop changes to its field); an empty table means DEFAULT_RULES, which the
data migration writes into it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from apps.engines.registry import SCENES
from apps.reviews.models import PolicyRule

GREEN, YELLOW, RED, REFUSE = "green", "yellow", "red", "refuse"
TIER_ORDER = {GREEN: 0, YELLOW: 1, RED: 2, REFUSE: 3}

# The default table, written by the data migration (0003) and used when the table is empty.
DEFAULT_RULES: list[dict[str, Any]] = [
    {"field": "temperature", "tier": GREEN, "min_value": 0.0, "max_value": 1.2, "out_of_bounds_tier": YELLOW,
     "impact_note": "sampling temperature of the agent model"},
    {"field": "top_p", "tier": GREEN, "min_value": 0.1, "max_value": 1.0, "out_of_bounds_tier": REFUSE,
     "impact_note": "nucleus sampling of the agent model"},
    {"field": "max_steps", "tier": GREEN, "min_value": 1, "max_value": 60, "out_of_bounds_tier": YELLOW,
     "impact_note": "model replies per trajectory; more steps cost more tokens"},
    {"field": "system_prompt_extra", "tier": GREEN, "min_value": 0, "max_value": 4000, "out_of_bounds_tier": YELLOW,
     "impact_note": "hints appended to the agent's system prompt (length bounded)"},
    {"field": "prompt", "tier": YELLOW, "min_value": 1, "max_value": 20000, "out_of_bounds_tier": REFUSE,
     "impact_note": "rewrites the task description every later trajectory is asked to solve"},
    {"field": "expected_tools", "tier": YELLOW, "out_of_bounds_tier": REFUSE,
     "impact_note": "the tool list the task expects the agent to use"},
    {"field": "model", "tier": YELLOW, "out_of_bounds_tier": REFUSE,
     "allowed_values": ["scripted-reference", "deepseek-flash", "deepseek-v4-pro", "gpt-4o-mini", "gpt-4.1-mini", "gpt-5.4-mini",
                        "gemini-3.7-flash"],
     "impact_note": "switches the agent model (only to an allowed one)"},
    {"field": "quality_threshold", "tier": YELLOW, "min_value": 50, "max_value": 100, "out_of_bounds_tier": REFUSE,
     "impact_note": "the score a trajectory needs for the task to complete"},
    {"field": "max_tokens", "tier": RED, "min_value": 1000, "max_value": 2_000_000, "out_of_bounds_tier": REFUSE,
     "impact_note": "token budget per trajectory: raises what every later trajectory may cost"},
    {"field": "timeout_s", "tier": RED, "min_value": 10, "max_value": 7200, "out_of_bounds_tier": REFUSE,
     "impact_note": "wall-clock limit per trajectory: longer sandbox and model time, more cost"},
    {"field": "step_timeout_s", "tier": RED, "min_value": 1, "max_value": 600, "out_of_bounds_tier": REFUSE,
     "impact_note": "time each command may run in the sandbox"},
    {"field": "scene_config.image", "tier": RED, "out_of_bounds_tier": REFUSE,
     "impact_note": "the sandbox image: different software runs every later trajectory"},
    {"field": "scene_config.dependencies", "tier": RED, "out_of_bounds_tier": REFUSE,
     "impact_note": "packages installed into the sandbox"},
    {"field": "scene_config.network", "tier": RED, "out_of_bounds_tier": REFUSE,
     "impact_note": "network egress from the sandbox: agent-written code could reach the outside"},
    {"field": "scene_config.side_effect_tools", "tier": RED, "out_of_bounds_tier": REFUSE,
     "impact_note": "enables tools with side effects outside the sandbox"},
]

TASK_FIELDS = frozenset({
    "temperature", "top_p", "max_steps", "system_prompt_extra", "prompt", "expected_tools", "model",
    "quality_threshold", "max_tokens", "timeout_s", "step_timeout_s",
})
SCENE_PREFIX = "scene_config."


@dataclass(frozen=True)
class Rule:
    field: str
    tier: str
    min_value: float | None = None
    max_value: float | None = None
    allowed_values: tuple[Any, ...] = ()
    out_of_bounds_tier: str = REFUSE
    impact_note: str = ""


def rules() -> dict[str, Rule]:
    """The enabled rules by field, from the table (the defaults when the table is empty)."""
    rows = list(PolicyRule.objects.values())
    source = rows if rows else DEFAULT_RULES
    table = {}
    for row in source:
        if not row.get("enabled", True):
            continue
        table[row["field"]] = Rule(
            field=row["field"], tier=row["tier"], min_value=row.get("min_value"), max_value=row.get("max_value"),
            allowed_values=tuple(row.get("allowed_values") or ()), out_of_bounds_tier=row.get("out_of_bounds_tier") or REFUSE,
            impact_note=row.get("impact_note") or "",
        )
    return table


def _measure(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return float(len(value))
    return None


def within(rule: Rule, value: Any) -> bool:
    if rule.allowed_values and value not in rule.allowed_values:
        return False
    measure = _measure(value)
    if measure is None:  # lists, objects, booleans: bounds do not apply
        return True
    if rule.min_value is not None and measure < rule.min_value:
        return False
    if rule.max_value is not None and measure > rule.max_value:
        return False
    return True


def classify(field: str, value: Any, table: dict[str, Rule] | None = None) -> str:
    """The tier of changing `field` to `value` (REFUSE when the policy does not allow it)."""
    table = rules() if table is None else table
    rule = table.get(field)
    if rule is None:
        return REFUSE
    return rule.tier if within(rule, value) else rule.out_of_bounds_tier


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _why_refused(field: str, value: Any, rule: Rule | None) -> str:
    if rule is None:
        return f"no enabled policy rule covers {field}, so it is never changed"
    if rule.tier == REFUSE and within(rule, value):
        return f"the policy refuses every change to {field}"
    if rule.allowed_values and value not in rule.allowed_values:
        return f"it is not one of the allowed values ({', '.join(map(str, rule.allowed_values))})"
    low = "-inf" if rule.min_value is None else f"{rule.min_value:g}"
    high = "inf" if rule.max_value is None else f"{rule.max_value:g}"
    what = "its length is" if isinstance(value, str) else "it is"
    return f"{what} outside the policy's bounds {low} to {high}"


def require_allowed(field: str, value: Any, *, tier: str, table: dict[str, Rule] | None = None) -> None:
    """Raise ValidationError unless the policy lets a proposal of `tier` set `field` to `value`:
    the value is within the rule's bounds and allowed values, or its out-of-bounds tier is no
    higher than `tier` (a reviewer's yellow decision never applies a red value)."""
    table = rules() if table is None else table
    actual = classify(field, value, table)
    if actual == REFUSE:
        raise ValidationError(f"the policy does not allow changing {field} to {_shown(value)}: "
                              f"{_why_refused(field, value, table.get(field))}")
    if TIER_ORDER[actual] > TIER_ORDER[tier]:
        raise ValidationError(f"changing {field} to {_shown(value)} is a {actual} change; "
                              f"a {tier} proposal cannot apply it")


def validate_proposal(task: Any, field: str, to_value: Any, options: Any = (),
                      table: dict[str, Rule] | None = None) -> str:
    """The tier of proposing `field` -> `to_value` with these options; ValidationError when the
    field, the value or any option is invalid for the task or not allowed at that tier."""
    table = rules() if table is None else table
    check_value(task, field, to_value)
    tier = classify(field, to_value, table)
    require_allowed(field, to_value, tier=tier, table=table)
    if not isinstance(options, (list, tuple)):
        raise ValidationError("options must be a list of values")
    for index, option in enumerate(options):
        try:
            check_value(task, field, option)
            require_allowed(field, option, tier=tier, table=table)
        except ValidationError as exc:
            raise ValidationError(f"option {index}: {'; '.join(exc.messages)}") from None
    return tier


def impact_note(field: str, table: dict[str, Rule] | None = None) -> str:
    table = rules() if table is None else table
    rule = table.get(field)
    return rule.impact_note if rule else ""


def current_value(task: Any, field: str) -> Any:
    if field.startswith(SCENE_PREFIX):
        return copy.deepcopy((task.scene_config or {}).get(field[len(SCENE_PREFIX):]))
    if field in TASK_FIELDS:
        return copy.deepcopy(getattr(task, field))
    raise ValidationError(f"{field!r} is not a task config field the policy knows")


def check_value(task: Any, field: str, value: Any) -> None:
    """Raise ValidationError unless `value` is a valid value of `field` on this task."""
    if field.startswith(SCENE_PREFIX):
        key = field[len(SCENE_PREFIX):]
        config = dict(task.scene_config or {})
        config[key] = value
        scene = SCENES.get(task.scene)
        if scene is not None:
            errors = sorted(scene.validator().iter_errors(config), key=lambda e: list(e.absolute_path))
            if errors:
                raise ValidationError(f"{field}: the {task.scene} scene does not accept it: {errors[0].message}")
        return
    if field not in TASK_FIELDS:
        raise ValidationError(f"{field!r} is not a task config field the policy knows")
    model_field = type(task)._meta.get_field(field)
    try:
        cleaned = model_field.clean(value, task)
    except ValidationError as exc:
        raise ValidationError(f"{field}: {'; '.join(exc.messages)}") from None
    if field == "expected_tools" and not (isinstance(cleaned, list) and all(isinstance(t, str) for t in cleaned)):
        raise ValidationError("expected_tools: must be a list of tool names")


def apply_change(task: Any, field: str, value: Any, *, tier: str, table: dict[str, Rule] | None = None) -> str:
    """Set `field` to `value` on the (locked, unsaved) task, checked again against the field and
    the policy as it is now (a proposal of `tier` may apply it); returns the model field to save."""
    check_value(task, field, value)
    require_allowed(field, value, tier=tier, table=table)
    if field.startswith(SCENE_PREFIX):
        config = dict(task.scene_config or {})
        config[field[len(SCENE_PREFIX):]] = value
        task.scene_config = config
        return "scene_config"
    setattr(task, field, type(task)._meta.get_field(field).to_python(value))
    return field
