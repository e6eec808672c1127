"""Open: analyze a trace folder on the server's disk (under the traces root) or uploaded files."""

from __future__ import annotations

import dash
from dash import Input, Output, State, callback, dcc, html

from viewer import ids, upload
from viewer.data import PathRefused, RunStore, ranks_loaded
from viewer.pages import compare_href, current_store, skipped_files_line


def layout(**_query):
    root = current_store().root
    return html.Div(className="page", children=[
        html.H2("Open traces"),
        html.Div(className="card", children=[
            html.H3("A folder on this server"),
            html.P(className="hint", children=[
                "A run folder (run.json + rank<R>.json.gz) or any folder of Kineto traces (*.json, *.json.gz), "
                "inside the traces root ", html.Code(str(root)), ". Relative paths are taken from the root.",
            ]),
            dcc.Input(id=ids.OPEN_PATH, type="text", placeholder="e.g. sample-ddp-2r", debounce=True,
                      style={"width": "420px", "marginRight": "0.6rem"}),
            html.Button("Open", id=ids.OPEN_BUTTON, className="button"),
        ]),
        html.Div(className="card", children=[
            html.H3("Upload trace files"),
            html.P(className="hint", children=(
                f"Drop the trace files of one run (rank<R>.json or .json.gz, optionally its run.json): "
                f"at most {upload.MAX_UPLOAD_FILES} files, each at most {upload.MAX_UPLOAD_BYTES // 2**20} MiB as sent, "
                f"and a .gz may unpack to at most {upload.MAX_UNPACKED_BYTES // 2**20} MiB. They are saved as a new run "
                "folder under the traces root if every file parses; otherwise nothing is saved and the reasons are shown. "
                "Bigger traces: copy them under the traces root and open the folder above."
            )),
            dcc.Upload(id=ids.OPEN_UPLOAD, multiple=True, max_size=upload.MAX_UPLOAD_BYTES, className="upload",
                       children=html.Div(["Drag and drop trace files here, or ", html.A("pick files")])),
        ]),
        dcc.Loading(html.Div(id=ids.OPEN_RESULT)),
    ])


dash.register_page(__name__, path="/open", name="Open", title="ptprof · open", order=2, layout=layout)


def open_folder(store: RunStore, path: str | None):
    """Children for the result area: a link to the run, its load error, or why the path was refused."""
    if not isinstance(path, str) or not path.strip():
        return html.Div("Type a folder under the traces root.", className="hint")
    try:
        run_id = store.run_id_of(path.strip())
    except PathRefused as e:
        return html.Div(f"Refused: {e}", className="error")
    return _result(store, run_id)


def open_upload(store: RunStore, contents, names):
    """Children for the result area: a link to the new run, or every reason the upload was refused."""
    if not contents:
        raise dash.exceptions.PreventUpdate
    try:
        run_id = upload.save_upload(store, upload.decode_upload(contents, names))
    except PathRefused as e:
        return html.Div(f"Upload refused, nothing was saved: {e}", className="error")
    return _result(store, run_id)


def _result(store: RunStore, run_id: str):
    data = store.get(run_id)
    if not data.ok:
        return html.Div([html.Div(f"{run_id}: could not load its traces", className="error"), html.Pre(data.error, className="error")])
    return html.Div(className="card", children=[
        html.Span(f"{run_id}: {ranks_loaded(data)} loaded. ", className="ok"),
        dcc.Link("Open it in Compare", href=compare_href([run_id]), className="button"),
        *([skipped] if (skipped := skipped_files_line(data)) is not None else []),
    ])


@callback(Output(ids.OPEN_RESULT, "children", allow_duplicate=True), Input(ids.OPEN_BUTTON, "n_clicks"), Input(ids.OPEN_PATH, "value"),
          prevent_initial_call=True)
def open_path(_clicks, path):
    return open_folder(current_store(), path)


@callback(Output(ids.OPEN_RESULT, "children"), Input(ids.OPEN_UPLOAD, "contents"), State(ids.OPEN_UPLOAD, "filename"),
          prevent_initial_call=True)
def upload_files(contents, names):
    return open_upload(current_store(), contents, names)
