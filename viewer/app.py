"""The Dash app: `create_app(traces_dir)` builds the shell (nav bar + pages) over a RunStore.

    from viewer.app import create_app
    create_app("traces").run(host="127.0.0.1", port=8050)

Pages (viewer/pages/) register themselves and use `@callback`; they reach the runs through
`viewer.pages.current_store()`, which reads the store this function puts in the Flask config.
Dash collects `@callback`s globally, so one process serves one app.
"""

from __future__ import annotations

from pathlib import Path

from dash import Dash, dcc, html, page_container

from viewer.data import RunStore
from viewer.pages import STORE_KEY
from viewer.upload import MAX_UPLOAD_BYTES

MAX_REQUEST_BYTES = 4 * MAX_UPLOAD_BYTES  # one upload request: base64 (4/3) of a few files at the per-file limit


def create_app(traces_dir: str | Path = "traces") -> Dash:
    """A Dash app browsing the runs under `traces_dir` (which need not exist yet)."""
    app = Dash(__name__, use_pages=True, pages_folder="", title="ptprof", suppress_callback_exceptions=True,
               update_title=None)
    app.server.config[STORE_KEY] = RunStore(traces_dir)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    # Imported only now: register_page needs an app created with use_pages.
    from viewer.pages import compare, open, plan, runs  # noqa: F401,A004

    app.layout = html.Div([
        html.Nav(className="nav", children=[
            html.Span("ptprof", className="brand"),
            dcc.Link("Runs", href="/"),
            dcc.Link("Compare", href="/compare"),
            dcc.Link("Open", href="/open"),
            dcc.Link("Plan", href="/plan"),
        ]),
        page_container,
    ])
    return app
