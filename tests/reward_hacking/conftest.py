"""The reward-hacking suite: adversarial twins of each scene's bundled examples, every one of which
must score 0 while the bundled example it copies still scores as before (issue 35, item 7).

A twin is a scripted episode that reaches the task's final state or answer without doing the task
the way it means: the right answer without the process, a call to a tool that does not exist, an
error ignored, partial completion, another page or task solved, script injected into a page,
evidence cited but never opened, a value used before it was asked for, a state check fooled. The
classes and what decides each are in docs/reviews.md ("Reward-hacking suite").

Each twin runs through the real agent loop (apps.engines.agent.run_episode) with the suite's
stand-in model (tests/reward_hacking/standin.py): the offline scripted model, except that it
plays calls to tools the request did not offer, so the test sees what the platform does with them.

Adding a scene's twins: write tests/reward_hacking/test_<scene>.py and, for each class that applies
to the scene, one test that first runs the bundled example (it must still score what it scores
today) and then its twin through the same fixture:

    from tests.engines.test_agent import call

    def test_finish_without_writing_the_code_scores_zero(scripted_episode):
        result = scripted_episode("code_exec", row["prompt"], row["config"],
                                  [call("finish", answer="all tests pass")])
        assert result.reward == 0.0, result.verifier_output

`scripted_episode(scene, prompt, scene_config, steps, *, scripts=(), sandbox_backend="local",
**task_fields)` builds a real Task.config_snapshot() (max_steps defaults to the number of steps
+ 2), serves `steps` as the script for `prompt` (plus any further {"id", "prompt",
"reference_solution"} scripts, e.g. a multi_agent role's), and returns the EpisodeResult;
`scripted_episode.model` is the last run's PermissiveScriptedModel (its `unoffered` lists the
calls to tools the request did not offer). Scenes without a sandbox pass sandbox_backend=None.
`scripted_episode.run(config, scripts)` plays any config snapshot (a stored trajectory's) instead;
scripts may be dicts or offline_model.Script objects (load_scripts of a bundled file).
A twin that scores 1 is a defect of the scene's verifier: fix the verifier and keep the twin.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from typing import Any, Callable

import pytest

from apps.engines.agent import EpisodeResult, run_episode
from apps.engines.llm import cache_identity
from apps.engines.sandboxes import get_backend
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import config_for, llm_env  # noqa: F401 - llm_env is a fixture
from tests.reward_hacking.standin import running_standin, standin_client


class ScriptedEpisode:
    """Callable fixture value: one scripted episode of any scene through the real loop."""

    def __init__(self) -> None:
        self.model: Any = None

    def __call__(self, scene: str, prompt: str, scene_config: dict[str, Any], steps: list[dict[str, Any]], *,
                 scripts: Iterable[Any] = (), sandbox_backend: Any = "local", **task_fields: Any) -> EpisodeResult:
        task_fields.setdefault("max_steps", len(steps) + 2)
        config = config_for(prompt, scene_config, scene=scene, **task_fields)
        return self.run(config, [{"id": "twin", "prompt": prompt, "reference_solution": steps}, *scripts],
                        sandbox_backend=sandbox_backend)

    def run(self, config: dict[str, Any], scripts: Iterable[Any], *, sandbox_backend: Any = "local") -> EpisodeResult:
        """Any config snapshot (a stored trajectory's, say) played by the stand-in with these scripts."""
        backend = get_backend(sandbox_backend) if isinstance(sandbox_backend, str) else sandbox_backend
        with running_standin(scripts) as server:
            self.model = server.model
            llm = standin_client(server.url)

            async def episode() -> EpisodeResult:
                try:
                    return await run_episode(config=config, llm=llm, sandbox_backend=backend,
                                             cache_key_extra=cache_identity(uuid.uuid4()))
                finally:
                    await llm.aclose()

            return asyncio.run(episode())


@pytest.fixture
def scripted_episode(transactional_db: Any, sandbox_settings: Any, llm_env: Any) -> Callable[..., EpisodeResult]:  # noqa: F811
    """See the module docstring."""
    return ScriptedEpisode()
