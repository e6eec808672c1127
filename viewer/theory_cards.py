"""Pure builders of Compare's first two cards: frames in, Dash components out (no I/O, no profiler calls).

- *Findings*: profiler.findings' FINDING_COLUMNS rows as sentences, each with its evidence and
  the change to try, most important first (the first TOP_FINDINGS, the rest under "show all").
- *Theory vs measured*: profiler.theory's CHECK_COLUMNS rows, one line per (run, quantity) where
  every rank agrees, else the min–max across ranks and the rank that stands out; numbers in human
  units to 3 significant figures; plus a bar chart of the byte quantities, predicted vs measured.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl
from dash import dash_table, dcc, html
from plotly.subplots import make_subplots

from viewer.figures import _empty, run_color

TOP_FINDINGS = 8
FINDING_INPUT = {"run": pl.String, "rank": pl.Int32, "rule": pl.String, "score": pl.Float64, "text": pl.String,
                 "evidence": pl.String, "change": pl.String}  # profiler.findings.FINDING_COLUMNS
CHECK_INPUT = {"run": pl.String, "rank": pl.Int32, "quantity": pl.String, "unit": pl.String, "predicted": pl.Float64,
               "measured": pl.Float64, "ratio": pl.Float64, "verdict": pl.String, "note": pl.String}  # profiler.theory.CHECK_COLUMNS
THEORY_COLUMNS = ["run", "quantity", "ranks", "predicted", "measured", "ratio", "verdict", "note"]
VERDICT_STYLE = {  # verdict -> (text colour, background): agreement green, disagreement red, no verdict grey
    "match": ("#065f46", "#ecfdf5"),
    "above": ("#9a3412", "#fff7ed"),
    "below": ("#9a3412", "#fff7ed"),
    "mixed": ("#9a3412", "#fff7ed"),  # ranks disagree: the ranks column names the odd one
    "no theory": ("#6b7280", "#f9fafb"),
    "no measurement": ("#6b7280", "#f9fafb"),
}
_BYTE_UNITS = {"bytes", "byte", "b"}
_TIME_UNITS = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}  # -> ms


def conform(frame: pl.DataFrame | None, schema: dict) -> pl.DataFrame:
    """`frame` with exactly `schema`'s columns (missing ones null), in its types: what a builder reads."""
    if frame is None or frame.is_empty():
        return pl.DataFrame(schema=schema)
    return frame.with_columns([pl.lit(None, dtype=t).alias(c) for c, t in schema.items() if c not in frame.columns]) \
        .select([pl.col(c).cast(t) for c, t in schema.items()])


# ---------------------------------------------------------------------------------------------
# Human numbers


def sig3(v: float) -> str:
    """`v` to 3 significant figures, never in e-notation for the magnitudes we show (1230, 12.3, 0.0123)."""
    if v == 0:
        return "0"
    digits = 2 - math.floor(math.log10(abs(v)))
    return f"{round(v, digits):.{max(digits, 0)}f}"


def human(v: float | None, unit: str | None) -> str:
    """A value with its unit, readable: bytes as KiB/MiB/GiB, times as ms, 3 significant figures;
    '—' for none, and for a value no number can honestly show (NaN, inf)."""
    if v is None or not math.isfinite(v):
        return "—"
    u = (unit or "").strip()
    low = u.lower()
    if low in _BYTE_UNITS:
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(v) >= scale:
                return f"{sig3(v / scale)} {name}"
        return f"{sig3(v)} B"
    if low in _TIME_UNITS:
        return f"{sig3(v * _TIME_UNITS[low])} ms"
    if low in {"gbps", "gb/s"}:
        return f"{sig3(v)} GB/s"
    if low in {"pct", "%", "percent"}:
        return f"{sig3(v)} %"
    if low in {"phi", "φ"}:
        return f"{sig3(v)} Φ"
    if low in {"x", "ratio", ""}:
        return sig3(v) + ("×" if low in {"x", "ratio"} else "")
    if low in {"count", "calls"}:
        return f"{v:,.0f}" if float(v).is_integer() else sig3(v)
    return f"{sig3(v)} {u}"


def _span(lo: float | None, hi: float | None, unit: str | None) -> str:
    return human(lo, unit) if lo == hi or lo is None or hi is None else f"{human(lo, unit)} – {human(hi, unit)}"


# ---------------------------------------------------------------------------------------------
# Findings


def ranked_findings(findings: pl.DataFrame | None) -> pl.DataFrame:
    """FINDING_INPUT rows most important first (score descending; no score, or NaN, last), the
    order the rules gave kept among equals."""
    f = conform(findings, FINDING_INPUT)
    return f.with_columns(pl.col("score").fill_nan(None)).sort("score", descending=True, nulls_last=True, maintain_order=True)


def finding_item(row: dict, show_run: bool) -> html.Li:
    """One finding: its sentence, then where it was seen (run, rank, evidence) and the change to try."""
    text = (row.get("text") or "").strip() or f"(rule {row.get('rule') or '?'} gave no sentence)"
    where = []
    if show_run:
        where.append(row["run"] if row.get("run") else "comparison")
    if row.get("rank") is not None:
        where.append(f"rank {row['rank']}")
    evidence = (row.get("evidence") or "").strip()
    change = (row.get("change") or "").strip()
    score = row.get("score")
    return html.Li(className="finding", children=[
        html.Div(className="finding-text", children=[
            html.Span(f"[{' · '.join(where)}] ", className="finding-where") if where else None, text,
        ]),
        html.Div(["Evidence: ", evidence], className="finding-evidence hint") if evidence else None,
        html.Div([html.B("Try: "), change], className="finding-change") if change else None,
    ], title=f"rule {row.get('rule')}" + (f", score {sig3(score)}" if score is not None else ""))


def findings_children(findings: pl.DataFrame | None, runs: list[str], *, problems: list[str] = (), top: int = TOP_FINDINGS) -> list:
    """The Findings card's body: the top `top` findings, the rest under "show all N", or a line
    saying there are none (never a blank card). `problems`: lines to show first (a run that did
    not load, a comparison that failed)."""
    out = [html.Div(p, className="warning") for p in problems]
    f = ranked_findings(findings)
    if f.is_empty():
        what = "these runs" if len(runs) > 1 else "this run"
        out.append(html.P(f"No findings: no rule fired on {what}." if runs else "No findings: no run loaded.",
                          className="no-findings"))
        return out
    rows = f.to_dicts()
    show_run = len(runs) > 1 or any(r["run"] is None for r in rows)
    items = [finding_item(r, show_run) for r in rows]
    out.append(html.Ol(items[:top], className="findings"))
    if len(items) > top:
        out.append(html.Details([html.Summary(f"show all {len(items)} findings"),
                                 html.Ol(items[top:], start=top + 1, className="findings")]))
    return out


# ---------------------------------------------------------------------------------------------
# Theory vs measured


def collapse_check(check: pl.DataFrame | None, runs: list[str] | None = None) -> pl.DataFrame:
    """One row per (run, quantity, unit): the values where every rank agrees (predicted, measured
    and verdict the same), else their min and max across ranks and the rank that stands out (the
    rarest verdict, a disagreement before a match, then the ratio furthest from 1). Nothing where
    `check` has no rows for `runs`.

    Columns: run, quantity, unit, n_ranks, agree, predicted_min/max, measured_min/max, ratio_min/max,
    verdict (the ranks' common verdict, else "mixed"), odd_rank, odd_verdict, odd_measured, note (distinct notes)."""
    c = pl.col
    f = conform(check, CHECK_INPUT).with_columns(c("predicted", "measured", "ratio").fill_nan(None))
    if runs is not None:
        f = f.filter(c("run").is_in(runs))
    if f.is_empty():
        return pl.DataFrame()
    g = ["run", "quantity", "unit"]
    f = f.with_row_index("_i").with_columns(
        _first=c("_i").min().over(g),  # groups keep the order the producer gave (communication, then memory)
        _n_verdict=pl.len().over(*g, "verdict"),
        _log=pl.when(c("ratio") > 0).then(c("ratio").log().abs()),
        _not_match=(c("verdict") != "match").fill_null(True),
    )
    # Oddest rank first within each group (the rarest verdict, a disagreement, the ratio furthest from 1).
    f = f.with_columns(_odd=c("_n_verdict").max().over(g) - c("_n_verdict"))
    f = f.sort(["_first", "_odd", "_not_match", "_log"], descending=[False, True, True, True], nulls_last=True)
    out = f.group_by(g, maintain_order=True).agg(
        n_ranks=c("rank").n_unique(),
        agree=(c("predicted").n_unique() == 1) & (c("measured").n_unique() == 1) & (c("verdict").n_unique() == 1),
        predicted_min=c("predicted").min(), predicted_max=c("predicted").max(),
        measured_min=c("measured").min(), measured_max=c("measured").max(),
        ratio_min=c("ratio").min(), ratio_max=c("ratio").max(),
        verdict=pl.when(c("verdict").n_unique() == 1).then(c("verdict").first()).otherwise(pl.lit("mixed")),
        odd_rank=c("rank").first(), odd_verdict=c("verdict").first(), odd_measured=c("measured").first(),
        note=c("note").drop_nulls().unique(maintain_order=True).str.join("; "),
    )
    order = {r: i for i, r in enumerate(runs or out["run"].unique(maintain_order=True).to_list())}
    return out.with_columns(_o=c("run").replace_strict(order, default=len(order), return_dtype=pl.Int64)) \
        .sort("_o", maintain_order=True).drop("_o")


def theory_rows(check: pl.DataFrame | None, runs: list[str] | None = None) -> list[dict]:
    """The Theory vs measured table's rows (THEORY_COLUMNS), every number in human units."""
    rows = []
    for r in collapse_check(check, runs).iter_rows(named=True):
        unit = r["unit"]
        if r["agree"]:
            ranks = f"all {r['n_ranks']}" if r["n_ranks"] > 1 else f"rank {r['odd_rank']}"
        else:
            ranks = f"{r['n_ranks']} ranks differ; odd one: rank {r['odd_rank']}, measured {human(r['odd_measured'], unit)}" \
                    + (f", {r['odd_verdict']}" if r["verdict"] == "mixed" else "")
        rows.append(dict(
            run=r["run"], quantity=r["quantity"], ranks=ranks,
            predicted=_span(r["predicted_min"], r["predicted_max"], unit),
            measured=_span(r["measured_min"], r["measured_max"], unit),
            ratio=_span(r["ratio_min"], r["ratio_max"], "x"),
            verdict=r["verdict"] or "—", note=r["note"] or "",
        ))
    return rows


def theory_table(rows: list[dict], table_id: str, font: str) -> dash_table.DataTable:
    """The rows as a DataTable, verdicts coloured (VERDICT_STYLE)."""
    return dash_table.DataTable(
        id=table_id, columns=[{"name": c, "id": c} for c in THEORY_COLUMNS], data=rows, sort_action="native",
        style_cell={"fontFamily": font, "fontSize": "0.85rem", "padding": "3px 8px", "textAlign": "left",
                    "whiteSpace": "normal", "height": "auto", "maxWidth": "420px"},
        style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6"},
        style_data_conditional=[
            {"if": {"filter_query": f'{{verdict}} = "{v}"', "column_id": "verdict"}, "color": fg, "backgroundColor": bg,
             "fontWeight": "600"} for v, (fg, bg) in VERDICT_STYLE.items()
        ],
    )


def build_theory_bytes_figure(check: pl.DataFrame | None, runs: list[str] | None = None) -> go.Figure:
    """Predicted beside measured MiB for every byte quantity (communication per step by collective
    kind, persistent memory), one panel per run; bars are medians over ranks, whiskers the min–max."""
    c = pl.col
    f = conform(check, CHECK_INPUT).filter(c("unit").str.to_lowercase().is_in(list(_BYTE_UNITS)))
    f = f.with_columns(c("predicted", "measured").fill_nan(None))
    runs = [r for r in (runs or f["run"].unique(maintain_order=True).to_list()) if r in set(f["run"].to_list())]
    if not runs:
        return _empty("no byte quantities to set beside theory", height=160)
    fig = make_subplots(rows=1, cols=len(runs), subplot_titles=runs, horizontal_spacing=0.08)
    for i, run in enumerate(runs, start=1):
        part = f.filter(c("run") == run).group_by("quantity", maintain_order=True).agg(
            [getattr(c(col), fn)().alias(f"{col}_{fn}") for col in ("predicted", "measured") for fn in ("median", "min", "max")])
        for col, color, name in (("predicted", "#9ca3af", "predicted"), ("measured", run_color(i - 1), f"measured ({run})")):
            mid = part[f"{col}_median"] / 2**20
            fig.add_trace(go.Bar(
                x=part["quantity"].to_list(), y=mid.to_list(), name=name, marker_color=color, legendgroup=name,
                showlegend=i == 1 or col == "measured", customdata=[human(v, "bytes") for v in part[f"{col}_median"]],
                error_y=dict(type="data", symmetric=False, array=(part[f"{col}_max"] / 2**20 - mid).to_list(),
                             arrayminus=(mid - part[f"{col}_min"] / 2**20).to_list(), thickness=1, width=3),
                hovertemplate="%{x}<br>" + name + ": %{customdata}<extra>" + run + "</extra>",
            ), row=1, col=i)
    fig.update_layout(barmode="group", template="plotly_white", height=320, yaxis_title="MiB",
                      margin=dict(l=60, r=20, t=40, b=80), legend=dict(orientation="h", y=1.08, x=0, yanchor="bottom"))
    return fig


def theory_children(check: pl.DataFrame | None, has_manifest: dict[str, bool], runs: list[str], *, table_id: str,
                    graph_config: dict, font: str) -> list:
    """The Theory vs measured card's body: a line per run with no rows saying why, the table and
    the bytes figure; or one line when no run has any (never a blank card)."""
    f = conform(check, CHECK_INPUT)
    present = set(f["run"].to_list())
    out = []
    for run in runs:
        if has_manifest.get(run) is False:  # said even beside its rows: those are measurements alone
            shown = "; its measured bytes are shown without a prediction" if run in present else ""
            out.append(html.Div(f"{run}: no theory for foreign traces (no run.json says what the run was){shown}.",
                                className="hint"))
            continue
        if run in present:
            continue
        if run not in has_manifest:
            out.append(html.Div(f"{run}: not analysed (see the status above).", className="hint"))
        else:
            out.append(html.Div(f"{run}: no predicted quantity for this run (theory knows no formula for it, or its "
                                "run.json lacks the facts one needs: see the warnings of `ptprof analyze`).", className="hint"))
    rows = theory_rows(f, runs)
    if not rows:
        return out or [html.P("No theory to compare: no runs.", className="hint")]
    out.append(theory_table(rows, table_id, font))
    bytes_fig = build_theory_bytes_figure(f, runs)
    out.append(dcc.Graph(figure=bytes_fig, config=graph_config))
    return out
