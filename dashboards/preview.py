"""Draw a dashboard's panels from a real Prometheus as one HTML page (SVG), and screenshot it with chromium.

No Grafana server is needed: the panels' own queries (variables filled) run against Prometheus, and each panel
is drawn where its gridPos puts it. It is a faithful picture of the data, not of Grafana's styling: time
series as lines (stacked panels as stacked areas), stats as their last value, heatmaps as bucket counts with
exemplars as dots.
"""

from __future__ import annotations

import html
import math
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from dashboards.prom_api import Exemplar, PrometheusApi, Series
from dashboards.queries import PanelQuery, fill, panel_queries, panels

PAGE_WIDTH: Final = 1600
CELL_H: Final = 30  # Grafana's grid: 24 columns, 30 px rows
GAP: Final = 8
PALETTE: Final = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a",
                  "#37872d", "#c4162a", "#1f60c4", "#8f3bb8")


@dataclass
class PanelData:
    results: list[tuple[PanelQuery, list[Series]]] = field(default_factory=list)
    exemplars: list[Exemplar] = field(default_factory=list)


def fetch(api: PrometheusApi, model: Mapping[str, Any], values: Mapping[str, str], start: float, end: float,
          step: float = 1.0, exemplar_shift_s: float = 0.0) -> dict[int, PanelData]:
    """Every panel's query results over [start, end]; exemplars moved by `exemplar_shift_s` (replays)."""
    out: dict[int, PanelData] = {}
    for q in panel_queries(model):
        expr = fill(q.expr, values)
        series = api.query(expr, end) if q.instant else api.query_range(expr, start, end, step)
        data = out.setdefault(q.panel_id, PanelData())
        data.results.append((q, series))
        if q.exemplar:
            for e in api.exemplars(expr, start - exemplar_shift_s - 3600, end - exemplar_shift_s):
                data.exemplars.append(Exemplar(e.series, e.labels, e.value, e.ts + exemplar_shift_s))
    return out


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    if not fmt or fmt == "__auto":
        return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "value"
    out = fmt
    for k, v in labels.items():
        out = out.replace("{{" + k + "}}", v)
    return out.replace("{{", "").replace("}}", "")


def fmt_value(v: float, unit: str) -> str:
    if v != v:
        return "NaN"
    if unit == "percentunit":
        return f"{v * 100:.0f}%" if abs(v) >= 0.1 else f"{v * 100:.1f}%"
    if unit == "s":
        return f"{v * 1000:.2f} ms" if abs(v) < 0.01 else f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    suffix = "/s" if unit == "reqps" else ""
    if abs(v) >= 1000:
        return f"{v / 1000:.1f}k{suffix}"
    return f"{v:.0f}{suffix}" if v == int(v) else f"{v:.2f}{suffix}"


def _esc(s: str) -> str:
    return html.escape(s, quote=True)


def _line_chart(p: Mapping[str, Any], data: PanelData, w: int, h: int, start: float, end: float) -> str:
    unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "none")
    stacked = p.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode") == "normal"
    lines = [(legend(q.legend, s.labels), s) for q, ss in data.results for s in ss]
    left, bottom, top = 58, 18, 4
    pw = w - left - 6
    cols = max(1, min(3, pw // 170))
    ph = h - bottom - top - 16 * math.ceil(len(lines) / cols) - 4
    ts = sorted({t for _, s in lines for t, _ in s.points})
    stack_base: dict[float, float] = {t: 0.0 for t in ts}
    drawn: list[tuple[str, list[tuple[float, float, float]]]] = []  # name, (t, low, high)
    for name, s in lines:
        pts = []
        for t, v in s.finite:
            low = stack_base[t] if stacked else 0.0
            pts.append((t, low, low + v))
            if stacked:
                stack_base[t] = low + v
        drawn.append((name, pts))
    ys = [y for _, pts in drawn for _, lo, hi in pts for y in (lo, hi)] or [0.0, 1.0]
    y0, y1 = min(0.0, min(ys)), max(ys)
    y1 = y0 + 1 if y1 <= y0 else y1 * 1.05

    def x(t: float) -> float:
        return left + (t - start) / max(end - start, 1e-9) * pw

    def y(v: float) -> float:
        return top + ph - (v - y0) / (y1 - y0) * ph

    out = [f'<svg width="{w}" height="{h}" font-size="10" fill="#ccc">']
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#333"/>'
                   f'<text x="{left - 4}" y="{y(v) + 3:.1f}" text-anchor="end">{_esc(fmt_value(v, unit))}</text>')
    for i in range(5):
        t = start + (end - start) * i / 4
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        out.append(f'<text x="{x(t):.1f}" y="{top + ph + 12}" text-anchor="{anchor}">+{t - start:.0f}s</text>')
    for i, (_, pts) in enumerate(drawn):
        color = PALETTE[i % len(PALETTE)]
        if not pts:
            continue
        path = " ".join(f"{x(t):.1f},{y(hi):.1f}" for t, _, hi in pts)
        if stacked:
            back = " ".join(f"{x(t):.1f},{y(lo):.1f}" for t, lo, _ in reversed(pts))
            out.append(f'<polygon points="{path} {back}" fill="{color}" fill-opacity="0.35" stroke="none"/>')
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    for e in data.exemplars:
        if start <= e.ts <= end:
            out.append(f'<circle cx="{x(e.ts):.1f}" cy="{y(e.value):.1f}" r="3" fill="#40a0ff"/>')
    ly = top + ph + 28
    for i, (name, _) in enumerate(lines):
        lx, row = left + (i % cols) * (pw // cols), ly + (i // cols) * 16
        out.append(f'<rect x="{lx}" y="{row - 8}" width="10" height="4" fill="{PALETTE[i % len(PALETTE)]}"/>'
                   f'<text x="{lx + 14}" y="{row - 3}">{_esc(name[:(pw // cols) // 6])}</text>')
    out.append("</svg>")
    return "".join(out)


def _heatmap(data: PanelData, w: int, h: int, start: float, end: float) -> str:
    series = [s for _, ss in data.results for s in ss if "le" in s.labels]
    series.sort(key=lambda s: float(s.labels["le"]))
    left, bottom = 58, 18
    pw, ph = w - left - 6, h - bottom - 4
    if not series:
        return f'<svg width="{w}" height="{h}"><text x="10" y="20" fill="#888">No data</text></svg>'
    ts = sorted({t for s in series for t, _ in s.points})
    cum = [{t: v for t, v in s.finite} for s in series]
    counts = [[max(0.0, cum[i].get(t, 0.0) - (cum[i - 1].get(t, 0.0) if i else 0.0)) for t in ts]
              for i in range(len(series))]
    peak = max((c for row in counts for c in row), default=0.0) or 1.0
    rh, cw = ph / len(series), pw / max(len(ts), 1)
    out = [f'<svg width="{w}" height="{h}" font-size="10" fill="#ccc">']
    for i, s in enumerate(series):
        yy = 4 + ph - (i + 1) * rh
        out.append(f'<text x="{left - 4}" y="{yy + rh / 2 + 3:.1f}" text-anchor="end">≤{_esc(s.labels["le"])}</text>')
        for j, c in enumerate(counts[i]):
            if c > 0:
                out.append(f'<rect x="{left + j * cw:.1f}" y="{yy:.1f}" width="{cw + 0.5:.1f}" height="{rh - 1:.1f}" '
                           f'fill="#ff9830" fill-opacity="{0.15 + 0.85 * (c / peak) ** 0.5:.2f}"/>')
    bounds = [float(s.labels["le"]) for s in series]
    for e in data.exemplars:
        if start <= e.ts <= end:
            i = next((k for k, b in enumerate(bounds) if e.value <= b), len(bounds) - 1)
            cx = left + (e.ts - start) / max(end - start, 1e-9) * pw
            out.append(f'<circle cx="{cx:.1f}" cy="{4 + ph - (i + 0.5) * rh:.1f}" r="3.5" fill="#40a0ff" '
                       'stroke="#fff" stroke-width="0.5"/>')
    out.append(f'<text x="{left}" y="{h - 4}">+0s</text><text x="{left + pw}" y="{h - 4}" text-anchor="end">'
               f'+{end - start:.0f}s</text></svg>')
    return "".join(out)


def _stat(p: Mapping[str, Any], data: PanelData, w: int, h: int) -> str:
    defaults = p.get("fieldConfig", {}).get("defaults", {})
    unit = defaults.get("unit", "none")
    red = [s["value"] for s in defaults.get("thresholds", {}).get("steps", []) if s.get("value") is not None]
    values = [(legend(q.legend, s.labels), s.finite[-1][1]) for q, ss in data.results for s in ss if s.finite]
    if not values:
        return f'<svg width="{w}" height="{h}"><text x="10" y="30" fill="#888">No data</text></svg>'
    if p.get("options", {}).get("textMode") == "name":  # show the series' name (e.g. a version) as the value
        return (f'<svg width="{w}" height="{h}"><text x="{w / 2:.0f}" y="{h / 2 + 6:.0f}" fill="#73bf69" '
                f'font-size="30" font-weight="bold" text-anchor="middle">{_esc(values[0][0])}</text></svg>')
    out = [f'<svg width="{w}" height="{h}">']
    size = 34 if len(values) == 1 else 24
    for i, (name, v) in enumerate(values[:3]):
        color = "#f2495c" if red and v >= red[0] else "#73bf69"
        cx = w * (i + 0.5) / min(len(values), 3)
        out.append(f'<text x="{cx:.0f}" y="{h / 2 + 6:.0f}" fill="{color}" font-size="{size}" font-weight="bold" '
                   f'text-anchor="middle">{_esc(fmt_value(v, unit))}</text>')
        if len(values) > 1:
            out.append(f'<text x="{cx:.0f}" y="{h / 2 + 24:.0f}" fill="#ccc" font-size="11" '
                       f'text-anchor="middle">{_esc(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def render_html(model: Mapping[str, Any], data: Mapping[int, PanelData], start: float, end: float,
                subtitle: str = "") -> tuple[str, int]:
    """The page and its height in pixels."""
    colw = PAGE_WIDTH / 24
    boxes, bottom = [], 0
    for p in model.get("panels", []):
        g = p["gridPos"]
        x, y, w, h = g["x"] * colw, 44 + g["y"] * CELL_H, g["w"] * colw - GAP, g["h"] * CELL_H - GAP
        bottom = max(bottom, int(y + h + GAP))
        if p["type"] == "row":
            boxes.append(f'<div class="row" style="left:{x:.0f}px;top:{y:.0f}px;width:{w:.0f}px">'
                         f'{_esc(p["title"])}</div>')
            continue
        iw, ih = int(w) - 12, int(h) - 30
        d = data.get(p["id"], PanelData())
        body = (_stat(p, d, iw, ih) if p["type"] == "stat" else _heatmap(d, iw, ih, start, end)
                if p["type"] == "heatmap" else _line_chart(p, d, iw, ih, start, end))
        boxes.append(f'<div class="panel" style="left:{x:.0f}px;top:{y:.0f}px;width:{w:.0f}px;height:{h:.0f}px">'
                     f'<div class="title">{_esc(p["title"])}</div>{body}</div>')
    css = ("body{margin:0;background:#111217;font-family:Inter,Helvetica,Arial,sans-serif;color:#ccccdc}"
           ".panel{position:absolute;background:#181b1f;border:1px solid #2a2d33;border-radius:3px;padding:4px 6px;"
           "box-sizing:border-box}.title{font-size:13px;font-weight:500;height:22px}"
           ".row{position:absolute;font-size:15px;font-weight:500;border-bottom:1px solid #2a2d33;height:22px}"
           "h1{font-size:18px;margin:0;padding:10px 8px;font-weight:500}h1 span{color:#888;font-size:13px}")
    page = (f"<!doctype html><html><head><meta charset='utf-8'><style>{css}</style></head><body>"
            f"<h1>{_esc(model.get('title', ''))} <span>{_esc(subtitle)}</span></h1>{''.join(boxes)}</body></html>")
    return page, bottom


def screenshot(page: str, height: int, png: Path, chromium: str | None = None, timeout_s: float = 60) -> Path:
    """Render `page` with headless chromium into `png` (PAGE_WIDTH wide)."""
    exe = chromium or shutil.which("chromium") or shutil.which("chromium-browser") or "/usr/bin/chromium"
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "page.html"
        src.write_text(page, encoding="utf-8")
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp}/p",
               f"--screenshot={png}", f"--window-size={PAGE_WIDTH},{height}", src.as_uri()]
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout_s)
    return png


def panel_titles(model: Mapping[str, Any]) -> Sequence[str]:
    return [p.get("title", "") for p in panels(model)]
