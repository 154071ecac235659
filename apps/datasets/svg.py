"""Server-side SVG bar charts for data card histograms (no JavaScript, no external assets)."""
from __future__ import annotations

from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP, PAD_RIGHT = 360, 150, 30, 30, 14, 16


def _label(value: float) -> str:
    return f"{value:g}" if abs(value) >= 1 or value == 0 else f"{value:.2f}".rstrip("0")


def histogram_svg(hist: dict[str, Any] | None, *, title: str) -> SafeString:
    """An accessible inline SVG of equal-width bins [[lo, hi, count], ...]."""
    bins = (hist or {}).get("bins") or []
    if not bins:
        return format_html('<p class="muted">{}: no values</p>', title)
    peak = max(c for _, _, c in bins) or 1
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_BOTTOM - PAD_TOP
    bar_w = plot_w / len(bins)
    def num(x: float) -> str:
        return f"{x:.1f}"

    bars = format_html_join(
        "", '<g><title>{} – {}: {}</title><rect x="{}" y="{}" width="{}" height="{}" '
        'class="bar"/><text x="{}" y="{}" class="count">{}</text></g>',
        (
            (_label(lo), _label(hi), c, num(PAD_LEFT + i * bar_w + 1), num(PAD_TOP + plot_h - plot_h * c / peak),
             num(max(bar_w - 2, 1)), num(plot_h * c / peak), num(PAD_LEFT + (i + 0.5) * bar_w),
             num(PAD_TOP + plot_h - plot_h * c / peak - 2), c if c else "")
            for i, (lo, hi, c) in enumerate(bins)
        ),
    )
    ticks = format_html_join(
        "", '<text x="{}" y="{}" class="tick">{}</text>',
        ((num(PAD_LEFT + i * bar_w), HEIGHT - PAD_BOTTOM + 14, _label(bins[i][0] if i < len(bins) else bins[-1][1]))
         for i in range(0, len(bins) + 1, max(1, len(bins) // 5))),
    )
    missing = (hist or {}).get("missing") or 0
    note = format_html('<text x="{}" y="{}" class="tick">{} without a value</text>', WIDTH - 6 - 120,
                       HEIGHT - 4, missing) if missing else ""
    return format_html(
        '<svg class="histogram" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{t}">'
        '<style>.bar{{fill:#4a7bd0}}.count{{font-size:9px;text-anchor:middle;fill:#333}}'
        '.tick{{font-size:9px;fill:#555;text-anchor:middle}}</style>'
        '<line x1="{pl}" y1="{base}" x2="{right}" y2="{base}" stroke="#888"/>{bars}{ticks}{note}</svg>',
        w=WIDTH, h=HEIGHT, t=title, pl=PAD_LEFT, base=PAD_TOP + plot_h, right=WIDTH - PAD_RIGHT, bars=bars, ticks=ticks,
        note=note or mark_safe(""),
    )
