"""Form fields of the console's filters: names chosen from suggestions, never typed ids."""
from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.urls import reverse_lazy
from django.utils.html import format_html

from apps.tasks.models import Batch


class SuggestInput(forms.TextInput):
    """A text input whose datalist htmx fills from /review/suggest/<kind> as one types."""

    def __init__(self, kind: str, placeholder: str = ""):
        self.list_id = f"{kind}-names"
        super().__init__(attrs={
            "list": self.list_id, "autocomplete": "off", "placeholder": placeholder,
            "hx-get": reverse_lazy("reviews:suggest", args=[kind]), "hx-target": f"#{self.list_id}",
            "hx-trigger": "input changed delay:200ms, focus once", "hx-swap": "innerHTML"})

    def render(self, *args: Any, **kwargs: Any) -> str:
        return super().render(*args, **kwargs) + format_html('<datalist id="{}"></datalist>', self.list_id)


class BatchNameField(forms.CharField):
    """A batch chosen by its name (a datalist suggests names as one types); cleans to the batch's id."""

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("widget", SuggestInput("batches", "batch name"))
        super().__init__(required=False, max_length=200, label="batch", **kwargs)

    def clean(self, value: Any) -> int | None:
        name = super().clean(value).strip()
        if not name:
            return None
        pk = Batch.objects.filter(name=name).values_list("pk", flat=True).first()
        if pk is None:
            raise ValidationError(f"no batch is named {name!r}")
        return pk


def batch_ids(text: str) -> list[int]:
    """The ids of the batches named in a comma-separated list; ValidationError naming the unknown ones."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    found = dict(Batch.objects.filter(name__in=names).values_list("name", "pk")) if names else {}
    missing = [n for n in names if n not in found]
    if missing:
        raise ValidationError(f"no batch is named {', '.join(repr(n) for n in missing)}")
    return [found[n] for n in names]
