"""Plots as inline SVG text: a line chart with alarm markers, stacked bars, horizontal bars. Pure functions from
numbers to markup (no I/O), so the page is one self-contained file that needs no script or CDN to draw."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

WIDTH, HEIGHT = 560, 240
LEFT, RIGHT, TOP, BOTTOM = 52, 12, 14, 30  # plot margins (px)
ALARM_COLOR = "#d62728"


@dataclass
class Series:
    name: str
    xs: list[float]
    ys: list[float]
    color: str
    points: bool = False  # draw markers (few points, e.g. held-out evals)
    width: float = 1.6
    opacity: float = 1.0


@dataclass
class Alarm:
    step: int
    names: list[str] = field(default_factory=list)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step + 1e-9) * step  # 1e-9: 3.8 / 0.2 is 18.999... in floats
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 12))
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 1e-3:
        return f"{v:.0e}" if abs(v) < 1e-3 else f"{v:,.0f}"
    return f"{v:.4g}"


class _Frame:
    """Maps data coordinates to pixels for a plot area with the given ranges."""

    def __init__(self, x0, x1, y0, y1, width=WIDTH, height=HEIGHT):
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)
        self.w, self.h = width, height

    def px(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * (self.w - LEFT - RIGHT)

    def py(self, y: float) -> float:
        return self.h - BOTTOM - (y - self.y0) / (self.y1 - self.y0) * (self.h - TOP - BOTTOM)


def _axes(f: _Frame, xticks: list[float], yticks: list[float], xlabel: str) -> list[str]:
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{f.w - LEFT - RIGHT}" height="{f.h - TOP - BOTTOM}" class="plot-bg"/>']
    for t in yticks:
        y = f.py(t)
        out.append(f'<line x1="{LEFT}" x2="{f.w - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{LEFT - 5}" y="{y + 3.5:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>')
    for t in xticks:
        x = f.px(t)
        out.append(f'<text x="{x:.1f}" y="{f.h - BOTTOM + 14}" class="tick" text-anchor="middle">{_fmt(t)}</text>')
    out.append(f'<text x="{(LEFT + f.w - RIGHT) / 2}" y="{f.h - 3}" class="axis-label" text-anchor="middle">{escape(xlabel)}</text>')
    return out


def _svg(chart_id: str, body: list[str], title: str, width=WIDTH, height=HEIGHT) -> str:
    return (f'<svg class="chart" data-chart="{chart_id}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


def _empty(chart_id: str, title: str, message: str) -> str:
    return _svg(chart_id, [f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" class="empty" text-anchor="middle">{escape(message)}</text>'], title)


def line_chart(chart_id: str, title: str, series: list[Series], alarms: list[Alarm] = (), *, y_range=None,
               xlabel: str = "step") -> str:
    """Lines (and markers) per series; a dashed red line with a triangle at every step that raised an alarm."""
    drawn = [s for s in series if s.xs]
    if not drawn:
        return _empty(chart_id, title, "no data yet")
    xs = [x for s in drawn for x in s.xs] + [a.step for a in alarms]
    ys = [y for s in drawn for y in s.ys]
    lo, hi = y_range if y_range else (min(ys), max(ys))
    if not y_range and hi - lo < 1e-12:
        lo, hi = lo - (abs(lo) * 0.1 or 0.5), hi + (abs(hi) * 0.1 or 0.5)
    yticks = nice_ticks(lo, hi)
    xticks = nice_ticks(min(xs), max(xs), 6)
    f = _Frame(min(xs), max(xs), yticks[0], yticks[-1])
    body = _axes(f, [t for t in xticks if min(xs) <= t <= max(xs)] or [min(xs)], yticks, xlabel)
    for a in alarms:
        x = f.px(a.step)
        label = escape(f"step {a.step}: " + ", ".join(a.names))
        body.append(f'<g class="alarm" data-step="{a.step}"><title>{label}</title>'
                    f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" stroke="{ALARM_COLOR}" stroke-dasharray="4 3"/>'
                    f'<path d="M{x - 5:.1f},{TOP} L{x + 5:.1f},{TOP} L{x:.1f},{TOP + 8} Z" fill="{ALARM_COLOR}"/></g>')
    for s in drawn:
        pts = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in zip(s.xs, s.ys))
        attrs = f'data-series="{escape(s.name)}" data-points="{len(s.xs)}" data-last="{s.ys[-1]!r}"'
        if len(s.xs) > 1:
            body.append(f'<polyline {attrs} points="{pts}" fill="none" stroke="{s.color}" stroke-width="{s.width}" '
                        f'stroke-opacity="{s.opacity}"/>')
        if s.points or len(s.xs) == 1:
            body.append(f'<g {attrs} fill="{s.color}">' + "".join(
                f'<circle cx="{f.px(x):.1f}" cy="{f.py(y):.1f}" r="3"><title>step {x:g}: {y:.4g}</title></circle>'
                for x, y in zip(s.xs, s.ys)) + "</g>")
    return _svg(chart_id, body, title)


def stacked_bars(chart_id: str, title: str, xs: list[float], parts: dict[str, list[float]], colors: dict[str, str],
                 *, ylabel_unit: str = "s", xlabel: str = "step", max_bars: int = 120) -> str:
    """One bar per x (steps averaged into at most `max_bars` bins), split into the given parts, bottom to top."""
    if not xs:
        return _empty(chart_id, title, "no steps yet")
    per_bin = math.ceil(len(xs) / max_bars)
    bins = [(xs[i], xs[min(i + per_bin, len(xs)) - 1], range(i, min(i + per_bin, len(xs)))) for i in range(0, len(xs), per_bin)]
    heights = [{k: sum(parts[k][j] for j in idx) / len(idx) for k in parts} for _, _, idx in bins]
    top = max(sum(h.values()) for h in heights) or 1.0
    yticks = nice_ticks(0.0, top)
    f = _Frame(0, len(bins), 0.0, yticks[-1])
    shown = [i for i in range(len(bins)) if i % max(1, len(bins) // 6) == 0]
    body = _axes(f, [], yticks, f"{xlabel} (mean over {per_bin} steps per bar)" if per_bin > 1 else xlabel)
    for i in shown:
        body.append(f'<text x="{f.px(i + 0.5):.1f}" y="{HEIGHT - BOTTOM + 14}" class="tick" text-anchor="middle">{_fmt(bins[i][0])}</text>')
    bar_w = max((f.px(1) - f.px(0)) * 0.85, 0.5)
    for i, ((a, b, _), h) in enumerate(zip(bins, heights)):
        y = 0.0
        for k, v in h.items():
            y1, y2 = f.py(y), f.py(y + v)
            body.append(f'<rect data-part="{escape(k)}" x="{f.px(i) + (f.px(1) - f.px(0) - bar_w) / 2:.1f}" y="{y2:.1f}" '
                        f'width="{bar_w:.1f}" height="{max(y1 - y2, 0):.2f}" fill="{colors[k]}">'
                        f'<title>steps {a:g}-{b:g}: {k} {v:.3g} {ylabel_unit}</title></rect>')
            y += v
    return _svg(chart_id, body, title)


def hbars(chart_id: str, title: str, values: dict[str, float], *, color: str = "#4c78a8", percent: bool = True) -> str:
    """Horizontal bars, one per label (fractions shown as percent)."""
    if not values:
        return _empty(chart_id, title, "no steps yet")
    row, height = 30, 30 * len(values) + 24
    label_w, width = 90, WIDTH
    top = max(max(values.values()), 1.0 if percent else 0.0) or 1.0
    body = []
    for i, (k, v) in enumerate(values.items()):
        y = 8 + i * row
        w = (width - label_w - 70) * v / top
        text = f"{100 * v:.1f}%" if percent else _fmt(v)
        body.append(f'<g data-role="{escape(k)}" data-value="{v!r}">'
                    f'<text x="{label_w - 6}" y="{y + 15}" class="tick" text-anchor="end">{escape(k)}</text>'
                    f'<rect x="{label_w}" y="{y}" width="{max(w, 0.5):.1f}" height="20" fill="{color}"/>'
                    f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" class="tick">{text}</text></g>')
    return _svg(chart_id, body, title, width, height)
