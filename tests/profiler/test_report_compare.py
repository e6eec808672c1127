"""`compare_runs`: runs side by side, each metric what its name says; hand-computed tiny values."""

from __future__ import annotations

from types import SimpleNamespace

import polars as pl
import pytest

from profiler import analyze, load_traces
from profiler.report import RANK_METRICS, compare_runs, comparison_warnings
from tests.profiler.conftest import GPU_NCCL


def two_runs(steps_b: int = 3) -> SimpleNamespace:
    # run A: ranks 0, 1; run B: ranks 0, 1. Only the frames compare_runs reads.
    rows = [("A", 0, 100.0, 10.0, 40.0), ("A", 1, 200.0, 30.0, 60.0), ("B", 0, 300.0, 20.0, 55.0), ("B", 1, 300.0, 20.0, 55.0)]
    breakdown = pl.DataFrame(
        [{**dict.fromkeys(RANK_METRICS, 0.0), "run": run, "rank": rank, "window_us": w, "compute_us": c, "overlap_pct": o}
         for run, rank, w, c, o in rows])
    return SimpleNamespace(
        ranks=pl.DataFrame({"run": ["A", "A", "B", "B"], "rank": [0, 1, 0, 1]}),
        breakdown=breakdown,
        step_stats=pl.DataFrame({"run": ["A", "A", "B", "B"], "rank": [0, 1, 0, 1], "n_steps": [2, 2, steps_b, steps_b],
                                 "mean_us": [50.0, 100.0, 100.0, 100.0]}),
        # A: rank 0 has two collectives (10 + 20), rank 1 one (50); B: rank 0 one (40), rank 1 none
        collective_stats=pl.DataFrame({"run": ["A", "A", "A", "B"], "rank": [0, 0, 1, 0], "total_us": [10.0, 20.0, 50.0, 40.0]}),
        collectives=pl.DataFrame({"run": ["A", "A", "A", "B"], "rank": [0, 0, 1, 0], "start_us": [0.0, 100.0, 0.0, 0.0],
                                  "end_us": [10.0, 120.0, 50.0, 40.0]}),
        memory_peaks=pl.DataFrame({"run": ["A", "A", "B", "B"], "rank": [0, 1, 0, 1],
                                   "peak_allocated_bytes": [1000, 3000, 2000, 2000]}),
        pipeline=None,
    )


def test_each_metric_is_what_its_name_says():
    t = {r["metric"]: r for r in compare_runs(two_runs()).to_dicts()}
    assert (t["window_us"]["A"], t["window_us"]["B"], t["window_us"]["B_diff_pct"]) == (150.0, 300.0, 100.0)
    # mean over ranks of each rank's total: A (30 + 50) / 2, B (40 + 0) / 2 -- not the sums 80 and 40
    assert (t["collective_us"]["A"], t["collective_us"]["B"], t["collective_us"]["B_diff_pct"]) == (40.0, 20.0, -50.0)
    # the max over ranks, and named so
    assert "peak_allocated_bytes" not in t
    assert (t["peak_allocated_bytes_max"]["A"], t["peak_allocated_bytes_max"]["B"]) == (3000.0, 2000.0)
    assert t["peak_allocated_bytes_max"]["B_diff_pct"] == pytest.approx(-100 / 3)
    assert (t["step_mean_us"]["A"], t["step_mean_us"]["B"]) == (75.0, 100.0)
    # a percentage changes by points: 50 % -> 55 % is +5 points (not +10 %)
    assert (t["overlap_pct"]["A"], t["overlap_pct"]["B"]) == (50.0, 55.0)
    assert t["overlap_pct"]["B_diff_pts"] == pytest.approx(5.0) and t["overlap_pct"]["B_diff_pct"] is None
    assert t["window_us"]["B_diff_pts"] is None
    # from 0 (idle_us 0 in both runs) there is no percent change: null, not NaN or inf
    assert (t["idle_us"]["A"], t["idle_us"]["B_diff_pct"]) == (0.0, None)


def test_a_pipeline_run_is_compared_by_its_bubble_beside_the_textbook():
    a = two_runs()
    # B is a pipeline of 2 ranks over 2 steps: bubbles 40, 60 (rank 0) and 30, 50 (rank 1); its
    # textbook (p-1)/(m+p-1) at p = 2, m = 4 is 20 % on every row. A is no pipeline.
    a.pipeline = pl.DataFrame({"run": ["B"] * 4, "rank": [0, 0, 1, 1], "step": [1, 2, 1, 2],
                               "bubble_pct": [40.0, 60.0, 30.0, 50.0], "theory_pct": [20.0] * 4})
    t = {r["metric"]: r for r in compare_runs(a).to_dicts()}
    assert (t["bubble_pct"]["A"], t["bubble_pct"]["B"]) == (None, 45.0)
    assert (t["bubble_textbook_pct"]["A"], t["bubble_textbook_pct"]["B"]) == (None, 20.0)
    assert t["bubble_pct"]["B_diff_pts"] is None  # no change from a run that has no bubble
    assert "bubble_pct" not in {r["metric"] for r in compare_runs(two_runs()).to_dicts()}


def test_the_runs_table_shows_two_pipelines_bubbles(tmp_path):
    from tests.conftest import REPO
    from tests.profiler.test_cli import analyze

    res = analyze(REPO / "traces" / "sample-1f1b-2r", REPO / "traces" / "sample-zbv-2r")
    assert res.returncode == 0, res.stderr
    side = res.stdout[res.stdout.index("== Runs side by side"):]
    bubble = next(line for line in side.splitlines() if line.strip().startswith("pipeline bubble"))
    textbook = next(line for line in side.splitlines() if line.strip().startswith("textbook for its shape"))
    # 1F1B at p = 2, m = 4 (run.json): (p-1)/(m+p-1) = 1/5; zero-bubble V has no closed form
    assert textbook.split()[-4:] == ["20.0", "%", "—", "—"]
    assert bubble.split()[-1] == "pts"
    assert "(textbook — for sample-zbv-2r: no closed form for its schedule" in side
    alone = analyze(REPO / "traces" / "sample-1f1b-2r", REPO / "traces" / "sample-ddp-2r").stdout
    assert "pipeline bubble" in alone and "no closed form" not in alone


def test_time_in_collectives_counts_calls_in_flight_together_once():
    a = two_runs()
    # A's rank 0: its 20 µs call now runs inside the 10 µs one's span ([0, 10) and [5, 25)): 25 µs, not 30
    a.collectives = a.collectives.with_columns(start_us=pl.Series([0.0, 5.0, 0.0, 0.0]), end_us=pl.Series([10.0, 25.0, 50.0, 40.0]))
    t = {r["metric"]: r for r in compare_runs(a).to_dicts()}
    assert t["collective_us"]["A"] == (25.0 + 50.0) / 2


def test_different_step_counts_are_a_warning():
    (w,) = comparison_warnings(two_runs())
    assert "different numbers of steps" in w and "A: 2" in w and "B: 3" in w
    assert comparison_warnings(two_runs(steps_b=2)) == []


def test_the_step_count_warning_is_said_once_in_the_tables_and_the_json(tmp_path):
    import json

    from tests.conftest import REPO, SHARED_TRACES
    from tests.profiler.test_cli import analyze

    out = tmp_path / "r.json"
    # 2 profiled steps per rank beside a trace of 5 steps
    res = analyze(REPO / "traces" / "sample-ddp-2r", SHARED_TRACES / "single" / "v100_ns_resolution_rank0.json.gz", "--json", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("different numbers of steps") == 1
    assert sum("different numbers of steps" in w for w in json.loads(out.read_text())["warnings"]) == 1


def test_the_first_run_given_is_the_baseline_not_the_first_by_name(tmp_path):
    import json

    from tests.conftest import REPO
    from tests.profiler.test_cli import analyze

    out = tmp_path / "r.json"
    # names that sort the other way: fsdp given first, ddp second
    res = analyze(REPO / "traces" / "sample-fsdp-2r", REPO / "traces" / "sample-ddp-2r", "--json", out)
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    assert [r["run"] for r in report["runs"]] == ["sample-fsdp-2r", "sample-ddp-2r"]
    window = next(r for r in report["comparison"] if r["metric"] == "window_us")
    assert "sample-ddp-2r_diff_pct" in window and "sample-fsdp-2r_diff_pct" not in window
    assert window["sample-ddp-2r_diff_pct"] == pytest.approx(
        100 * (window["sample-ddp-2r"] - window["sample-fsdp-2r"]) / window["sample-fsdp-2r"])
    # the text report's side by side: the change is "vs" the first given
    assert "vs sample-fsdp-2r" in res.stdout and "vs sample-ddp-2r" not in res.stdout


def test_a_run_with_ranks_missing_says_which():
    # gpu_nccl_2_of_128 holds ranks 0 and 1 of a 128-rank job (its distributedInfo): 126 are absent.
    a = analyze(load_traces(GPU_NCCL, progress=False))
    (line,) = [w for w in a.warnings if "ranks loaded" in w]
    assert "2 of 128 ranks loaded" in line and "missing 2-127:" in line
    assert not [w for w in analyze(load_traces(GPU_NCCL, progress=False), rank=0).warnings if "ranks loaded" in w]


def test_missing_rank_spans_are_counted_by_hand():
    from profiler.report import missing_rank_warnings

    ranks = pl.DataFrame({"run": ["a"] * 4 + ["b"] * 2, "rank": [0, 3, 4, 9, 0, 1], "world_size": [12] * 4 + [2] * 2})
    (line,) = missing_rank_warnings(ranks)  # run b has both of its 2 ranks: no warning
    assert line.startswith("run a: 4 of 12 ranks loaded") and "missing 1-2, 5-8, 10-11:" in line
    # every other rank of 4,096 loaded: 2,048 one-rank spans missing, 6 named, the rest counted
    ranks = pl.DataFrame({"run": "a", "rank": range(0, 4096, 2), "world_size": 4096})
    (line,) = missing_rank_warnings(ranks)
    assert line.startswith("run a: 2,048 of 4,096 ranks loaded") and "missing 1, 3, 5, 7, 9, 11 and 2,042 more spans:" in line


def test_ranks_past_the_world_size_are_said():
    # --rank-from-filename over 100 copies of a 2-rank job's trace: ranks 2-99 cannot be of that job.
    from profiler.report import missing_rank_warnings

    (line,) = missing_rank_warnings(pl.DataFrame({"run": "a", "rank": range(100), "world_size": 2}))
    assert line.startswith("run a: 98 of the 100 ranks loaded (2-99) are at or past its traces' world size, 2:")
    # Both at once: ranks 0 and 5 of a world of 4 (1-3 missing, 5 past it).
    lines = missing_rank_warnings(pl.DataFrame({"run": "b", "rank": [0, 5], "world_size": 4}))
    assert len(lines) == 2 and lines[0].startswith("run b: 1 of the 2 ranks loaded (5) are at or past its traces' world size, 4:")
    assert lines[1].startswith("run b: 1 of 4 ranks loaded (its traces' world size); missing 1-3:")
    assert not missing_rank_warnings(pl.DataFrame({"run": "c", "rank": [0, 1], "world_size": [None, None]},
                                                  schema_overrides={"world_size": pl.Int64}))


def test_a_run_without_the_chosen_step_is_left_out_not_a_crash():
    # --step S where run B has no step S: B keeps its ranks but has no breakdown row to compare.
    a = two_runs()
    a.breakdown = a.breakdown.filter(pl.col("run") == "A")
    a.step_stats = a.step_stats.filter(pl.col("run") == "A")
    t = {r["metric"]: r for r in compare_runs(a).to_dicts()}
    assert (t["window_us"]["A"], set(t["window_us"])) == (150.0, {"metric", "A"})
    # none has it: an empty table, still with its metric column
    a.breakdown = a.breakdown.clear()
    assert compare_runs(a).columns == ["metric"] and compare_runs(a).is_empty()


def test_step_that_some_runs_lack_on_the_command_line(tmp_path):
    from tests.conftest import REPO, SHARED_TRACES
    from tests.profiler.test_cli import analyze

    # sample-ddp-2r profiles steps 1-2; this trace's steps are other numbers
    res = analyze(REPO / "traces" / "sample-ddp-2r", SHARED_TRACES / "single" / "v100_ns_resolution_rank0.json.gz",
                  "--step", "2", "--top", "5")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr and "no step 2" in res.stdout + res.stderr


def test_rank_r_says_which_runs_lack_it():
    # --rank 1 over a 2-rank run and a lone rank-3 trace: the lone one drops out of every table, said
    from tests.conftest import REPO, SHARED_TRACES

    a = analyze(load_traces([REPO / "traces" / "sample-ddp-2r", SHARED_TRACES / "single" / "a100_rank3_of_8.json.gz"],
                            progress=False), rank=1)
    assert a.breakdown["rank"].to_list() == [1]
    assert "--rank 1: run single has no rank 1; left out" in a.warnings
    both = analyze(load_traces([REPO / "traces" / "sample-ddp-2r", REPO / "traces" / "sample-fsdp-2r"], progress=False), rank=1)
    assert not [w for w in both.warnings if w.startswith("--rank")]


def test_the_textbook_rows_label_is_the_formula_its_value_came_from():
    """An interleaved 1F1B run's textbook bubble 11.1 % = (p-1)/(v·m+p-1) at p=2, m=4, v=2 was
    labelled (p-1)/(m+p-1), which gives 20 % (trial)."""
    from profiler.pipeline import schedule_theory_pct
    from profiler.text_pipeline import _textbook_label

    assert _textbook_label("interleaved-1f1b") == "textbook (p-1)/(v·m+p-1)"
    assert schedule_theory_pct("interleaved-1f1b", 2, 4, 2, {}) == pytest.approx(100 * 1 / 9)
    assert _textbook_label("1f1b") == _textbook_label("gpipe") == "textbook (p-1)/(m+p-1)"
    assert schedule_theory_pct("1f1b", 2, 4, 1, {}) == pytest.approx(20.0)
    assert _textbook_label("pipedream") == "textbook (no flush)" and "ZB-H1" in _textbook_label("zero-bubble")
