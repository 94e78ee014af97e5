"""report.html: one self-contained page about a supervised run.

Loss over absolute optimizer steps and VRAM over time for every attempt, a marker
where each OOM struck, and what changed between attempts. Inline SVG and CSS only:
no script, no network, so it opens anywhere, including from an archive years later.
Pure: `render(summary, attempts) -> str`.
"""

from __future__ import annotations

import html
import math
from typing import Any, Iterable, Sequence

from kohya_tuner.run.journal import AttemptRecord
from kohya_tuner.run.policy import phase_words
from kohya_tuner.config_io import show_value

# Colour-blind-safe palette (Okabe–Ito), cycled per attempt.
_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"]
_W, _H = 860, 260
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 56, 16, 14, 36


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _colour(i: int) -> str:
    return _COLOURS[i % len(_COLOURS)]


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / n
    mag = 10 ** _floor_log10(raw)
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = step * _ceil_div(lo, step)
    ticks = []
    v = start
    while v <= hi + 1e-9 and len(ticks) < 20:
        ticks.append(round(v, 10))
        v += step
    return ticks


def _floor_log10(x: float) -> int:
    import math

    return int(math.floor(math.log10(x))) if x > 0 else 0


def _ceil_div(a: float, b: float) -> int:
    import math

    return int(math.ceil(a / b - 1e-9))


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 0.01 or v == 0 else f"{v:.1e}"


class _Chart:
    """A minimal line chart in SVG user units."""

    def __init__(self, x_range: tuple[float, float], y_range: tuple[float, float], x_label: str, y_label: str):
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        if self.x1 <= self.x0:
            self.x1 = self.x0 + 1
        if self.y1 <= self.y0:
            self.y1 = self.y0 + 1
        self.parts: list[str] = []
        self.x_label, self.y_label = x_label, y_label

    def sx(self, x: float) -> float:
        return _PAD_L + (x - self.x0) / (self.x1 - self.x0) * (_W - _PAD_L - _PAD_R)

    def sy(self, y: float) -> float:
        return _H - _PAD_B - (y - self.y0) / (self.y1 - self.y0) * (_H - _PAD_T - _PAD_B)

    def axes(self) -> None:
        p = self.parts
        p.append(f'<rect x="{_PAD_L}" y="{_PAD_T}" width="{_W - _PAD_L - _PAD_R}" height="{_H - _PAD_T - _PAD_B}" '
                 'class="frame"/>')
        for t in _nice_ticks(self.x0, self.x1):
            x = self.sx(t)
            p.append(f'<line x1="{x:.1f}" y1="{_PAD_T}" x2="{x:.1f}" y2="{_H - _PAD_B}" class="grid"/>')
            p.append(f'<text x="{x:.1f}" y="{_H - _PAD_B + 14}" class="tick" text-anchor="middle">{_fmt(t)}</text>')
        for t in _nice_ticks(self.y0, self.y1, 4):
            y = self.sy(t)
            p.append(f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_W - _PAD_R}" y2="{y:.1f}" class="grid"/>')
            p.append(f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{_fmt(t)}</text>')
        p.append(f'<text x="{(_W + _PAD_L) / 2:.0f}" y="{_H - 4}" class="label" text-anchor="middle">'
                 f'{_e(self.x_label)}</text>')
        p.append(f'<text x="12" y="{(_H - _PAD_B + _PAD_T) / 2:.0f}" class="label" text-anchor="middle" '
                 f'transform="rotate(-90 12 {(_H - _PAD_B + _PAD_T) / 2:.0f})">{_e(self.y_label)}</text>')

    def line(self, points: Sequence[tuple[float, float]], colour: str, title: str) -> None:
        if not points:
            return
        if len(points) == 1:
            x, y = points[0]
            self.parts.append(f'<circle cx="{self.sx(x):.1f}" cy="{self.sy(y):.1f}" r="2.5" fill="{colour}">'
                              f'<title>{_e(title)}</title></circle>')
            return
        coords = " ".join(f"{self.sx(x):.1f},{self.sy(y):.1f}" for x, y in points)
        self.parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.6">'
                          f'<title>{_e(title)}</title></polyline>')

    def hline(self, y: float, label: str, cls: str = "limit") -> None:
        if not (self.y0 <= y <= self.y1):
            return
        sy = self.sy(y)
        self.parts.append(f'<line x1="{_PAD_L}" y1="{sy:.1f}" x2="{_W - _PAD_R}" y2="{sy:.1f}" class="{cls}"/>')
        self.parts.append(f'<text x="{_W - _PAD_R - 4}" y="{sy - 4:.1f}" class="tick" text-anchor="end">'
                          f'{_e(label)}</text>')

    def marker(self, x: float, label: str, y: float | None = None) -> None:
        sx = self.sx(x)
        sy = self.sy(y) if y is not None else _PAD_T + 10
        self.parts.append(f'<g class="oom"><line x1="{sx:.1f}" y1="{_PAD_T}" x2="{sx:.1f}" y2="{_H - _PAD_B}"/>'
                          f'<path d="M{sx - 5:.1f},{sy - 5:.1f} L{sx + 5:.1f},{sy + 5:.1f} M{sx - 5:.1f},'
                          f'{sy + 5:.1f} L{sx + 5:.1f},{sy - 5:.1f}"/><title>{_e(label)}</title></g>')

    def svg(self, aria: str) -> str:
        return (f'<svg viewBox="0 0 {_W} {_H}" width="100%" role="img" aria-label="{_e(aria)}" '
                f'xmlns="http://www.w3.org/2000/svg">' + "".join(self.parts) + "</svg>")


def _oom_label(a: AttemptRecord) -> str:
    where = phase_words(a.phase)
    figures = ""
    if a.oom:
        tried = a.oom.get("tried_gib")
        free = a.oom.get("free_gib")
        if tried is not None:
            figures = f": tried {tried:.2f} GiB"
            if free is not None:
                figures += f" with {free:.2f} GiB free"
    return f"attempt {a.attempt}: out of memory{where} at step {a.end_step}{figures}"


def _finite_points(rows: Iterable[Sequence[Any]], ix: int, iy: int) -> tuple[list[tuple[float, float]], list[float]]:
    """The plottable points, and the x of each point whose y is NaN or infinite (the loss a
    diverged run logs: it is marked on the chart, never scaled into an axis)."""
    points, bad = [], []
    for row in rows:
        try:
            # A non-finite loss is stored as null (strict JSON): still a point that diverged.
            x, y = float(row[ix]), (math.nan if row[iy] is None else float(row[iy]))
        except (IndexError, TypeError, ValueError):
            continue
        if not math.isfinite(x):
            continue
        (points.append((x, y)) if math.isfinite(y) else bad.append(x))
    return points, bad


def loss_chart(attempts: Sequence[AttemptRecord], total_steps: int | None) -> str | None:
    found = [(a, *_finite_points(a.loss, 1, 2)) for a in attempts]
    series = [(a, pts) for a, pts, _ in found]
    diverged = [(a, x) for a, _, bad in found for x in bad[:1]]
    if not any(points for _, points in series) and not diverged and not any(a.outcome == "oom" for a in attempts):
        return None
    ys = [y for _, pts in series for _, y in pts]
    xs = [x for _, pts in series for x, _ in pts] + [a.end_step for a in attempts] + [x for _, x in diverged]
    y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
    margin = (y1 - y0) * 0.08 or 0.05
    chart = _Chart((0, max([total_steps or 0] + xs + [1])), (max(0.0, y0 - margin), y1 + margin),
                   "optimizer step (absolute)", "loss")
    chart.axes()
    for i, (a, pts) in enumerate(series):
        chart.line(pts, _colour(i), f"attempt {a.attempt}")
        if a.outcome == "oom":
            chart.marker(a.end_step, _oom_label(a))
    for a, x in diverged:
        chart.marker(x, f"attempt {a.attempt}: the loss is not a number (NaN or infinite) from step {x:g}")
    return chart.svg("loss over optimizer steps, one line per attempt")


def vram_chart(attempts: Sequence[AttemptRecord], capacity_gib: float | None) -> str | None:
    """VRAM over wall-clock time with the attempts laid end to end."""
    if not any(a.vram for a in attempts):
        return None
    offset = 0.0
    series = []
    bounds = []
    for a in attempts:
        pts = [(offset + t, v) for t, v in _finite_points(a.vram, 0, 1)[0]]
        series.append((a, pts))
        end = offset + max(a.duration_s, pts[-1][0] - offset if pts else 0.0)
        bounds.append((offset, end))
        offset = end
    ys = [v for _, pts in series for _, v in pts]
    top = max(ys + ([capacity_gib] if capacity_gib else []) or [1.0])
    chart = _Chart((0, max(offset, 1.0)), (0, top * 1.08), "seconds since the first launch", "GiB in use")
    chart.axes()
    if capacity_gib:
        chart.hline(capacity_gib, f"card {capacity_gib:.1f} GiB")
    for i, ((a, pts), (start, end)) in enumerate(zip(series, bounds)):
        chart.line(pts, _colour(i), f"attempt {a.attempt}, peak {a.peak_vram_gib or 0:.2f} GiB")
        if a.outcome == "oom":
            chart.marker(end, _oom_label(a))
    return chart.svg("GPU memory over time, attempts one after another")


def _changes_html(a: AttemptRecord) -> str:
    if not a.changes:
        return "—"
    items = "".join(f"<li><code>{_e(c.key)}</code>: {_e(show_value(c.old))} → <b>{_e(show_value(c.new))}</b></li>"
                    for c in a.changes)
    return f"<ul>{items}</ul>"


def _duration(seconds: float | None) -> str:
    s = int(seconds or 0)
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {sec:02d}s" if m else f"{sec}s")


def _legend(attempts: Iterable[AttemptRecord]) -> str:
    return "".join(f'<span class="key"><i style="background:{_colour(i)}"></i>attempt {_e(a.attempt)}</span>'
                   for i, a in enumerate(attempts))


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:920px;color:#222;padding:0 12px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px}
.status{display:inline-block;padding:2px 8px;border-radius:4px;color:#fff;font-weight:600}
.success{background:#2e7d32}.failed{background:#c62828}.interrupted{background:#ef6c00}.running{background:#1565c0}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:12px 0}dt{color:#666}dd{margin:0}
table{border-collapse:collapse;width:100%;font-size:13px}th,td{border-bottom:1px solid #ddd;padding:6px;text-align:left;vertical-align:top}
th{background:#f5f5f5}ul{margin:0;padding-left:16px}code{font-size:12px}
.frame{fill:none;stroke:#999}.grid{stroke:#eee}.tick{font-size:11px;fill:#555}.label{font-size:12px;fill:#333}
.limit{stroke:#c62828;stroke-dasharray:5 4}.oom line{stroke:#c62828;stroke-dasharray:2 3}.oom path{stroke:#c62828;stroke-width:2.2}
.key{margin-right:14px;font-size:12px}.key i{display:inline-block;width:14px;height:3px;margin-right:4px;vertical-align:middle}
.muted{color:#777}
"""


def _steps_line(summary: dict[str, Any], total: int | None) -> str:
    done = summary.get("steps_done", 0)
    redone = summary.get("steps_redone", summary.get("steps_lost", 0)) or 0
    reached = summary.get("reached_step", done)
    head = f"{reached} of {total} planned" if total else f"{reached}"
    return f"{head}; {done} trained, {redone} of them redone after a failure"


def render(summary: dict[str, Any], attempts: Sequence[AttemptRecord], *, title: str = "kohya-tuner run",
           capacity_gib: float | None = None) -> str:
    status = str(summary.get("status") or "running")
    total = summary.get("total_steps")
    rows = []
    for a in attempts:
        outcome = a.outcome + (f" ({a.phase})" if a.phase and a.outcome in ("oom", "error") else "")
        start = (f"resumed {_e(a.resume_from)}" if a.resume_from
                 else f"from the LoRA weights of step {_e(a.start_step)}" if a.start_step else "from step 0")
        rows.append(
            "<tr>"
            f"<td>{_e(a.attempt)}{' (probe)' if a.probe else ''}</td>"
            f"<td>{_e(a.reason)}{'<br><span class=muted>' + _e(a.note) + '</span>' if a.note else ''}</td>"
            f"<td>{_changes_html(a)}</td>"
            f"<td>{a.start_step} → {a.end_step}{' / ' + str(a.total_steps) if a.total_steps else ''}"
            f"<br><span class=muted>{start}</span></td>"
            f"<td>{_e(outcome)}{'<br>exit ' + _e(a.exit_status) if a.exit_status not in (None, 0) else ''}</td>"
            f"<td>{'' if a.peak_vram_gib is None else f'{a.peak_vram_gib:.2f} GiB'}</td>"
            f"<td>{_duration(a.duration_s)}</td>"
            "</tr>"
        )
    loss_svg = loss_chart(attempts, total)
    vram_svg = vram_chart(attempts, capacity_gib or (summary.get("gpu") or {}).get("total_gib"))
    gpu = summary.get("gpu") or {}
    facts = [
        ("LoRA", summary.get("lora") or "—"),
        ("why it stopped", summary.get("reason")),
        ("optimizer steps", _steps_line(summary, total)),
        ("attempts", f"{summary.get('attempts', len(attempts))} ({summary.get('failed_attempts', 0)} failed)"),
        ("time lost to failures", _duration(summary.get("time_lost_s"))),
        ("peak VRAM", f"{summary['peak_vram_gib']:.2f} GiB" if summary.get("peak_vram_gib") is not None
         else "not measured (no NVML)"),
        ("GPU", gpu.get("name") and f"{gpu.get('name')} ({gpu.get('total_gib', 0):.1f} GiB)"),
    ]
    if summary.get("continue_command"):
        facts.append(("continue with", summary["continue_command"]))
    changed = summary.get("changed_settings") or {}
    changed_rows = "".join(f"<tr><td><code>{_e(k)}</code></td><td>{_e(show_value(v.get('plan')))}</td>"
                           f"<td><b>{_e(show_value(v.get('final')))}</b></td></tr>" for k, v in changed.items())
    out = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)} <span class='status {_e(status)}'>{_e(status)}</span></h1>",
        "<dl>" + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts if v not in (None, "")) + "</dl>",
    ]
    if loss_svg:
        out += ["<h2>Loss</h2>", f"<div>{_legend(attempts)}</div>", loss_svg]
    if vram_svg:
        out += ["<h2>GPU memory</h2>", f"<div>{_legend(attempts)}</div>", vram_svg]
    elif attempts:
        out.append("<p class=muted>No GPU memory samples: NVML was not available during this run.</p>")
    out += ["<h2>Attempts</h2>",
            "<table><tr><th>#</th><th>why</th><th>what changed</th><th>steps</th><th>outcome</th>"
            "<th>peak VRAM</th><th>time</th></tr>" + "".join(rows) + "</table>"]
    if changed_rows:
        out += ["<h2>Settings that differ from the plan</h2>",
                "<table><tr><th>setting</th><th>plan</th><th>final</th></tr>" + changed_rows + "</table>"]
    out.append(f"<p class=muted>Written by kohya-tuner {_e(summary.get('finished') or '')}.</p></body></html>")
    return "\n".join(out)
