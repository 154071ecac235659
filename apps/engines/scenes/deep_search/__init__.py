"""The deep_search scene: web research ending in a sourced answer (runtime.py; verify.py grades it)."""
