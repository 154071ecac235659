"""The envscaler scene: stateful domain environments served over MCP inside the task's sandbox.

- importer.py: `validate_inputs(metadata=..., scenarios=...)`, the validation of the reference's
  two JSON files into task rows (EnvScalerImportError carries every per-item error); the
  all-or-nothing import of those rows as a batch is apps.engines.pipelines.envscaler.envscaler_import,
  used by `manage.py import_envscaler`, the console upload (apps/engines/views.py) and the API.
- runtime.py: `EnvScalerRuntime`, the scene's hooks for the shared agent loop.
- the server runs behind the shared MCP hub (apps/engines/mcp/), which records every exchange.
- server.py: the environment side (fastmcp server, import validation); runs only in sandboxes.
"""
