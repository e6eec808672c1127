"""Plan: the parallel layouts of a transformer on G GPUs of a cluster, ranked by predicted step
time (profiler.plan, the same as `ptprof plan`), with each layout's breakdown and memory against
HBM. `/plan`."""

from __future__ import annotations

import dash
from dash import html



def layout(**_query):
    return html.Div(className="page", children=[html.H2("Plan"), html.P("Not yet built (issue 15).", className="hint")])


dash.register_page(__name__, path="/plan", name="Plan", title="ptprof · plan", order=3, layout=layout)
