"""A tenth scene, outside apps/engines/scenes, for docs/new-scene.md and tests/engines/test_new_scene.py."""
