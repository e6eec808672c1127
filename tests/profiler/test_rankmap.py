"""The per-rank map (profiler/rankmap.py) gives the full path's numbers.

The map analyses each rank alone, in a worker; the full path is `analyze_rank` run once over the
event frame of every rank at once (`Traces.events`). They agree only if no per-rank analysis
depends on another rank's events (to the last bit), which is what the first test checks on real
traces. Then: a warm load (summaries read from the cache) gives the cold load's report, and
--step / --top give the same numbers whether the workers made the summaries with them or the
ranks are analysed again here.
"""

from __future__ import annotations

import polars as pl
import pytest
from polars.testing import assert_frame_equal

import profiler.report as report_module
from profiler import load_traces
from profiler.rankmap import MapOptions, RankSummary, RankTask, analyze_rank, decode, encode, summarize
from profiler.report import analyze, build_report, rank_summaries
from tests.conftest import REPO, SHARED_TRACES
from tests.profiler.conftest import GPU_NCCL

SETS = sorted((REPO / "traces").glob("sample-*")) + [GPU_NCCL, SHARED_TRACES / "single"]


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    """Rows in one order: by every column that can be sorted (run labels as text)."""
    frame = frame.with_columns(pl.col(c).cast(pl.String) for c, t in frame.schema.items() if t == pl.Categorical)
    keys = [c for c, t in frame.schema.items() if not isinstance(t, (pl.List, pl.Struct, pl.Array, pl.Object))]
    return frame.sort(keys, nulls_last=True) if frame.height else frame


@pytest.mark.parametrize("path", SETS, ids=lambda p: p.name)
def test_each_rank_alone_gives_the_numbers_of_all_ranks_at_once(path):
    # workers=1: summarized in this process, the same `summarize` without starting workers (the
    # engines are compared in test_engine.py)
    traces = load_traces(path, progress=False, workers=1, options=MapOptions(activity=True))  # the viewer's bins too
    per_rank = rank_summaries(traces, traces.ranks, rank=None, step=None, top_n=15)
    assert all(p.frames is not None for p in traces.parts)  # the workers' summaries, not made again here
    whole = analyze_rank(traces.events, traces.ranks, traces.runs, step=None, top_n=15)
    assert set(whole) == set(per_rank[0])
    for name, frame in whole.items():
        parts = [r[name] for r in per_rank if r[name].width]
        mapped = pl.concat(parts, how="diagonal_relaxed") if parts else per_rank[0][name]
        assert mapped.height == frame.height, name
        mapped, frame = _sorted(mapped), _sorted(frame.select(mapped.columns))
        # Exact, float sums included: no rank's numbers depend on the other ranks in the frame
        # (which the batched map relies on: test_batchmap.py).
        assert_frame_equal(mapped, frame, check_exact=True)


def test_a_warm_load_gives_the_cold_report(tmp_path, monkeypatch):
    monkeypatch.setenv("PTPROF_CACHE_DIR", str(tmp_path))
    cold = build_report(analyze(load_traces(REPO / "traces" / "sample-1f1b-2r", progress=False, workers=1)))
    assert len(list(tmp_path.glob("*.summary"))) == 2

    class NoWorkers:  # a warm load must not map anything: every summary comes from the cache
        workers = 2

        def map(self, tasks):
            assert not tasks, [t.path for t in tasks]
            return iter(())

    warm = load_traces(REPO / "traces" / "sample-1f1b-2r", progress=False, engine=NoWorkers())
    assert build_report(analyze(warm)) == cold


@pytest.mark.parametrize("step, top_n", [(2, 3), (None, 1)])
def test_step_and_top_from_the_map_equal_an_analysis_here(monkeypatch, step, top_n):
    path = REPO / "traces" / "sample-1f1b-2r"
    again = load_traces(path, progress=False, workers=1)  # summaries made for the defaults: analyze runs the ranks again
    here = build_report(analyze(again, step=step, top_n=top_n))

    def not_here(*args, **kwargs):
        raise AssertionError("analysed again in this process")

    mapped = load_traces(path, progress=False, workers=1, options=MapOptions(step=step, top_n=top_n))
    monkeypatch.setattr(report_module, "analyze_rank", not_here)
    assert build_report(analyze(mapped, step=step, top_n=top_n)) == here
    assert mapped.parts[0].frames["top_operators"].height == top_n


def test_a_summary_survives_its_bytes():
    summary = summarize(RankTask(str(GPU_NCCL / "rank1.json.gz"), "x", None, MapOptions()))
    assert isinstance(summary, RankSummary)
    back = decode(encode(summary))
    assert (back.meta, back.rank, back.parquet) == (summary.meta, summary.rank, summary.parquet)
    assert back.frames.keys() == summary.frames.keys()
    assert all(back.frames[k].equals(summary.frames[k]) for k in summary.frames)
    with pytest.raises(ValueError, match="truncated"):
        decode(encode(summary)[:-1])


def test_a_summary_of_odd_frames_survives_its_bytes():
    # What analyses can leave: empty frames that keep their schema, a frame of no columns,
    # categoricals (decoded after other values entered the string cache: the text comes back,
    # not the codes; tests/profiler/test_engine.py decodes in another process), nulls,
    # NaN and -0.0, lists and structs: each back with the same values and dtypes.
    pl.Series(["zz", "q"]).cast(pl.Categorical)
    frames = {
        "text": pl.DataFrame({"run": ["b", None, "a"], "x": [1.5, float("nan"), -0.0], "n": [None, None, None]},
                             schema={"run": pl.Categorical, "x": pl.Float64, "n": pl.Null}),
        "empty": pl.DataFrame(schema={"rank": pl.Int32, "l": pl.List(pl.String), "b": pl.Float32}),
        "no_columns": pl.DataFrame(),
        "nested": pl.DataFrame({"s": [{"a": 1, "b": "q"}, None], "l": [[1, None], []]}),
    }
    back = decode(encode(RankSummary({"n_events": 3}, 7, None, frames, "disk full")))
    assert (back.meta, back.rank, back.parquet, back.unstored) == ({"n_events": 3}, 7, None, "disk full")
    assert list(back.frames) == list(frames)
    for name, frame in frames.items():
        assert back.frames[name].schema == frame.schema, name
        assert back.frames[name].shape == frame.shape, name
        assert back.frames[name].equals(frame), name
    assert back.frames["text"]["run"].to_list() == ["b", None, "a"]
    with pytest.raises(ValueError, match="not a ptprof rank summary"):
        decode(b"PTPS1\n" + encode(RankSummary({}, 0, None, frames))[6:])  # the Arrow IPC form of before
