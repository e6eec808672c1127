"""The Plan page: its pure builders (viewer.plan_figures) on hand-made Estimates and PlanResults,
and its callback function on good and bad forms (no browser)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from profiler.layout import Estimate, Layout
from profiler.plan import PlanResult
from tests.viewer.conftest import dash_post
from tests.viewer.test_theory_cards import _find, _text
from viewer import ids
from viewer.plan_figures import (
    PURE_PLAN_LINE,
    ROT_OUTLINE,
    TABLE_COLUMNS,
    TOP_MAX,
    UNATTRIBUTED,
    assumption_lines,
    build_plan_breakdown_figure,
    build_plan_memory_figure,
    plan_children,
    plan_entries,
    plan_table_rows,
    refused_lines,
)

GiB = 2**30
HBM = 80 * GiB
USABLE = 78 * GiB  # HBM less a 2 GiB reserve: what `fits` and the table's "% of usable HBM" compare with


def _est(dp, tp, pp, breakdown, *, params_gib=10.0, grads_gib=5.0, opt_gib=20.0, act_gib=15.0, step=None, mfu=40.0) -> Estimate:
    mem = {"params": int(params_gib * GiB), "grads": int(grads_gib * GiB), "optimizer": int(opt_gib * GiB),
           "activations": int(act_gib * GiB)}
    mem["total"] = sum(mem.values())
    return Estimate(layout=Layout(dp=dp, tp=tp, pp=pp, microbatches=4), step_s=sum(breakdown.values()) if step is None else step,
                    breakdown_s=breakdown, mfu_pct=mfu, memory_bytes=mem, hbm_bytes=HBM, usable_hbm_bytes=USABLE,
                    fits=mem["total"] <= USABLE,
                    assumptions=["link efficiency 0.8 assumed"], dominant="compute efficiency ±20 % moves the step ±0.2 s")


# Three fitting layouts, fastest first (steps 1.0, 1.25, 1.75 s), written out by hand.
A = _est(8, 1, 1, {"compute": 0.8, "comm_exposed:dp": 0.2, "comm_exposed:cp": 0.0})  # 1.0 s (cp: zero everywhere, not drawn)
B = _est(4, 2, 1, {"compute": 0.8, "comm_exposed:dp": 0.1, "comm_exposed:tp": 0.35})  # 1.25 s
C = _est(2, 2, 2, {"compute": 0.8, "comm_exposed:tp": 0.35, "bubble": 0.5, "optimizer": 0.1})  # 1.75 s
TOO_BIG = _est(1, 8, 1, {"compute": 0.9, "comm_exposed:tp": 0.4}, act_gib=60.0)  # 95 GiB > 80 GiB HBM


def _result(ranked, rot=None, rot_rank=None, **kw) -> PlanResult:
    return PlanResult(ranked=ranked, considered=kw.get("considered", 40), refused=kw.get("refused", {"does not fit HBM": 30, "tp does not divide heads": 7}),
                      rule_of_thumb=rot, rule_of_thumb_rank=rot_rank, assumptions=kw.get("assumptions", ["gemm efficiency 0.8 of peak"]))


def _bars(fig):
    return [t for t in fig.data if t.type == "bar"]


def test_breakdown_bars_stack_to_each_step():
    fig = build_plan_breakdown_figure(plan_entries(_result([A, B, C]), 10))
    bars = _bars(fig)
    assert list(bars[0].x) == ["#1", "#2", "#3"]
    # One trace per breakdown key, known keys in a fixed order.
    assert [t.name for t in bars] == ["compute", "exposed tp comm", "exposed dp comm", "pipeline bubble", "optimizer step"]
    totals = [sum(t.y[i] for t in bars) for i in range(3)]
    assert totals == pytest.approx([1.0, 1.25, 1.75])
    assert {t.marker.color for t in bars if t.name.startswith("exposed")} <= {"#F58518", "#FFBF79"}
    assert not [t for t in bars if t.name == UNATTRIBUTED]


def test_a_breakdown_short_of_the_step_shows_the_rest_as_unattributed():
    short = _est(8, 1, 1, {"compute": 1.5}, step=2.0)
    bars = _bars(build_plan_breakdown_figure(plan_entries(_result([short]), 10)))
    assert [t.name for t in bars] == ["compute", UNATTRIBUTED]
    assert bars[1].y[0] == pytest.approx(0.5) and sum(t.y[0] for t in bars) == pytest.approx(2.0)


def test_memory_bars_stack_parts_under_the_hbm_line():
    fig = build_plan_memory_figure(plan_entries(_result([A, B]), 10))
    bars = _bars(fig)
    assert [t.name for t in bars] == ["parameters", "gradients", "optimizer state", "activations"]
    assert [sum(t.y[i] for t in bars) for i in range(2)] == pytest.approx([50.0, 50.0])  # 10 + 5 + 20 + 15 GiB
    hbm, usable = fig.layout.shapes
    assert hbm.y0 == hbm.y1 == pytest.approx(80.0) and hbm.line.dash == "dash"  # the cluster's HBM, GiB
    assert usable.y0 == usable.y1 == pytest.approx(78.0) and usable.line.dash == "dot"  # less the reserve
    assert [a.text for a in fig.layout.annotations] == ["HBM 80.0 GiB", "usable 78.0 GiB"]


def test_rule_of_thumb_in_the_top_is_highlighted_in_place():
    entries = plan_entries(_result([A, B, C], rot=B, rot_rank=2), 10)
    assert [e.label for e in entries] == ["#1", "#2 rule of thumb", "#3"]
    for fig in (build_plan_breakdown_figure(entries), build_plan_memory_figure(entries)):
        for t in _bars(fig):
            assert list(t.marker.line.width) == [0, ROT_OUTLINE["width"], 0]
    rows = plan_table_rows(entries)
    assert [r["note"] for r in rows] == ["", "rule of thumb", ""]


def test_rule_of_thumb_below_the_top_or_not_fitting_is_appended():
    ranked = [A] * 30
    low = plan_entries(_result(ranked, rot=C, rot_rank=25), 5)
    assert [e.label for e in low] == ["#1", "#2", "#3", "#4", "#5", "#25 rule of thumb"]
    # Ranked at 2 where another layout sits (the planner's rank is where its step would slot in):
    # that row is not called the rule's; the rule's own row is added.
    other = _est(2, 4, 1, {"compute": 1.1})
    elsewhere = plan_entries(_result([A, B, C], rot=other, rot_rank=2), 10)
    assert [e.label for e in elsewhere] == ["#1", "#2", "#3", "#2 rule of thumb"] and elsewhere[-1].estimate is other
    unfit = plan_entries(_result([A, B], rot=TOO_BIG, rot_rank=None), 10)
    assert [e.label for e in unfit] == ["#1", "#2", "rule of thumb (does not fit)"]
    row = plan_table_rows(unfit)[-1]
    assert row["rank"] is None and row["note"] == "rule of thumb, does not fit HBM"
    # 95 / 78 GiB usable = 121.79 %, to 3 figures (not 95 / 80 = 119 %: the column is against usable HBM)
    assert row["memory_gib"] == 95.0 and row["hbm_pct"] == pytest.approx(122.0)
    assert sum(t.y[2] for t in _bars(build_plan_memory_figure(unfit))) == pytest.approx(95.0)  # drawn above the line


def test_at_most_top_max_layouts_are_shown():
    assert len(plan_entries(_result([A] * 100), 500)) == TOP_MAX
    assert len(plan_entries(_result([A] * 100), 0)) == 1


def test_table_rows_carry_the_numbers():
    (row,) = plan_table_rows(plan_entries(_result([C]), 10))
    assert row["layout"] == "dp=2 tp=2 pp=2 z0 mb=1x4 1f1b"  # the CLI's table's form (plan_report.compact)
    assert (row["rank"], row["step_s"], row["mfu_pct"], row["memory_gib"]) == (1, 1.75, 40.0, 50.0)
    # 50 / 78 GiB usable = 64.10 %; tp 0.35 s; bubble 0.5 of 1.75 s = 28.6 % (a share of the step, as the CLI's column)
    assert (row["hbm_pct"], row["exposed_comm_s"], row["bubble_pct"]) == (64.1, 0.35, 28.6)
    assert [c[1] for c in TABLE_COLUMNS if c[0] == "hbm_pct"] == ["% of usable HBM"]


def test_non_finite_numbers_are_not_shown_as_numbers():
    odd = Estimate(layout=Layout(dp=8), step_s=1.0, breakdown_s={"compute": 1.0}, mfu_pct=math.nan,
                   memory_bytes={"total": 10 * GiB}, hbm_bytes=HBM, fits=True)
    (row,) = plan_table_rows(plan_entries(_result([odd]), 10))
    assert row["mfu_pct"] is None
    assert row["hbm_pct"] is None  # no usable HBM carried: no share of it (never one of the raw HBM under that name)


def test_refusals_and_assumptions_are_said():
    r = _result([A, B, C], refused={"layouts over HBM": 30, "splits where tp does not divide the heads": 7, "unused": 0})
    r.splits, r.seconds, r.pruning_check = 5, 0.25, "the 4 pruned neighbours of the top 3 were estimated: 0 faster"
    assert refused_lines(r) == ["40 layouts searched of 5 dividing dp·tp·pp splits in 0.250 s; 3 fit and are ranked.",
                                "30 layouts over HBM", "7 splits where tp does not divide the heads",
                                "Pruning check: the 4 pruned neighbours of the top 3 were estimated: 0 faster."]
    lines = assumption_lines(r)
    assert lines[0] == PURE_PLAN_LINE and "compute efficiency" in lines[0] and "assumed" in lines[0]
    assert lines[1:] == ["gemm efficiency 0.8 of peak", "link efficiency 0.8 assumed",
                         "Dominant uncertainty of #1: compute efficiency ±20 % moves the step ±0.2 s"]
    # The planner saying it already: not said twice.
    said = _result([A], assumptions=["compute efficiency is assumed (no trace informs a pure plan): roofline"])
    assert assumption_lines(said)[0].startswith("compute efficiency is assumed") and PURE_PLAN_LINE not in assumption_lines(said)


def test_the_result_area_has_every_part_and_nothing_fitting_is_an_error():
    lines = dict(why=["#1: the CLI's words"], rule_text="rule of thumb: its words")  # plan_report's, as the page passes
    body = plan_children(_result([A, B, C], rot=B, rot_rank=2), top=10, heading="h", table_id="t", font="x", **lines)
    text = _text(body)
    for title in ("Ranked layouts", "Why they win", "Where the step goes", "Memory per GPU", "Refused", "Assumptions"):
        assert title in text
    assert not _find(body, "error")
    nothing = _result([], rot=TOO_BIG, rot_rank=None, refused={"layouts over HBM": 40})
    (err,) = _find(plan_children(nothing, top=10, heading="h", table_id="t", font="x", **lines), "error")
    assert _text(err) == "No layout divides this model and batch: 40 layouts over HBM"
    nothing.min_memory_bytes = 95 * GiB
    none = plan_children(nothing, top=10, heading="h", table_id="t", font="x", **lines)
    (err,) = _find(none, "error")
    assert _text(err) == ("No layout fits: the smallest memory need of any layout is 95.0 GiB per GPU (more GPUs, a smaller "
                          "model or a smaller global batch): 40 layouts over HBM")
    assert "rule of thumb: its words" in _text(none)
    assert "#1: the CLI's words" in text and "rule of thumb: its words" in text


# ---------------------------------------------------------------------------------------------
# The page's callback function (needs the app: pages register themselves)


GOOD = dict(layers=2, hidden=256, heads=8, ffn=1024, vocab=1000, seq=128, global_batch=16, experts=0, top_k=0, gpus=8,
            cluster="h100", top=10)


@pytest.fixture(scope="module")
def plan_page(app):
    from viewer.pages import plan

    return plan


@pytest.mark.parametrize("change, says", [
    (dict(heads=7), "hidden 256 is not divisible by heads 7"),  # the form's names, not the CLI's flags
    (dict(cluster="nowhere"), "cluster 'nowhere': not a preset"),
    (dict(cluster="/etc/passwd"), "cluster '/etc/passwd': not a preset"),
    (dict(hidden="abc"), "hidden: a whole number is needed, not 'abc'"),
    # the browser sends None for an invalid number (2048.5, -5): not "a value is needed"
    (dict(layers=None), "layers: a whole number ≥ 1 is needed (got an invalid or empty value)"),
    (dict(seq=2.5), "sequence length: a whole number is needed"),
    (dict(gpus=10**9), "GPUs 1000000000: between 1 and 16384"),
    (dict(top_k=2), "MoE top-k 2 given without experts"),
    (dict(experts=4, top_k=5), "MoE experts 4, top-k 5"),
    (dict(gpus=True), "GPUs: a whole number is needed"),
])
def test_bad_input_is_one_error_line(plan_page, change, says):
    out = plan_page.plan_result({**GOOD, **change})
    assert out.className == "error" and says in _text(out)
    assert "Traceback" not in _text(out)


def test_the_callback_answers_any_input_with_a_line(app, plan_page):
    res = dash_post(app, f"{ids.PLAN_RESULT}.children", 1, state=["x"] * len(ids.PLAN_FORM))
    assert res.status_code == 200 and "whole number is needed" in res.get_data(as_text=True)
    assert plan_page.plan_result(None).className == "error"


def test_presets_fill_valid_models(plan_page):
    from profiler.layout import ModelSpec

    for name, (_label, dims) in plan_page.MODEL_PRESETS.items():
        values = dict(zip(plan_page.MODEL_FIELDS, plan_page.preset_values(name)))
        ModelSpec(**values).check()
    gpt3 = dict(zip(plan_page.MODEL_FIELDS, plan_page.preset_values("gpt3-175b")))
    assert ModelSpec(**gpt3).count_params() == pytest.approx(175e9, rel=0.02)  # GPT-3's 175B


def test_the_mixtral_preset_counts_mixtral_s_published_size(plan_page):
    """Mixtral 8x7B: 46.7 B total parameters (Jiang et al. 2024). Its SwiGLU width 14336 is passed as
    ffn = 1.5 x 14336 = 21504 (three matrices of hidden x 14336 = two of hidden x 21504); without GQA
    (8 KV heads of 32 count as 32) K and V add 32 layers x 2 x 4096 x 3072 = 0.81 B: within 2 %."""
    from profiler.layout import ModelSpec

    label, dims = plan_page.MODEL_PRESETS["mixtral-8x7b"]
    assert dims["ffn"] == 21504
    counted = ModelSpec(**dims).count_params()
    assert counted == pytest.approx(46.7e9, rel=0.02)
    assert f"{counted / 1e9:.1f}B counted" in label and "GQA" in label


def test_a_good_form_gives_the_ranked_table(plan_page):
    """The real planner (profiler.plan) on a small model on 8 GPUs: a table of ranked layouts."""
    form = {**GOOD, "cluster": plan_page._presets()[0]} if "h100" not in plan_page._presets() else GOOD
    out = plan_page.plan_result(form)
    assert not _find(out, "error"), _text(out)
    (table,) = [c for c in _walk(out) if getattr(c, "id", None) == ids.PLAN_TABLE]
    assert 1 <= len(table.data) <= 10 and table.data[0]["rank"] == 1
    steps = [r["step_s"] for r in table.data if r["rank"] is not None]
    # fastest first but for the near-tie band (profiler.plan.prefer_in_band: within 2 % of the fastest)
    assert steps[0] <= 1.02 * min(steps) and all(s > 0 for s in steps)
    assert "compute efficiency is assumed" in _text(out)  # a pure plan says so
    # layouts as the CLI's table writes them (plan_report.compact) in the table as in the why lines; both parse back
    from profiler.layout import parse_layout
    from profiler.plan_report import compact

    assert all(compact(parse_layout(r["layout"])[0]) == r["layout"] and " z" in f" {r['layout']}" for r in table.data)
    # Both figures drawn from the real estimates: the step's parts stack to the table's step.
    step_fig, memory_fig = [c.figure for c in _walk(out) if type(c).__name__ == "Graph"]
    bars = [t for t in step_fig.data if t.type == "bar"]
    assert [sum(t.y[i] for t in bars) for i in range(len(table.data))] == pytest.approx([r["step_s"] for r in table.data], rel=5e-3)  # the table: 3 figures
    from profiler.cluster import load_cluster

    h100 = load_cluster("h100")  # the page draws the preset's HBM, and what `fits` compares with
    assert [sh.y0 for sh in memory_fig.layout.shapes] == pytest.approx([h100.hbm_bytes / GiB, h100.usable_hbm_bytes / GiB])


def _walk(component):
    if isinstance(component, (list, tuple)):
        for c in component:
            yield from _walk(c)
    elif component is not None and not isinstance(component, (str, int, float)):
        yield component
        yield from _walk(getattr(component, "children", None))


def test_a_search_past_the_time_limit_is_stopped_with_the_cli_command(plan_page, monkeypatch):
    monkeypatch.setattr(plan_page, "PLAN_TIME_LIMIT_S", 0.0)
    out = plan_page.plan_result(GOOD)
    assert out.className == "error" and "passed the page's 0 s limit" in _text(out)
    assert "ptprof plan --layers 2 --hidden 256 --heads 8 --ffn 1024 --vocab 1000 --seq 128 --global-batch 16 --gpus 8 --cluster h100" in _text(out)


def test_the_cli_command_is_one_ptprof_plan_takes(plan_page):
    from profiler.cli_whatif import build_plan_parser
    from profiler.layout import ModelSpec

    spec = ModelSpec(layers=32, hidden=4096, heads=32, ffn=14336, vocab=32000, seq=4096, global_batch=1024, experts=8, top_k=2,
                     flash_attention=True)
    cmd = plan_page.cli_command(spec, 512, "h100")
    args = build_plan_parser().parse_args(cmd.split()[2:])
    assert (args.layers, args.hidden, args.heads, args.ffn, args.vocab, args.seq, args.global_batch, args.moe, args.gpus,
            args.cluster, args.flash_attention) == (32, 4096, 32, 14336, 32000, 4096, 1024, "8,2", 512, "h100", True)


def test_flash_attention_reaches_the_model(plan_page):
    spec, *_ = plan_page.read_form({**GOOD, "flash_attention": ["on"]})
    assert spec.flash_attention and not plan_page.read_form(GOOD)[0].flash_attention
    out = plan_page.plan_result({**GOOD, "flash_attention": "on"})
    assert out.className == "error" and "flash attention: a checkbox's list of values" in _text(out)


def test_the_query_fills_the_form_and_odd_values_keep_the_defaults(plan_page):
    def values(page):
        return {c.id: c.value for c in _walk(page) if getattr(c, "id", None) in (*ids.PLAN_FORM.values(), ids.PLAN_PRESET)}

    linked = values(plan_page.layout(preset="gpt3-175b", gpus="1024", cluster="a100"))
    assert (linked[ids.PLAN_PRESET], linked[ids.PLAN_FORM["layers"]], linked[ids.PLAN_FORM["hidden"]]) == ("gpt3-175b", 96, 12288)
    assert (linked[ids.PLAN_FORM["gpus"]], linked[ids.PLAN_FORM["cluster"]]) == (1024, "a100")
    odd = values(plan_page.layout(preset="<script>", gpus="1e9", cluster="../etc"))
    assert (odd[ids.PLAN_PRESET], odd[ids.PLAN_FORM["layers"]], odd[ids.PLAN_FORM["gpus"]], odd[ids.PLAN_FORM["cluster"]]) == \
        ("gpt3-1.3b", 24, 8, "h100")


def test_error_messages_use_the_form_names(plan_page):
    assert "--" not in plan_page.plan_result({**GOOD, "heads": 7}).children


def test_heading_says_one_gpu_and_the_preset_its_counted_size(plan_page):
    from profiler.cluster import load_cluster
    from profiler.layout import ModelSpec

    spec = ModelSpec(**plan_page.MODEL_PRESETS["gpt3-1.3b"][1])
    assert " on 1 GPU of " in plan_page._heading(spec, 1, load_cluster("h100"), 0.1)
    assert " on 8 GPUs of " in plan_page._heading(spec, 8, load_cluster("h100"), 0.1)
    # h100.toml: 79.65 GiB HBM less the 2 GiB default reserve = 77.65 GiB usable, what `fits` compares with
    assert "79.65 GiB HBM (77.65 usable)" in plan_page._heading(spec, 8, load_cluster("h100"), 0.1)
    # 24 layers x 12 x 2048^2 + (51200 + 2048) x 2048 embeddings ~ 1.42 B: the label says the counted size
    assert f"{spec.count_params() / 1e9:.2f}B" in plan_page.MODEL_PRESETS["gpt3-1.3b"][0] == "GPT-3 XL dims (1.42B counted)"


def test_assumptions_say_the_pure_plan_once():
    said = _result([replace(A, assumptions=["compute efficiency assumed (no trace informs it)", "link x"])],
                   assumptions=["compute efficiency is assumed (no trace informs a pure plan): roofline"])
    lines = assumption_lines(said)
    assert sum("compute efficiency" in l and "assumed" in l for l in lines) == 1 and "link x" in lines


def test_the_page_says_the_caveats_and_flags_rows(plan_page):
    form = {**GOOD, "flash_attention": ["on"]}
    out = plan_page.plan_result(form)
    text = _text(out)
    assert "5-12 % faster than measured" in text and "no measurement validated: " in text
    (table,) = [c for c in _walk(out) if getattr(c, "id", None) == ids.PLAN_TABLE]
    assert "fused (flash) attention" in table.data[0]["note"]
    assert table.style_table["overflowX"] == "auto"


def test_a_default_taken_for_an_empty_or_invalid_box_is_said(plan_page):
    # the browser sends None for ffn = 2048.5 as for an empty box: the page uses 4 x hidden and says so
    assert plan_page.defaulted_note({**GOOD, "ffn": None}) == " Defaults used: ffn 4·hidden (its box was empty or invalid)."
    assert plan_page.defaulted_note(GOOD) == ""
    out = plan_page.plan_result({**GOOD, "ffn": None, "vocab": ""})
    assert "Defaults used: ffn 4·hidden, vocab 51200 (their boxes were empty or invalid)." in _text(out)
