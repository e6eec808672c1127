"""Compare: 1-4 runs side by side: findings first, theory vs measured, then on one time axis the
timeline, breakdown, pipeline, memory, collectives and step times. `/compare?runs=a,b` (run ids
are folders under the traces root).

A run of more than viewer.scale.SCALE_RANKS ranks is drawn as groups of ranks (pipeline stages, or
all ranks): medians with min–max bands, outlier ranks named (docs/viewer.md); the timeline's
dropdown, or `&rank=17` / `&group=stage1` in the URL, drills into one rank or group."""

from __future__ import annotations

import math
import re

import dash
from dash import Input, Output, State, callback, ctx, dash_table, dcc, html

from profiler import TraceError
from viewer import compare_data, data, figures, ids, scale, scale_data, scale_figures, theory_cards
from viewer.data import RunStore
from viewer.figures import COLLECTIVE_COLUMNS
from viewer.pages import FONT, MAX_COMPARE, current_store, run_id_list, skipped_files_line

GRAPH_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}
_RANGE_KEY = re.compile(r"^xaxis\d*\.range(\[[01]\])?$")


def parse_runs(runs: str | None) -> list[str]:
    """Run ids from the `runs` query parameter: comma separated, duplicates dropped, at most MAX_COMPARE."""
    return _query_runs(runs)[:MAX_COMPARE]


def _query_runs(runs) -> list[str]:
    # Split on the commas, then each id unquoted: pages.compare_href quotes a comma inside a name
    # (%2C), and a hand-typed `?runs=a,b` has no % to undo.
    from urllib.parse import unquote

    text = ",".join(map(str, runs)) if isinstance(runs, list) else runs if isinstance(runs, str) else ""
    return list(dict.fromkeys(r for r in (unquote(part).strip() for part in text.split(",")) if r))


def _card(title: str, hint: str, *children):
    return html.Div(className="card", children=[html.H3(title), html.P(hint, className="hint"), *children])


def _graph(id_: str):
    # Not autosized: an autosized first draw reports {"autosize": true} as relayoutData, which
    # re-triggers the timeline's callback while its first (slow on a big run) call is in flight,
    # and Dash drops the first answer: the card would stay at "loading…".
    placeholder = figures._empty("loading…")
    placeholder.update_layout(autosize=False)
    return dcc.Loading(dcc.Graph(id=id_, config=GRAPH_CONFIG, figure=placeholder))


def initial_view(rank=None, group=None) -> str:
    """The drill-down the URL asks for (`&rank=17`, `&group=stage1`) as the dropdown's value; a
    value that is not a rank or group name (`&rank=abc`, `&rank=-1`, `&rank=`) is kept as typed, so
    the timeline says what is wrong with it (scale_data.bad_view) instead of showing the groups.
    A parameter given twice arrives as a list: its values joined by commas (not a rank either)."""
    for kind, value in (("rank", rank), ("group", group)):
        if value is None:
            continue
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        view = f"{kind}:{text.strip()}"
        parsed = scale_data.parse_view(view)
        return f"rank:{parsed[1]}" if kind == "rank" and parsed else view[:200]
    return ""


def layout(runs: str | None = None, rank: str | None = None, group: str | None = None, **_query):
    picked, asked = parse_runs(runs), _query_runs(runs)
    view = initial_view(rank, group)
    if not picked:
        return html.Div(className="page", children=[
            html.H2("Compare"),
            html.P(["No runs picked. Tick 2 to 4 runs on the ", dcc.Link("Runs", href="/"), " page, or open one from ",
                    dcc.Link("Open", href="/open"), "."]),
        ])
    return html.Div(className="page", children=[
        dcc.Store(id=ids.COMPARE_RUNS, data=picked),
        html.H2("Compare: " + " · ".join(picked)),
        html.Div(f"Showing the first {MAX_COMPARE} of the {len(asked)} runs asked for.", className="error") if len(asked) > len(picked) else None,
        html.Div(id=ids.COMPARE_STATUS),
        _card("Findings", "What the numbers mean and what to change, most important first: each finding with its "
              "evidence and a change to try (rules: docs/findings.md); [comparison] marks those about the runs together.",
              dcc.Loading(html.Div(id=ids.COMPARE_FINDINGS, children=html.P("loading…", className="hint")))),
        _card("Theory vs measured", "The textbook prediction beside the traces' measurement (docs/theory.md), one line "
              "per quantity when every rank agrees, else the range across ranks and the rank that stands out.",
              dcc.Loading(html.Div(id=ids.COMPARE_THEORY, children=html.P("loading…", className="hint")))),
        _card("Timeline", "One lane per rank and thread / GPU stream, runs aligned at their first profiled step. Drag to zoom "
              "(double-click to reset): the server re-bins the visible range, so zooming in reveals single operators. "
              f"Runs of more than {scale.SCALE_RANKS} ranks: one row per group (pipeline stage, else all ranks) and lane, "
              "the median busy share over the group's ranks (line) inside the min–max band, per category; "
              f"{scale.OUTLIER_RULE}. Pick a group or rank below (or add &rank=N / &group=NAME to the URL) to see its own lanes.",
              dcc.Dropdown(id=ids.COMPARE_VIEW, options=[{"label": "all ranks, by group (median, min–max)", "value": ""}]
                           + ([{"label": view.replace(":", " ", 1)[:60], "value": view}] if view else []),
                           value=view, clearable=False, style={"maxWidth": "28rem", "marginBottom": "0.5rem"}),
              _graph(ids.COMPARE_TIMELINE)),
        html.Div(className="row", children=[
            _card("Where the time went", "Per rank, % of its profiled window: compute, communication hidden under compute, "
                  "exposed communication, other busy time and idle (the profiler's temporal breakdown). "
                  f"Above {scale.SCALE_RANKS} ranks: per group, the median over its ranks with the min–max as an error bar.",
                  _graph(ids.COMPARE_BREAKDOWN)),
            _card("Step times", f"Every profiled step of every rank; above {scale.SCALE_RANKS} ranks, per group, each rank's mean "
                  "step time (a box over the ranks), outlier ranks named.", _graph(ids.COMPARE_STEPS)),
        ]),
        _card("Pipeline", "Measured forward / backward blocks of one step per rank, labelled by microbatch, next to the "
              "schedule's ideal order (run.json), with the measured bubble against theory. Above "
              f"{scale.SCALE_RANKS} ranks: one pipeline, the lowest rank of each stage.", _graph(ids.COMPARE_PIPELINE)),
        html.Div(className="row", children=[
            _card("Memory over time", "Allocated bytes from [memory] events (runs recorded with --profile-memory); "
                  "triangles mark each rank's peak. Above " f"{scale.SCALE_RANKS} ranks: per group, the median over its ranks "
                  "with the min–max band, from each rank's 64-bucket memory curve.", _graph(ids.COMPARE_MEMORY)),
            _card("Persistent memory per rank", "Parameters, gradients and optimizer state each rank holds (run.json): "
                  "the ZeRO table made visible.", _graph(ids.COMPARE_PERSISTENT)),
        ]),
        _card("Collectives", "Per run and collective: count and size per rank, time, bus bandwidth (nccl-tests' "
              "definition) and the spread of start times across ranks (skew).",
              dcc.Loading(dash_table.DataTable(
                  id=ids.COMPARE_COLLECTIVES, columns=[{"name": c, "id": c} for c in COLLECTIVE_COLUMNS], data=[],
                  sort_action="native", style_cell={"fontFamily": FONT, "fontSize": "0.85rem", "padding": "3px 8px"},
                  style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6"}))),
    ])


# ---------------------------------------------------------------------------------------------
# What each callback returns, as plain functions of a store and the run ids (tested directly)


dash.register_page(__name__, path="/compare", name="Compare", title="ptprof · compare", order=1, layout=layout)


def status_children(store: RunStore, run_ids: list[str]):
    """A line per run: what it is (and the files it skipped), or the error that stopped it (shown
    in place of its figures)."""
    out = []
    for d in store.get_many(run_ids):
        if d.ok:
            row = data.run_row(d)
            out.append(html.Div(className="hint", children=(
                f"{d.run_id}: {row['paradigm']}, {data.ranks_loaded(d)} ({row['mesh'] or 'no mesh'}), {row['device']}, "
                f"mean step {row['step_ms']} ms"
            )))
            if (skipped := skipped_files_line(d)) is not None:
                out.append(skipped)
        else:
            out.append(html.Div(f"{d.run_id}: {d.error}", className="error"))
    return out


def findings_card(store: RunStore, run_ids: list[str]):
    """The Findings card's body: the ranked findings of the runs that loaded (and of their
    comparison), or a line saying there are none; runs that failed are named first."""
    runs = store.get_many(run_ids)
    found, why = compare_data.findings_frame(runs)
    problems = [f"{d.run_id}: not analysed, so no findings ({d.error})" for d in runs if not d.ok] + ([why] if why else [])
    return theory_cards.findings_children(found, [d.run_id for d in runs if d.ok], problems=problems)


def theory_card(store: RunStore, run_ids: list[str]):
    """The Theory vs measured card's body (viewer.theory_cards.theory_children)."""
    check, has_manifest = compare_data.theory_frame(store.get_many(run_ids))
    return theory_cards.theory_children(check, has_manifest, run_ids, table_id=ids.COMPARE_THEORY_TABLE,
                                        graph_config=GRAPH_CONFIG, font=FONT)


def timeline_figure(store: RunStore, run_ids: list[str], relayout: dict | None = None, view: str | None = None):
    """The timeline: one lane per rank (today's), or, where a run has more than SCALE_RANKS ranks,
    the groups' bands or the drill-down's ranks (`view`: "rank:17", "group:stage1")."""
    x_range = visible_range(relayout)
    runs = store.get_many(run_ids)
    if why := scale_data.bad_view(view):  # `&rank=abc` typed in the address: say so, not the groups
        return figures._empty(why)
    if scale_data.any_at_scale(runs) or scale_data.parse_view(view) is not None:  # a drill-down works at any rank count
        why = scale_data.missing_view(runs, scale_data.parse_view(view))
        if why:  # `&rank=999` typed in the address: say so, not "no events"
            return figures._empty(why)
        try:
            kind, out = scale_data.scale_timeline(runs, x_range, scale_data.parse_view(view))
        except TraceError as e:  # a rank's events not on this machine (a run loaded by a Dask cluster)
            return figures._empty(str(e))
        view_ = scale_data.parse_view(view)
        if kind == "segments":
            return figures.build_timeline_figure(out, run_ids, x_range=x_range, note=scale_data.absent_note(runs, view_),
                                                 shows=scale_data.view_label(view_) if view_ is not None else None)
        bands, outliers, n_ranks = out
        return scale_figures.build_band_timeline(bands, outliers, run_ids, x_range=x_range, n_ranks=n_ranks,
                                                 note=scale_data.band_note(runs, x_range, view_))
    segments = compare_data.timeline_segments(runs, x_range)
    return figures.build_timeline_figure(segments, run_ids, x_range=x_range)


def breakdown_figure(store: RunStore, run_ids: list[str]):
    runs = store.get_many(run_ids)
    if scale_data.any_at_scale(runs):
        return scale_figures.build_group_breakdown(scale_data.breakdown_bands(runs), scale_data.group_metrics(runs)[2], run_ids)
    return figures.build_breakdown_figure(compare_data.breakdown_frame(runs), run_ids)


def steps_figure(store: RunStore, run_ids: list[str]):
    runs = store.get_many(run_ids)
    if scale_data.any_at_scale(runs):
        return scale_figures.build_group_steps(*scale_data.group_metrics(runs), run_ids)
    return figures.build_step_time_figure(compare_data.steps_frame(runs), run_ids)


def pipeline_figure(store: RunStore, run_ids: list[str]):
    return figures.build_pipeline_figure(*compare_data.pipeline_frames(store.get_many(run_ids)), run_ids)


def memory_figures(store: RunStore, run_ids: list[str]):
    """(memory over time, persistent memory): per group from the per-rank memory curves at scale."""
    runs = store.get_many(run_ids)
    if scale_data.any_at_scale(runs):
        return (scale_figures.build_memory_bands(scale_data.memory_bands(runs), run_ids),
                scale_figures.build_group_persistent(scale_data.persistent_bands(runs), run_ids))
    curves, peaks = compare_data.memory_frames(runs)
    return figures.build_memory_figure(curves, peaks, run_ids), figures.build_persistent_figure(compare_data.persistent_frame(runs), run_ids)


def collectives_rows(store: RunStore, run_ids: list[str]):
    return figures.build_collectives_table(*compare_data.collectives_frames(store.get_many(run_ids)))


def visible_range(relayout: dict | None) -> tuple[float, float] | None:
    """The x range a zoom asked for (plotly's relayoutData, any of the shared x axes), low to
    high; None to reset, and for anything that is not two different finite numbers (the browser
    may send anything)."""
    if not isinstance(relayout, dict):
        return None
    for key, value in relayout.items():
        if not isinstance(key, str) or not _RANGE_KEY.match(key):
            continue
        if key.endswith(".range"):
            pair = value if isinstance(value, (list, tuple)) and len(value) == 2 else (None, None)
        elif key.endswith("[0]"):
            pair = (value, relayout.get(key[:-3] + "[1]"))
        else:
            continue
        lo, hi = (_finite(v) for v in pair)
        if lo is not None and hi is not None and lo != hi:
            return min(lo, hi), max(lo, hi)
    return None


def _finite(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _checked(run_ids) -> tuple[list[str], str | None]:
    """(run ids, None) as a Compare callback may use them (run_id_list), or ([], why refused)."""
    try:
        return run_id_list(run_ids), None
    except ValueError as e:
        return [], str(e)


# ---------------------------------------------------------------------------------------------
# Callbacks: unpack, fetch the analyses (cached per run), build the figure


# The run ids come from a dcc.Store the browser holds: each callback checks them (_checked) and
# answers a refusal with an empty figure saying why (the status line says it too), never a 500.


def _guarded(run_ids, build):
    """A card's children from `build(store, run_ids)`, or the refusal of odd run ids as one line."""
    run_ids, why = _checked(run_ids)
    return html.Div(why, className="error") if why else build(current_store(), run_ids)


@callback(Output(ids.COMPARE_STATUS, "children"), Input(ids.COMPARE_RUNS, "data"))
def show_status(run_ids):
    return _guarded(run_ids, status_children)


@callback(Output(ids.COMPARE_FINDINGS, "children"), Input(ids.COMPARE_RUNS, "data"))
def show_findings(run_ids):
    return _guarded(run_ids, findings_card)


@callback(Output(ids.COMPARE_THEORY, "children"), Input(ids.COMPARE_RUNS, "data"))
def show_theory(run_ids):
    return _guarded(run_ids, theory_card)


@callback(Output(ids.COMPARE_VIEW, "options"), Input(ids.COMPARE_RUNS, "data"), State(ids.COMPARE_VIEW, "value"))
def show_view_options(run_ids, view):
    run_ids, why = _checked(run_ids)
    if why:
        return [{"label": "all ranks, by group (median, min–max)", "value": ""}]
    return scale_data.view_options(current_store().get_many(run_ids), keep=view)


@callback(Output(ids.COMPARE_TIMELINE, "figure"), Input(ids.COMPARE_RUNS, "data"), Input(ids.COMPARE_TIMELINE, "relayoutData"),
          Input(ids.COMPARE_VIEW, "value"))
def show_timeline(run_ids, relayout, view):
    run_ids, why = _checked(run_ids)
    if why:
        return figures._empty(why)
    if ctx.triggered_id == ids.COMPARE_TIMELINE and not _is_zoom(relayout):
        raise dash.exceptions.PreventUpdate  # a resize, a legend click, a malformed range: nothing to re-bin
    return timeline_figure(current_store(), run_ids, relayout if ctx.triggered_id == ids.COMPARE_TIMELINE else None, view)


def _is_zoom(relayout) -> bool:
    """A usable x range, or a reset (autorange) of an x axis."""
    return visible_range(relayout) is not None or (
        isinstance(relayout, dict) and any(isinstance(k, str) and re.match(r"^xaxis\d*\.autorange$", k) for k in relayout))


@callback(Output(ids.COMPARE_BREAKDOWN, "figure"), Input(ids.COMPARE_RUNS, "data"))
def show_breakdown(run_ids):
    run_ids, why = _checked(run_ids)
    if why:
        return figures._empty(why)
    return breakdown_figure(current_store(), run_ids)


@callback(Output(ids.COMPARE_STEPS, "figure"), Input(ids.COMPARE_RUNS, "data"))
def show_steps(run_ids):
    run_ids, why = _checked(run_ids)
    if why:
        return figures._empty(why)
    return steps_figure(current_store(), run_ids)


@callback(Output(ids.COMPARE_PIPELINE, "figure"), Input(ids.COMPARE_RUNS, "data"))
def show_pipeline(run_ids):
    run_ids, why = _checked(run_ids)
    if why:
        return figures._empty(why)
    return pipeline_figure(current_store(), run_ids)


@callback(Output(ids.COMPARE_MEMORY, "figure"), Output(ids.COMPARE_PERSISTENT, "figure"), Input(ids.COMPARE_RUNS, "data"))
def show_memory(run_ids):
    run_ids, why = _checked(run_ids)
    if why:
        return figures._empty(why), figures._empty(why)
    return memory_figures(current_store(), run_ids)


@callback(Output(ids.COMPARE_COLLECTIVES, "data"), Input(ids.COMPARE_RUNS, "data"))
def show_collectives(run_ids):
    run_ids, why = _checked(run_ids)
    if why:
        return []
    return collectives_rows(current_store(), run_ids)
