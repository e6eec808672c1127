"""`--hta` on nanosecond traces: ptprof keeps exact times, and names HTA's rounding as the difference."""

from __future__ import annotations

import json

import pytest

from profiler.hta import compare_with_hta, has_sub_us_times, hta_rounding, rounded_breakdown
from tests.conftest import SHARED_TRACES
from tests.profiler.conftest import kernel, launch, make_events, step
from tests.profiler.test_cli import analyze

# Two steps [0, 100). Kernels [10.4, 20.6) and [20.7, 30.2): exact busy 10.2 + 9.5 = 19.7 over a
# window of 10.4..30.2 = 19.8. HTA rounds inward: [11, 20) and [21, 30): busy 18, window 11..30 = 19.
NS = [step(1, 0, 50), step(2, 50, 50), launch(1, 1), launch(2, 2),
      kernel("a", "compute", 10.4, 10.2, 1), kernel("b", "compute", 20.7, 9.5, 2)]


def test_rounding_by_hand():
    ev = make_events(NS)
    assert has_sub_us_times(ev) and not has_sub_us_times(make_events([step(1, 0, 10)]))
    k = hta_rounding(ev).filter(ev["device"] == "gpu")
    assert k.select("ts_us", "end_us", "dur_us").rows() == [(11, 20, 9), (21, 30, 9)]
    row = rounded_breakdown([ev]).row(0, named=True)
    assert (row["window_us_rounded"], row["compute_us_rounded"], row["idle_us_rounded"]) == (19, 18, 1)


def test_an_event_inside_one_microsecond_becomes_empty():
    k = hta_rounding(make_events([kernel("a", "compute", 3.2, 0.5, 1)]))
    assert k.select("ts_us", "end_us", "dur_us").row(0) == (4, 4, 0)


def test_comparison_names_the_rounding_only_where_it_applies():
    ours = make_events(NS)
    from profiler import temporal_breakdown

    hta = temporal_breakdown(hta_rounding(ours)).select("rank", "window_us", "compute_us", "non_compute_us", "idle_us", "overlap_pct")
    table = compare_with_hta(temporal_breakdown(ours), hta, rounded_breakdown([ours])).row(0, named=True)
    assert "rounds each event inward" in table["cause"]
    assert table["compute_us_diff_pct_of_window"] == pytest.approx(100 * 1.7 / 19)
    assert table["compute_us_rounded_diff_pct_of_window"] == 0
    whole = make_events([step(1, 0, 50), launch(1, 1), kernel("a", "compute", 10, 10, 1)])
    plain = compare_with_hta(temporal_breakdown(whole), temporal_breakdown(whole).select(hta.columns), rounded_breakdown([whole]))
    assert plain["cause"].to_list() == [None] and plain["compute_us_rounded"].to_list() == [None]


def test_cli_hta_on_a_nanosecond_trace(tmp_path):
    # HTA on this file (0.5.0): window 480,029, compute 464,915, non-compute 2,971, idle 12,143 µs;
    # ptprof's exact compute is 468,173.25 (0.68 % of the window more).
    out = tmp_path / "r.json"
    res = analyze(SHARED_TRACES / "single" / "v100_ns_resolution_rank0.json.gz", "--hta", "--json", out)
    assert res.returncode == 0, res.stderr
    assert "Why they differ: nanosecond timestamps: HTA rounds each event inward" in res.stdout
    (row,) = json.loads(out.read_text())["hta"][0]["ranks"]
    assert row["compute_us"] == pytest.approx(468173.25) and row["compute_us_hta"] == 464915
    assert "rounds" in row["cause"]
    for c in ("compute_us", "non_compute_us", "idle_us"):
        assert abs(row[f"{c}_rounded_diff_pct_of_window"]) <= 0.5, (c, row)
