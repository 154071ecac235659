"""Server-rendered SVG charts: data card histograms and the overview's daily series.

Inline SVG, escaped text, no JavaScript and no external assets; each bar carries a <title> with
its exact value (the tooltip). Charts scale down to the width of their box (a phone's too).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP, PAD_RIGHT = 360, 150, 30, 30, 14, 16
STYLE = ('<style>.bar{fill:#4a7bd0}.bar-1{fill:#5aa469}.count{font-size:9px;text-anchor:middle;fill:#333}'
         '.tick{font-size:9px;fill:#555;text-anchor:middle}.axis{font-size:9px;fill:#555}.end{text-anchor:end}'
         '.gap{font-size:9px;fill:#999;text-anchor:middle}</style>')


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1 or value == 0 else f"{value:.2f}".rstrip("0")


def _num(x: float) -> str:
    return f"{x:.1f}"


def _frame(*, title: str, body: SafeString, width: int = WIDTH, css_class: str = "histogram") -> SafeString:
    return format_html(
        '<svg class="{c}" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{t}" '
        'preserveAspectRatio="xMinYMin meet">{style}<line x1="{pl}" y1="{base}" x2="{right}" y2="{base}" '
        'stroke="#888"/>{body}</svg>',
        c=css_class, w=width, h=HEIGHT, t=title, style=mark_safe(STYLE), pl=PAD_LEFT, base=HEIGHT - PAD_BOTTOM,
        right=width - PAD_RIGHT, body=body,
    )


def histogram_svg(hist: dict[str, Any] | None, *, title: str) -> SafeString:
    """An accessible inline SVG of equal-width bins [[lo, hi, count], ...]."""
    bins = (hist or {}).get("bins") or []
    if not bins:
        return format_html('<p class="muted">{}: no values</p>', title)
    peak = max(c for _, _, c in bins) or 1
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_BOTTOM - PAD_TOP
    bar_w = plot_w / len(bins)
    bars = format_html_join(
        "", '<g><title>{} – {}: {}</title><rect x="{}" y="{}" width="{}" height="{}" '
        'class="bar"/><text x="{}" y="{}" class="count">{}</text></g>',
        (
            (_label(lo), _label(hi), c, _num(PAD_LEFT + i * bar_w + 1), _num(PAD_TOP + plot_h - plot_h * c / peak),
             _num(max(bar_w - 2, 1)), _num(plot_h * c / peak), _num(PAD_LEFT + (i + 0.5) * bar_w),
             _num(PAD_TOP + plot_h - plot_h * c / peak - 2), c if c else "")
            for i, (lo, hi, c) in enumerate(bins)
        ),
    )
    ticks = format_html_join(
        "", '<text x="{}" y="{}" class="tick">{}</text>',
        ((_num(PAD_LEFT + i * bar_w), HEIGHT - PAD_BOTTOM + 14, _label(bins[i][0] if i < len(bins) else bins[-1][1]))
         for i in range(0, len(bins) + 1, max(1, len(bins) // 5))),
    )
    missing = (hist or {}).get("missing") or 0
    note = format_html('<text x="{}" y="{}" class="tick">{} without a value</text>', WIDTH - 6 - 120,
                       HEIGHT - 4, missing) if missing else mark_safe("")
    return _frame(title=title, body=format_html("{}{}{}", bars, ticks, note))


def series_svg(labels: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]], *, title: str,
               fmt: Callable[[float], str] = _label, peak: float | None = None, width: int = 420,
               classes: Sequence[str] = ("bar", "bar bar-1")) -> SafeString:
    """Bars over time: one bar per label, the series stacked in order (the first at the bottom),
    series n drawn with classes[n] (blue, green).

    A value of None is no data (drawn as a dash, never as 0); `peak` fixes the scale (100 for a
    rate), else the tallest stack sets it. The axis shows the peak and every other label."""
    if not labels:
        return format_html('<p class="muted">{}: no days yet</p>', title)
    totals = [sum(v[i] or 0 for _, v in series) for i in range(len(labels))]
    top = peak if peak is not None else (max(totals) or 1)
    plot_w, plot_h = width - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_BOTTOM - PAD_TOP
    bar_w = plot_w / len(labels)
    base = PAD_TOP + plot_h
    parts: list[tuple[Any, ...]] = []
    gaps: list[tuple[Any, ...]] = []
    for i, label in enumerate(labels):
        x = PAD_LEFT + i * bar_w
        if all(v[i] is None for _, v in series):
            gaps.append((label, _num(x + bar_w / 2), _num(base - 3)))
            continue
        y = base
        for n, (name, values) in enumerate(series):
            value = values[i] or 0
            h = plot_h * min(value, top) / top
            y -= h
            parts.append((label, name, fmt(value), _num(x + 1), _num(y), _num(max(bar_w - 2, 1)), _num(h),
                          classes[n % len(classes)]))
    bars = format_html_join("", '<g><title>{} {}: {}</title><rect x="{}" y="{}" width="{}" height="{}" '
                                'class="{}"/></g>', parts)
    dashes = format_html_join("", '<g><title>{}: no data</title><text x="{}" y="{}" class="gap">–</text></g>', gaps)
    ticks = format_html_join("", '<text x="{}" y="{}" class="tick">{}</text>',
                             ((_num(PAD_LEFT + (i + 0.5) * bar_w), HEIGHT - PAD_BOTTOM + 14, labels[i])
                              for i in range(len(labels) - 1, -1, -2)))
    # The peak's label above the plot (a long one such as "$0.2040" fits no left margin).
    axis = format_html('<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#ddd"/><text x="{}" y="{}" class="axis">{}'
                       '</text><text x="{}" y="{}" class="axis end">0</text>',
                       PAD_LEFT, PAD_TOP, width - PAD_RIGHT, PAD_TOP, PAD_LEFT, PAD_TOP - 3, fmt(top),
                       PAD_LEFT - 3, base)
    return _frame(title=title, body=format_html("{}{}{}{}", bars, dashes, ticks, axis), width=width,
                  css_class="series")
