"""The `model` rule's allowed values name current models: DeepSeek retired deepseek-chat and
deepseek-reasoner on 2026-07-24 (apps/engines/profiles.json), so a proposal switching to one of
them would only be refused when the next iteration starts. Each retired name becomes its
replacement; a table an operator edited keeps its other values and its order."""
from django.db import migrations

RETIRED = {"deepseek-chat": "deepseek-flash", "deepseek-reasoner": "deepseek-flash"}


def forwards(apps, schema_editor):
    PolicyRule = apps.get_model("reviews", "PolicyRule")
    for rule in PolicyRule.objects.filter(field="model"):
        values = list(rule.allowed_values or [])
        current = list(dict.fromkeys(RETIRED.get(v, v) for v in values))
        if current != values:
            rule.allowed_values = current
            rule.save(update_fields=["allowed_values"])


class Migration(migrations.Migration):
    dependencies = [("reviews", "0006_review_cost")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
