"""Runs: every run under the traces root in one sortable, filterable table; pick 2-4 to compare.

The table shows at once, from run.json and the runs already analysed; the others are analysed in
the background (RunStore.load_in_background) and a dcc.Interval fills their columns in as they
finish, with a progress line, until none is left.
"""

from __future__ import annotations


import dash
from dash import Input, Output, State, callback, ctx, dash_table, dcc, html

from profiler.textfmt import truncate
from viewer import ids
from viewer.data import PENDING, RUN_COLUMNS, PathRefused, RunStore, manifest_row, pending_row, relative_paths, run_row
from viewer.pages import (FONT, MAX_COMPARE, STATUS_CELL_CHARS, STATUS_TIP_CHARS, compare_href, current_store,
                          run_id_list)

POLL_MS = 1000  # how often the page asks for runs analysed since

# `ptprof list` counts every step a run ran; this table only the profiled ones (the analyses' steps).
COLUMN_NAMES = {
    "run": "run", "paradigm": "paradigm", "ranks": "ranks", "mesh": "mesh", "device": "device", "steps": "profiled steps",
    "step_ms": "mean step (ms)", "exposed_comm_pct": "exposed comm %", "overlap_pct": "overlap %", "bubble_pct": "bubble %",
    "peak_mib": "peak MiB (max rank)", "peak_mib_per_rank": "peak MiB per rank", "status": "status",
}
NUMERIC = {"ranks", "steps", "step_ms", "exposed_comm_pct", "overlap_pct", "bubble_pct", "peak_mib"}
# A run name or status is read in full: those two columns wrap (long paths break anywhere) instead
# of ending in an ellipsis, which hid what tells two runs apart (a name's end, `...-run-0042`) and
# what went wrong (the file name and the error after a path). A status cut past STATUS_CELL_CHARS
# keeps rows a few lines high (a run skipping 1,000 files), the whole text in its tooltip.
WRAPPED = {"run": "240px", "status": "220px"}  # column -> min width, so wrapping never squeezes it narrow


def layout(**_query):
    return html.Div(className="page", children=[
        html.H2("Runs"),
        html.P(className="hint", children=[
            "Every run folder under the traces root (run.json or *.json[.gz] traces). Tick 2 to 4 runs, then Compare. "
            "Sort by clicking a header; filter by typing in the row under it (e.g. ", html.Code("> 10"), " or ", html.Code("fsdp"), ").",
        ]),
        html.Div(className="row", style={"alignItems": "center", "gap": "0.8rem"}, children=[
            dcc.Link("Compare selected", id=ids.RUNS_COMPARE_LINK, href="/compare", className="button disabled"),
            html.Button("Reload", id=ids.RUNS_RELOAD, className="button secondary"),
            html.Span(id=ids.RUNS_HINT, className="hint"),
        ]),
        html.Div(id=ids.RUNS_PROGRESS, className="hint"),
        dcc.Interval(id=ids.RUNS_POLL, interval=POLL_MS, disabled=True),
        dcc.Store(id=ids.RUNS_DONE),
        html.Div(className="card", children=dash_table.DataTable(
            id=ids.RUNS_TABLE,
            columns=[{"name": COLUMN_NAMES[c], "id": c, "type": "numeric" if c in NUMERIC else "text"} for c in RUN_COLUMNS],
            data=[],
            row_selectable="multi",
            selected_row_ids=[],
            sort_action="native",
            filter_action="native",
            page_action="native",
            page_size=50,
            style_table={"overflowX": "auto"},
            style_cell={"fontFamily": FONT, "fontSize": "0.85rem", "padding": "3px 6px", "textAlign": "left",
                        "maxWidth": "380px", "overflow": "hidden", "textOverflow": "ellipsis"},
            style_cell_conditional=[
                {"if": {"column_id": c}, "minWidth": w, "whiteSpace": "normal", "height": "auto", "overflowWrap": "anywhere"}
                for c, w in WRAPPED.items()
            ],
            style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6"},
            style_data_conditional=[
                {"if": {"filter_query": '{status} != "ok"', "column_id": "status"}, "color": "#b91c1c"},
            ],
            tooltip_duration=None,
        )),
    ])


dash.register_page(__name__, path="/", name="Runs", title="ptprof · runs", order=0, layout=layout)


def runs_table_rows(store: RunStore) -> tuple[list[dict], list[str]]:
    """(rows, pending): one row per run, with the run id as the row id for selection, at once:
    analysed runs in full (viewer.data.run_row), the others from run.json (pending), a folder we
    refuse or cannot read with its error. Nothing is loaded here."""
    rows, pending = [], []
    for r in store.run_ids():
        try:
            data = store.peek(r)
            if data is None:
                row = pending_row(r, store.root / r)
                if row["status"] == PENDING:
                    pending.append(r)
            else:
                row = run_row(data)
        except PathRefused as e:
            row = manifest_row(r, None, str(e))
        except Exception as e:  # noqa: BLE001 -- one odd folder shows its error in its row, never a 500
            row = manifest_row(r, None, f"{type(e).__name__}: {e}")
        row["status"] = relative_paths(row["status"], store.root / r)
        rows.append({**row, "id": r})
    return rows, pending


def table_cells(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(data, tooltip_data) of the table for runs_table_rows' rows: a status longer than
    STATUS_CELL_CHARS cut in its cell, whole (up to STATUS_TIP_CHARS) in its tooltip; no tooltip
    where the cell already shows all."""
    data, tips = [], []
    for r in rows:
        status = r["status"]
        if isinstance(status, str) and len(status) > STATUS_CELL_CHARS:
            data.append({**r, "status": truncate(status, STATUS_CELL_CHARS)})
            tips.append({"status": {"value": truncate(status, STATUS_TIP_CHARS), "type": "text"}})
        else:
            data.append(r)
            tips.append({})
    return data, tips


def progress_line(rows: list[dict], pending: list[str]) -> str:
    """The line over the table: how many runs are analysed, while any is pending."""
    if not rows:
        return "No runs under the traces root yet."
    if pending:
        return f"Analysing runs: {len(rows) - len(pending)} of {len(rows)} done…"
    return f"{len(rows)} runs."


def compare_link(selected: list[str] | None) -> tuple[str, str, str]:
    """(href, class, hint) of the Compare link for the ticked runs."""
    selected = list(selected or [])
    if len(selected) < 2:
        return "/compare", "button disabled", "tick at least two runs"
    if len(selected) > MAX_COMPARE:
        return "/compare", "button disabled", f"at most {MAX_COMPARE} runs side by side ({len(selected)} ticked)"
    return compare_href(selected), "button", f"{len(selected)} runs: " + ", ".join(selected)


@callback(Output(ids.RUNS_TABLE, "data"), Output(ids.RUNS_TABLE, "tooltip_data"), Output(ids.RUNS_PROGRESS, "children"),
          Output(ids.RUNS_POLL, "disabled"), Output(ids.RUNS_DONE, "data"),
          Input(ids.RUNS_RELOAD, "n_clicks"), Input(ids.RUNS_POLL, "n_intervals"), State(ids.RUNS_DONE, "data"))
def fill_table(_clicks, _ticks, shown):
    store = current_store()
    rows, pending = runs_table_rows(store)
    if pending:
        store.load_in_background(pending)
    state = [len(rows), len(pending)]
    if ctx.triggered_id == ids.RUNS_POLL and state == shown:
        # Nothing finished since the last poll: leave the table alone (re-rendering it would
        # flicker and could swallow a click on a row).
        return dash.no_update, dash.no_update, dash.no_update, False, dash.no_update
    data, tips = table_cells(rows)
    return data, tips, progress_line(rows, pending), not pending, state


@callback(Output(ids.RUNS_COMPARE_LINK, "href"), Output(ids.RUNS_COMPARE_LINK, "className"), Output(ids.RUNS_HINT, "children"),
          Input(ids.RUNS_TABLE, "selected_row_ids"))
def update_compare_link(selected):
    try:
        selected = run_id_list(selected, limit=None)
    except ValueError as e:
        return "/compare", "button disabled", str(e)
    return compare_link(selected)
