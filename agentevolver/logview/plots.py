"""Metric curves as inline SVG, drawn on the server.

Hand-written instead of a plotting library: the viewer must work offline with no CDN, and the pages
need only a few line charts (tens of points) with hover values, which is ~60 lines of SVG; a JS
charting library would be a vendored dependency bigger than the whole viewer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

__all__ = ["PANELS", "Panel", "heat_strip", "line_chart", "panels_for"]

#: Colours of the series in one chart (colour-blind safe, Okabe-Ito).
COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")

#: The standard panels: title and the metric names (or ``prefix*``) it plots, those present in the run.
PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Reward", ("critic/score/mean", "critic/rewards/mean")),
    ("Success rate", ("episode/success_rate",)),
    ("Loss", ("actor/pg_loss", "critic/vf_loss")),
    ("KL", ("actor/kl_loss", "actor/ppo_kl")),
    ("Lengths (tokens)", ("response_length/mean", "prompt_length/mean")),
    ("Step time (s)", ("timing_s/step",)),
    ("Validation", ("val-core/*",)),
)


@dataclass
class Panel:
    title: str
    series: dict[str, list[tuple[int, float]]]


def panels_for(series: dict[str, list[tuple[int, float]]]) -> list[Panel]:
    """The standard panels that have at least one of their metrics in ``series``."""
    panels = []
    for title, names in PANELS:
        chosen: dict[str, list[tuple[int, float]]] = {}
        for name in names:
            if name.endswith("*"):
                chosen.update({key: points for key, points in series.items() if key.startswith(name[:-1])})
            elif name in series:
                chosen[name] = series[name]
        if chosen:
            panels.append(Panel(title, chosen))
    return panels


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.3f}".rstrip("0").rstrip(".")


def _bounds(values: Iterable[float]) -> tuple[float, float]:
    values = list(values)
    low, high = min(values), max(values)
    if math.isclose(low, high):
        pad = abs(low) * 0.1 or 1.0
        return low - pad, high + pad
    return low, high


def line_chart(series: dict[str, Sequence[tuple[int, float]]], *, width: int = 420, height: int = 180,
               title: str = "") -> Markup:
    """An SVG chart of each series (x = step); every point carries a hover title with its value."""
    series = {name: list(points) for name, points in series.items() if points}
    if not series:
        return Markup('<p class="empty">no data</p>')
    left, right, top, bottom = 52, 10, 10, 22
    steps = [step for points in series.values() for step, _ in points]
    x_low, x_high = min(steps), max(steps)
    y_low, y_high = _bounds(value for points in series.values() for _, value in points)
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(step: float) -> float:
        return left + (plot_w / 2 if x_low == x_high else (step - x_low) / (x_high - x_low) * plot_w)

    def y(value: float) -> float:
        return top + (1 - (value - y_low) / (y_high - y_low)) * plot_h

    parts = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
             f'role="img" aria-label="{escape(title)}">',
             f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="frame"/>']
    for value in (y_low, (y_low + y_high) / 2, y_high):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y(value):.1f}" y2="{y(value):.1f}" class="grid"/>'
                     f'<text x="{left - 4}" y="{y(value) + 4:.1f}" text-anchor="end">{_fmt(value)}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}">step {x_low}</text>')
    if x_high != x_low:
        parts.append(f'<text x="{left + plot_w}" y="{height - 6}" text-anchor="end">{x_high}</text>')
    for index, (name, points) in enumerate(series.items()):
        colour = COLOURS[index % len(COLOURS)]
        path = " ".join(f"{x(step):.1f},{y(value):.1f}" for step, value in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        for step, value in points:
            parts.append(f'<circle cx="{x(step):.1f}" cy="{y(value):.1f}" r="2.6" fill="{colour}">'
                         f'<title>{escape(name)} @ step {step}: {value:.6g}</title></circle>')
    parts.append("</svg>")
    legend = "".join(f'<span class="key"><i style="background:{COLOURS[i % len(COLOURS)]}"></i>{escape(name)}</span>'
                     for i, name in enumerate(series))
    return Markup(f'<figure class="plot"><figcaption>{escape(title)}</figcaption>{"".join(parts)}'
                  f'<div class="legend">{legend}</div></figure>')


def heat_strip(values: Sequence[float | None], *, height: int = 14) -> Markup:
    """One cell per token: blue for positive, red for negative advantage, grey for none (mask 0).

    Runs of equal colour are merged, so a GRPO episode (one advantage for all its tokens) is a few rects.
    """
    if not values:
        return Markup("")
    scale = max((abs(v) for v in values if v is not None), default=0.0) or 1.0
    cells: list[tuple[int, int, str, str]] = []
    for index, value in enumerate(values):
        if value is None:
            colour, label = "#d0d0d0", "no advantage"
        else:
            strength = min(abs(value) / scale, 1.0)
            shade = round(235 - 175 * strength)
            colour = f"rgb({shade},{shade},255)" if value >= 0 else f"rgb(255,{shade},{shade})"
            label = f"{value:+.4f}"
        if cells and cells[-1][2] == colour and cells[-1][3] == label:
            start, _, _, _ = cells[-1]
            cells[-1] = (start, index + 1, colour, label)
        else:
            cells.append((index, index + 1, colour, label))
    rects = "".join(f'<rect x="{start}" y="0" width="{end - start}" height="1" fill="{colour}">'
                    f'<title>tokens {start}-{end - 1}: {label}</title></rect>' for start, end, colour, label in cells)
    return Markup(f'<svg class="heat" viewBox="0 0 {len(values)} 1" preserveAspectRatio="none" '
                  f'height="{height}" width="100%">{rects}</svg>')
