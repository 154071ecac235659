"""Reads about corpora used by more than one caller (data cards, the scene runtimes)."""
from __future__ import annotations

from apps.engines.models import Corpus


def corpus_licences(names: list[str]) -> list[dict[str, str]]:
    """The licences of the registered corpora among `names` (a selector for data cards), each once."""
    seen: set[tuple[str, str]] = set()
    out: list[dict[str, str]] = []
    for row in Corpus.objects.filter(name__in=names).order_by("name"):
        for entry in row.licences:
            key = (row.name, entry.get("source", ""))
            if key not in seen:
                seen.add(key)
                out.append({"corpus": row.name, **entry})
    return out


# Scenes whose tasks read the web toolset's `scene_config.web`.
WEB_SCENES = ("deep_search", "search2qa")


def task_corpora(task_ids: list[int]) -> list[str]:
    """The corpora the given tasks' episodes searched (their scene_config.web; the default corpus
    when a web scene's task names none and uses the corpus backend)."""
    from django.conf import settings

    from apps.tasks.models import Task

    names: set[str] = set()
    for scene_config in Task.objects.filter(pk__in=task_ids, scene__in=WEB_SCENES).values_list("scene_config", flat=True):
        web = (scene_config or {}).get("web") or {}
        if web.get("backend", "corpus") == "corpus":
            names.add(web.get("corpus") or settings.WEB_CORPUS_DEFAULT)
    return sorted(names)


def task_corpus_licences(task_ids: list[int]) -> list[dict[str, str]]:
    """The licences of the corpora the given tasks searched (a data card's `licences`)."""
    return corpus_licences(task_corpora(task_ids))
