"""Pure builders of the Plan page: a profiler.plan.PlanResult (plain Estimates) in; table rows,
figures, lines and Dash components out. No I/O, no planning, no callbacks (viewer/pages/plan.py
runs the planner and hands its result here).

What is shown, per layout: the top N of `PlanResult.ranked` (N <= TOP_MAX keeps the payload small)
plus the rule-of-thumb layout where it ranks lower or does not fit, highlighted everywhere
(table row, bars) so the reader sees where the teaching rule lands. Step breakdowns stack to
`step_s` (Estimate's contract); any part the breakdown leaves unattributed is drawn as such, never
dropped. Numbers that are not finite are shown as "—", never as a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go
from dash import dash_table, dcc, html

from profiler.plan_report import compact, exposed_comm_s
from viewer.figures import CATEGORY_COLORS, _empty

TOP_MAX = 20  # layouts drawn and tabled at most: a plan may rank thousands
GIB = 2**30
ROT = "rule of thumb"
ROT_OUTLINE = dict(color="#111827", width=3)  # the rule-of-thumb bar's outline
ROT_ROW_STYLE = {"backgroundColor": "#fef9c3", "fontWeight": "600"}

# Breakdown keys (costmodel's Estimate.breakdown_s; docs/whatif.md names each): colour and legend.
# Exposed communication is orange by dimension, as communication is in the rest of the viewer.
BREAKDOWN_STYLE = {
    "compute": ("compute", CATEGORY_COLORS["compute"]),
    "recompute": ("recomputation", "#9ECAE9"),
    "comm_exposed:tp": ("exposed tp comm", "#F58518"),
    "comm_exposed:cp": ("exposed cp comm", "#FDAE6B"),
    "comm_exposed:dp": ("exposed dp comm", "#FFBF79"),
    "comm_exposed:ep": ("exposed ep comm", "#D94801"),
    "comm_exposed:pp": ("exposed pp comm", "#A63603"),
    "bubble": ("pipeline bubble", "#BDBDBD"),
    "optimizer": ("optimizer step", CATEGORY_COLORS["memory"]),
}
UNATTRIBUTED = "unattributed"  # step_s minus the breakdown's sum, where positive
OTHER_COLORS = ["#72B7B2", "#B279A2", "#9D755D", "#EECA3B", "#FF9DA6", "#54A24B", "#E45756"]
MEMORY_PARTS = [("params", "parameters", "#4C78A8"), ("grads", "gradients", "#F58518"),
                ("optimizer", "optimizer state", "#54A24B"), ("activations", "activations", "#B279A2")]
TABLE_COLUMNS = [  # (id, header, numeric)
    ("rank", "rank", True), ("layout", "layout", False), ("step_s", "step (s)", True), ("mfu_pct", "MFU %", True),
    ("memory_gib", "memory GiB", True), ("hbm_pct", "% of usable HBM", True), ("exposed_comm_s", "exposed comm (s)", True),
    ("bubble_pct", "bubble %", True), ("note", "note", False),
]


@dataclass(frozen=True)
class PlanEntry:
    """One layout as the page shows it: its rank among the fitting layouts (None: it does not
    fit), its Estimate, and whether it is the rule of thumb's."""

    rank: int | None
    estimate: object  # profiler.layout.Estimate (duck-typed: the builders read its fields only)
    rule_of_thumb: bool = False

    @property
    def label(self) -> str:
        """The bar's x label and the table's key: `#3`, `#3 rule of thumb`, `rule of thumb (does not fit)`."""
        if self.rank is None:
            return f"{ROT} (does not fit)" if self.rule_of_thumb else "(does not fit)"
        return f"#{self.rank}" + (f" {ROT}" if self.rule_of_thumb else "")


def plan_entries(result, top: int = 10) -> list[PlanEntry]:
    """The top `top` (capped at TOP_MAX) ranked layouts, then the rule of thumb's if it ranks
    lower or does not fit (so it is always on the page when the planner gave one)."""
    top = max(1, min(int(top), TOP_MAX))
    rot, rot_rank = result.rule_of_thumb, result.rule_of_thumb_rank
    # The rule's row is the ranked layout at its rank when that is the same layout; otherwise
    # (below the top, not fitting, or ranked where another layout sits) it is added at the end.
    entries = [PlanEntry(i, e, rule_of_thumb=rot is not None and i == rot_rank and e.layout == rot.layout)
               for i, e in enumerate(result.ranked[:top], start=1)]
    if rot is not None and not any(e.rule_of_thumb for e in entries):
        fits = rot_rank is not None and getattr(rot, "fits", True)
        entries.append(PlanEntry(rot_rank if fits else None, rot, rule_of_thumb=True))
    return entries


# ---------------------------------------------------------------------------------------------
# Numbers


def _finite(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def sig3(v: float | None, unit: str = "") -> str:
    """3 significant figures, no e-notation for the magnitudes shown; '—' for none or not finite."""
    v = _finite(v)
    if v is None:
        return "—"
    if v == 0:
        return "0" + unit
    digits = 2 - math.floor(math.log10(abs(v)))
    return f"{round(v, digits):.{max(digits, 0)}f}{unit}"


def _round3(v) -> float | None:
    v = _finite(v)
    if v is None or v == 0:
        return v
    return round(v, 2 - math.floor(math.log10(abs(v))))


def breakdown_label(key: str) -> str:
    if key in BREAKDOWN_STYLE:
        return BREAKDOWN_STYLE[key][0]
    if key.startswith("comm_exposed:"):
        return f"exposed {key.split(':', 1)[1]} comm"
    return key.replace("_", " ")


def breakdown_keys(entries: list[PlanEntry]) -> list[str]:
    """Every breakdown key of these layouts, in a fixed order: the known ones as BREAKDOWN_STYLE
    lists them, then others as first seen (so a key keeps its colour from plan to plan)."""
    seen = list(dict.fromkeys(k for e in entries for k in e.estimate.breakdown_s))
    return [k for k in BREAKDOWN_STYLE if k in seen] + [k for k in seen if k not in BREAKDOWN_STYLE]


def breakdown_color(key: str, others: list[str]) -> str:
    if key in BREAKDOWN_STYLE:
        return BREAKDOWN_STYLE[key][1]
    if key.startswith("comm_exposed:"):
        return "#E6550D"
    return OTHER_COLORS[others.index(key) % len(OTHER_COLORS)] if key in others else "#9CA3AF"


# ---------------------------------------------------------------------------------------------
# Table


def plan_table_rows(entries: list[PlanEntry], flags=None) -> list[dict]:
    """One row per entry (TABLE_COLUMNS): rank, layout (plan_report.compact, as the CLI's table),
    step, MFU, memory per GPU and its share of the usable HBM (what `fits` compares with; none
    where the estimate does not carry it), exposed communication (plan_report.exposed_comm_s), bubble as a share of the step (as the CLI); `note` says
    rule of thumb / does not fit, and `flags(estimate)`'s words (tight, unvalidated features)."""
    rows = []
    for e in entries:
        est = e.estimate
        total = est.memory_bytes.get("total")
        usable = _finite(getattr(est, "usable_hbm_bytes", None))
        notes = ([ROT] if e.rule_of_thumb else []) + ([] if est.fits else ["does not fit HBM"])
        notes += list(flags(est)) if flags is not None else []
        step = _finite(est.step_s)
        rows.append({
            "id": e.label, "rank": e.rank, "layout": compact(est.layout), "step_s": _round3(est.step_s),
            "mfu_pct": _round3(est.mfu_pct),
            "memory_gib": _round3(total / GIB) if _finite(total) is not None else None,
            "hbm_pct": _round3(100 * total / usable) if _finite(total) is not None and usable else None,
            "exposed_comm_s": _round3(exposed_comm_s(est)), "bubble_pct": _round3(100 * est.breakdown_s.get("bubble", 0.0) / step) if step else None,
            "note": ", ".join(notes), "rule_of_thumb": e.rule_of_thumb,
        })
    return rows


def build_plan_table(entries: list[PlanEntry], *, table_id: str, font: str, flags=None):
    """The ranked layouts as a DataTable, the rule of thumb's row highlighted; wide tables scroll
    inside their card and the note wraps (it overflowed the page at 1400 px)."""
    rows = plan_table_rows(entries, flags)
    return dash_table.DataTable(
        id=table_id, data=rows,
        columns=[{"name": name, "id": c, "type": "numeric" if num else "text"} for c, name, num in TABLE_COLUMNS],
        sort_action="native",
        style_table={"overflowX": "auto", "maxWidth": "100%"},
        style_cell_conditional=[{"if": {"column_id": "note"}, "whiteSpace": "normal", "minWidth": "12rem", "maxWidth": "24rem"}],
        style_cell={"fontFamily": font, "fontSize": "0.85rem", "padding": "3px 8px", "textAlign": "left"},
        style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6"},
        style_data_conditional=[
            {"if": {"filter_query": '{note} contains "rule of thumb"'}, **ROT_ROW_STYLE},
            {"if": {"filter_query": "{hbm_pct} > 100", "column_id": "hbm_pct"}, "color": "#b91c1c"},
        ],
    )


# ---------------------------------------------------------------------------------------------
# Figures


def _outlines(entries: list[PlanEntry]) -> dict:
    return dict(color=ROT_OUTLINE["color"], width=[ROT_OUTLINE["width"] if e.rule_of_thumb else 0 for e in entries])


def build_plan_breakdown_figure(entries: list[PlanEntry]) -> go.Figure:
    """One stacked bar per layout, one colour per breakdown key (seconds of a step): the parts
    stack to the layout's step_s; the rule of thumb's bar is outlined and so labelled."""
    entries = [e for e in entries if _finite(e.estimate.step_s) is not None]
    if not entries:
        return _empty("no layout to draw")
    # A key that is zero in every layout shown adds nothing to a stack but a legend entry.
    keys = [k for k in breakdown_keys(entries) if any(_finite(e.estimate.breakdown_s.get(k)) for e in entries)]
    others = [k for k in keys if k not in BREAKDOWN_STYLE]
    x = [e.label for e in entries]
    hover = [compact(e.estimate.layout) for e in entries]
    fig = go.Figure()
    for key in keys:
        y = [_finite(e.estimate.breakdown_s.get(key, 0.0)) or 0.0 for e in entries]
        name = breakdown_label(key)
        fig.add_trace(go.Bar(x=x, y=y, name=name, marker=dict(color=breakdown_color(key, others), line=_outlines(entries)),
                             customdata=hover, hovertemplate="%{customdata}<br>" + name + ": %{y:.4g} s<extra>%{x}</extra>"))
    rest = [e.estimate.step_s - sum(_finite(v) or 0.0 for v in e.estimate.breakdown_s.values()) for e in entries]
    if any(r > 1e-9 * max(e.estimate.step_s, 1e-12) for r, e in zip(rest, entries)):
        fig.add_trace(go.Bar(x=x, y=[max(r, 0.0) for r in rest], name=UNATTRIBUTED, marker=dict(color="#E5E7EB", line=_outlines(entries)),
                             customdata=hover, hovertemplate="%{customdata}<br>not in the breakdown: %{y:.4g} s<extra>%{x}</extra>"))
    fig.add_trace(go.Scatter(x=x, y=[e.estimate.step_s for e in entries], mode="text", name="step",
                             text=[sig3(e.estimate.step_s, " s") for e in entries], textposition="top center",
                             showlegend=False, hoverinfo="skip"))
    top_s = max(max(e.estimate.step_s, sum(_finite(v) or 0.0 for v in e.estimate.breakdown_s.values())) for e in entries)
    fig.update_layout(barmode="stack", template="plotly_white", height=380, yaxis=dict(title="seconds per step", range=[0, 1.15 * top_s]),
                      margin=dict(l=60, r=20, t=30, b=60), legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom", traceorder="normal"))
    return fig


def memory_parts_gib(estimate) -> dict[str, float]:
    """Memory per GPU in GiB by MEMORY_PARTS, plus `other` for what `total` holds beyond them."""
    mem = estimate.memory_bytes
    parts = {k: (_finite(mem.get(k)) or 0.0) / GIB for k, _, _ in MEMORY_PARTS}
    total = _finite(mem.get("total"))
    if total is not None and total / GIB - sum(parts.values()) > 1e-9 * max(total / GIB, 1.0):
        parts["other"] = total / GIB - sum(parts.values())
    return parts


def build_plan_memory_figure(entries: list[PlanEntry], hbm_bytes: int | None = None) -> go.Figure:
    """Memory per GPU of each layout, stacked parameters / gradients / optimizer state /
    activations (GiB), with the cluster's HBM as a dashed line; the rule of thumb's bar outlined."""
    if not entries:
        return _empty("no layout to draw")
    hbm = _finite(hbm_bytes if hbm_bytes is not None else entries[0].estimate.hbm_bytes)
    parts = [memory_parts_gib(e.estimate) for e in entries]
    x = [e.label for e in entries]
    hover = [compact(e.estimate.layout) for e in entries]
    fig = go.Figure()
    for key, name, color in MEMORY_PARTS + [("other", "other", "#9CA3AF")]:
        if key == "other" and not any("other" in p for p in parts):
            continue
        fig.add_trace(go.Bar(x=x, y=[round(p.get(key, 0.0), 4) for p in parts], name=name,
                             marker=dict(color=color, line=_outlines(entries)), customdata=hover,
                             hovertemplate="%{customdata}<br>" + name + ": %{y:.3g} GiB<extra>%{x}</extra>"))
    if hbm is not None:
        fig.add_hline(y=hbm / GIB, line=dict(color="#b91c1c", dash="dash", width=2),
                      annotation_text=f"HBM {sig3(hbm / GIB)} GiB", annotation_position="top left")
    # `fits` compares with the HBM less the cluster's reserve (CUDA context, NCCL buffers,
    # fragmentation): drawn too where the estimate carries it.
    usable = _finite(getattr(entries[0].estimate, "usable_hbm_bytes", None))
    if usable is not None and hbm is not None and usable < hbm:
        fig.add_hline(y=usable / GIB, line=dict(color="#b91c1c", dash="dot", width=1),
                      annotation_text=f"usable {sig3(usable / GIB)} GiB", annotation_position="bottom left")
    fig.update_layout(barmode="stack", template="plotly_white", height=380, yaxis_title="GiB per GPU",
                      margin=dict(l=60, r=20, t=30, b=60), legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom", traceorder="normal"))
    return fig


# ---------------------------------------------------------------------------------------------
# Lines: what was refused, what is assumed (why the best win and where the rule of thumb ranks are
# profiler.plan_report's lines, the CLI's, handed in by the page)


def refused_lines(result) -> list[str]:
    """How many layouts were searched and ranked, then each reason others were dropped with its
    count (profiler.plan's keys name their unit: splits or layouts), then the pruning check."""
    splits, seconds = getattr(result, "splits", 0), _finite(getattr(result, "seconds", None))
    of = f" of {splits} dividing dp·tp·pp splits" if splits else ""
    took = f" in {sig3(seconds)} s" if seconds else ""
    lines = [f"{result.considered:,} layouts searched{of}{took}; {len(result.ranked):,} fit and are ranked."]
    lines += [f"{n:,} {why}" for why, n in sorted(result.refused.items(), key=lambda kv: -kv[1]) if n]
    check = getattr(result, "pruning_check", "")
    return lines + ([f"Pruning check: {check}."] if check else [])


PURE_PLAN_LINE = ("A pure plan: no run or trace informs it, so the compute efficiency (the share of peak FLOP/s the "
                  "model's matmuls reach) is assumed, not measured (docs/whatif.md, 'Compute').")


def assumption_lines(result) -> list[str]:
    """The planner's assumptions (led by the pure-plan line where the planner does not say that
    the compute efficiency is assumed), those of the best layout (deduplicated), and the one that
    dominates its uncertainty."""
    best = result.ranked[0] if result.ranked else None
    lines = [*result.assumptions, *(best.assumptions if best else [])]
    if any("compute efficiency is assumed" in a for a in result.assumptions):
        # the planner said it; the cost model's shorter "compute efficiency assumed (...)" repeats it
        lines = [a for a in lines if not a.startswith("compute efficiency assumed")]
    if not any("compute efficiency is assumed" in a for a in lines):
        lines.insert(0, PURE_PLAN_LINE)
    if best is not None and best.dominant:
        lines.append(f"Dominant uncertainty of #1: {best.dominant}")
    return list(dict.fromkeys(lines))


# ---------------------------------------------------------------------------------------------
# The page's result area


def _card(title: str, *children):
    return html.Div(className="card", children=[html.H3(title), *children])


def _ul(lines: list[str], cls: str = ""):
    return html.Ul([html.Li(line) for line in lines], className=cls)


def plan_children(result, *, top: int, heading, table_id: str, font: str, why: list[str], rule_text: str,
                  graph_config: dict | None = None, cautions: list[str] | None = None, flags=None):
    """The result area for a PlanResult: a summary line, the ranked table, the breakdown and
    memory figures, why the best win (`why`) and where the rule of thumb ranks (`rule_text`): the
    CLI's lines (profiler.plan_report.why_lines, rule_line), then what was refused and what is
    assumed. No fitting layout: says so with the refusals, never a blank area."""
    summary = html.P(heading, className="hint")
    if not result.ranked:
        need = _finite(getattr(result, "min_memory_bytes", None))
        head = (f"No layout fits: the smallest memory need of any layout is {sig3(need / GIB)} GiB per GPU (more GPUs, a "
                "smaller model or a smaller global batch)" if need is not None else "No layout divides this model and batch")
        return [summary, html.Div(head + ": " + "; ".join(refused_lines(result)[1:] or ["none was enumerated"]), className="error"),
                _card("Rule of thumb", html.P(rule_text)),
                _card("Assumptions", _ul(assumption_lines(result)))]
    entries = plan_entries(result, top)
    config = graph_config or {"displaylogo": False}
    return [
        summary,
        _card("Ranked layouts", html.P(f"The fastest {min(top, len(result.ranked))} of {len(result.ranked)} fitting layouts; "
                                       "the rule of thumb's row is highlighted.", className="hint"),
              build_plan_table(entries, table_id=table_id, font=font, flags=flags),
              *([_ul(cautions, "cautions")] if cautions else [])),
        _card("Why they win", _ul(why), html.P(rule_text, className="rule-of-thumb")),
        html.Div(className="row", children=[
            _card("Where the step goes", html.P("Predicted seconds per step by part, one bar per layout; the outlined bar "
                                                "is the rule of thumb's.", className="hint"),
                  dcc.Graph(figure=build_plan_breakdown_figure(entries), config=config)),
            _card("Memory per GPU", html.P("Parameters, gradients, optimizer state and activations per GPU against the "
                                           "cluster's HBM (dashed).", className="hint"),
                  dcc.Graph(figure=build_plan_memory_figure(entries), config=config)),
        ]),
        _card("Refused", _ul(refused_lines(result))),
        _card("Assumptions", _ul(assumption_lines(result))),
    ]
