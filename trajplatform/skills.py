"""VibeDataBot's skill manifest: which scenes this platform offers.

With `PLATFORM_SKILLS_URL` set, start-up GETs `{url}/api/skills` (timeout
PLATFORM_SKILLS_TIMEOUT_S) and keeps the skills whose `sig_owner` is "trajectory-synthesis"
and whose `status` is "active" (`skill_id` "trajectory-<scene>", a string description). Only
their scenes are enabled: listed by GET /api/v1/scenes and accepted for new tasks. The process
refuses to start (`SkillManifestUnavailable`, an ImproperlyConfigured) when the URL is set but
unreachable, answers non-200 or non-JSON, has no `skills` list, or yields no active skill of a
known scene. Unset: every scene is enabled.

Manifest entry (the reference platform's shape, workbench-notes §4.3):
`{"skill_id": "trajectory-search2qa", "sig_owner": "trajectory-synthesis", "status": "active",
"description": "...", "trigger_keywords": [...], "must_clarify": [{"param", "question",
"options": [{"value", "label", "hint", "maps_to"}]}], "defaults": {...}, "required_params": [...]}`.
Malformed `must_clarify` items are skipped, non-list `options` become empty, non-string
`required_params` are dropped, `defaults` must be an object (else empty).
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from apps.engines.registry import SCENES

logger = logging.getLogger(__name__)

SKILL_OWNER = "trajectory-synthesis"
SKILL_PREFIX = "trajectory-"


class SkillManifestUnavailable(ImproperlyConfigured):
    """PLATFORM_SKILLS_URL is set but gave no usable manifest."""


@dataclass(frozen=True)
class SkillEntry:
    scene_id: str
    skill_id: str
    description: str
    trigger_keywords: list[str] = field(default_factory=list)
    must_clarify: list[dict[str, Any]] = field(default_factory=list)
    defaults: dict[str, Any] = field(default_factory=dict)
    required_params: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "skill_id": self.skill_id,
            "description": self.description,
            "trigger_keywords": self.trigger_keywords,
            "must_clarify": self.must_clarify,
            "defaults": self.defaults,
            "required_params": self.required_params,
        }


_lock = threading.Lock()
_catalog: dict[str, SkillEntry] | None = None  # None: no manifest configured or not loaded


def _options(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        return []
    out = []
    for option in raw:
        if isinstance(option, dict) and "value" in option:
            item = {k: option[k] for k in ("value", "label", "hint") if k in option}
            if isinstance(option.get("maps_to"), dict):
                item["maps_to"] = option["maps_to"]
            out.append(item)
    return out


def _must_clarify(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        return []
    items = []
    for item in raw:
        if isinstance(item, dict) and isinstance(item.get("param"), str) and isinstance(item.get("question"), str):
            items.append({"param": item["param"], "question": item["question"], "options": _options(item.get("options"))})
    return items


def parse_manifest(payload: Any) -> dict[str, SkillEntry]:
    """The enabled scenes of a decoded manifest; raises SkillManifestUnavailable when none."""
    if not isinstance(payload, dict) or not isinstance(payload.get("skills"), list):
        raise SkillManifestUnavailable("the skill manifest has no 'skills' list")
    catalog: dict[str, SkillEntry] = {}
    skipped: list[str] = []
    for skill in payload["skills"]:
        if not isinstance(skill, dict):
            continue
        skill_id = skill.get("skill_id")
        if skill.get("sig_owner") != SKILL_OWNER or skill.get("status") != "active":
            continue
        if not isinstance(skill_id, str) or not skill_id.startswith(SKILL_PREFIX):
            continue
        if not isinstance(skill.get("description"), str):
            continue
        scene_id = skill_id[len(SKILL_PREFIX):]
        if scene_id not in SCENES:
            skipped.append(skill_id)
            continue
        keywords = skill.get("trigger_keywords")
        required = skill.get("required_params")
        defaults = skill.get("defaults")
        catalog[scene_id] = SkillEntry(
            scene_id=scene_id,
            skill_id=skill_id,
            description=skill["description"],
            trigger_keywords=[k for k in keywords if isinstance(k, str)] if isinstance(keywords, list) else [],
            must_clarify=_must_clarify(skill.get("must_clarify")),
            defaults=dict(defaults) if isinstance(defaults, dict) else {},
            required_params=[p for p in required if isinstance(p, str)] if isinstance(required, list) else [],
        )
    if skipped:
        logger.warning("skill manifest: skipping active skills of unknown scenes: %s", ", ".join(skipped))
    if not catalog:
        raise SkillManifestUnavailable(
            f"the skill manifest lists no active {SKILL_OWNER!r} skill of a known scene "
            f"(skill_id '{SKILL_PREFIX}<scene>', scenes: {', '.join(SCENES)})"
        )
    return catalog


def fetch_manifest(url: str, *, timeout_s: float | None = None) -> dict[str, SkillEntry]:
    """GET {url}/api/skills and parse it; raises SkillManifestUnavailable with the reason."""
    import httpx  # deferred: heavy (httpx), only when the manifest is fetched

    endpoint = url.rstrip("/") + "/api/skills"
    timeout = settings.PLATFORM_SKILLS_TIMEOUT_S if timeout_s is None else timeout_s
    where = f"PLATFORM_SKILLS_URL={url}: GET {endpoint}"
    try:
        response = httpx.get(endpoint, timeout=timeout, follow_redirects=False, headers={"Accept": "application/json"})
    except httpx.HTTPError as exc:
        raise SkillManifestUnavailable(f"{where} failed: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise SkillManifestUnavailable(f"{where} answered HTTP {response.status_code}")
    try:
        payload = response.json()
    except ValueError:
        raise SkillManifestUnavailable(f"{where} did not return JSON") from None
    try:
        return parse_manifest(payload)
    except SkillManifestUnavailable as exc:
        raise SkillManifestUnavailable(f"{where}: {exc}") from None


def load_skills(url: str | None = None) -> dict[str, SkillEntry] | None:
    """At start-up: fetch the manifest when PLATFORM_SKILLS_URL (or `url`) is set; fail fast."""
    global _catalog
    url = settings.PLATFORM_SKILLS_URL if url is None else url
    with _lock:
        _catalog = fetch_manifest(url) if url else None
        if _catalog is not None:
            logger.info("skill manifest from %s enables scenes: %s", url, ", ".join(sorted(_catalog)))
        return _catalog


def reset_skills() -> None:
    """Forget a loaded manifest (every scene enabled again)."""
    global _catalog
    with _lock:
        _catalog = None


def enabled_scene_ids() -> list[str]:
    """Scene ids this platform offers, in registry order."""
    catalog = _catalog
    return [s for s in SCENES if catalog is None or s in catalog]


def skill_for(scene_id: str) -> SkillEntry | None:
    catalog = _catalog
    return None if catalog is None else catalog.get(scene_id)
