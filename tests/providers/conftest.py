"""The provider conformance suite (issue 34): a loopback stand-in per profile (standin.py) that
enforces what that provider documents, and bundled code_exec, envscaler and gui tasks run end to
end through each. docs/llm.md ("The loop and the profile") lists the rules each stand-in enforces."""
from tests.engines.conftest import sandbox_root_dir, sandbox_settings  # noqa: F401 - fixtures
from tests.engines.test_agent import llm_env  # noqa: F401 - fixture
from tests.engines.test_gui import artifact_root  # noqa: F401 - fixture
