"""Pure figure builders for runs drawn as groups of ranks (viewer/scale.py): the median over a
group's ranks as a line, the min–max over them as a band, and the outlier ranks named. What
they send is bounded by runs x groups x lanes x bins, never by the rank count.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from viewer.figures import (BREAKDOWN_PARTS, CATEGORY_COLORS, CATEGORY_NAMES, DASHES, MIB, NO_MEMORY, PERSISTENT_PARTS, _empty, _runs,
                            breakdown_parts, run_color)

ROW_HEIGHT = 0.85  # of a lane row's unit height: a lane's busy share 1.0 reaches this high


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    return f"rgba({int(h[0:2], 16)},{int(h[2:4], 16)},{int(h[4:6], 16)},{alpha})"


def _outlier_text(outliers: pl.DataFrame, run: str, limit: int = 8) -> str:
    o = outliers.filter(pl.col("run") == run) if outliers.height else outliers
    if o.is_empty():
        return "no outlier ranks"
    names = o["why"].to_list()
    more = f" … and {len(names) - limit} more" if len(names) > limit else ""
    return "outliers: " + "; ".join(names[:limit]) + more


def build_band_timeline(bands: pl.DataFrame, outliers: pl.DataFrame, runs: list[str] | None = None, *,
                        x_range: tuple[float, float] | None = None, n_ranks: dict[str, int] | None = None,
                        note: str | None = None) -> go.Figure:
    """One subplot per run, one row per (group, lane): per category the median busy share over the
    group's ranks (line) inside its min–max band; the title names the outlier ranks. `note`: a
    line over the figure (viewer.scale_data.band_note: runs without the group, a zoom past the bins).

    bands: viewer.scale.activity_bands (run, group, group_key, lane, lane_key, category, bin, t_ms,
    bin_ms, median, lo, hi). Bins without a row are 0 (no rank busy there).
    """
    runs = _runs(bands, runs)
    if not runs:
        return _empty("no timeline activity in these runs")
    c = pl.col
    rows = {r: bands.filter(c("run") == r).select("group", "group_key", "lane", "lane_key").unique().sort("group_key", "lane_key")
            for r in runs}
    titles = [f"{r}: {(n_ranks or {}).get(r, '?')} ranks, median (line) and min–max (band) per group<br><sup>"
              f"{_outlier_text(outliers, r)}</sup>" for r in runs]
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=titles,
                        row_heights=[max(1, rows[r].height) for r in runs])
    shown = set()
    for i, run in enumerate(runs, start=1):
        part = bands.filter(c("run") == run)
        labels = []
        for j, (group, _, lane, _) in enumerate(rows[run].iter_rows()):
            base = rows[run].height - 1 - j  # first row on top
            labels.append((base + ROW_HEIGHT / 2, f"{group} {lane}"))
            lane_part = part.filter((c("group") == group) & (c("lane") == lane))
            n = int(part["bin"].max()) + 1  # bins past the run's last activity are not sent
            x0, dx = float(part["t_ms"].min() - part["bin"].min() * part["bin_ms"][0]), float(part["bin_ms"][0])
            for cat in CATEGORY_NAMES:
                seg = lane_part.filter(c("category") == cat)
                if seg.is_empty():
                    continue
                arrays = {}
                for col in ("lo", "hi", "median"):
                    a = np.zeros(n)
                    a[seg["bin"].to_numpy()] = seg[col].to_numpy()
                    # numpy arrays: plotly validates them whole and sends them as typed arrays (4 bytes a value)
                    arrays[col] = (base + ROW_HEIGHT * a).astype(np.float32)
                common = dict(x0=x0, dx=dx, mode="lines", legendgroup=cat, hoverinfo="skip")
                fig.add_trace(go.Scatter(y=arrays["lo"], line=dict(width=0, shape="hv"), showlegend=False, **common), row=i, col=1)
                fig.add_trace(go.Scatter(y=arrays["hi"], line=dict(width=0, shape="hv"), fill="tonexty", fillcolor=_rgba(CATEGORY_COLORS[cat], 0.25),
                                         showlegend=False, **common), row=i, col=1)
                fig.add_trace(go.Scatter(
                    y=arrays["median"], x0=x0, dx=dx, mode="lines", line=dict(color=CATEGORY_COLORS[cat], width=1.2, shape="hv"),
                    name=CATEGORY_NAMES[cat], legendgroup=cat, showlegend=cat not in shown,
                    hovertemplate=f"{group} {lane} · {cat}: median busy %{{customdata:.0%}}<extra>{run}</extra>",
                    customdata=seg_median(seg, n).astype(np.float32),
                ), row=i, col=1)
                shown.add(cat)
        fig.update_yaxes(tickvals=[t for t, _ in labels], ticktext=[lab for _, lab in labels], showgrid=False,
                         range=[-0.1, max(1, rows[run].height)], zeroline=False, row=i, col=1)
    fig.update_layout(template="plotly_white", height=140 + 34 * sum(max(1, rows[r].height) for r in runs) + 60 * len(runs),
                      margin=dict(l=140, r=20, t=70, b=40), legend=dict(orientation="h", y=1.06, x=0, yanchor="bottom"),
                      uirevision="timeline", dragmode="zoom")
    fig.update_xaxes(title_text="ms from the first profiled step", row=len(runs), col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    if note:  # above the legend, in the figure's own margin (as figures.build_timeline_figure)
        fig.update_layout(margin=dict(t=100), title=dict(text=note, font=dict(size=12, color="#666"), x=0, y=0.99, yanchor="top"))
    return fig


def seg_median(seg: pl.DataFrame, n: int) -> np.ndarray:
    a = np.zeros(n)
    a[seg["bin"].to_numpy()] = seg["median"].to_numpy()
    return a


def build_group_breakdown(bands: pl.DataFrame, outliers: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Per (run, group), each part of the temporal breakdown as % of the window: the median over
    the group's ranks (bar) with the min–max (error bar); outliers named in the title.

    bands: viewer.scale.band_over_ranks of breakdown_parts' *_pct columns."""
    runs = _runs(bands, runs)
    if not runs:
        return _empty("no temporal breakdown")
    b, x = _by_group(bands, runs)
    fig = go.Figure()
    for col, name, color in BREAKDOWN_PARTS:
        p = col.replace("_us", "_pct")
        med = b[f"{p}_median"]
        fig.add_trace(go.Bar(
            x=x, y=med.round(2).to_list(), name=name, marker_color=color,
            error_y=dict(type="data", symmetric=False, array=(b[f"{p}_hi"] - med).round(2).to_list(),
                         arrayminus=(med - b[f"{p}_lo"]).round(2).to_list(), thickness=1, width=3),
            hovertemplate="%{x}<br>" + name + ": median %{y:.1f}% of the window (bar: min–max over the group's ranks)<extra></extra>",
        ))
    title = "<br>".join(f"{r}: {_outlier_text(outliers, r, 4)}" for r in runs)
    fig.update_layout(barmode="group", template="plotly_white", height=380, yaxis=dict(title="% of profiled window (median)", range=[0, 100]),
                      title=dict(text=f"<sup>{title}</sup>", x=0, font=dict(size=12)),
                      margin=dict(l=60, r=20, t=60, b=60), legend=dict(orientation="h", y=1.02, x=1, xanchor="right", yanchor="bottom"))
    return fig


def breakdown_pct(breakdown: pl.DataFrame) -> pl.DataFrame:
    """run, rank and each breakdown part as % of the rank's window (the inputs of the bands)."""
    return breakdown_parts(breakdown).select("run", "rank", *[col.replace("_us", "_pct") for col, _, _ in BREAKDOWN_PARTS])


def build_group_steps(metrics: pl.DataFrame, groups: dict[str, pl.DataFrame], outliers: pl.DataFrame,
                      runs: list[str] | None = None) -> go.Figure:
    """Per (run, group) the distribution of the ranks' mean step times (box: one value per rank),
    the outlier ranks as named markers."""
    runs = _runs(metrics, runs)
    if not runs:
        return _empty("no steps")
    fig = go.Figure()
    for i, run in enumerate(runs):
        m = metrics.filter(pl.col("run") == run).join(groups[run], on="rank").sort("group_key", "rank")
        single = m["group"].n_unique() <= 1
        for (group,), part in m.group_by("group", maintain_order=True):  # one box per group: one value per rank
            fig.add_trace(go.Box(y=part["step_ms"].to_numpy().astype(np.float32), name=run if single else f"{run} {group}",
                                 marker_color=run_color(i), boxpoints=False, hoverinfo="y"))
        o = outliers.filter((pl.col("run") == run) & (pl.col("metric") == "step time")) if outliers.height else outliers
        if o.height:
            xs = [run if single else f"{run} {g}" for g in o["group"]]
            fig.add_trace(go.Scatter(x=xs, y=o["value"].round(3).to_list(), mode="markers+text", text=[f"r{r}" for r in o["rank"]],
                                     textposition="middle right", marker=dict(color="black", symbol="x", size=8),
                                     name=f"{run} outliers", hovertext=o["why"].to_list(), hoverinfo="text"))
    fig.update_layout(template="plotly_white", height=320, yaxis_title="mean step time per rank (ms)", showlegend=False,
                      margin=dict(l=60, r=20, t=30, b=40))
    return fig


def build_memory_bands(bands: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Allocated MiB over time per (run, group, device): the median over the group's ranks (line)
    inside the min–max band, from the per-rank memory curves."""
    runs = _runs(bands, runs)
    if not runs:
        return _empty(NO_MEMORY)
    fig = go.Figure()
    for i, run in enumerate(runs):
        part = bands.filter(pl.col("run") == run)
        for j, ((group, dev), b) in enumerate(part.group_by("group", "mem_device", maintain_order=True)):
            x = b["t_ms"].to_numpy().astype(np.float32)
            name = f"{run} {group} {dev}"
            mib = {k: (b[k] / MIB).to_numpy().astype(np.float32) for k in ("lo", "hi", "median")}
            fig.add_trace(go.Scatter(x=x, y=mib["lo"], mode="lines", line=dict(width=0, shape="hv"),
                                     legendgroup=name, showlegend=False, hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=x, y=mib["hi"], mode="lines", line=dict(width=0, shape="hv"),
                                     fill="tonexty", fillcolor=_rgba(run_color(i), 0.15), legendgroup=name, showlegend=False, hoverinfo="skip"))
            fig.add_trace(go.Scatter(x=x, y=mib["median"], mode="lines", name=name, legendgroup=name,
                                     line=dict(color=run_color(i), dash=DASHES[j % len(DASHES)], width=1.5, shape="hv"),
                                     hovertemplate="median %{y:.2f} MiB at %{x:.2f} ms<extra>" + name + "</extra>"))
    fig.update_layout(template="plotly_white", height=380, xaxis_title="ms from the first profiled step",
                      yaxis_title="allocated (MiB): median, band min–max", margin=dict(l=60, r=20, t=30, b=50), legend=dict(font=dict(size=10)))
    return fig


def build_group_persistent(bands: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Stacked MiB per (run, group): the median over the group's ranks of parameters / gradients /
    optimizer state (run.json); hover gives the min–max."""
    runs = _runs(bands, runs)
    if not runs:
        return _empty("no persistent memory (run.json's per-rank memory block)")
    b, x = _by_group(bands, runs)
    fig = go.Figure()
    for col, name, color in PERSISTENT_PARTS:
        if f"{col}_median" not in b.columns or not (b[f"{col}_hi"].fill_null(0) > 0).any():
            continue
        lo, hi = (b[f"{col}_lo"].fill_null(0) / MIB).round(2), (b[f"{col}_hi"].fill_null(0) / MIB).round(2)
        fig.add_trace(go.Bar(x=x, y=(b[f"{col}_median"].fill_null(0) / MIB).round(4).to_list(), name=name, marker_color=color,
                             customdata=list(zip(lo.to_list(), hi.to_list())),
                             hovertemplate="%{x}<br>" + name + ": median %{y:.2f} MiB (min %{customdata[0]}, max %{customdata[1]})<extra></extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", height=340, yaxis_title="MiB held per rank (median over the group)",
                      margin=dict(l=60, r=20, t=30, b=60), legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom", traceorder="normal"))
    return fig


def _by_group(bands: pl.DataFrame, runs: list[str]) -> tuple[pl.DataFrame, list[list]]:
    """The bands of `runs` in page order then group order, and their two-level x axis (run, "group (n)")."""
    b = bands.filter(pl.col("run").is_in(runs)).with_columns(
        _order=pl.col("run").replace_strict({r: i for i, r in enumerate(runs)}, return_dtype=pl.Int64)).sort("_order", "group_key")
    return b, [b["run"].to_list(), [f"{g} ({n})" for g, n in zip(b["group"], b["n_ranks"])]]
