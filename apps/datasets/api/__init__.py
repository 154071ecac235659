"""The datasets REST API."""
