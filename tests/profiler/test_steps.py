"""Steps: ProfilerStep windows, which step an event is in, and step time statistics."""

from __future__ import annotations

import json

import polars as pl
import pytest

from profiler import NO_STEP, assign_steps, profiler_steps, step_time_stats
from profiler.load import load_traces
from profiler.report import analyze
from profiler.steps import empty_last_steps, step_tails
from tests.profiler.conftest import kernel, launch, make_events, step


def test_profiler_step_windows_per_rank():
    ev = pl.concat([
        make_events([step(3, 0, 40), step(4, 40, 60), dict(name="aten::mm", kind="op", ts_us=5, dur_us=10),
                     dict(name="aten::mm", kind="op", ts_us=45, dur_us=10)], rank=0),  # (a last step holds work)
        make_events([step(3, 2, 50), dict(name="aten::add", kind="op", ts_us=3, dur_us=1)], rank=1),
    ])
    s = profiler_steps(ev)
    assert s.select("rank", "step", "start_us", "end_us", "dur_us").rows() == [
        (0, 3, 0.0, 40.0, 40.0), (0, 4, 40.0, 100.0, 60.0), (1, 3, 2.0, 52.0, 50.0)]
    assert s["has_profiler_steps"].all()


def test_no_profiler_steps_is_one_window_without_memory_events():
    ev = make_events([
        dict(name="aten::mm", kind="op", ts_us=10, dur_us=5),
        dict(name="aten::add", kind="op", ts_us=30, dur_us=10),
        dict(name="[memory]", kind="memory_event", ph="i", ts_us=90, dur_us=0),  # not activity
    ])
    s = profiler_steps(ev)
    assert s.select("step", "start_us", "end_us", "has_profiler_steps").rows() == [(NO_STEP, 10.0, 40.0, False)]


def test_cpu_events_by_start_gpu_activity_by_its_launch():
    ev = make_events([
        step(1, 0, 50), step(2, 50, 50),
        dict(name="aten::mm", kind="op", ts_us=45, dur_us=20),  # starts in step 1, ends in step 2
        launch(48, 7),
        kernel("gemm", "compute", 60, 10, 7),  # runs during step 2, launched in step 1
        kernel("orphan", "compute", 70, 5, 99),  # launch not in the trace (before profiling): no step, as in HTA
        kernel("uncorrelated", "compute", 75, 5, None),  # no correlation at all: by its own start
        dict(name="aten::add", kind="op", ts_us=150, dur_us=1),  # after every step
    ])
    got = dict(assign_steps(ev).select(pl.col("name").cast(pl.String), "step").iter_rows())
    assert got == {"ProfilerStep#1": 1, "ProfilerStep#2": 2, "aten::mm": 1, "cudaLaunchKernel": 1, "gemm": 1,
                   "orphan": None, "uncorrelated": 2, "aten::add": None}


def test_kernels_take_the_first_call_of_their_correlation_alone_or_beside_another_rank():
    # One rank is matched by binary search, several by a join: the same answer. Two calls share
    # correlation 7 (the one the trace lists first, in step 2, counts); kernel 3 ran in step 2's
    # time but was launched in step 1.
    rows = [step(1, 0, 50), step(2, 50, 50), launch(60, 7), launch(10, 7), launch(20, 3),
            kernel("gemm", "compute", 70, 5, 7), kernel("late", "compute", 55, 5, 3), kernel("orphan", "compute", 56, 1, 4)]
    alone = assign_steps(make_events(rows, rank=0))
    beside = assign_steps(pl.concat([make_events(rows, rank=0), make_events(rows[:2], rank=1)])).filter(pl.col("rank") == 0)
    for ev in (alone, beside):
        got = {n: s for n, s in ev.filter(pl.col("device") == "gpu").select(pl.col("name").cast(pl.String), "step").iter_rows()}
        assert got == {"gemm": 2, "late": 1, "orphan": None}
    assert alone["step"].equals(beside["step"])

@pytest.mark.parametrize("layout", ["blocks", "interleaved", "tied starts"])
def test_a_batch_of_ranks_gives_each_rank_its_steps_alone(layout):
    # Three ranks with the same correlation ids and times (a batch of copies): rank r's kernels
    # take the step of rank r's own call only. Rank 2 never calls correlation 3: its kernel 3 has
    # no step, though ranks 0 and 1 launched a 3. Each rank one block of rows (a batch: binary
    # searches per rank), the ranks' rows interleaved, or two steps starting together (both by a
    # sort and a join): each rank's steps as alone, and the hand-made ones.
    def rows(r: int) -> list[dict]:
        out = [step(1, 0, 50), step(2, 50, 50), launch(60, 7), launch(10, 7), dict(name="aten::mm", kind="op", ts_us=49, dur_us=5),
               kernel("gemm", "compute", 70, 5, 7), kernel("late", "compute", 55, 5, 3), kernel("free", "compute", 99, 2, None)]
        out += [launch(20, 3)] if r < 2 else []
        out += [dict(step(9, 0, 0), tid=2)] if layout == "tied starts" else []  # a 0 µs step at step 1's start
        return out

    ranks = [make_events(rows(r), rank=r) for r in range(3)]
    batch = pl.concat(ranks)
    if layout == "interleaved":
        batch = batch.sort(pl.int_range(pl.len()).over("rank"), "rank")  # round robin, each rank's rows in order
    together = assign_steps(batch)
    for r, alone in enumerate(ranks):
        mine = assign_steps(alone)
        if layout != "tied starts":  # (there, which of the two steps holds time 0 is the sort's business, alone too)
            got = dict(mine.select(pl.col("name").cast(pl.String), "step").iter_rows())
            assert {k: got[k] for k in ("gemm", "late", "aten::mm", "free")} == {"gemm": 2, "late": 1 if r < 2 else None, "aten::mm": 1, "free": 2}
        theirs = together.filter(pl.col("rank") == r)
        assert theirs.sort("ts_us", "name", maintain_order=True).equals(mine.sort("ts_us", "name", maintain_order=True))


def test_single_step_rank_keeps_its_device_activity_in_its_step():
    # HTA's rule (Trace._filter_irrelevant_gpu_kernels): with fewer than two ProfilerSteps, no
    # device activity is dropped for its launch. Per rank: rank 1 has two steps and keeps the filter.
    single = make_events([step(5, 0, 50), launch(60, 7), kernel("late", "compute", 70, 5, 7),
                          kernel("orphan", "compute", 80, 5, 99), dict(name="aten::add", kind="op", ts_us=90, dur_us=1)], rank=0)
    double = make_events([step(5, 0, 50), step(6, 50, 50), launch(120, 7), kernel("late", "compute", 130, 5, 7),
                          kernel("orphan", "compute", 80, 5, 99)], rank=1)
    got = {(r, n): s for r, n, s in assign_steps(pl.concat([single, double])).select("rank", pl.col("name").cast(pl.String), "step").iter_rows()}
    assert (got[(0, "late")], got[(0, "orphan")], got[(0, "aten::add")]) == (5, 5, None)  # CPU events still by their start
    assert (got[(1, "late")], got[(1, "orphan")]) == (None, None)


def test_step_time_stats():
    ev = make_events([step(1, 0, 10), step(2, 10, 20), step(3, 30, 60), dict(name="aten::mm", kind="op", ts_us=31, dur_us=1)])
    row = step_time_stats(profiler_steps(ev)).row(0, named=True)
    assert (row["n_steps"], row["mean_us"], row["median_us"], row["min_us"], row["max_us"]) == (3, 30, 20, 10, 60)
    assert row["std_us"] == pytest.approx(26.457513, rel=1e-6)  # sample std of 10, 20, 60


# ---------------------------------------------------------------------------------------------
# A trace cut short: its last step's span outlasts its events (steps.step_tails, report.cut_trace_warnings)


def _marked_steps(ev: pl.DataFrame) -> pl.DataFrame:
    """Every ProfilerStep span as a step, empty ones too (as a caller may pass them)."""
    return profiler_steps(ev, keep_empty=True)


def test_step_tails_is_the_last_step_past_the_last_other_event():
    ev = pl.concat([
        # rank 0: step 2 [50, 150); its last events: a kernel ending at 80, a memory instant at 90
        make_events([step(1, 0, 50), step(2, 50, 100), launch(55, 7), kernel("gemm", "compute", 65, 15, 7),
                     dict(name="aten::mm", kind="op", ts_us=60, dur_us=10),
                     dict(name="[memory]", kind="memory_event", ph="i", ts_us=90, dur_us=0)], rank=0),
        make_events([step(1, 0, 40), dict(name="aten::mm", kind="op", ts_us=30, dur_us=12)], rank=1),  # op ends after: 0
        make_events([dict(name="aten::mm", kind="op", ts_us=0, dur_us=5)], rank=2),  # no ProfilerStep: no row
        make_events([step(4, 10, 30)], rank=3),  # a rank's only step, empty: kept, and it ends nothing (null)
        # rank 4: the last step opens after the last event (what prof.step() after a loop leaves): left
        # out, so step 1 [0, 50) is the last, its operator ending at 30
        make_events([step(1, 0, 50), step(2, 60, 8), dict(name="aten::mm", kind="op", ts_us=10, dur_us=20)], rank=4),
    ])
    got = step_tails(ev, profiler_steps(ev))
    assert got.select("rank", "step", "dur_us", "tail_us").rows() == [
        (0, 2, 100.0, 60.0), (1, 1, 40.0, 0.0), (3, 4, 30.0, None), (4, 1, 50.0, 20.0)]
    # a step of the caller's that holds no event ends nothing: null, not a tail
    kept = make_events([step(4, 10, 30), dict(name="aten::mm", kind="op", ts_us=0, dur_us=5)], rank=3)
    assert step_tails(kept, _marked_steps(kept)).select("tail_us").rows() == [(None,)]
    alone = step_tails(ev.filter(pl.col("rank") == 0), profiler_steps(ev.filter(pl.col("rank") == 0)))
    assert alone.select("rank", "tail_us").rows() == [(0, 60.0)]  # one rank's path: the same


def _kineto(path, events):
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "pid": 1, "tid": 1, "cat": "cpu_op", **e} if "cat" not in e else {"ph": "X", **e} for e in events]}))


def _step(k, ts, dur):
    return {"cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1, "ts": ts, "dur": dur}


def test_a_cut_trace_says_why_its_step_outlasts_the_window(tmp_path):
    # rank 0 (GPU): steps [0, 100) and [100, 500) µs; step 2's last event ends at 200 (an operator
    # 105 + 95), its kernel runs 120-160: 300 µs of its 400 µs have no event (75.0 %). Mean step
    # (100 + 400) / 2 = 250 µs; GPU window 30 (first kernel) to 160 = 130 µs: shorter than a step.
    launch0 = {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "dur": 1}
    gpu = {"cat": "kernel", "pid": 0, "tid": 7}
    _kineto(tmp_path / "rank0.json", [
        _step(1, 0, 100), _step(2, 100, 400), {"name": "aten::mm", "ts": 10, "dur": 20},
        {**launch0, "ts": 20, "args": {"correlation": 1}},
        {**gpu, "name": "gemm", "ts": 30, "dur": 50, "args": {"correlation": 1, "stream": 7}},
        {**launch0, "ts": 110, "args": {"correlation": 2}},
        {**gpu, "name": "gemm", "ts": 120, "dur": 40, "args": {"correlation": 2, "stream": 7}},
        {"name": "aten::add", "ts": 105, "dur": 95}])
    # rank 1 (CPU): steps [0, 100), [100, 300); last event ends at 250: 50 µs of 200 (25 %)
    _kineto(tmp_path / "rank1.json", [_step(1, 0, 100), _step(2, 100, 200), {"name": "aten::mm", "ts": 10, "dur": 40},
                                      {"name": "aten::add", "ts": 120, "dur": 130}])
    # rank 2 (CPU): 5 µs of 200 (2.5 %, under CUT_TAIL_PCT): a whole trace, not named
    _kineto(tmp_path / "rank2.json", [_step(1, 0, 100), _step(2, 100, 200), {"name": "aten::mm", "ts": 10, "dur": 40},
                                      {"name": "aten::add", "ts": 120, "dur": 175}])
    a = analyze(load_traces(tmp_path, cache=False, workers=1, progress=False))
    stats = {r: m for r, m in a.step_stats.select("rank", "mean_us").iter_rows()}
    window = {r: w for r, w in a.breakdown.select("rank", "window_us").iter_rows()}
    assert stats[0] == 250.0 and window[0] == 130.0  # the step outlasts the window: what is explained
    assert a.breakdown.filter(pl.col("rank") == 1)["idle_us"].item() == 300.0 - 40 - 130  # the 50 µs tail is idle
    (w,) = [w for w in a.warnings if "before its last step" in w]
    assert w.startswith(f"run {tmp_path.name}: the trace of 2 ranks (0-1) ends 50.0 µs–300 µs before its last step does "
                        "(most on rank 0: step 2, 75.0 % of its 400 µs with no event)"), w
    assert "first to last GPU activity" in w and "a CPU rank's breakdown counts it as idle" in w
    # one GPU rank alone: named, and no CPU clause
    (w,) = [w for w in analyze(load_traces(tmp_path / "rank0.json", cache=False, workers=1, progress=False)).warnings
            if "before its last step" in w]
    assert "the trace of rank 0 ends 300 µs before" in w and "idle" not in w, w


@pytest.mark.parametrize("last", [0, 8], ids=["zero-length", "empty"])
def test_an_empty_last_step_is_not_a_cut_trace(tmp_path, last):
    # The step opened after the loop's last event (the reviewer's trace: a ProfilerStep of 0 µs
    # divided by zero) holds nothing: not a trace cut short, no warning, no crash.
    _kineto(tmp_path / "rank0.json", [_step(1, 1000, 100), {"name": "aten::mm", "ts": 1010, "dur": 50},
                                      _step(2, 1200, last)])
    a = analyze(load_traces(tmp_path, cache=False, workers=1, progress=False))
    # step 1's 40 µs after its last operator is no cut either: a step (empty, left out) follows it
    assert not [w for w in a.warnings if "before its last step" in w], a.warnings
    assert [w for w in a.warnings if "holds no CPU event (step 2, " in w]


def test_a_rank_s_only_step_stays_a_step_even_empty(tmp_path):
    # Left out, the rank would have no step at all (one window over its events, a second warning).
    _kineto(tmp_path / "rank0.json", [{"name": "aten::mm", "ts": 1000, "dur": 50}, _step(1, 1100, 0)])
    traces = load_traces(tmp_path, cache=False, workers=1, progress=False)
    a = analyze(traces)
    assert a.step_stats.select("n_steps").rows() == [(1,)]
    assert not [w for w in a.warnings if "holds no" in w or "no ProfilerStep" in w], a.warnings
    # --step of it: a step with no interval at all (it raised polars' ColumnNotFoundError)
    assert analyze(traces, step=1).step_stats.select("n_steps", "mean_us").rows() == [(1, 0.0)]


def test_an_empty_last_step_is_left_out_and_said(tmp_path):
    # rank 0: steps 1 [0, 100) and 2 [100, 300) hold operators; step 3 opens at 300 for 0 µs (what
    # prof.step() after the loop leaves). rank 1: the same, its step 3 [300, 350) holds nothing.
    # Step times: (100 + 200) / 2 = 150 µs on both, not (100 + 200 + 0) / 3.
    ops = [_step(1, 0, 100), _step(2, 100, 200), {"name": "aten::mm", "ts": 10, "dur": 80},
           {"name": "aten::add", "ts": 110, "dur": 150}]
    _kineto(tmp_path / "rank0.json", [*ops, _step(3, 300, 0)])
    _kineto(tmp_path / "rank1.json", [*ops, _step(3, 300, 50)])
    traces = load_traces(tmp_path, cache=False, workers=1, progress=False)
    a = analyze(traces)
    assert a.step_stats.select("rank", "n_steps", "mean_us").rows() == [(0, 2, 150.0), (1, 2, 150.0)]
    (w,) = [w for w in a.warnings if "holds no CPU event" in w]
    assert w.startswith(f"run {tmp_path.name}: the last ProfilerStep of 2 ranks (0-1) holds no CPU event (step 3, "
                        "at most 50.0 µs long)"), w
    with pytest.raises(ValueError, match="step 3 holds no CPU event .* steps there: 1, 2"):
        analyze(traces, step=3)
    both = empty_last_steps(pl.concat([traces.parts[0].events(), traces.parts[1].events()], how="diagonal_relaxed"))
    assert both.select("rank", "step", "dur_us").rows() == [(0, 3, 0.0), (1, 3, 50.0)]  # a batch's frame: each rank's


def test_two_spans_of_one_step_number_refuse_the_file(tmp_path):
    """ProfilerStep#2 twice (a hand-edited or merged trace) was taken as one step from the first's
    start to the second's end: 300 µs for steps of 100 and 150 µs, silently. The file is refused,
    the other ranks analysed."""
    from profiler.errors import TraceError

    ev = make_events([step(2, 0, 100), step(2, 150, 150), dict(name="aten::mm", kind="op", ts_us=5, dur_us=10)])
    with pytest.raises(TraceError, match=r"^ProfilerStep#2 appears 2 times: spans of one step number cannot be told apart"):
        profiler_steps(ev)
    _kineto(tmp_path / "rank0.json", [_step(2, 0, 100), _step(2, 150, 150), _step(3, 300, 50),
                                      {"name": "aten::mm", "ts": 10, "dur": 40}])
    _kineto(tmp_path / "rank1.json", [_step(2, 0, 100), _step(3, 100, 200), {"name": "aten::mm", "ts": 10, "dur": 40},
                                      {"name": "aten::mm", "ts": 110, "dur": 180}])
    t = load_traces(tmp_path, cache=False, workers=1, progress=False)
    assert t.ranks["rank"].to_list() == [1]
    assert [str(p) for p in t.problems] == [f"{tmp_path / 'rank0.json'}: rank 0: ProfilerStep#2 appears 2 times: spans of one step number "
                          f"cannot be told apart (torch.profiler numbers each step once); rename or drop the extra spans"]
    assert analyze(t).step_stats["mean_us"].to_list() == [150.0]  # (100 + 200) / 2, rank 1 alone
