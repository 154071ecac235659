"""What a file says that an import or export used to drop, kept (the review of issue 39's readers)."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.datasets.test_interchange import ATIF_RFC_EXAMPLE, import_file, real_trajectory  # noqa: F401
from tests.datasets.interchange.test_real_files import export
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 (fixtures)
from tests.engines.test_agent import llm_env  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

SEARCH = {"type": "function", "function": {
    "name": "financial_search", "description": "Look up a ticker's market data.",
    "parameters": {"type": "object", "properties": {"ticker": {"type": "string"}, "metric": {
        "type": "string", "enum": ["price", "volume"]}}, "required": ["ticker", "metric"]}}}


def test_atif_tool_definitions_are_the_trajectory_s_tools_and_ours_go_out_as_them(
        tmp_path: Path, real_trajectory: Any) -> None:  # noqa: F811
    doc = copy.deepcopy(ATIF_RFC_EXAMPLE)
    doc["agent"]["tool_definitions"] = [SEARCH["function"]]  # the inner form some producers write
    path = tmp_path / "trajectory.json"
    path.write_text(json.dumps(doc))
    [t] = import_file(path, "--format", "atif", "--outcome", "success")
    # before: a spec guessed from the calls, without its description, types, enum or required list
    assert t.tools == [SEARCH]
    [line], _ = export("atif", [t])
    assert line["agent"] == doc["agent"]  # the file's agent, as it was
    [line], _ = export("atif", [real_trajectory])
    assert line["agent"]["tool_definitions"] == real_trajectory.tools and real_trajectory.tools
    bad = copy.deepcopy(doc)
    bad["agent"]["tool_definitions"] = [{"description": "no name"}]
    path.write_text(json.dumps(bad))
    with pytest.raises(Exception, match="nothing was imported"):
        import_file(path, "--format", "atif", "--outcome", "success", "--batch", "bad")
