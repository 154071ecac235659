"""Default policy rules, and the verdict `revise` renamed to `needs_fix`."""
from django.db import migrations


def forwards(apps, schema_editor):
    from apps.reviews.policy import DEFAULT_RULES

    PolicyRule = apps.get_model("reviews", "PolicyRule")
    for rule in DEFAULT_RULES:
        PolicyRule.objects.get_or_create(field=rule["field"], defaults={k: v for k, v in rule.items() if k != "field"})
    apps.get_model("reviews", "Review").objects.filter(verdict="revise").update(verdict="needs_fix")


def backwards(apps, schema_editor):
    apps.get_model("reviews", "Review").objects.filter(verdict="needs_fix").update(verdict="revise")


class Migration(migrations.Migration):
    dependencies = [("reviews", "0002_review_loop")]

    operations = [migrations.RunPython(forwards, backwards)]
