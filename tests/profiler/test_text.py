"""The text report (profiler.text): units, widths, collapsed ranks, relative times, sparklines and
the order of its sections, on hand-made frames with hand-computed answers and on real traces."""

from __future__ import annotations

import dataclasses

import polars as pl
import pytest

from profiler import analyze, load_traces
from profiler.findings import FINDING_COLUMNS
from profiler.memory import CURVE_COLUMNS, memory_curve
from profiler.text import (
    WIDTH, collapse, fmt_bw, fmt_bytes, fmt_pct, fmt_since, fmt_time, format_tables, sig3, sparkline,
)
from profiler.textfmt import table, truncate
from profiler.theory import CHECK_COLUMNS
from tests.conftest import REPO, SHARED_TRACES

SAMPLES = sorted((REPO / "traces").glob("sample-*"))
T0 = 1.7e12  # an epoch µs step start, as in real traces


def too_wide(text: str) -> list[str]:
    """Lines over WIDTH columns; warning and skipped lines stay whole on one line by design."""
    return [line for line in text.split("\n") if len(line) > WIDTH]


@pytest.fixture(scope="module")
def ddp():
    """The analysis of the shipped 2-rank DDP sample, to replace frames of by hand."""
    return analyze(load_traces([REPO / "traces" / "sample-ddp-2r"]))


def section(text: str, name: str) -> list[str]:
    """The lines of section `name` (its title to the next title)."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(f"== {name}:"))
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("== ")), len(lines))
    return lines[start:end]


# ---- units -----------------------------------------------------------------------------------


def test_three_significant_digits():
    assert [sig3(x) for x in (1.5, 12.345, 456.7, 0.012345, 1234, 9.996, 0)] == ["1.50", "12.3", "457", "0.0123", "1230", "10.0", "0"]
    assert [sig3(x) for x in (float("nan"), float("inf"), None, True)] == ["—"] * 4


def test_plurals():
    from profiler.textfmt import plural

    assert [plural(1, "microbatch"), plural(4, "microbatch"), plural(1, "rank"), plural(0, "rank")] == [
        "1 microbatch", "4 microbatches", "1 rank", "0 ranks"]
    assert plural(2020, "call") == "2,020 calls"  # a count is printed with thousands separators


def test_table_counts_have_thousands_separators(ddp):
    from profiler.textfmt import more

    assert more(1250, 12) == ["  … 1,238 more (ptprof analyze --full)"]
    a = dataclasses.replace(ddp, collective_stats=ddp.collective_stats.with_columns(count=pl.lit(2020, pl.Int64)),
                            alpha_beta=ddp.alpha_beta.with_columns(n_calls=pl.lit(2020, pl.Int64)),
                            top_operators=ddp.top_operators.with_columns(count=pl.lit(2020, pl.Int64)))
    colls = [line for line in section(format_tables(a), "Collectives") if "all_reduce" in line]
    assert colls and all(" 2,020 " in line for line in colls), colls
    full = [line for line in section(format_tables(a, full=True), "Collectives") if "all_reduce" in line]
    assert full and all(" 2,020 " in line for line in full), full
    fits = [line for line in section(format_tables(a), "Latency and bandwidth") if "all_reduce" in line]
    assert fits and all(line.split()[3] == "2,020" for line in fits), fits
    ops = [line for line in section(format_tables(a, full=True), "Top CPU operators") if "aten::" in line]
    assert ops and all(line.split()[2] == "2,020" for line in ops), ops


def test_human_units():
    assert fmt_bytes(1536 * 1024) == "1.50 MiB"
    assert fmt_bytes(64) == "64 B" and fmt_bytes(3 * 2**30) == "3.00 GiB" and fmt_bytes(1023.9 * 2**20) == "1.00 GiB"
    assert fmt_time(12_345) == "12.3 ms" and fmt_time(569.8) == "570 µs" and fmt_time(2_500_000) == "2.50 s"
    assert fmt_time(0) == "0 ms" and fmt_time(float("nan")) == "—"
    assert fmt_pct(4.7812) == "4.78 %"


def test_a_slow_bandwidth_is_never_zero():
    # a gloo busbw of 0.00143 GB/s is 1.43 MB/s; 57 kB/s is not "0.0"
    assert fmt_bw(0.00143) == "1.43 MB/s" and fmt_bw(0.0014) == "1.40 MB/s"
    assert fmt_bw(0.0000571) == "57.1 kB/s" and fmt_bw(23.4) == "23.4 GB/s" and fmt_bw(None) == "—"


def test_times_relative_to_a_step():
    assert fmt_since(5300.0) == "+5.30 ms" and fmt_since(-120.0) == "-120 µs"


# ---- collapsing ranks ------------------------------------------------------------------------


def test_collapse_names_the_ranks_at_each_end():
    f = pl.DataFrame({"run": ["r"] * 4, "rank": [0, 1, 2, 3], "x_us": [1000.0, 12_300.0, 500.0, 2000.0]})
    (row,) = collapse(f, ["x_us"]).to_dicts()
    assert (row["min"], row["min_rank"], row["median"], row["max"], row["max_rank"], row["n"]) == (500, 2, 1500, 12_300, 1, 4)
    # a tie names the lowest rank; NaN is left out, not a minimum
    tied = pl.DataFrame({"run": ["r"] * 3, "rank": [2, 0, 1], "x_us": [7.0, 7.0, float("nan")]})
    (row,) = collapse(tied, ["x_us"]).to_dicts()
    assert (row["max_rank"], row["min_rank"], row["n"]) == (0, 0, 2)


def four_ranks(a):
    # exposed communication 1.00 / 12.3 / 0.500 / 2.00 ms on ranks 0-3 (median 1.50 ms)
    exposed = [1000.0, 12_300.0, 500.0, 2000.0]
    template = a.breakdown.row(0, named=True)
    breakdown = pl.DataFrame([{**template, "rank": r, "exposed_comm_us": e} for r, e in enumerate(exposed)],
                             schema=a.breakdown.schema)
    stats = a.step_stats.row(0, named=True)
    step_stats = pl.DataFrame([{**stats, "rank": r} for r in range(4)], schema=a.step_stats.schema)
    return dataclasses.replace(a, breakdown=breakdown, step_stats=step_stats)


def test_a_path_cut_at_its_start_restarts_at_a_separator():
    # The Runs table's traces column keeps a path's end; it was cut mid-name ("…ed/traces/...").
    path = "/work/shared/traces/single/v100_nccl_memory_rank1.json.gz"  # 57 characters
    assert truncate(path, 40, tail=True) == "…/single/v100_nccl_memory_rank1.json.gz"  # 39: "…aces" dropped
    assert truncate(path, 57, tail=True) == path and truncate(path, 56, tail=True).startswith("…/")
    # Never down to a bare separator: a folder's "(N files)" or a short tail keeps the cut name.
    folder = "/data/traces/gpu_nccl_2_of_128/ (2 files)"
    assert truncate(folder, 20, tail=True) == "…2_of_128/ (2 files)"  # not "…/ (2 files)"
    assert truncate(folder, 31, tail=True) == "…/gpu_nccl_2_of_128/ (2 files)"  # 30: "…traces" dropped
    assert truncate("/a/bb/x.json", 9, tail=True) == "…/x.json"  # a fragment "b" dropped
    # "…/x.json" would drop most of what fits (a long folder name): the cut name stays.
    assert truncate("/data/a_very_long_folder_name/x.json", 20, tail=True) == "…_folder_name/x.json"
    assert truncate("abcdefghijk", 5, tail=True) == "…hijk" and truncate("abcdefghijk", 5) == "abcd…"
    lines = table(["run", "traces"], [["a", path]], "ll", shrink=1, tail=True, width=44)
    assert lines[2] == "  a    …/v100_nccl_memory_rank1.json.gz"  # 37 fit: "…ngle" dropped
    assert len(lines[1]) == len(lines[2])  # the rule under the header is as wide as the cut column


def test_the_collapsed_table_names_the_worst_rank(ddp):
    text = format_tables(four_ranks(ddp))
    (line,) = [line for line in section(text, "Where the time goes") if line.strip().startswith("exposed comm")]
    assert "500 µs (rank 2)" in line and "1.50 ms" in line and line.endswith("12.3 ms (rank 1)")


def test_full_shows_every_rank(ddp):
    text = format_tables(four_ranks(ddp), full=True)
    rows = [line.split() for line in section(text, "Where the time goes")[3:]]
    exposed = {int(r[0]): " ".join(r[-4:-2]) for r in rows if r and r[0].isdigit()}
    assert exposed == {0: "1.00 ms", 1: "12.3 ms", 2: "500 µs", 3: "2.00 ms"}
    assert not too_wide(text)


# ---- findings and theory first ---------------------------------------------------------------


def findings_frame(run: str) -> pl.DataFrame:
    long = "Exposed communication is 45.0 % of the step on rank 1: the all-reduce of the last bucket " * 4
    return pl.DataFrame([
        {"run": run, "rank": 1, "rule": "exposed-comm", "score": 45.0, "text": long.strip(),
         "evidence": "rank 1, step 2, all_reduce in backward", "change": "bucket gradients earlier (bucket_cap_mb)"},
        {"run": run, "rank": None, "rule": "straggler", "score": 5.0, "text": "Rank 0 starts collectives last.",
         "evidence": "rank 0 last in 80 % of collectives", "change": "look at rank 0's data loading"},
    ], schema=FINDING_COLUMNS)


def check_frame(run: str) -> pl.DataFrame:
    mib = 2.0**20
    rows = [{"run": run, "rank": r, "quantity": "all_reduce bytes per step", "unit": "bytes", "predicted": 2 * mib,
             "measured": 3 * mib if r == 3 else 2 * mib, "ratio": 1.5 if r == 3 else 1.0,
             "verdict": "above" if r == 3 else "match", "note": None} for r in range(4)]
    return pl.DataFrame(rows, schema=CHECK_COLUMNS)


def test_findings_come_first_then_theory_then_tables(ddp):
    run = ddp.ranks["run"].cast(pl.String)[0]
    a = dataclasses.replace(ddp, findings=findings_frame(run), theory_check=check_frame(run))
    text = format_tables(a)
    titles = [line for line in text.split("\n") if line.startswith("== ")]
    assert titles[0].startswith("== Findings:") and titles[2].startswith("== Theory vs measured:")
    assert titles[1].startswith("== Runs:") and titles[3].startswith("== Predicted communication:")
    assert titles[4].startswith("== Where the time goes:")
    findings = section(text, "Findings")
    assert findings[1].startswith("  1. Exposed communication is 45.0 %") and len(findings) > 5  # wrapped
    assert any(line.startswith("  2. Rank 0 starts collectives last.") for line in findings)
    assert "    evidence: rank 1, step 2, all_reduce in backward" in findings
    assert not too_wide(text)


def test_theory_check_collapses_to_the_rank_furthest_from_theory(ddp):
    run = ddp.ranks["run"].cast(pl.String)[0]
    a = dataclasses.replace(ddp, theory_check=check_frame(run))
    (row,) = [line for line in section(format_tables(a), "Theory vs measured") if "all_reduce bytes" in line]
    assert "2.00 MiB" in row and "3.00 MiB" in row and "1.50×" in row
    assert "above (1 of 4)" in row and row.rstrip().endswith("rank 3")
    full = [line for line in section(format_tables(a, full=True), "Theory vs measured") if "all_reduce bytes" in line]
    assert len(full) == 4 and sum("match" in line for line in full) == 3


def test_empty_theory_is_no_section_and_no_findings_is_said(ddp):
    from profiler.alphabeta import FIT_COLUMNS
    from profiler.theory_memory import ACTIVATION_COLUMNS, WHATIF_COLUMNS

    empty = {"findings": FINDING_COLUMNS, "theory_check": CHECK_COLUMNS, "alpha_beta": FIT_COLUMNS,
             "memory_whatif": WHATIF_COLUMNS, "activation": ACTIVATION_COLUMNS}
    text = format_tables(dataclasses.replace(ddp, **{k: pl.DataFrame(schema=v) for k, v in empty.items()}))
    for name in ("Theory vs measured", "Latency and bandwidth", "Memory by layout", "Activations at the peak"):
        assert f"== {name}" not in text
    assert "== Where the time goes" in text
    # no finding is said first, so a user knows the rules ran
    assert text.lstrip().startswith("== Findings: none: no rule's threshold was reached")


def test_memory_by_layout_is_left_out_at_data_parallel_degree_1(ddp):
    from profiler.theory_memory import WHATIF_COLUMNS

    rows = [{"run": "sample-ddp-2r", "layout": l, "dp": 1, "params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 1,
             "total_bytes": 3, "current": l == "ddp", "rank": 0, "saved_bytes": 0, "note": None}
            for l in ("ddp", "zero1", "zero2", "fsdp")]
    text = format_tables(dataclasses.replace(ddp, memory_whatif=pl.DataFrame(rows, schema=WHATIF_COLUMNS)))
    assert "== Memory by layout" not in text


# ---- memory over time ------------------------------------------------------------------------


def test_sparkline():
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert sparkline([0, 7, 0, 0], width=2) == "█▁"  # merged by the maximum: the peak stays
    assert sparkline([2, 4], low=0, high=8) == "▃▅"  # 2/8*7 = 1.75 -> 2; 4/8*7 = 3.5 -> 4
    assert sparkline([]) == "" and sparkline([float("nan")]) == ""


def timeline(ts: list[float], allocated: list[int], rank: int = 0) -> pl.DataFrame:
    n = len(ts)
    return pl.DataFrame({"run": ["r"] * n, "rank": [rank] * n, "mem_device": ["cpu"] * n, "ts_us": ts,
                         "allocated_bytes": allocated}).with_columns(pl.col("run").cast(pl.Categorical),
                                                                     pl.col("rank").cast(pl.Int32))


def test_memory_curve_buckets_keep_the_highest_and_lowest_level():
    # 5 buckets of 2 µs over 0-10 µs; the level is a step function: bucket 1 starts at 20 (the
    # level bucket 0 left), bucket 2-3 have no events and hold 5.
    c = memory_curve(timeline([0, 1, 2, 9, 10], [10, 20, 5, 50, 0]), buckets=5)
    assert c["allocated_bytes"].to_list() == [20, 20, 5, 5, 50]
    assert c["min_allocated_bytes"].to_list() == [10, 5, 5, 5, 0]
    assert c["start_us"].to_list() == [0, 2, 4, 6, 8] and c["bucket"].to_list() == [0, 1, 2, 3, 4]
    one = memory_curve(timeline([3.0], [7]))
    assert one.select("bucket", "allocated_bytes", "min_allocated_bytes").rows() == [(0, 7, 7)]
    assert memory_curve(timeline([], [])).is_empty() and dict(memory_curve(timeline([], [])).schema) == CURVE_COLUMNS


def test_a_sparkline_per_rank_with_min_and_peak(ddp):
    run = ddp.ranks["run"].cast(pl.String)[0]
    mib = 2**20
    rows = [{"run": run, "rank": r, "mem_device": "cpu", "bucket": b, "start_us": T0 + b, "allocated_bytes": v * mib,
             "min_allocated_bytes": v * mib} for r, vals in ((0, range(8)), (1, [7] * 8)) for b, v in enumerate(vals)]
    a = dataclasses.replace(ddp, memory_curve=pl.DataFrame(rows, schema=CURVE_COLUMNS))
    lines = section(format_tables(a), "Memory over time")
    (r0,) = [line for line in lines if line.startswith("  rank 0 ")]
    (r1,) = [line for line in lines if line.startswith("  rank 1 ")]
    assert "▁▂▃▄▅▆▇█" in r0 and r0.endswith("min 0 B, peak 7.00 MiB")
    assert "████████" in r1 and r1.endswith("min 7.00 MiB, peak 7.00 MiB")  # one scale for the run's ranks


def test_the_memory_peak_is_timed_from_its_step(ddp):
    run = ddp.ranks["run"].cast(pl.String)[0]
    steps = pl.DataFrame({"run": [run] * 2, "rank": [0, 0], "step": [2, 3], "start_us": [T0, T0 + 100_000.0],
                          "end_us": [T0 + 100_000.0, T0 + 200_000.0], "dur_us": [100_000.0] * 2, "has_profiler_steps": [True] * 2}
                         ).cast({"run": pl.Categorical, "rank": pl.Int32})
    peaks = pl.DataFrame({"run": [run], "rank": [0], "mem_device": ["cpu"], "peak_allocated_bytes": [1536 * 1024],
                          "peak_ts_us": [T0 + 105_300.0], "peak_step": [3], "peak_reserved_bytes": [0], "n_events": [9],
                          "floor_allocated_bytes": [0]},
                         schema=ddp.memory_peaks.schema)
    a = dataclasses.replace(ddp, steps=steps, memory_peaks=peaks)
    (line,) = [line for line in section(format_tables(a), "Memory peaks") if line.startswith("  cpu")]
    assert "1.50 MiB" in line and line.endswith("step 3 +5.30 ms") and "1.7e" not in line


def test_memory_peaks_the_same_on_every_rank_are_said_once(ddp):
    # Both ranks peak at 1.50 MiB: one column headed "every rank (2)", the time of the rank named;
    # the value sat under "min" beside empty median and max columns.
    run = ddp.ranks["run"].cast(pl.String)[0]
    steps = pl.DataFrame({"run": [run] * 2, "rank": [0, 1], "step": [3, 3], "start_us": [T0, T0],
                          "end_us": [T0 + 100_000.0] * 2, "dur_us": [100_000.0] * 2, "has_profiler_steps": [True] * 2}
                         ).cast({"run": pl.Categorical, "rank": pl.Int32})
    peaks = pl.DataFrame({"run": [run] * 2, "rank": [0, 1], "mem_device": ["cpu"] * 2, "peak_allocated_bytes": [1536 * 1024] * 2,
                          "peak_ts_us": [T0 + 5_300.0, T0 + 7_100.0], "peak_step": [3, 3], "peak_reserved_bytes": [0, 0],
                          "n_events": [9, 9], "floor_allocated_bytes": [0, 0]}, schema=ddp.memory_peaks.schema)
    lines = section(format_tables(dataclasses.replace(ddp, steps=steps, memory_peaks=peaks)), "Memory peaks")
    (head,) = [line for line in lines if line.lstrip().startswith("device")]
    assert head.split() == ["device", "peak,", "every", "rank", "(2)", "reached", "at"]
    (line,) = [line for line in lines if line.startswith("  cpu")]
    assert line.split() == ["cpu", "1.50", "MiB", "step", "3", "+5.30", "ms", "(rank", "0)"]
    # a third rank with no [memory] event: the two that agree are "2 of 3 ranks", not every rank
    three = pl.concat([ddp.ranks, ddp.ranks.head(1).with_columns(rank=pl.lit(2, ddp.ranks.schema["rank"]))])
    lines = section(format_tables(dataclasses.replace(ddp, ranks=three, steps=steps, memory_peaks=peaks)), "Memory peaks")
    (head,) = [line for line in lines if line.lstrip().startswith("device")]
    assert head.split() == ["device", "peak,", "2", "of", "3", "ranks", "reached", "at"]
    # one rank peaking higher: min / median / max as before
    lines = section(format_tables(dataclasses.replace(ddp, steps=steps, memory_peaks=peaks.with_columns(
        peak_allocated_bytes=pl.Series([1536 * 1024, 2048 * 1024])))), "Memory peaks")
    (line,) = [line for line in lines if line.startswith("  cpu")]
    assert line.split()[:3] == ["cpu", "1.50", "MiB"] and line.endswith("step 3 +7.10 ms")


# ---- real traces: width, comparison, --full --------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.name for s in SAMPLES])
def test_the_shipped_runs_fit_100_columns(sample):
    a = analyze(load_traces([sample]))
    for full in (False, True):
        text = format_tables(a, full=full)
        assert not too_wide(text), too_wide(text)
        assert "== Where the time goes" in text and "== Collectives" in text


@pytest.mark.multirank
@pytest.mark.parametrize("key", [("ddp", 2, "--profile-memory", "--recompute"), ("pipedream", 2)], ids=["recompute", "pipedream"])
def test_recompute_and_pipedream_runs_fit_100_columns(runs, key):
    # runs already made by tests/profiler/test_recompute.py and tests/runners/test_pipedream.py
    a = analyze(load_traces([runs(*key)]))
    for full in (False, True):
        text = format_tables(a, full=full)
        assert not too_wide(text), too_wide(text)
        assert "1 microbatches" not in text and "stage(s)" not in text and " 1 ranks" not in text
    assert ("== Recomputation" if key[0] == "ddp" else "pipedream: 2 pipeline ranks, 4 microbatches, 1 stage per rank") in text
    if key[0] == "pipedream":  # beside its 0 % textbook bubble, what a flush would cost: (2-1)/(4+2-1)
        assert "1F1B with a flush would idle (p-1)/(m+p-1) = 20.0 %" in " ".join(format_tables(a).split())


def test_the_runs_table_names_the_variant_flags(ddp):
    run = ddp.ranks["run"].cast(pl.String)[0]
    manifest = ddp.runs[run]
    a = dataclasses.replace(ddp, runs={run: {**manifest, "options": {**manifest["options"], "recompute": True, "sp": True}}})
    (row,) = [line for line in section(format_tables(a), "Runs") if line.startswith(f"  {run} ")]
    assert row.split()[1] == "ddp+sp+rc"
    assert section(format_tables(ddp), "Runs")[3].split()[1] == "ddp"


def test_the_runs_table_names_the_model_and_a_comparison_says_when_models_differ():
    # sample-1f1b-2r trained `tiny` (run.json: 133,760 parameters), sample-zbv-2r `tiny8` (430,208).
    text = format_tables(analyze(load_traces([REPO / "traces" / "sample-1f1b-2r", REPO / "traces" / "sample-zbv-2r"])))
    rows = {line.split()[0]: line.split() for line in section(text, "Runs")[3:5]}
    assert rows["sample-1f1b-2r"][2:4] == ["tiny", "134k"] and rows["sample-zbv-2r"][2:4] == ["tiny8", "430k"]
    assert "note: models differ (sample-1f1b-2r: tiny 134k, sample-zbv-2r: tiny8 430k)" in text
    assert any(line.startswith("  note: the runs trained different models") for line in section(text, "Runs"))  # near the top
    same = format_tables(analyze(load_traces([REPO / "traces" / "sample-ddp-2r", REPO / "traces" / "sample-fsdp-2r"])))
    assert "models differ" not in same and "different models" not in same


@pytest.mark.parametrize("n_params, shown", [(1e40, "tiny"), (float("inf"), "tiny"), (True, "tiny"), (-5, "tiny"),
                                             (175e9, "tiny 175B"), ("many", "tiny")])
def test_an_odd_parameter_count_in_run_json_is_left_out_and_the_table_fits(ddp, n_params, shown):
    run = ddp.ranks["run"].cast(pl.String)[0]
    manifest = ddp.runs[run]
    a = dataclasses.replace(ddp, runs={run: {**manifest, "model": {**manifest["model"], "n_params": n_params}}})
    lines = section(format_tables(a), "Runs")
    (row,) = [line for line in lines if line.startswith(f"  {run} ")]
    # run, paradigm, then the model: the preset alone where the count is no count a model has
    assert row.split()[1] == "ddp" and " ".join(row.split()[2:2 + len(shown.split())]) == shown, row
    assert row.split()[2 + len(shown.split())] == "2" and all(len(line) <= 100 for line in lines)  # then the ranks


def test_the_json_report_names_each_runs_model_as_run_json_gives_it(ddp):
    import json

    from profiler import build_report

    paths = [REPO / "traces" / "sample-1f1b-2r", REPO / "traces" / "sample-zbv-2r", SHARED_TRACES / "gpu_nccl_2_of_128"]
    report = build_report(analyze(load_traces(paths)))
    got = {r["run"]: r["model"] for r in report["runs"]}
    for path in paths[:2]:  # read here from run.json, not through the profiler
        model = json.loads((path / "run.json").read_text())["model"]
        assert got[path.name] == {"preset": model["preset"], "n_params": model["n_params"]}
    assert got["sample-1f1b-2r"] == {"preset": "tiny", "n_params": 133760}
    (foreign,) = [m for run, m in got.items() if run not in ("sample-1f1b-2r", "sample-zbv-2r")]
    assert foreign is None  # no run.json
    # run.json is user data: what no model can have is null, the rest kept; the report stays JSON.
    run = ddp.ranks["run"].cast(pl.String)[0]
    for n_params, want in ((1e40, None), (float("nan"), None), (True, None), (-5, None), (2.5, None), ("many", None),
                           (175e9, 175_000_000_000)):
        manifest = ddp.runs[run]
        a = dataclasses.replace(ddp, runs={run: {**manifest, "model": {"preset": "tiny", "n_params": n_params}}})
        (entry,) = build_report(a)["runs"]
        assert entry["model"] == {"preset": "tiny", "n_params": want}, n_params
        json.dumps(entry["model"], allow_nan=False)
    a = dataclasses.replace(ddp, runs={run: {**ddp.runs[run], "model": {"preset": "", "n_params": "x"}}})
    assert build_report(a)["runs"][0]["model"] is None


def test_a_cpu_pipelines_sends_and_receives_show_no_bandwidth_and_say_why():
    text = format_tables(analyze(load_traces(REPO / "traces" / "sample-zbv-2r")))
    lines = section(text, "Collectives")
    rows = {line.split()[0]: line.split() for line in lines if line.split()[:1] in (["send"], ["recv"])}
    assert set(rows) == {"send", "recv"} and all(r[-1] == "—" for r in rows.values()), rows
    assert "note: send and recv on gloo: a span runs from the post (isend / irecv) to the wait" in " ".join(lines)
    assert not too_wide(text)
    ddp = section(format_tables(analyze(load_traces(REPO / "traces" / "sample-ddp-2r"))), "Collectives")
    assert "send and recv on gloo" not in " ".join(ddp)  # said only where such calls are


def test_two_runs_side_by_side_in_human_units():
    a = analyze(load_traces([REPO / "traces" / "sample-ddp-2r", REPO / "traces" / "sample-fsdp-2r"]))
    text = format_tables(a)
    assert not too_wide(text), too_wide(text)
    table = section(text, "Runs side by side")
    assert table[1] == "  (step time: the mean step; the other times: summed over each rank's profiled steps)"
    assert table[2].split() == ["sample-ddp-2r", "sample-fsdp-2r", "vs", "sample-ddp-2r"]
    (hidden,) = [line for line in table if line.strip().startswith("share of comm hidden")]
    assert hidden.endswith("pts") and hidden.count("%") == 2  # two percentages, their change in points
    (peak,) = [line for line in table if line.strip().startswith("memory peak")]
    assert "MiB" in peak or "KiB" in peak
    assert "  -- run sample-ddp-2r" in section(text, "Where the time goes")


def test_warnings_stay_one_printable_line(ddp):
    text = format_tables(dataclasses.replace(ddp, warnings=["run x: odd\nFORGED line"], problems=["a\x1b[31m.json: bad"]))
    assert "warning: run x: odd\\nFORGED line" in text.split("\n") and "skipped: a\\x1b[31m.json: bad" in text.split("\n")


def test_long_warnings_wrap_at_100_columns_with_an_indented_rest(ddp):
    long = "run r rank 3: " + " ".join(f"word{i}" for i in range(60))
    lines = format_tables(dataclasses.replace(ddp, warnings=[long], problems=[])).split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("warning: run r rank 3: word0"))
    rest = lines[start + 1:]
    assert len(rest) >= 3 and all(line.startswith("    word") and len(line) <= 100 for line in rest)
    assert " ".join(line.strip() for line in lines[start:]) == "warning: " + long


@pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason="../shared/traces is absent")
@pytest.mark.parametrize("name", ["gpu_nccl_2_of_128", "single"])
def test_foreign_traces_fit_100_columns(name):
    a = analyze(load_traces([SHARED_TRACES / name]))
    for full in (False, True):
        text = format_tables(a, full=full)
        assert not too_wide(text), too_wide(text)


def test_the_cli_takes_full():
    from tests.profiler.test_cli import analyze as cli

    res = cli(REPO / "traces" / "sample-1f1b-2r", "--full")
    assert res.returncode == 0, res.stderr
    assert not too_wide(res.stdout)
    order = [line for line in res.stdout.split("\n") if line.startswith("  rank 0 step ")]
    assert len(order) == 2  # --full: each rank's order in each step


@pytest.mark.parametrize("top", [20, None], ids=["--top 20", "default 15"])
def test_top_n_shows_n_rows(capsys, top):
    """--top N promises N rows of the operator table (it used to stop at 12, the other tables' cap)."""
    import gzip
    import json

    from profiler.cli import main

    sample = REPO / "traces" / "sample-ddp-2r"
    for k in (0, 1):  # the sample has more than 20 CPU operators on each rank, counted from its JSON
        events = json.loads(gzip.decompress((sample / f"rank{k}.json.gz").read_bytes()))["traceEvents"]
        assert len({e["name"] for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"}) > 20
    assert main(["analyze", str(sample), *(["--top", str(top)] if top else [])]) == 0
    lines = section(capsys.readouterr().out, "Top CPU operators")
    rows = [line for line in lines[lines.index(next(x for x in lines if x.lstrip().startswith("──"))) + 1:]
            if line.strip() and not line.startswith("  … ")]
    assert len(rows) == (top or 15), lines
    assert lines[-2].startswith("  … ") and lines[-2].endswith(" more (ptprof analyze --full)")  # the other ranks' names


def test_top_operators_give_calls_as_the_range_over_ranks():
    # rank 0 called aten::mm 97 times, rank 1 100 times: "97–100" (a median would read 98.5 calls)
    from profiler.text import _top

    f = pl.DataFrame({"run": ["r"] * 4, "rank": [0, 1, 0, 1], "name": ["aten::mm", "aten::mm", "aten::add", "aten::add"],
                      "count": [97, 100, 5, 5], "self_us": [10.0, 12.0, 3.0, 4.0], "total_us": [20.0, 22.0, 3.0, 4.0]})
    lines = _top(None, f, ["r"], False, "Top CPU operators", "self time", "self_us", [("self", "self_us")])
    mm, add = (next(line.split() for line in lines if line.lstrip().startswith(op)) for op in ("aten::mm", "aten::add"))
    assert mm[1:5] == ["2", "97–100", "11.0", "µs"]  # ranks, calls, median of 10 and 12 µs
    assert add[1:3] == ["2", "5"]


def test_hta_beside_ours_fits_and_says_each_difference():
    from profiler.hta import format_hta

    # ours 1000.000 ms window with 600 ms compute; HTA 999.000 ms and 590 ms: window +0.10 % of ours
    # (1/1000), compute given as +1.00 %; HTA's rounding reproduces HTA's numbers exactly.
    rank = {"rank": 0, "window_us": 1e6, "window_us_hta": 999e3, "compute_us": 600e3, "compute_us_hta": 590e3,
            "compute_us_diff_pct_of_window": 1.0, "overlap_pct": 14.951, "overlap_pct_hta": 14.95,
            "overlap_diff_points": 0.001, "window_us_rounded": 999e3, "compute_us_rounded": 590e3,
            "compute_us_rounded_diff_pct_of_window": 0.0}
    text = format_hta([{"run": "r", "ranks": [rank]}, {"run": "cpu", "error": "HTA skipped: no GPU activity"}], "why")
    lines = text.split("\n")
    assert not too_wide(text)
    (window,) = [line for line in lines if " window " in line]
    assert window.split() == ["0", "window", "1,000.000", "ms", "999.000", "ms", "+0.10", "%", "999.000", "ms", "+0.00", "%"]
    (compute,) = [line for line in lines if " compute " in line]
    assert "+1.00 %" in compute and compute.endswith("+0.00 %")
    (hidden,) = [line for line in lines if "comm hidden" in line and "%" in line and "(" not in line]
    assert "14.95 %" in hidden and "+0.00 pts" in hidden
    assert "  Why they differ: why." in lines and "HTA skipped: no GPU activity" in lines


def test_alpha_beta_whatif_and_predicted_comm_from_their_schemas(ddp):
    from profiler.alphabeta import FIT_COLUMNS
    from profiler.theory import COMM_COLUMNS
    from profiler.theory_memory import WHATIF_COLUMNS

    run = ddp.ranks["run"].cast(pl.String)[0]
    mib = 2**20
    fit = pl.DataFrame([{"run": run, "backend": "gloo", "collective": "all_reduce", "group_size": 2, "n_calls": 12,
                         "n_sizes": 3, "alpha_us": 250.0, "beta_gbps": 0.0021, "r2": 0.9876, "note": None},
                        {"run": run, "backend": "gloo", "collective": "broadcast", "group_size": 2, "n_calls": 2,
                         "n_sizes": 1, "alpha_us": None, "beta_gbps": None, "r2": None, "note": "one size: no fit"}],
                       schema=FIT_COLUMNS)
    whatif = pl.DataFrame([{"run": run, "layout": layout, "dp": 2, "params_bytes": p * mib, "grads_bytes": g * mib,
                            "optimizer_bytes": o * mib, "total_bytes": (p + g + o) * mib, "current": layout == "ddp"}
                           for layout, p, g, o in (("ddp", 4, 4, 8), ("zero1", 4, 4, 4), ("fsdp", 2, 2, 4))],
                          schema=WHATIF_COLUMNS)
    comm = pl.DataFrame([{"run": run, "rank": r, "dim": "dp", "phase": "backward", "collective": "all_reduce",
                          "group_size": 2, "calls": 1, "bytes": 4 * mib, "traffic_bytes": 4.0 * mib, "phi": 2.0,
                          "formula": "2Φ", "note": None} for r in (0, 1)]
                        # rows of one step only: shown where that step was analysed (the sample's 2 and 3)
                        + [{"run": run, "rank": 0, "dim": "dp", "phase": "forward", "collective": "broadcast",
                            "group_size": 2, "calls": 1, "bytes": 4, "traffic_bytes": 4.0, "phi": None,
                            "formula": f"in step {s}", "note": None, "step": s} for s in (1, 2)], schema=COMM_COLUMNS)
    a = dataclasses.replace(ddp, alpha_beta=fit, memory_whatif=whatif, theory_comm=comm)
    text = format_tables(a)
    (ar,) = [line for line in section(text, "Latency and bandwidth") if "all_reduce" in line]
    assert ar.split()[:5] == ["gloo", "all_reduce", "2", "12", "3"] and "250 µs" in ar and "2.10 MB/s" in ar and "0.987" in ar  # r² 0.9876 cut to 3 decimals, as the fit note cuts it
    (bc,) = [line for line in section(text, "Latency and bandwidth") if "broadcast" in line]
    assert bc.count("—") == 3 and bc.endswith("one size: no fit")
    layouts = section(text, "Memory by layout")
    (ddp_row,) = [line for line in layouts if line.startswith("  ddp ")]
    assert "16.0 MiB  ◀ this run" in ddp_row and "◀" not in "".join(line for line in layouts if "fsdp" in line)
    # Default: the formula behind the lowest rank's prediction, one line per row (rank 1's is the same).
    assert section(text, "Predicted communication")[1:] == ["  dp backward all_reduce: 1 call, 4.00 MiB/step = 2Φ",
                                                             "  dp forward broadcast: 1 call, 4 B/step = in step 2", ""]
    full = section(format_tables(a, full=True), "Predicted communication")
    assert [line.split()[:4] for line in full if "all_reduce" in line] == [["0", "dp", "backward", "all_reduce"],
                                                                           ["1", "dp", "backward", "all_reduce"]]
    assert all(line.split()[-5:] == ["4.00", "MiB", "4.00", "MiB", "2.00"] for line in full if "all_reduce" in line), full
    assert not too_wide(text) and not too_wide(format_tables(a, full=True))


def test_long_kernel_names_end_in_an_ellipsis(ddp):
    run = ddp.ranks["run"].cast(pl.String)[0]
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float>>" * 4
    kernels = pl.DataFrame({"run": [run, run], "rank": [0, 1], "name": [name, name], "kind": ["compute"] * 2,
                            "count": [10, 10], "total_us": [2000.0, 3000.0], "mean_us": [200.0, 300.0]}
                           ).cast({"run": pl.Categorical, "rank": pl.Int32, "count": pl.UInt32})
    a = dataclasses.replace(ddp, top_kernels=kernels)
    for full in (False, True):
        rows = [line for line in section(format_tables(a, full=full), "Top GPU kernels") if "vectorized" in line]
        assert rows and all(len(line) <= WIDTH and "…" in line for line in rows)
    (row,) = [line for line in section(format_tables(a), "Top GPU kernels") if "vectorized" in line]
    assert row.endswith("2.50 ms  3.00 ms (rank 1)")  # median of 2 and 3 ms; the max names its rank


def test_the_table_and_the_finding_name_the_same_slowest_stage():
    from profiler import findings as F
    from profiler.pipeline import slowest_over_steps

    a = analyze(load_traces([REPO / "traces" / "sample-1f1b-2r"]))
    # Three steps: stage 0 the single worst once (1.5x), stage 1 the slowest twice (1.1x, 1.2x).
    p = pl.concat([a.pipeline, a.pipeline.filter(pl.col("step") == 3).with_columns(step=pl.lit(4, a.pipeline.schema["step"]))])
    by_step = {2: (0, 1.5), 3: (1, 1.1), 4: (1, 1.2)}
    p = p.with_columns(slowest_stage=pl.col("step").replace_strict({k: v[0] for k, v in by_step.items()}, return_dtype=pl.Int64),
                       slowest_stage_ratio=pl.col("step").replace_strict({k: v[1] for k, v in by_step.items()},
                                                                         return_dtype=pl.Float64))
    assert slowest_over_steps(p) == (1, pytest.approx(1.15))
    b = dataclasses.replace(a, pipeline=p)
    assert "  slowest stage: stage 1, 1.15× (its compute over the mean stage's, in the steps it was slowest)" in (
        section(format_tables(b), "Pipeline bubble"))
    # The order's legend names every action a grid can hold, pipedream's U included, untruncated.
    assert "== Pipeline order: actions by rank (F forward, B backward, I/W input/weight grad, U weight update)" in (
        format_tables(b).splitlines())
    (f,) = F.pipeline_bubble_rule(b)
    assert "the slowest stage is stage 1 (rank 1), 1.15× the mean stage's compute." in f["text"]


def test_the_bubble_split_and_the_activations_at_the_peak():
    from profiler.theory_memory import ACTIVATION_COLUMNS

    a = analyze(load_traces([REPO / "traces" / "sample-1f1b-2r"]))
    run = a.ranks["run"].cast(pl.String)[0]
    # docs/profiler.md's worked example: 24 busy of 46 rank-µs; 12 schedule + 6 imbalance + 4 wait = 22
    split = {"pipeline_bubble_pct": 100 * 22 / 46, "schedule_bubble_pct": 100 * 12 / 46, "imbalance_pct": 100 * 6 / 46,
             "comm_wait_pct": 100 * 4 / 46, "slowest_stage": 1, "slowest_stage_ratio": 2.0}
    pipeline = a.pipeline.with_columns(*[pl.lit(v).cast(a.pipeline.schema[k]).alias(k) for k, v in split.items()])
    act = pl.DataFrame([{"run": run, "rank": r, "mem_device": "cuda:0", "peak_allocated_bytes": 3 * 2**30,
                         "persistent_bytes": 2**30, "footprint_bytes": 3 * 2**30, "activation_bytes": b,
                         "activation_pct": 100 * b / (3 * 2**30), "basis": "device counter", "note": None}
                        for r, b in ((0, 2 * 2**30), (1, 2**30))], schema=ACTIVATION_COLUMNS)
    text = format_tables(dataclasses.replace(a, pipeline=pipeline, activation=act))
    lines = section(text, "Pipeline bubble")
    start = next(i for i, line in enumerate(lines) if line.startswith("  where the bubble comes from"))
    header = next(line for line in lines[start:] if "every rank" in line)
    assert header.split() == ["every", "rank", "(2)"]  # all agree: said once, in the header
    got = {line.split("%")[0].strip().rsplit(" ", 1)[0].strip(): line.split()[-2] for line in lines[start:]
           if line.endswith(" %") and ("bubble (all" in line or line.startswith("    "))}
    assert got == {"pipeline bubble (all ranks)": "47.8", "the schedule's own": "26.1", "+ unequal stages": "13.0",
                   "+ communication wait": "8.70"}
    assert "  slowest stage: stage 1, 2.00× (its compute over the mean stage's, in the steps it was slowest)" in lines
    act_lines = section(text, "Activations at the peak")
    (b,) = [line for line in act_lines if "cuda:0 activations " in line]
    (s,) = [line for line in act_lines if "cuda:0 activations' share of it" in line]
    (f,) = [line for line in act_lines if "cuda:0 footprint at the peak" in line]  # what the share is of, beside it
    assert f.endswith("3.00 GiB (every rank)")
    assert "1.00 GiB (rank 1)" in b and b.endswith("2.00 GiB (rank 0)")
    assert "33.3 % (rank 1)" in s and s.endswith("66.7 % (rank 0)")
    assert not too_wide(text) and not too_wide(format_tables(dataclasses.replace(a, pipeline=pipeline), full=True))


def test_the_pipeline_caption_says_why_a_schedule_has_no_textbook_row_and_full_keeps_the_notes():
    zbv = analyze(load_traces(REPO / "traces" / "sample-zbv-2r"))
    for full in (False, True):
        text = format_tables(zbv, full=full)
        caption = " ".join(" ".join(section(text, "Pipeline bubble")).split())
        assert "textbook: none, zbv has no closed form here" in caption  # zbv: theory_pct null, no textbook row
        assert "the share of the pipeline's window (its first action to its last, over its ranks)" in caption
        assert "note: send and recv on gloo" in " ".join(section(text, "Collectives"))  # --full too
        assert not too_wide(text)
    one_f = " ".join(" ".join(section(format_tables(analyze(load_traces(REPO / "traces" / "sample-1f1b-2r"))),
                                      "Pipeline bubble")).split())
    assert "textbook: the schedule's idle share of an ideal pipeline" in one_f


def test_unknown_group_sizes_say_why_they_have_no_busbw():
    a = analyze(load_traces(SHARED_TRACES / "gpu_nccl_2_of_128"))  # all_to_all and all_reduce: no group size in the trace
    for full, words in ((False, "note: (?): the trace does not say the group's size, so no busbw"),
                        (True, "note: a collective whose group's size the trace does not say, so no busbw")):
        assert words in " ".join(" ".join(section(format_tables(a, full=full), "Collectives")).split())
    ddp = analyze(load_traces(REPO / "traces" / "sample-ddp-2r"))  # its group is known
    assert "group's size" not in " ".join(section(format_tables(ddp), "Collectives"))


def test_a_row_some_ranks_lack_is_not_said_of_every_rank():
    from profiler.textfmt import collapse, collapsed_table, fmt_pct

    frame = pl.DataFrame({"run": ["r"] * 3, "rank": [0, 1, 2], "x": [5.0, 5.0, 5.0], "y": [7.0, 7.0, None]})
    lines = collapsed_table(collapse(frame, ["x", "y"]), {"x": "x", "y": "y"}, fmt_pct)
    (x,), (y,) = [line for line in lines if line.startswith("  x")], [line for line in lines if line.startswith("  y")]
    assert x.strip().endswith("5.00 % (every rank)") and y.strip().endswith("7.00 % (2 of 3 ranks)"), lines
    agree = collapsed_table(collapse(frame, ["x"]), {"x": "x"}, fmt_pct)
    assert agree[0].split() == ["every", "rank", "(3)"] and agree[-1].split() == ["x", "5.00", "%"]
    assert collapsed_table(collapse(frame, ["x"]), {"z": "z"}, fmt_pct) == []  # no row asked for: no table


def test_each_collective_note_is_one_warning_and_the_send_recv_one_stays_in_its_table():
    from profiler.collectives import GLOO_NOTE, GLOO_P2P_NOTE

    a = analyze(load_traces([REPO / "traces" / "sample-fsdp-2r", REPO / "traces" / "sample-zbv-2r"]))
    assert a.collective_stats.filter(pl.col("note") == GLOO_P2P_NOTE).height  # zbv's sends carry it
    assert a.warnings.count(GLOO_NOTE) == 1 and GLOO_P2P_NOTE not in a.warnings  # fsdp's reduce-scatters: once


def test_the_stragglers_table_says_of_how_many_collectives():
    # sample-ddp-2r: rank 0 started both of the group's 2 profiled collectives last; the finding
    # says that is too few (< 4) to call it a straggler, and the table's "100 %" now shows the 2.
    lines = section(format_tables(analyze(load_traces(REPO / "traces" / "sample-ddp-2r"))), "Stragglers")
    (row,) = [line for line in lines if line.startswith("  [0, 1]")]
    assert row.split()[2:6] == ["0", "100", "%", "(2"] and row.split()[6:8] == ["of", "2)"]
    assert "straggler when that is at least 75 % and 4 collectives" in " ".join(" ".join(lines).split())


def test_a_straggler_row_of_an_unknown_group_says_why_no_finding_names_it():
    # gpu_nccl_2_of_128: rank 1 is last in 8 of 10 collectives of no named group (80 % >= 75 %,
    # 8 >= 4), and the straggler finding leaves unknown groups out (docs/findings.md): the
    # table says so beside the row, which read as a straggler the findings had missed.
    from tests.conftest import SHARED_TRACES

    a = analyze(load_traces(SHARED_TRACES / "gpu_nccl_2_of_128"))
    lines = section(format_tables(a), "Stragglers")
    (row,) = [line for line in lines if line.startswith("  —")]
    assert row.split()[1:6] == ["1", "80.0", "%", "(8", "of"]
    said = " ".join(" ".join(lines).split())
    assert "group —: the traces do not say which group a collective is of" in said
    assert "no finding names a straggler from it" in said
    assert not [f for f in a.findings.to_dicts() if f["rule"] == "straggler"]
    known = " ".join(section(format_tables(analyze(load_traces(REPO / "traces" / "sample-ddp-2r"))), "Stragglers"))
    assert "the traces do not say which group" not in known


def test_a_pipeline_without_run_json_says_its_schedule_is_unknown(tmp_path):
    import shutil

    for f in (REPO / "traces" / "sample-1f1b-2r").glob("rank*.json.gz"):
        shutil.copy(f, tmp_path / f.name)  # the traces alone: no run.json, so no schedule
    text = format_tables(analyze(load_traces(tmp_path)))
    lines = section(text, "Pipeline bubble")
    assert lines and lines[1].startswith("  schedule unknown:") and "None" not in " ".join(lines)
    assert "textbook: none, the schedule is not known (no run.json)" in " ".join(" ".join(lines).split())


def test_a_torch18_trace_has_no_steps_among_its_operators_and_says_why_memory_is_unknown():
    """torch 1.8 files ProfilerStep#N under `Operator` and writes [memory] events with Bytes but no
    Total Allocated: six of fifteen top CPU operators were steps, and the memory tables showed "—"
    with no reason (trial)."""
    import gzip
    import json

    from profiler import analyze, load_traces
    from profiler.text import format_tables
    from tests.conftest import SHARED_TRACES

    path = SHARED_TRACES / "single" / "torch18_v100_resnet50_rank0.json.gz"
    raw = json.loads(gzip.decompress(path.read_bytes()))
    events = raw["traceEvents"] if isinstance(raw, dict) else raw
    assert {e["cat"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")} == {"Operator"}
    memory = [e for e in events if e.get("name") == "[memory]"]
    assert memory and not any("Total Allocated" in e["args"] for e in memory)
    a = analyze(load_traces(path, progress=False))
    assert not a.top_operators.filter(pl.col("name").cast(pl.String).str.starts_with("ProfilerStep")).height
    assert a.top_operators.height > 0
    text = format_tables(a)
    assert "(—: [memory] events with each allocation's Bytes but no Total Allocated, as older torch (1.8)" in text


def test_the_theory_table_says_what_phi_and_the_volume_are(ddp):
    """`volume/step 2.00 Φ` with Φ defined only in the JSON (trial). The sample's model has 133,760
    fp32 parameters: Φ = 535,040 B (run.json's params × 4, counted here by hand)."""
    lines = section(format_tables(ddp), "Theory vs measured")
    note = " ".join(x.strip() for x in lines if "Φ =" in x or "volume/step: the bytes" in x or "all-reduce counted" in x)
    assert "in units of Φ, the model's parameters' bytes; Φ = 535,040 B; all-reduce counted twice" in note


def test_the_gloo_send_recv_note_names_pipeline_actions_only_in_a_pipeline():
    """A ring-attention run (sends and receives, no pipeline) was told what the breakdown does
    "inside a pipeline action" (trial); a pipeline run keeps the clause."""
    ring = section(format_tables(analyze(load_traces([REPO / "traces" / "sample-ring-2r"]))), "Collectives")
    pipe = section(format_tables(analyze(load_traces([REPO / "traces" / "sample-1f1b-2r"]))), "Collectives")
    assert any("note: send and recv on gloo" in x for x in ring) and "pipeline action" not in " ".join(ring)
    assert "inside a pipeline action the breakdown counts none" in " ".join(x.strip() for x in pipe)


def test_the_zero_ladder_says_why_torchs_zero2_holds_more_parameters():
    """zero1 802 KiB beside zero2 795 KiB, zero2's parameters 1.5x zero1's, unexplained (trial):
    torch's ZeRO-2 keeps the gathered parameters beside their shards. The fsdp sample's ladder:
    Φ = 535,040 B over N = 2, so zero2's parameters are Φ + Φ/2 = 802,560 B."""
    a = analyze(load_traces([REPO / "traces" / "sample-fsdp-2r"]))
    z2 = a.memory_whatif.filter(pl.col("layout") == "zero2").row(0, named=True)
    assert z2["params_bytes"] == 535_040 + 535_040 // 2
    lines = section(format_tables(a), "Memory by layout")
    assert "keeps the gathered parameters (Φ) beside their shards (Φ/N) from forward to backward" in " ".join(
        x.strip() for x in lines)
