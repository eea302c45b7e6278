"""``slurm-gpu summary --html FILE``: one self-contained page (jinja2 template in
``slurm_hooks/data/summary.html.j2``, autoescaped: every job name, user and reason is text).

Charts are inline SVG whose geometry is computed here (pure: report in, rectangles out), so
the page needs no script and fetches nothing; it prints on paper as it shows on screen.
"""
from __future__ import annotations

from importlib import resources
from typing import Any, Dict, List, Sequence

from healthcheck.records.classes import HARDWARE_CLASSES

TEMPLATE = "summary.html.j2"
# Hardware causes in warm colours, Slurm's own endings in cool or neutral ones.
CAUSE_COLORS = {
    "COMPLETED": "#8fbf8f", "FAILED": "#6b8fc7", "CANCELLED": "#b0b0b0", "TIMEOUT": "#c9a0dc",
    "PREEMPTED": "#7fc6c6", "REQUEUED": "#a3b8d9", "NODE_FAIL": "#5a5a8a", "OUT_OF_MEMORY": "#9a7fb0",
    "GPU_LOST": "#d62728", "GPU_XID": "#ff7f0e", "GPU_ECC": "#e377c2", "NVLINK": "#bc4b00",
    "INFINIBAND": "#f2b701",
}
OTHER_COLORS = ("#7f7f7f", "#9e9e6b", "#6b9e9e", "#9e6b9e", "#c7c76b")
CHART_W, CHART_H = 760, 240
MARGIN_L, MARGIN_B, MARGIN_T = 56, 36, 12
MAX_BARS = 120
MAX_BAR_W = 48


def hours(value: float) -> str:
    """GPU-hours for people: small numbers keep their digits."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3f}"


def cause_color(cause: str, others: Dict[str, str]) -> str:
    if cause in CAUSE_COLORS:
        return CAUSE_COLORS[cause]
    if cause not in others:
        others[cause] = OTHER_COLORS[len(others) % len(OTHER_COLORS)]
    return others[cause]


def _series_order(causes: Sequence[str]) -> List[str]:
    """Slurm's endings at the bottom of a stack, hardware causes on top where the eye goes."""
    return sorted(causes, key=lambda c: (c in HARDWARE_CLASSES, c))


def timeline_chart(report: Dict[str, Any], colors: Dict[str, str]) -> Dict[str, Any]:
    rows = report["over_time"]["rows"]
    if len(rows) > MAX_BARS:                        # keep the last MAX_BARS buckets readable
        rows = rows[-MAX_BARS:]
    causes = _series_order({c for row in rows for c in row["jobs"]})
    totals = [sum(row["jobs"].values()) for row in rows]
    peak = max(totals) if totals else 0
    plot_w, plot_h = CHART_W - MARGIN_L - 8, CHART_H - MARGIN_B - MARGIN_T
    step = plot_w / max(len(rows), 1)
    bars = []
    for i, row in enumerate(rows):
        y = MARGIN_T + plot_h
        for cause in causes:
            jobs = row["jobs"].get(cause, 0)
            if not jobs or not peak:
                continue
            height = plot_h * jobs / peak
            y -= height
            width = min(max(step * 0.8, 1), MAX_BAR_W)
            bars.append({"x": round(MARGIN_L + i * step + (step - width) / 2, 2), "y": round(y, 2),
                         "w": round(width, 2), "h": round(max(height, 0.5), 2),
                         "color": cause_color(cause, colors),
                         "title": f"{row['t']}: {jobs} {cause}"})
    labels = []
    if rows:
        last = len(rows) - 1
        for i in sorted({0, last // 2, last}):
            anchor = "start" if i == 0 else ("end" if i == last else "middle")
            x = MARGIN_L + i * step + (0 if i == 0 else step if i == last else step / 2)
            labels.append({"x": round(x, 2), "text": rows[i]["t"], "anchor": anchor})
    return {"w": CHART_W, "h": CHART_H, "bars": bars, "labels": labels, "peak": peak,
            "axis_x": MARGIN_L, "axis_y": MARGIN_T + plot_h, "top": MARGIN_T,
            "bucket": report["over_time"]["bucket"],
            "legend": [{"cause": c, "color": cause_color(c, colors)} for c in causes]}


def hbar_chart(items: List[Dict[str, Any]], value_key: str, label_key: str, unit: str,
               colors: Dict[str, str], color_key: str = "") -> Dict[str, Any]:
    row_h, label_w = 24, 150
    peak = max((item[value_key] for item in items), default=0) or 1
    plot_w = CHART_W - label_w - 90
    bars = []
    for i, item in enumerate(items):
        value = item[value_key]
        bars.append({"y": 6 + i * row_h, "x": label_w, "w": round(max(plot_w * value / peak, 1), 2),
                     "h": row_h - 8, "label": str(item[label_key]),
                     "value": (hours(value) + " " + unit) if unit else f"{value:g}",
                     "color": item.get("color") or cause_color(str(item.get(color_key, "")), colors)})
    return {"w": CHART_W, "h": 12 + len(items) * row_h, "bars": bars, "label_w": label_w}


def share_chart(report: Dict[str, Any]) -> Dict[str, Any]:
    hw = report["hardware"]
    rows = []
    for i, (label, share) in enumerate((("jobs", hw["share_jobs"]), ("GPU-hours", hw["share_gpu_hours"]))):
        rows.append({"y": 8 + i * 34, "label": label, "w": round(560 * share, 2), "pct": f"{share * 100:.1f}%"})
    return {"w": CHART_W, "h": 80, "rows": rows, "x": 110, "full": 560}


def context(report: Dict[str, Any], generated: str, top_nodes: int = 30) -> Dict[str, Any]:
    colors: Dict[str, str] = {}
    lost = [{"cause": cause, "gpu_hours": row["gpu_hours"]} for cause, row in report["by_cause"].items()
            if cause != "COMPLETED" and row["gpu_hours"] > 0]
    lost.sort(key=lambda item: -item["gpu_hours"])
    nodes = [n for n in report["by_node"] if n["hardware_endings"] or n["drains"] or n["flagged"]][:top_nodes]
    node_items = [{"node": n["node"], "hardware_endings": n["hardware_endings"],
                   "color": "#d62728" if n["flagged"] else "#ff9f5a"} for n in nodes if n["hardware_endings"]]
    return {
        "r": report,
        "generated": generated,
        "timeline": timeline_chart(report, colors),
        "lost": hbar_chart(lost, "gpu_hours", "cause", "GPU-h", colors, color_key="cause"),
        "share": share_chart(report),
        "node_chart": hbar_chart(node_items[:15], "hardware_endings", "node", "", colors),
        "nodes": nodes,
        "colors": {cause: cause_color(cause, colors) for cause in report["by_cause"]},
    }


def render_html(report: Dict[str, Any], generated: str) -> str:
    import jinja2

    source = resources.files("slurm_hooks").joinpath(f"data/{TEMPLATE}").read_text("utf-8")
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters["hours"] = hours
    return env.from_string(source).render(**context(report, generated))
