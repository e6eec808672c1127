"""Component ids, one constant each, prefixed by page, so callbacks and tests agree on them."""

# Runs page
RUNS_TABLE = "runs-table"
RUNS_RELOAD = "runs-reload"
RUNS_COMPARE_LINK = "runs-compare-link"
RUNS_HINT = "runs-hint"
RUNS_PROGRESS = "runs-progress"  # "Analysing runs: 3 of 17 done…"
RUNS_POLL = "runs-poll"  # dcc.Interval: asks for runs analysed since, while any is pending
RUNS_DONE = "runs-done"  # dcc.Store: [rows, pending] last shown, so an idle poll changes nothing

# Compare page
COMPARE_RUNS = "compare-runs"  # dcc.Store: the run ids, in the order picked
COMPARE_STATUS = "compare-status"
COMPARE_FINDINGS = "compare-findings"  # the first card's body: ranked findings of the compared runs
COMPARE_THEORY = "compare-theory"  # theory vs measured: a line per run without theory, table, bytes figure
COMPARE_THEORY_TABLE = "compare-theory-table"
COMPARE_TIMELINE = "compare-timeline"
COMPARE_VIEW = "compare-view"  # dcc.Dropdown: groups (""), "group:stage1" or "rank:17": the drill-down at scale
COMPARE_BREAKDOWN = "compare-breakdown"
COMPARE_PIPELINE = "compare-pipeline"
COMPARE_MEMORY = "compare-memory"
COMPARE_PERSISTENT = "compare-persistent"
COMPARE_COLLECTIVES = "compare-collectives"
COMPARE_STEPS = "compare-steps"

# Open page
OPEN_PATH = "open-path"
OPEN_BUTTON = "open-button"
OPEN_UPLOAD = "open-upload"
OPEN_RESULT = "open-result"

# Plan page: the form's inputs (PLAN_FORM: field -> id, in the callback's State order), the button, the result
PLAN_PRESET = "plan-preset"  # dcc.Dropdown: fills the model fields
PLAN_FORM = {
    "layers": "plan-layers", "hidden": "plan-hidden", "heads": "plan-heads", "ffn": "plan-ffn", "vocab": "plan-vocab",
    "seq": "plan-seq", "global_batch": "plan-global-batch", "experts": "plan-experts", "top_k": "plan-top-k",
    "flash_attention": "plan-flash-attention", "gpus": "plan-gpus", "cluster": "plan-cluster", "top": "plan-top",
}
PLAN_BUTTON = "plan-button"
PLAN_RESULT = "plan-result"
PLAN_TABLE = "plan-table"
