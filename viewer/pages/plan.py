"""Plan: the parallel layouts of a transformer on G GPUs of a cluster, ranked by predicted step
time (profiler.plan, the same as `ptprof plan`), with each layout's breakdown and memory against
HBM. `/plan`.

The form's values come from the browser (anything): `read_form` checks them and names the field
at fault; the cluster must be a shipped preset (never a path: the server's files are not the
browser's to name). `plan_result` runs the planner and hands its PlanResult to the pure builders
of viewer.plan_figures; any refusal is one line on the page, never a traceback.
"""

from __future__ import annotations

import math
import re
import time

import dash
from dash import Input, Output, State, callback, dcc, html

from viewer import ids, plan_figures
from profiler.plan import PlanTooLong
from viewer.pages import FONT

MAX_PAGE_GPUS = 16384  # the bound for a plan that takes seconds; the CLI takes more
MAX_DIM = 1 << 40  # as `ptprof plan`'s whole-number flags
DEFAULT_VOCAB = 51200  # `ptprof plan --vocab`'s default
TOP_CHOICES = (5, 10, 20)
# A plan runs inside the request: past this it is stopped (the CLI has no limit). Realistic models
# plan in seconds even at 16,384 GPUs; dims rich in divisors (720 layers and heads, a batch of
# 720720 on 10,080 GPUs) multiply the layouts into the millions and take minutes.
PLAN_TIME_LIMIT_S = 20.0
GRAPH_CONFIG = {"displaylogo": False, "toImageButtonOptions": {"format": "png", "scale": 2}}

# Model presets: (label, dims). Sources: GPT-3 (Brown et al. 2020, Table 2.1: 175B with a 3.2M-token
# batch = 1536 x 2048; XL 1.3B with 1M tokens = 512 x 2048; XL's table lists 24 heads of 128, which
# do not divide 2048: 16 heads of 128 here); 22B as ../shared/validation/published_runs.md
# (Korthikanti et al. 2022, Table 3); Mixtral 8x7B's dims (Jiang et al. 2024, Table 1: hidden 4096,
# SwiGLU width 14336, so ffn = 1.5 x 14336 = 21504 by the tool's rule for a SwiGLU MLP; its 8 KV heads
# are not modelled (GQA), so it counts 47.5 B against the published 46.7 B; its batch is not
# published: 1024 x 4096 is illustrative).
MODEL_PRESETS = {
    "gpt3-1.3b": ("GPT-3 XL dims (1.42B counted)", dict(layers=24, hidden=2048, heads=16, ffn=8192, vocab=51200, seq=2048, global_batch=512)),
    "22b": ("22B (published runs)", dict(layers=48, hidden=6144, heads=64, ffn=24576, vocab=51200, seq=2048, global_batch=4)),
    "gpt3-175b": ("GPT-3 175B", dict(layers=96, hidden=12288, heads=96, ffn=49152, vocab=51200, seq=2048, global_batch=1536)),
    "mixtral-8x7b": ("Mixtral 8x7B-like MoE (8 experts top-2, 47.5B counted: no GQA)",
                     dict(layers=32, hidden=4096, heads=32, ffn=21504, vocab=32000, seq=4096, global_batch=1024, experts=8, top_k=2)),
}
DEFAULT_PRESET = "gpt3-1.3b"
DEFAULT_GPUS = 8
MODEL_FIELDS = ("layers", "hidden", "heads", "ffn", "vocab", "seq", "global_batch", "experts", "top_k")
LABELS = {"layers": "layers", "hidden": "hidden", "heads": "heads", "ffn": "ffn (default 4·hidden)", "vocab": "vocab",
          "seq": "sequence length", "global_batch": "global batch (sequences)", "experts": "MoE experts (0: dense)",
          "top_k": "MoE top-k", "gpus": "GPUs"}


def _presets() -> list[str]:
    try:
        from profiler.cluster import preset_names

        return preset_names()
    except Exception:  # noqa: BLE001 -- a broken preset folder shows as an empty list, and the callback says why
        return []


def _field(name: str, value):
    return html.Label([LABELS[name], dcc.Input(id=ids.PLAN_FORM[name], type="number", min=0 if name in ("experts", "top_k") else 1,
                                               step=1, value=value)])


def layout(preset: str | None = None, gpus: str | None = None, cluster: str | None = None, **_query):
    """The form, filled from the query where it names a preset, GPUs and a cluster we know
    (`/plan?preset=gpt3-175b&gpus=1024&cluster=a100`); anything else keeps the defaults."""
    preset = preset if isinstance(preset, str) and preset in MODEL_PRESETS else DEFAULT_PRESET
    dims = dict(zip(MODEL_FIELDS, preset_values(preset)))
    try:
        gpus = _whole("gpus", gpus, high=MAX_PAGE_GPUS)
    except ValueError:
        gpus = DEFAULT_GPUS
    clusters = _presets()
    if cluster not in clusters:
        cluster = "h100" if "h100" in clusters else (clusters[0] if clusters else None)
    return html.Div(className="page", children=[
        html.H2("Plan"),
        html.P(className="hint", children=[
            "Every parallel layout of a transformer on G GPUs (dp × tp × pp [× ep], ZeRO/FSDP, microbatches, pipeline "
            "schedule, recomputation), keeping those that divide and fit memory, ranked by predicted step time: ",
            html.Code("ptprof plan"), " in the browser (docs/whatif.md).",
        ]),
        html.Div(className="card", children=[
            html.Div(className="form-grid", children=[
                html.Label(["model preset", dcc.Dropdown(id=ids.PLAN_PRESET, value=preset, clearable=False,
                                                         options=[{"label": lbl, "value": k} for k, (lbl, _) in MODEL_PRESETS.items()])],
                           style={"gridColumn": "span 2"}),
                *[_field(f, dims[f]) for f in MODEL_FIELDS],
                html.Label(["attention", dcc.Checklist(id=ids.PLAN_FORM["flash_attention"], value=[],
                                                       options=[{"label": " flash (fused)", "value": "on"}])]),
                _field("gpus", gpus),
                html.Label(["cluster", dcc.Dropdown(id=ids.PLAN_FORM["cluster"], options=clusters, clearable=False, value=cluster)]),
                html.Label(["layouts shown", dcc.Dropdown(id=ids.PLAN_FORM["top"], options=list(TOP_CHOICES), value=10, clearable=False)]),
            ]),
            html.Button("Plan", id=ids.PLAN_BUTTON, className="button"),
        ]),
        dcc.Loading(html.Div(id=ids.PLAN_RESULT, children=html.P("Pick a model and a cluster, then Plan.", className="hint"))),
    ])


dash.register_page(__name__, path="/plan", name="Plan", title="ptprof · plan", order=3, layout=layout)


# ---------------------------------------------------------------------------------------------
# What the callbacks return, as plain functions of the form's values (tested directly)


def _whole(name: str, value, *, required: bool = True, low: int = 1, high: int = MAX_DIM) -> int | None:
    """A whole number from the browser (an int, an integral float, digits), within [low, high]."""
    label = LABELS.get(name, name)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            # the browser sends None for an invalid number input too (2048.5, -5 where min is 1)
            raise ValueError(f"{label}: a whole number ≥ {low} is needed (got an invalid or empty value)")
        return None
    if isinstance(value, bool):
        v = None
    elif isinstance(value, int):
        v = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        v = int(value)
    elif isinstance(value, str) and value.strip().isdigit():
        v = int(value.strip())
    else:
        v = None
    if v is None:
        raise ValueError(f"{label}: a whole number is needed, not {str(value)[:40]!r}")
    if not low <= v <= high:
        raise ValueError(f"{label} {v}: between {low} and {high} on this page")
    return v


def read_form(form: dict):
    """(ModelSpec, gpus, cluster preset name, top) from the form's values, or ValueError
    (LayoutError for a model that cannot be) naming the field."""
    from profiler.layout import ModelSpec

    if not isinstance(form, dict):
        raise ValueError("the form's values did not arrive")
    dims = {f: _whole(f, form.get(f)) for f in ("layers", "hidden", "heads", "seq", "global_batch")}
    hidden = dims.pop("hidden")
    ffn = _whole("ffn", form.get("ffn"), required=False) or 4 * hidden
    vocab = _whole("vocab", form.get("vocab"), required=False) or DEFAULT_VOCAB
    experts = _whole("experts", form.get("experts"), required=False, low=0) or 0
    top_k = _whole("top_k", form.get("top_k"), required=False, low=0) or 0
    if top_k and not experts:
        raise ValueError(f"MoE top-k {top_k} given without experts: set the experts (or top-k to 0)")
    if experts and not top_k:
        raise ValueError(f"MoE experts {experts} need a top-k (1 to {experts})")
    flash = form.get("flash_attention")
    if flash is not None and not isinstance(flash, list):
        raise ValueError(f"flash attention: a checkbox's list of values, not {str(flash)[:40]!r}")
    gpus = _whole("gpus", form.get("gpus"), high=MAX_PAGE_GPUS)
    spec = ModelSpec(hidden=hidden, ffn=ffn, vocab=vocab, experts=experts, top_k=top_k, flash_attention="on" in (flash or []),
                     **dims)
    spec.check()
    cluster = form.get("cluster")
    presets = _presets()
    if not isinstance(cluster, str) or cluster not in presets:
        raise ValueError(f"cluster {str(cluster)[:40]!r}: not a preset; pick one of {', '.join(presets) or '(none shipped)'}")
    top = form.get("top")
    top = top if isinstance(top, int) and not isinstance(top, bool) and 1 <= top <= plan_figures.TOP_MAX else 10
    return spec, gpus, cluster, top


# the CLI's flags in the planner's messages, as the form names them
FORM_WORDS = {"--moe": "MoE experts, top-k", "--global-batch": "global batch", "--seq": "sequence length",
              "--layers": "layers", "--hidden": "hidden", "--heads": "heads", "--ffn": "ffn", "--vocab": "vocab",
              "--gpus": "GPUs", "--flash-attention": "flash attention", "--cluster": "cluster"}


def form_words(message: str) -> str:
    """A planner message with its CLI flags (`--moe 2,4: ...`) in the form's field names."""
    message = re.sub(r"--moe (\d+),(\d+)", r"MoE experts \1, top-k \2", message)
    return re.sub(r"--[a-z-]+", lambda m: FORM_WORDS.get(m.group(0), m.group(0)), message)


OPTIONAL_DEFAULTS = {"ffn": "4·hidden", "vocab": str(DEFAULT_VOCAB), "experts": "0 (dense)", "top_k": "0 (dense)"}


def defaulted_note(form: dict) -> str:
    """' Defaults used: ffn 4·hidden (its box was empty or invalid).' -- the browser sends None for an
    invalid number box as for an empty one, so a default taken is said, never silent."""
    names = [f for f in OPTIONAL_DEFAULTS if form.get(f) is None or (isinstance(form.get(f), str) and not form[f].strip())]
    if not names:
        return ""
    return (" Defaults used: " + ", ".join(f"{LABELS[f].split(' (')[0]} {OPTIONAL_DEFAULTS[f]}" for f in names)
            + (" (their boxes were" if len(names) > 1 else " (its box was") + " empty or invalid).")


def _heading(spec, gpus: int, cluster, seconds: float) -> str:
    moe = f", MoE {spec.experts} experts top-{spec.top_k}" if spec.moe else ""
    moe += ", flash attention" if spec.flash_attention else ""
    return (f"{plan_figures.sig3(spec.count_params() / 1e9)} B parameters ({spec.layers} layers, hidden {spec.hidden}, "
            f"{spec.heads} heads, ffn {spec.ffn}, vocab {spec.vocab}, seq {spec.seq}, global batch {spec.global_batch}{moe}) "
            f"on {gpus} GPU{'s' if gpus != 1 else ''} of {cluster.name} ({plan_figures.sig3(cluster.peak_tflops)} TFLOP/s, "
            f"{cluster.hbm_gib:g} GiB HBM ({cluster.usable_hbm_bytes / 2**30:.4g} usable), {cluster.gpus_per_node} per node); planned in {seconds:.2f} s.")


def cli_command(spec, gpus: int, cluster: str) -> str:
    """The `ptprof plan` command that plans the same (no time limit, --json for a report)."""
    moe = f" --moe {spec.experts},{spec.top_k}" if spec.moe else ""
    moe += " --flash-attention" if spec.flash_attention else ""
    return (f"ptprof plan --layers {spec.layers} --hidden {spec.hidden} --heads {spec.heads} --ffn {spec.ffn} "
            f"--vocab {spec.vocab} --seq {spec.seq} --global-batch {spec.global_batch}{moe} --gpus {gpus} --cluster {cluster}")


def plan_result(form: dict):
    """The result area's children: the plan (viewer.plan_figures.plan_children), or one line
    saying why there is none."""
    try:
        spec, gpus, name, top = read_form(form)
        from profiler import plan as planner
        from profiler.cluster import load_cluster
        from profiler.plan_report import caveats, row_flags, rule_line, why_lines

        cluster = load_cluster(name)
        t0 = time.perf_counter()
        result = planner.plan(spec, gpus, cluster, time_limit_s=PLAN_TIME_LIMIT_S)  # bounded: a web request
        took = time.perf_counter() - t0
        # The CLI's words for why the best win and where the rule of thumb ranks (one truth for both).
        why, rule_text = why_lines(result, cluster), " ".join(" ".join(rule_line(result)).split())
        cautions = caveats(spec, result, top, cluster)
    except PlanTooLong:
        return html.Div([f"Refused: the search passed the page's {PLAN_TIME_LIMIT_S:g} s limit (these dims and GPUs have "
                         "many divisors, so millions of layouts). Fewer GPUs or a batch with fewer divisors plan faster; "
                         "the CLI has no limit: ", html.Code(cli_command(spec, gpus, name))], className="error")
    except ValueError as e:  # LayoutError, ClusterError and the form's own refusals
        return html.Div(f"Refused: {form_words(str(e))}", className="error")
    except Exception as e:  # noqa: BLE001 -- the page's rule: a line saying what failed, never a 500
        return html.Div(f"The plan failed: {type(e).__name__}: {e}", className="error")
    heading = [_heading(spec, gpus, cluster, took) + defaulted_note(form), " The same in a shell: ",
               html.Code(cli_command(spec, gpus, name))]
    return plan_figures.plan_children(result, top=top, heading=heading, table_id=ids.PLAN_TABLE,
                                      font=FONT, graph_config=GRAPH_CONFIG, why=why, rule_text=rule_text,
                                      cautions=cautions, flags=lambda est: row_flags(spec, est, cluster))


def preset_values(preset) -> list:
    """The model fields' values for a preset, in MODEL_FIELDS order (experts/top-k 0 when dense)."""
    if not isinstance(preset, str) or preset not in MODEL_PRESETS:
        raise dash.exceptions.PreventUpdate
    dims = MODEL_PRESETS[preset][1]
    return [dims.get(f, 0) for f in MODEL_FIELDS]


# ---------------------------------------------------------------------------------------------
# Callbacks


@callback(*[Output(ids.PLAN_FORM[f], "value") for f in MODEL_FIELDS], Input(ids.PLAN_PRESET, "value"), prevent_initial_call=True)
def fill_preset(preset):
    return preset_values(preset)


@callback(Output(ids.PLAN_RESULT, "children"), Input(ids.PLAN_BUTTON, "n_clicks"), *[State(i, "value") for i in ids.PLAN_FORM.values()],
          prevent_initial_call=True)
def show_plan(_clicks, *values):
    return plan_result(dict(zip(ids.PLAN_FORM, values)))
