"""The reviews REST API."""
