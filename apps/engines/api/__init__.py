"""The engines REST API: the scene catalog and EnvScaler uploads."""
