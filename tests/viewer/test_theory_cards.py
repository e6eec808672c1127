"""Compare's Findings and Theory vs measured cards, on hand-made frames in the profiler's schemas
(FINDING_COLUMNS, CHECK_COLUMNS), and through the page's functions on the samples."""

from __future__ import annotations

import math

import polars as pl
import pytest

from profiler.findings import FINDING_COLUMNS
from profiler.theory import CHECK_COLUMNS
from tests.viewer.conftest import BROKEN, dash_post
from viewer import compare_data, ids
from viewer.theory_cards import (
    CHECK_INPUT,
    FINDING_INPUT,
    TOP_FINDINGS,
    build_theory_bytes_figure,
    collapse_check,
    findings_children,
    human,
    sig3,
    theory_children,
    theory_rows,
)

MiB = 2**20


def _text(component) -> str:
    """Every string inside a Dash component tree, one space between words (what a reader sees)."""
    return " ".join(_strings(component).split())


def _strings(component) -> str:
    if component is None:
        return ""
    if isinstance(component, (str, int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(_strings(c) for c in component)
    return _strings(getattr(component, "children", None))


def _find(component, cls: str) -> list:
    """Components with class `cls` in a tree."""
    out = []
    if isinstance(component, (list, tuple)):
        for c in component:
            out += _find(c, cls)
    elif component is not None and not isinstance(component, (str, int, float)):
        if cls in (getattr(component, "className", None) or "").split():
            out.append(component)
        out += _find(getattr(component, "children", None), cls)
    return out


def _findings(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([{c: r.get(c) for c in FINDING_COLUMNS} for r in rows], schema=FINDING_COLUMNS)


def _check(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=CHECK_COLUMNS, orient="row")


def test_schemas_are_the_profilers():
    # The cards read the profiler's frames: a renamed column there must fail here, not blank a card.
    assert FINDING_INPUT == FINDING_COLUMNS
    assert CHECK_INPUT == CHECK_COLUMNS


@pytest.mark.parametrize("v, unit, shown", [
    (3 * MiB, "bytes", "3.00 MiB"), (1536, "bytes", "1.50 KiB"), (1000, "bytes", "1000 B"), (2.5 * 2**30, "bytes", "2.50 GiB"),
    (12345.0, "us", "12.3 ms"), (0.5, "ms", "0.500 ms"), (0.04321, "gbps", "0.0432 GB/s"), (1.5, "phi", "1.50 Φ"),
    (33.333, "pct", "33.3 %"), (1.0, "x", "1.00×"), (12.0, "count", "12"), (7.0, "widgets", "7.00 widgets"),
    (None, "bytes", "—"), (float("nan"), "us", "—"), (float("inf"), "bytes", "—"), (0.0, "bytes", "0 B"), (-1234.5, "", "-1230"),
])
def test_human_units_three_significant_figures(v, unit, shown):
    assert human(v, unit) == shown


def test_sig3_never_uses_e_notation():
    for v in (123456.0, 0.000123, 99.95, 1.0):
        assert "e" not in sig3(v)
    assert sig3(123456.0) == "123000" and sig3(0.000123) == "0.000123"


# ---------------------------------------------------------------------------------------------
# Findings


def test_findings_ranked_with_evidence_and_change():
    f = _findings([
        dict(run="a", rank=None, rule="low", score=5.0, text="Low one.", evidence="step 2", change="Nothing."),
        dict(run=None, rank=None, rule="cmp", score=80.0, text="fsdp's step is 8.5× ddp's.", evidence="all-gather forward",
             change="Prefetch the next all-gather."),
        dict(run="b", rank=1, rule="straggler", score=None, text="Rank 1 is late.", evidence=None, change=None),
        dict(run="b", rank=0, rule="nan", score=float("nan"), text="NaN score.", evidence="", change="x"),
    ])
    body = findings_children(f, ["a", "b"])
    items = _find(body, "finding")
    assert [_text(i.children[0]).split("] ")[-1].strip() for i in items] == ["fsdp's step is 8.5× ddp's.", "Low one.", "Rank 1 is late.", "NaN score."]
    first = _text(items[0])
    assert "[comparison]" in first and "Evidence: all-gather forward" in first and "Try: Prefetch the next all-gather." in first
    assert "[b · rank 1]" in _text(items[2]) and "Evidence" not in _text(items[2]) and "Try" not in _text(items[2])
    assert not _find(body, "no-findings")


def test_only_the_top_findings_show_the_rest_behind_show_all():
    n = TOP_FINDINGS + 3
    f = _findings([dict(run="a", rule=f"r{i}", score=float(i), text=f"Finding {i}.") for i in range(n)])
    body = findings_children(f, ["a"])
    shown, details = body[0], body[1]
    assert len(shown.children) == TOP_FINDINGS
    assert _text(shown.children[0]).endswith(f"Finding {n - 1}.")  # highest score first
    assert "show all 11 findings" in _text(details.children[0])
    assert len(details.children[1].children) == 3 and details.children[1].start == TOP_FINDINGS + 1
    assert "[a]" not in _text(body)  # one run: no run label on each line


def test_no_findings_is_said_not_blank():
    for empty in (pl.DataFrame(schema=FINDING_COLUMNS), None, pl.DataFrame(schema={"run": pl.String})):
        body = findings_children(empty, ["a", "b"])
        assert _text(body) == "No findings: no rule fired on these runs."
    assert _text(findings_children(None, [], problems=["x: not analysed"])) == "x: not analysed No findings: no run loaded."


def test_a_finding_without_text_names_its_rule():
    body = findings_children(_findings([dict(run="a", rule="exposed_comm", score=1.0, text="  ")]), ["a"])
    assert "(rule exposed_comm gave no sentence)" in _text(body)


# ---------------------------------------------------------------------------------------------
# Theory vs measured


def _two_rank_check() -> pl.DataFrame:
    return _check([
        # ranks agree exactly: one line "all 2"
        ("ddp", 0, "all_reduce bytes/step", "bytes", 2.0 * MiB, 2.0 * MiB, 1.0, "match", None),
        ("ddp", 1, "all_reduce bytes/step", "bytes", 2.0 * MiB, 2.0 * MiB, 1.0, "match", None),
        # ranks differ, same verdict: min–max, the rank furthest from theory named
        ("ddp", 0, "params bytes", "bytes", 4.0 * MiB, 4.0 * MiB, 1.0, "match", "fp32"),
        ("ddp", 1, "params bytes", "bytes", 4.0 * MiB, 4.02 * MiB, 1.005, "match", "fp32"),
        # verdicts differ: "mixed", the odd rank with its verdict
        ("ddp", 0, "optimizer bytes", "bytes", 8.0 * MiB, 8.0 * MiB, 1.0, "match", None),
        ("ddp", 1, "optimizer bytes", "bytes", 8.0 * MiB, 4.0 * MiB, 0.5, "below", "sharded?"),
        # a foreign run's alpha-beta style row: no prediction
        ("x", 0, "exposed comm", "pct", None, 12.5, None, "no theory", None),
    ])


def test_collapse_across_ranks():
    col = collapse_check(_two_rank_check(), ["ddp", "x"]).to_dicts()
    assert [(r["run"], r["quantity"], r["agree"], r["n_ranks"]) for r in col] == [
        ("ddp", "all_reduce bytes/step", True, 2), ("ddp", "params bytes", False, 2), ("ddp", "optimizer bytes", False, 2),
        ("x", "exposed comm", True, 1)]
    params, opt = col[1], col[2]
    assert (params["measured_min"], params["measured_max"], params["odd_rank"], params["verdict"]) == (4 * MiB, 4.02 * MiB, 1, "match")
    assert (opt["verdict"], opt["odd_rank"], opt["odd_verdict"], opt["odd_measured"]) == ("mixed", 1, "below", 4 * MiB)
    assert opt["note"] == "sharded?" and params["note"] == "fp32"


def test_theory_rows_in_human_units():
    rows = theory_rows(_two_rank_check(), ["ddp", "x"])
    assert rows[0] == dict(run="ddp", quantity="all_reduce bytes/step", ranks="all 2", predicted="2.00 MiB", measured="2.00 MiB",
                           ratio="1.00×", verdict="match", note="")
    assert rows[1]["measured"] == "4.00 MiB – 4.02 MiB" and rows[1]["predicted"] == "4.00 MiB"
    assert rows[1]["ranks"] == "2 ranks differ; odd one: rank 1, measured 4.02 MiB"
    assert rows[2]["ranks"] == "2 ranks differ; odd one: rank 1, measured 4.00 MiB, below" and rows[2]["verdict"] == "mixed"
    assert rows[2]["ratio"] == "0.500× – 1.00×"
    assert rows[3] == dict(run="x", quantity="exposed comm", ranks="rank 0", predicted="—", measured="12.5 %", ratio="—",
                           verdict="no theory", note="")


def test_the_odd_rank_is_the_rarest_verdict():
    # Four ranks, three match and one is above: that one is named, whatever its position.
    rows = [("r", k, "q", "bytes", 100.0, 100.0 if k != 2 else 150.0, 1.0 if k != 2 else 1.5, "match" if k != 2 else "above", None)
            for k in range(4)]
    (row,) = collapse_check(_check(rows)).to_dicts()
    assert (row["odd_rank"], row["odd_verdict"], row["verdict"]) == (2, "above", "mixed")


def test_nan_in_the_check_is_not_shown_as_a_number():
    rows = theory_rows(_check([("r", 0, "q", "bytes", float("nan"), 10.0, float("nan"), "no theory", None)]))
    assert rows[0]["predicted"] == "—" and rows[0]["ratio"] == "—" and "nan" not in str(rows).lower()


def test_bytes_figure_predicted_beside_measured():
    fig = build_theory_bytes_figure(_two_rank_check(), ["ddp", "x"])
    pred, meas = fig.data
    assert list(pred.x) == ["all_reduce bytes/step", "params bytes", "optimizer bytes"]  # the pct row is not bytes
    assert list(pred.y) == [2.0, 4.0, 8.0]
    assert [round(v, 6) for v in meas.y] == [2.0, 4.01, 6.0]  # medians over the two ranks
    assert [round(v, 6) for v in meas.error_y.arrayminus] == [0.0, 0.01, 2.0]
    assert meas.customdata[2] == "6.00 MiB"
    empty = build_theory_bytes_figure(pl.DataFrame(schema=CHECK_COLUMNS))
    assert not empty.data and "no byte quantities" in empty.layout.annotations[0].text


def test_theory_card_says_why_a_run_has_no_rows():
    body = theory_children(pl.DataFrame(schema=CHECK_COLUMNS), {"ddp": True, "foreign": False}, ["ddp", "foreign", "gone"],
                           table_id="t", graph_config={}, font="x")
    text = _text(body)
    assert "ddp: no predicted quantity for this run" in text
    assert "foreign: no theory for foreign traces (no run.json" in text
    assert "gone: not analysed" in text
    body = theory_children(_two_rank_check(), {"ddp": True, "x": False}, ["ddp", "x"], table_id="t", graph_config={}, font="x")
    table = [c for c in body if getattr(c, "id", None) == "t"][0]
    assert len(table.data) == 4 and table.data[0]["verdict"] == "match"
    assert any(s["if"]["filter_query"] == '{verdict} = "below"' for s in table.style_data_conditional)


# ---------------------------------------------------------------------------------------------
# The page on the samples (findings monkeypatched: the rules are the profiler's, tested there)


def test_merged_analysis_labels_every_frame_by_run_id(store):
    runs = store.get_many(["sample-ddp-2r", "sample-1f1b-2r"])
    m = compare_data.merged_analysis(runs)
    assert set(m.runs) == {"sample-ddp-2r", "sample-1f1b-2r"}
    assert set(m.steps["run"].cast(pl.String)) == {"sample-ddp-2r", "sample-1f1b-2r"}
    assert m.steps.height == sum(d.analysis.steps.height for d in runs)
    assert set(m.pipeline["run"].cast(pl.String)) == {"sample-1f1b-2r"}  # ddp has no pipeline frame
    assert m.theory_check.schema == runs[0].analysis.theory_check.schema


def test_findings_card_shows_the_comparison(store, pages, monkeypatch):
    seen = {}

    def fake(a):
        seen["runs"] = sorted(a.runs)
        ddp, fsdp = (a.step_stats.filter(pl.col("run") == r)["mean_us"].mean() for r in ("sample-ddp-2r", "sample-fsdp-2r"))
        return _findings([dict(run=None, rule="headline", score=90.0, text=f"fsdp's step is {fsdp / ddp:.1f}× ddp's.",
                               evidence="mean step", change="Try ddp.")])

    monkeypatch.setattr("profiler.findings.findings", fake)
    body = pages.compare.findings_card(store, ["sample-ddp-2r", "sample-fsdp-2r", BROKEN])
    assert seen["runs"] == ["sample-ddp-2r", "sample-fsdp-2r"]  # the broken run is left out, named first
    assert _text(body[0]).startswith(f"{BROKEN}: not analysed, so no findings")
    (item,) = _find(body, "finding")
    assert "[comparison] fsdp's step is" in _text(item) and "Try: Try ddp." in _text(item)
    ratio = float(_text(item).split("step is ")[1].split("×")[0])
    assert math.isfinite(ratio) and ratio > 0


def test_a_failing_comparison_keeps_each_runs_findings(store, pages, monkeypatch):
    def boom(a):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("profiler.findings.findings", boom)
    body = pages.compare.findings_card(store, ["sample-ddp-2r", "sample-fsdp-2r"])
    assert "the findings comparing these runs failed (ZeroDivisionError: division by zero)" in _text(body)
    assert _find(body, "warning") and (_find(body, "finding") or _find(body, "no-findings"))


def test_theory_card_of_a_foreign_trace_says_so(store, pages):
    body = pages.compare.theory_card(store, ["foreign-trace"])
    text = _text(body)
    assert "foreign-trace: no theory for foreign traces (no run.json" in text
    # with measured rows beside it, and only then, the line says they are measurements alone
    tables = [c for c in body if getattr(c, "id", None) == ids.COMPARE_THEORY_TABLE]
    has_rows = bool(tables and tables[0].data)
    assert ("its measured bytes are shown without a prediction" in text) == has_rows


@pytest.mark.parametrize("output", [f"{ids.COMPARE_FINDINGS}.children", f"{ids.COMPARE_THEORY}.children"])
def test_cards_over_http(app, output):
    res = dash_post(app, output, ["sample-ddp-2r", "foreign-trace"])
    assert res.status_code == 200, res.get_data(as_text=True)[-300:]
    body = res.get_data(as_text=True)
    if output.startswith(ids.COMPARE_FINDINGS):
        assert "No findings" in body or '"finding"' in body
    else:
        assert "foreign-trace: no theory for foreign traces" in body


def test_theory_card_shows_a_runs_check_under_its_folder_name(store, pages):
    # A run's theory_check as the profiler labels it (its own name for the run), carried to the card under
    # the folder's id, with the foreign run beside it saying why it has none.
    import dataclasses
    import types

    ddp = store.get("sample-ddp-2r")
    check = _check([("run-json-id", k, "all_reduce bytes/step", "bytes", 1.5 * MiB, 1.5 * MiB, 1.0, "match", None) for k in (0, 1)])
    patched = dataclasses.replace(ddp, analysis=dataclasses.replace(ddp.analysis, theory_check=check), _derived={})
    fake = types.SimpleNamespace(get_many=lambda ids: [patched if r == "sample-ddp-2r" else store.get(r) for r in ids])
    body = pages.compare.theory_card(fake, ["sample-ddp-2r", "foreign-trace"])
    (table,) = [c for c in body if getattr(c, "id", None) == ids.COMPARE_THEORY_TABLE]
    ours = [r for r in table.data if r["run"] == "sample-ddp-2r"]
    assert ours == [dict(run="sample-ddp-2r", quantity="all_reduce bytes/step", ranks="all 2", predicted="1.50 MiB",
                         measured="1.50 MiB", ratio="1.00×", verdict="match", note="")]
    # the foreign run's rows are measurements alone: no prediction, verdict "no theory"
    theirs = [r for r in table.data if r["run"] != "sample-ddp-2r"]
    assert theirs and all(r["run"] == "foreign-trace" and r["predicted"] == "—" and r["verdict"] == "no theory" for r in theirs)
    assert "foreign-trace: no theory for foreign traces" in _text(body)
