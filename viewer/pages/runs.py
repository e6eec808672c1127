"""Runs: every run under the traces root in one sortable, filterable table; pick 2-4 to compare."""

from __future__ import annotations

import dash
from dash import Input, Output, callback, dash_table, dcc, html

from viewer import ids
from viewer.data import RUN_COLUMNS, RunStore, run_row
from viewer.pages import FONT, MAX_COMPARE, compare_href, current_store


COLUMN_NAMES = {
    "run": "run", "paradigm": "paradigm", "ranks": "ranks", "mesh": "mesh", "device": "device", "steps": "steps",
    "step_ms": "mean step (ms)", "exposed_comm_pct": "exposed comm %", "overlap_pct": "overlap %", "bubble_pct": "bubble %",
    "peak_mib": "peak MiB (max rank)", "peak_mib_per_rank": "peak MiB per rank", "status": "status",
}
NUMERIC = {"ranks", "steps", "step_ms", "exposed_comm_pct", "overlap_pct", "bubble_pct", "peak_mib"}


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
        dcc.Loading(html.Div(className="card", children=dash_table.DataTable(
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
            style_header={"fontWeight": "600", "backgroundColor": "#f3f4f6"},
            style_data_conditional=[
                {"if": {"filter_query": '{status} != "ok"', "column_id": "status"}, "color": "#b91c1c"},
            ],
            tooltip_duration=None,
        ))),
    ])


dash.register_page(__name__, path="/", name="Runs", title="ptprof · runs", order=0, layout=layout)


def runs_table_rows(store: RunStore) -> list[dict]:
    """One row per run (viewer.data.run_row), with the run id as the row id for selection."""
    return [{**run_row(store.get(r)), "id": r} for r in store.run_ids()]


def compare_link(selected: list[str] | None) -> tuple[str, str, str]:
    """(href, class, hint) of the Compare link for the ticked runs."""
    selected = list(selected or [])
    if len(selected) < 2:
        return "/compare", "button disabled", "tick at least two runs"
    if len(selected) > MAX_COMPARE:
        return "/compare", "button disabled", f"at most {MAX_COMPARE} runs side by side ({len(selected)} ticked)"
    return compare_href(selected), "button", f"{len(selected)} runs: " + ", ".join(selected)


@callback(Output(ids.RUNS_TABLE, "data"), Output(ids.RUNS_TABLE, "tooltip_data"), Input(ids.RUNS_RELOAD, "n_clicks"))
def fill_table(_clicks):
    rows = runs_table_rows(current_store())
    return rows, [{"status": {"value": str(r["status"]), "type": "text"}} for r in rows]


@callback(Output(ids.RUNS_COMPARE_LINK, "href"), Output(ids.RUNS_COMPARE_LINK, "className"), Output(ids.RUNS_HINT, "children"),
          Input(ids.RUNS_TABLE, "selected_row_ids"))
def update_compare_link(selected):
    return compare_link(selected)
