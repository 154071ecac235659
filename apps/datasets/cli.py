"""Pieces shared by the dataset management commands: progress bars, lookups, text rendering."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Callable, TextIO

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, DjangoHelpFormatter

from apps.datasets.models import DatasetVersion
from apps.datasets.selectors import NotFound, version_get

BAR_WIDTH = 30
REDRAW_EVERY_S = 0.2


class HelpFormatter(DjangoHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


class DatasetCommand(BaseCommand):
    """Help text shown as written; our `--version N` replaces Django's `--version`."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("conflict_handler", "resolve")
        return super().create_parser(prog_name, subcommand, **kwargs)


class ProgressBar:
    """A one-line progress bar on stderr: `label [#####.....] 512/1024 50%`, redrawn in place."""

    def __init__(self, stream: TextIO | None = None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._last = 0.0
        self._open = False

    def __call__(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if done < total and now - self._last < REDRAW_EVERY_S:
            return
        self._last = now
        filled = BAR_WIDTH if total <= 0 else int(BAR_WIDTH * min(done, total) / total)
        pct = 100 if total <= 0 else int(100 * min(done, total) / total)
        self.stream.write(f"\r{label:<10} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} {pct:3d}%")
        self._open = True
        if done >= total:
            self.stream.write("\n")
            self._open = False
        self.stream.flush()

    def close(self) -> None:
        if self._open:
            self.stream.write("\n")
            self._open = False

    def for_stage(self, label: str) -> Callable[[int, int], None]:
        return lambda done, total: self(label, done, total)


def resolve_user(username: str | None) -> Any:
    if not username:
        return None
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise CommandError(f"no user named {username!r}")
    return user


def get_version(name: str, number: int | None) -> DatasetVersion:
    try:
        return version_get(name, number)
    except NotFound as exc:
        raise CommandError(str(exc)) from None


def fmt_value(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    return str(value)


def histogram_lines(hist: dict[str, Any] | None, width: int = 40) -> list[str]:
    if not hist or not hist.get("bins"):
        return ["  (no values)"] + ([f"  missing: {hist['missing']}"] if hist and hist.get("missing") else [])
    peak = max(c for _, _, c in hist["bins"]) or 1
    lines = [f"  {fmt_value(lo):>7} – {fmt_value(hi):<7} {'█' * round(width * c / peak):<{width}} {c}"
             for lo, hi, c in hist["bins"]]
    if hist.get("missing"):
        lines.append(f"  missing: {hist['missing']}")
    return lines


def quantile_line(name: str, q: dict[str, Any] | None) -> str:
    q = q or {}
    parts = " ".join(f"{k}={fmt_value(q.get(k))}" for k in ("p0", "p10", "p50", "p90", "p99", "p100", "mean"))
    return f"  {name:<18} {parts}"
