"""The envscaler scene: stateful domain environments served over MCP inside the task's sandbox.

- importer.py: `envscaler_import(metadata=..., scenarios=..., actor=..., batch_name=None)`, the
  validated, all-or-nothing import of the reference's two JSON files (EnvScalerImportError
  carries every per-item error); used by `manage.py import_envscaler`, the console upload
  (apps/engines/views.py) and the API.
- runtime.py: `EnvScalerRuntime`, the scene's hooks for the shared agent loop.
- the server runs behind the shared MCP hub (apps/engines/mcp/), which records every exchange.
- server.py: the environment side (fastmcp server, import validation); runs only in sandboxes.
"""
