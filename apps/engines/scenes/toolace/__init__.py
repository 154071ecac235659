"""The toolace scene: synthesized tool suites that execute, tasks admitted by execution, a simulated user.

- pipeline.py: the generation pipeline (`synthesize_pipeline toolace`): tool-suite synthesis
  (refine -> expand -> couple, gated by envscaler's static and in-sandbox checks and a smoke call
  of every operation), task synthesis per usage flow (gated by replaying the expected calls in a
  fresh environment), tasks of scene `toolace`.
- gates.py: the gates, platform side; sandbox_gate.py: their sandbox side (beside envscaler's server.py).
- runtime.py: `ToolAceRuntime` (envscaler's runtime + ask_user + follow-ups + the mt mode).
- mt.py: ToolACE-MT's skeleton -> execute -> re-fill; rules.py: the verifier's hard rules.
- The simulated user is the shared toolset apps/engines/ask_user.py.
See docs/toolace.md.
"""
