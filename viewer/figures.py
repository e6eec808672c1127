"""Pure figure builders: tidy frames in, `go.Figure` out. No I/O, no profiler calls, no Dash.

Every builder takes frames with a `run` column (several runs at once: that is how Compare lines
them up) and colours by meaning, the same in every figure and run: CATEGORY_COLORS for time
(compute / comm / memory / other / idle), ACTION_COLORS for pipeline blocks, one colour per run
(RUN_COLORS, in the order runs were picked) where runs are overlaid.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

CATEGORY_COLORS = {
    "compute": "#4C78A8",
    "comm": "#F58518",
    "memory": "#54A24B",
    "other": "#B279A2",
    "idle": "#E4E4E4",
}
CATEGORY_NAMES = {"compute": "compute", "comm": "communication", "memory": "memory copy", "other": "other (launch, sync)", "idle": "idle"}
BREAKDOWN_PARTS = [  # (column, legend, colour): stacked, they add up to the rank's window
    ("compute_only_us", "compute", CATEGORY_COLORS["compute"]),
    ("overlap_us", "overlapped comm", "#FFBF79"),
    ("exposed_comm_us", "exposed comm", CATEGORY_COLORS["comm"]),
    ("other_us", "other busy", CATEGORY_COLORS["other"]),
    ("idle_us", "idle", "#BDBDBD"),
]
ACTION_COLORS = {"F": "#4C78A8", "B": "#E45756", "I": "#F58518", "W": "#72B7B2", "L": "#9D755D", "U": "#B279A2"}
ACTION_NAMES = {"F": "forward", "B": "backward", "I": "backward (input grads)", "W": "backward (weight grads)", "L": "loss",
                "U": "weight update (pipedream)"}
PERSISTENT_PARTS = [("params_bytes", "parameters", "#4C78A8"), ("grads_bytes", "gradients", "#F58518"),
                    ("optimizer_bytes", "optimizer state", "#54A24B"),
                    ("stashed_params_bytes", "stashed weights (pipedream)", "#B279A2")]  # null elsewhere: drawn where held
RUN_COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
MIB = 2**20


def _runs(frame: pl.DataFrame, runs: list[str] | None) -> list[str]:
    present = frame["run"].cast(pl.String).unique(maintain_order=True).to_list() if frame.height else []
    return [r for r in runs if r in present] if runs is not None else present


def _empty(message: str, height: int = 220) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5, font=dict(size=14, color="#666"))
    fig.update_layout(height=height, xaxis=dict(visible=False), yaxis=dict(visible=False), template="plotly_white",
                      margin=dict(l=20, r=20, t=20, b=20))
    return fig


def run_color(i: int) -> str:
    return RUN_COLORS[i % len(RUN_COLORS)]


# ---------------------------------------------------------------------------------------------
# Timeline


def build_timeline_figure(segments: pl.DataFrame, runs: list[str] | None = None, *, x_range=None, shows: str | None = None,
                          note: str | None = None) -> go.Figure:
    """One subplot per run (shared, zoomable time axis), one lane per rank and thread/stream.

    segments: viewer.aggregate.visible_timeline's frame (run, label, category, start_ms, end_ms,
    busy, text). One horizontal-bar trace per (run, category), so the trace count is bounded by
    runs x categories and the legend toggles a category in every run at once. `shows`: what a
    drill-down draws ("rank 17"), after each run's title; `note`: a line over the figure (the runs
    a drill-down has nothing of).
    """
    runs = _runs(segments, runs)
    if not runs:
        return _empty("no timeline events in these runs")
    n_lanes = {r: max(1, segments.filter(pl.col("run") == r)["label"].n_unique()) for r in runs}
    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[f"{r}: {shows}" if shows else r for r in runs], row_heights=[n_lanes[r] for r in runs])
    shown = set()
    for i, run in enumerate(runs, start=1):
        part = segments.filter(pl.col("run") == run)
        labels = part.select("rank", "label").unique().sort("rank", "label", maintain_order=True)["label"].to_list()
        for cat in CATEGORY_NAMES:
            seg = part.filter(pl.col("category") == cat)
            if seg.is_empty():
                continue
            fig.add_trace(
                go.Bar(
                    orientation="h",
                    y=seg["label"].to_list(),
                    base=seg["start_ms"].round(4).to_list(),
                    x=(seg["end_ms"] - seg["start_ms"]).round(4).to_list(),
                    marker=dict(color=CATEGORY_COLORS[cat],
                                opacity=None if cat == "idle" else (0.35 + 0.65 * seg["busy"]).round(2).to_list(),
                                line=dict(width=0)),
                    hovertext=seg["text"].to_list(),
                    hovertemplate="%{hovertext}<br>%{base:.3f} ms + %{x:.3f} ms<extra>%{y}</extra>",
                    name=CATEGORY_NAMES[cat],
                    legendgroup=cat,
                    legendrank=list(CATEGORY_NAMES).index(cat),  # same legend order whatever is in view
                    showlegend=cat not in shown,
                ),
                row=i, col=1,
            )
            shown.add(cat)
        fig.update_yaxes(categoryorder="array", categoryarray=labels[::-1], row=i, col=1)
    fig.update_layout(
        barmode="overlay", bargap=0.25, template="plotly_white", height=120 + 34 * sum(n_lanes.values()) + 40 * len(runs),
        margin=dict(l=90, r=20, t=40, b=40), legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom"),
        uirevision="timeline", dragmode="zoom",
    )
    fig.update_xaxes(title_text="ms from the first profiled step", row=len(runs), col=1)
    if x_range is not None:
        fig.update_xaxes(range=list(x_range))
    if note:  # above the legend, in the figure's own margin
        fig.update_layout(margin=dict(t=80), title=dict(text=note, font=dict(size=12, color="#666"), x=0, y=0.99, yanchor="top"))
    return fig


# ---------------------------------------------------------------------------------------------
# Temporal breakdown


def breakdown_parts(breakdown: pl.DataFrame) -> pl.DataFrame:
    """The profiler's temporal breakdown as parts that stack to each rank's window (µs and %)."""
    c = pl.col
    parts = breakdown.with_columns(
        compute_only_us=(c("compute_us") - c("overlap_us")).clip(0),
        other_us=(c("window_us") - c("compute_us") - c("exposed_comm_us") - c("idle_us")).clip(0),
    )
    return parts.with_columns([(100 * c(col) / c("window_us")).alias(col.replace("_us", "_pct")) for col, _, _ in BREAKDOWN_PARTS])


def build_breakdown_figure(breakdown: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Stacked bars per rank, grouped by run: compute / overlapped comm / exposed comm / other / idle,
    as % of the rank's profiled window (hover gives ms)."""
    runs = _runs(breakdown, runs)
    if not runs:
        return _empty("no temporal breakdown")
    parts = breakdown_parts(breakdown.with_columns(pl.col("run").cast(pl.String))).filter(pl.col("run").is_in(runs))
    parts = parts.with_columns(_order=pl.col("run").replace_strict({r: i for i, r in enumerate(runs)}, return_dtype=pl.Int64)).sort("_order", "rank")
    x = [parts["run"].to_list(), [f"r{r}" for r in parts["rank"]]]
    fig = go.Figure()
    for col, name, color in BREAKDOWN_PARTS:
        fig.add_trace(go.Bar(
            x=x, y=parts[col.replace("_us", "_pct")].round(2).to_list(), name=name, marker_color=color,
            customdata=(parts[col] / 1e3).round(3).to_list(),
            hovertemplate="%{x}<br>" + name + ": %{y:.1f}% (%{customdata:.2f} ms)<extra></extra>",
        ))
    fig.update_layout(barmode="stack", template="plotly_white", height=360, yaxis=dict(title="% of profiled window", range=[0, 100]),
                      margin=dict(l=60, r=20, t=30, b=60), legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom", traceorder="normal"))
    return fig


# ---------------------------------------------------------------------------------------------
# Pipeline


def build_pipeline_figure(actions: pl.DataFrame, ideal: pl.DataFrame, summary: pl.DataFrame | None = None,
                          runs: list[str] | None = None) -> go.Figure:
    """Per run two panels: measured blocks (one step, ms from its start) and the schedule's ideal
    order (one slot per action). One block per (rank, action, microbatch), labelled with the
    microbatch; the title gives the measured bubble next to the theory.

    actions: run, rank, action, microbatch, start_ms, end_ms (the profiler's pipeline actions, one
    step). ideal: run, rank, action, stage, microbatch, slot. summary: run, bubble_pct, theory_pct,
    ideal_pct (means over ranks), optional.
    """
    all_runs = _runs(pl.concat([actions.select("run"), ideal.select("run")]) if ideal.height or actions.height else actions, runs)
    if not all_runs:
        return _empty("no pipeline runs among these (no ptprof/pp spans and no ideal_order in run.json)")
    titles = []
    for run in all_runs:
        measured = f"{run}: measured{_bubble_text(summary, run)}"
        if actions.is_empty() or actions.filter(pl.col("run") == run).is_empty():
            measured += "<br><sup>no measured action spans</sup>"
        has_ideal = ideal.height and ideal.filter(pl.col("run") == run).height
        titles += [measured, f"{run}: schedule order" + ("" if has_ideal else "<br><sup>no ideal_order in run.json</sup>")]
    fig = make_subplots(rows=len(all_runs), cols=2, subplot_titles=titles, horizontal_spacing=0.06, vertical_spacing=0.3 / len(all_runs),
                        column_widths=[0.55, 0.45])
    shown = set()
    for i, run in enumerate(all_runs, start=1):
        for col, frame, x0, x1 in ((1, actions, "start_ms", "end_ms"), (2, ideal, "slot", None)):
            part = frame.filter(pl.col("run") == run)
            if part.is_empty():
                continue
            for act in ACTION_COLORS:
                blocks = part.filter(pl.col("action") == act)
                if blocks.is_empty():
                    continue
                width = (blocks[x1] - blocks[x0]).to_list() if x1 else [0.92] * blocks.height
                fig.add_trace(go.Bar(
                    orientation="h", y=[f"r{r}" for r in blocks["rank"]], base=blocks[x0].to_list(), x=width,
                    text=[str(m) for m in blocks["microbatch"]], textposition="inside", insidetextanchor="middle",
                    marker=dict(color=ACTION_COLORS[act], line=dict(width=0.5, color="white")),
                    name=ACTION_NAMES[act], legendgroup=act, showlegend=act not in shown,
                    hovertemplate=f"{ACTION_NAMES[act]} mb %{{text}}<extra>%{{y}}</extra>",
                ), row=i, col=col)
                shown.add(act)
            ranks = sorted(set(part["rank"].to_list()))
            fig.update_yaxes(categoryorder="array", categoryarray=[f"r{r}" for r in ranks][::-1], row=i, col=col)
        fig.update_xaxes(title_text="ms from step start", row=i, col=1)
        fig.update_xaxes(title_text="slot in the schedule", row=i, col=2)
    fig.update_layout(barmode="overlay", template="plotly_white", height=100 + 230 * len(all_runs),
                      margin=dict(l=50, r=20, t=50, b=40), legend=dict(orientation="h", y=1.04, x=0, yanchor="bottom"))
    return fig


def _bubble_text(summary: pl.DataFrame | None, run: str) -> str:
    if summary is None or summary.is_empty():
        return ""
    row = summary.filter(pl.col("run") == run)
    if row.is_empty():
        return ""
    r = row.row(0, named=True)
    bits = [f"bubble {r['bubble_pct']:.0f}%"] if r.get("bubble_pct") is not None else ["bubble not measured"]
    if r.get("theory_pct") is not None:
        bits.append(f"theory {r['theory_pct']:.0f}%")
    if r.get("ideal_pct") is not None:
        bits.append(f"ideal {r['ideal_pct']:.0f}%")
    return " (" + ", ".join(bits) + ")"


# ---------------------------------------------------------------------------------------------
# Memory


NO_MEMORY = "no [memory] events: record runs with --profile-memory to see allocations over time"
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]  # one per device / group within a run


def build_memory_figure(timeline: pl.DataFrame, peaks: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Allocated MiB over time, one line per (run, rank, device): runs by colour, ranks by dash;
    each curve's peak marked.

    timeline: run, rank, mem_device, t_ms, allocated_bytes (already decimated). peaks: run, rank,
    mem_device, peak_t_ms, peak_allocated_bytes.
    """
    runs = _runs(timeline, runs)
    if not runs:
        return _empty(NO_MEMORY)
    fig = go.Figure()
    for i, run in enumerate(runs):
        part = timeline.filter(pl.col("run") == run)
        for (rank, dev), curve in part.group_by("rank", "mem_device", maintain_order=True):
            fig.add_trace(go.Scatter(
                x=curve["t_ms"].round(4).to_list(), y=(curve["allocated_bytes"] / MIB).round(4).to_list(), mode="lines",
                line=dict(color=run_color(i), dash=DASHES[int(rank) % len(DASHES)], width=1.5, shape="hv"),
                name=f"{run} r{rank} {dev}", legendgroup=run,
                hovertemplate="%{y:.2f} MiB at %{x:.2f} ms<extra>" + f"{run} r{rank}" + "</extra>",
            ))
        pk = peaks.filter(pl.col("run") == run)
        if pk.height:
            fig.add_trace(go.Scatter(
                x=pk["peak_t_ms"].to_list(), y=(pk["peak_allocated_bytes"] / MIB).round(4).to_list(), mode="markers",
                marker=dict(symbol="triangle-down", size=11, color=run_color(i), line=dict(width=1, color="black")),
                name=f"{run} peaks", legendgroup=run, text=[f"r{r}" for r in pk["rank"]],
                hovertemplate="peak %{y:.2f} MiB (%{text})<extra>" + run + "</extra>",
            ))
    fig.update_layout(template="plotly_white", height=380, xaxis_title="ms from the first profiled step",
                      yaxis_title="allocated (MiB)", margin=dict(l=60, r=20, t=30, b=50), legend=dict(font=dict(size=10)))
    return fig


def build_persistent_figure(persistent: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Stacked MiB per rank, grouped by run: parameters / gradients / optimizer state (run.json):
    the ZeRO table, measured; plus pipedream's stashed weight copies where a run has them."""
    runs = _runs(persistent, runs)
    if not runs:
        return _empty("no persistent memory (run.json's per-rank memory block)")
    p = persistent.with_columns(pl.col("run").cast(pl.String)).filter(pl.col("run").is_in(runs))
    p = p.with_columns(_order=pl.col("run").replace_strict({r: i for i, r in enumerate(runs)}, return_dtype=pl.Int64)).sort("_order", "rank")
    x = [p["run"].to_list(), [f"r{r}" for r in p["rank"]]]
    fig = go.Figure()
    for col, name, color in PERSISTENT_PARTS:
        if col not in p.columns or (col == "stashed_params_bytes" and not (p[col].fill_null(0) > 0).any()):
            continue  # only pipedream stashes weights: no empty legend entry elsewhere
        fig.add_trace(go.Bar(x=x, y=(p[col].fill_null(0) / MIB).round(4).to_list(), name=name, marker_color=color,
                             hovertemplate="%{x}<br>" + name + ": %{y:.2f} MiB<extra></extra>"))
    fig.update_layout(barmode="stack", template="plotly_white", height=340, yaxis_title="MiB held per rank",
                      margin=dict(l=60, r=20, t=30, b=60), legend=dict(orientation="h", y=1.02, x=0, yanchor="bottom", traceorder="normal"))
    return fig


# ---------------------------------------------------------------------------------------------
# Steps and collectives


def build_step_time_figure(steps: pl.DataFrame, runs: list[str] | None = None) -> go.Figure:
    """Distribution of step times per run (every rank's profiled steps), box with points."""
    runs = _runs(steps, runs)
    if not runs:
        return _empty("no steps")
    fig = go.Figure()
    for i, run in enumerate(runs):
        part = steps.filter(pl.col("run") == run)
        fig.add_trace(go.Box(
            y=(part["dur_us"] / 1e3).round(3).to_list(), name=run, marker_color=run_color(i), boxpoints="all", jitter=0.4,
            pointpos=0, text=[f"r{r} step {s}" for r, s in zip(part["rank"], part["step"])],
            hovertemplate="%{y:.2f} ms (%{text})<extra></extra>",
        ))
    fig.update_layout(template="plotly_white", height=320, yaxis_title="step time (ms)", showlegend=False,
                      margin=dict(l=60, r=20, t=30, b=40))
    return fig


SKEW_INPUT = {"run": pl.String, "collective": pl.String, "spread_us": pl.Float64}  # what the table reads of the skew frame
COLLECTIVE_COLUMNS = ["run", "collective", "count", "size_mib", "time_ms", "mean_ms", "busbw_gbps", "skew_mean_ms", "skew_max_ms"]


def build_collectives_table(stats: pl.DataFrame, skew: pl.DataFrame) -> list[dict]:
    """Rows for the collectives table: per (run, collective), means over ranks of count, MiB moved,
    total and mean time, bus bandwidth, and the cross-rank start skew (mean and max)."""
    if stats.is_empty():
        return []
    c = pl.col
    # Runs without cross-rank start data (one rank, a pipeline whose ranks share no collective)
    # have no skew rows, not even columns: an empty frame of the right shape joins as nulls.
    skew = skew.select(*SKEW_INPUT) if SKEW_INPUT.keys() <= set(skew.columns) else pl.DataFrame(schema=SKEW_INPUT)
    stats, skew = (f.with_columns(c("run", "collective").cast(pl.String)) for f in (stats, skew))
    per_rank = stats.group_by("run", "rank", "collective").agg(
        count=c("count").sum(), bytes=c("total_bytes").sum(), total_us=c("total_us").sum(),
    )
    table = per_rank.group_by("run", "collective").agg(
        count=c("count").mean(), bytes=c("bytes").mean(), total_us=c("total_us").mean(), n=c("count").sum(),
    ).with_columns(mean_us=c("total_us") / c("count"))
    # busbw weighted by time over the rows that have one: rows without (no group size; gloo's send /
    # recv, collectives.GLOO_P2P_NOTE) are left out of the weights too, and a collective with none
    # has none (it read 0, or a mean understated by their time).
    timed = c("total_us").filter(c("busbw_gbps").is_not_null())
    bw = stats.group_by("run", "collective").agg(
        busbw_gbps=pl.when(timed.sum() > 0).then((c("busbw_gbps") * c("total_us")).sum() / timed.sum()))
    sk = skew.group_by("run", "collective").agg(skew_mean_ms=c("spread_us").mean() / 1e3, skew_max_ms=c("spread_us").max() / 1e3)
    out = (
        table.join(bw, on=["run", "collective"], how="left").join(sk, on=["run", "collective"], how="left")
        .select(
            c("run").cast(pl.String), "collective", c("count").round(1), size_mib=(c("bytes") / MIB).round(3),
            time_ms=(c("total_us") / 1e3).round(3), mean_ms=(c("mean_us") / 1e3).round(3), busbw_gbps=c("busbw_gbps").round(3),
            skew_mean_ms=c("skew_mean_ms").round(3), skew_max_ms=c("skew_max_ms").round(3),
        )
        .sort("run", "time_ms", descending=[False, True])
    )
    return out.to_dicts()
