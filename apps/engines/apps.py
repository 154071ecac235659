from django.apps import AppConfig


class EnginesConfig(AppConfig):
    name = "apps.engines"
    label = "engines"
