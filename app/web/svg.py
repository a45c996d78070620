"""Plots as inline SVG strings, drawn on the server: no JavaScript library, nothing fetched.

Every text that reaches the markup goes through `html.escape` (job names, causes and host output
are untrusted). Colours are presentation attributes, not `style=`, so the pages' Content Security
Policy can forbid inline styles. Each plot is an `<svg class="plot" data-plot=NAME>` the browser
test looks for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

__all__ = ["PALETTE", "histogram", "line_plot", "scatter", "stacked_area"]

PALETTE = ("#4e79a7", "#e15759", "#f28e2b", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")
W, H = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28


def _open(name: str, title: str) -> list[str]:
    return [
        f'<svg class="plot" data-plot="{escape(name)}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img">',
        f"<title>{escape(title)}</title>",
    ]


def _empty(name: str, title: str, why: str) -> str:
    out = _open(name, title)
    out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" fill="#666">{escape(why)}</text></svg>')
    return "".join(out)


def _scale(lo: float, hi: float, a: float, b: float) -> tuple[float, float, float, float]:
    if not hi > lo:
        hi = lo + 1.0
    return lo, hi, a, b


def _map(v: float, s: tuple[float, float, float, float]) -> float:
    lo, hi, a, b = s
    return a + (v - lo) / (hi - lo) * (b - a)


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _axes(xs: tuple[float, float, float, float], ys: tuple[float, float, float, float], x_label: str) -> list[str]:
    out = [
        f'<line x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}" stroke="#333"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}" stroke="#333"/>',
    ]
    for i in range(5):
        v = ys[0] + (ys[1] - ys[0]) * i / 4
        y = _map(v, ys)
        out.append(f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="10">{escape(_fmt(v))}</text>')
    for i in range(5):
        v = xs[0] + (xs[1] - xs[0]) * i / 4
        x = _map(v, xs)
        out.append(
            f'<text x="{x:.1f}" y="{H - BOTTOM + 12}" text-anchor="middle" font-size="10">{escape(_fmt(v))}</text>'
        )
    out.append(f'<text x="{W - RIGHT}" y="{H - 2}" text-anchor="end" font-size="10">{escape(x_label)}</text>')
    return out


def stacked_area(
    name: str,
    times_h: Sequence[float],
    layers: Mapping[str, Sequence[float]],
    *,
    caps: Sequence[tuple[str, float]] = (),
    title: str = "",
    x_label: str = "hours",
) -> str:
    """Cumulative series stacked bottom to top in `layers`' order, with a dashed line per cap. A cap
    far above the spend would flatten it to the axis: such a cap is named at the top, with the share
    of it spent, instead of drawn."""
    if len(times_h) < 2 or not layers:
        return _empty(name, title, "nothing spent yet")
    totals = [sum(layer[i] for layer in layers.values()) for i in range(len(times_h))]
    spent = max(totals)
    drawn = [(n, c) for n, c in caps if c <= 4 * spent]
    above = [(n, c) for n, c in caps if c > 4 * spent]
    top = max([spent, *(c for _, c in drawn)]) * 1.15 or 1.0
    xs = _scale(min(times_h), max(times_h), LEFT, W - RIGHT)
    ys = _scale(0.0, top, H - BOTTOM, TOP)
    out = _open(name, title)
    base = [0.0] * len(times_h)
    for k, (cause, values) in enumerate(layers.items()):
        upper = [b + v for b, v in zip(base, values, strict=True)]
        pts = [f"{_map(t, xs):.1f},{_map(u, ys):.1f}" for t, u in zip(times_h, upper, strict=True)]
        pts += [f"{_map(t, xs):.1f},{_map(b, ys):.1f}" for t, b in reversed(list(zip(times_h, base, strict=True)))]
        colour = PALETTE[k % len(PALETTE)]
        out.append(
            f'<polygon data-layer="{escape(cause)}" points="{" ".join(pts)}" fill="{colour}" fill-opacity="0.8">'
            f"<title>{escape(cause)}: ${values[-1]:.4f}</title></polygon>"
        )
        base = upper
    for i, (cap_name, cap) in enumerate(above):
        out.append(
            f'<text data-cap="{escape(cap_name)}" x="{W - RIGHT - 2}" y="{TOP + 10 + 12 * i}" text-anchor="end" '
            f'font-size="10" fill="#c00">{escape(cap_name)} ${cap:g} (above the chart: {100 * spent / cap:.1f}% spent)'
            "</text>"
        )
    for cap_name, cap in drawn:
        y = _map(cap, ys)
        out.append(
            f'<line data-cap="{escape(cap_name)}" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" '
            f'stroke="#c00" stroke-dasharray="6 4"/>'
            f'<text x="{W - RIGHT - 2}" y="{y - 3:.1f}" text-anchor="end" font-size="10" fill="#c00">'
            f"{escape(cap_name)} ${cap:g}</text>"
        )
    out += _axes(xs, ys, x_label)
    out.append("</svg>")
    return "".join(out)


def histogram(name: str, values: Sequence[float], *, bins: int = 10, title: str = "", x_label: str = "") -> str:
    """Counts of `values` in `bins` equal-width bins."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return _empty(name, title, "no values")
    lo, hi = min(finite), max(finite)
    width = (hi - lo) / bins if hi > lo else 1.0
    counts = [0] * bins
    for v in finite:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    xs = _scale(lo, lo + width * bins, LEFT, W - RIGHT)
    ys = _scale(0.0, max(counts) * 1.1, H - BOTTOM, TOP)
    out = _open(name, title)
    for i, n in enumerate(counts):
        x0, x1 = _map(lo + i * width, xs), _map(lo + (i + 1) * width, xs)
        y = _map(n, ys)
        out.append(
            f'<rect data-bin="{i}" x="{x0 + 1:.1f}" y="{y:.1f}" width="{max(0.0, x1 - x0 - 2):.1f}" '
            f'height="{H - BOTTOM - y:.1f}" fill="{PALETTE[0]}"><title>{n}</title></rect>'
        )
    out += _axes(xs, ys, x_label)
    out.append("</svg>")
    return "".join(out)


def scatter(name: str, points: Sequence[tuple[float, float]], *, title: str = "", x_label: str = "") -> str:
    """One dot per (x, y)."""
    if not points:
        return _empty(name, title, "no points")
    xs = _scale(min(p[0] for p in points), max(p[0] for p in points), LEFT + 6, W - RIGHT - 6)
    ys = _scale(0.0, max(p[1] for p in points) * 1.1 or 1.0, H - BOTTOM, TOP)
    out = _open(name, title)
    for x, y in points:
        out.append(
            f'<circle cx="{_map(x, xs):.1f}" cy="{_map(y, ys):.1f}" r="4" fill="{PALETTE[1]}">'
            f"<title>{escape(_fmt(y))}</title></circle>"
        )
    out += _axes(xs, ys, x_label)
    out.append("</svg>")
    return "".join(out)


def line_plot(name: str, points: Sequence[tuple[float, float]], *, title: str = "", x_label: str = "") -> str:
    """A polyline through (x, y) in x order."""
    pts = sorted(p for p in points if math.isfinite(p[0]) and math.isfinite(p[1]))
    if not pts:
        return _empty(name, title, "no points")
    xs = _scale(pts[0][0], pts[-1][0], LEFT, W - RIGHT)
    ys = _scale(min(0.0, *(p[1] for p in pts)), max(p[1] for p in pts) * 1.1 or 1.0, H - BOTTOM, TOP)
    out = _open(name, title)
    path = " ".join(f"{_map(x, xs):.1f},{_map(y, ys):.1f}" for x, y in pts)
    out.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="2"/>')
    out += _axes(xs, ys, x_label)
    out.append("</svg>")
    return "".join(out)
