"""Line charts as inline SVG: no JavaScript, no CDN, readable offline and in a screenshot."""

from __future__ import annotations

import html
import math

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], *, width: int = 420,
               height: int = 220, y_range: tuple[float, float] | None = None,
               marks: list[tuple[float, str]] | None = None) -> str:
    """One chart: each series a polyline with dots, x = iteration; a legend below the title;
    `marks`: (x, label) drawn as dashed vertical lines (a version promoted or rolled back)."""
    points = [(x, y) for values in series.values() for x, y in values if math.isfinite(y)]
    if not points:
        return (f'<figure class="chart"><figcaption>{html.escape(title)}</figcaption>'
                '<p class="muted">no data yet</p></figure>')
    left, right, top, bottom = 44, 12, 12, 28
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = y_range or (min(ys), max(ys))
    if y1 <= y0:
        y0, y1 = y0 - 0.5, y1 + 0.5

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * (width - left - right)

    def sy(y: float) -> float:
        return top + (1 - (y - y0) / (y1 - y0)) * (height - top - bottom)

    parts = [f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
             f'aria-label="{html.escape(title)}">',
             f'<rect x="{left}" y="{top}" width="{width - left - right}" height="{height - top - bottom}" '
             'fill="#fafafa" stroke="#ccc"/>']
    for frac in (0, 0.5, 1):
        y = y0 + frac * (y1 - y0)
        parts.append(f'<text x="{left - 4}" y="{sy(y) + 4:.1f}" text-anchor="end" class="tick">{y:.3g}</text>')
    for x in sorted(set(xs))[:: max(1, len(set(xs)) // 8)]:
        parts.append(f'<text x="{sx(x):.1f}" y="{height - 10}" text-anchor="middle" class="tick">{x:g}</text>')
    for x, label in marks or []:
        if x0 <= x <= x1:
            parts.append(f'<line class="mark" x1="{sx(x):.1f}" x2="{sx(x):.1f}" y1="{top}" y2="{height - bottom}" '
                         f'stroke="#888" stroke-dasharray="3,3"><title>{html.escape(label)}</title></line>')
    legend = []
    for n, (name, values) in enumerate(series.items()):
        colour = PALETTE[n % len(PALETTE)]
        good = [(x, y) for x, y in values if math.isfinite(y)]
        if not good:
            continue
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in good)
        parts.append(f'<polyline class="series" data-series="{html.escape(name)}" fill="none" stroke="{colour}" '
                     f'stroke-width="2" points="{path}"/>')
        parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{colour}"><title>'
                  f'{html.escape(name)} @ {x:g}: {y:.4g}</title></circle>' for x, y in good]
        legend.append(f'<span style="color:{colour}">&#9632; {html.escape(name)}</span>')
    parts.append("</svg>")
    return (f'<figure class="chart"><figcaption>{html.escape(title)} {" ".join(legend)}</figcaption>'
            f'{"".join(parts)}</figure>')


__all__ = ["line_chart"]
