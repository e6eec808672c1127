"""Figure builders on tiny hand-written frames: traces, lanes, colours, blocks (no browser)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from tests.profiler.conftest import make_events, step
from viewer import aggregate
from viewer.figures import (
    ACTION_COLORS,
    CATEGORY_COLORS,
    build_breakdown_figure,
    build_collectives_table,
    build_memory_figure,
    build_persistent_figure,
    build_pipeline_figure,
    build_step_time_figure,
    build_timeline_figure,
)


def _op(name, ts, dur, **kw):
    return dict(name=name, kind="op", ts_us=ts, dur_us=dur, **kw)


def _two_runs() -> pl.DataFrame:
    # Run a, rank 0: main thread ops [0, 40) (with a nested op) and [60, 90); a gloo span on
    # thread 9 [40, 60). Run b, ranks 0 and 1: one op each.
    a = make_events([
        step(1, 0, 100), _op("aten::mm", 0, 40), _op("aten::add", 10, 5), _op("aten::mm", 60, 30),
        dict(name="gloo:all_reduce", kind="comm", ts_us=40, dur_us=20, tid=9),
    ], run="a")
    b = pl.concat([make_events([step(1, 0, 50), _op("aten::mm", 5, 10)], run="b", rank=r) for r in (0, 1)])
    return pl.concat([a, b])


def _segments(events, **kw):
    parts = []
    for run in ("a", "b"):
        iv, merged = aggregate.timeline_intervals(events.filter(pl.col("run") == run))
        parts.append(aggregate.visible_timeline(iv, merged, (0.0, 0.1), **kw))
    return pl.concat(parts)


def test_timeline_lanes_traces_and_colours():
    seg = _segments(_two_runs())
    fig = build_timeline_figure(seg, ["a", "b"])
    # One trace per (run, category present): a has compute, comm, idle; b has compute, idle.
    assert [(t.name, t.xaxis) for t in fig.data] == [
        ("compute", "x"), ("communication", "x"), ("idle", "x"), ("compute", "x2"), ("idle", "x2"),
    ]
    assert {t.marker.color for t in fig.data if t.name == "compute"} == {CATEGORY_COLORS["compute"]}
    assert {t.marker.color for t in fig.data if t.name == "communication"} == {CATEGORY_COLORS["comm"]}
    assert set(fig.data[0].y) | set(fig.data[1].y) == {"r0 main", "r0 comm"}
    assert set(fig.data[3].y) == {"r0 main", "r1 main"}
    # Run a's main lane, raw events (names in hover): the nested op drawn on top of its parent.
    assert sorted(zip(fig.data[0].base, fig.data[0].hovertext)) == [(0.0, "aten::mm"), (0.01, "aten::add"), (0.06, "aten::mm")]
    # Idle is the gap [40, 60) µs on main, and [0, 40) + [60, 100) on the comm lane.
    idle = sorted((y, round(b, 6), round(x, 6)) for y, b, x in zip(fig.data[2].y, fig.data[2].base, fig.data[2].x))
    assert idle == ([("r0 comm", 0.0, 0.04), ("r0 comm", 0.06, 0.04), ("r0 main", 0.04, 0.02), ("r0 main", 0.09, 0.01)])
    assert fig.layout.showlegend is not False and sum(t.showlegend for t in fig.data) == 3  # a legend entry per category


def test_timeline_bins_when_many_events():
    seg = _segments(_two_runs(), raw_limit=0, max_bins=10)
    a = seg.filter(pl.col("run") == "a", pl.col("label") == "r0 main").sort("start_ms")
    # 10 bins of 10 µs; ops cover bins 0-3 and 6-8, nothing in 4-5 and 9: merged into 4 segments.
    assert [(c, round(s, 6), round(e, 6)) for c, s, e in a.select("category", "start_ms", "end_ms").rows()] == (
        [("compute", 0.0, 0.04), ("idle", 0.04, 0.06), ("compute", 0.06, 0.09), ("idle", 0.09, 0.1)]
    )
    assert a["text"][0] == "compute · 100% busy"


def test_breakdown_stacks_to_the_window():
    bd = pl.DataFrame({
        "run": ["a", "a", "b"], "rank": [0, 1, 0], "window_us": [100.0, 100.0, 50.0], "compute_us": [60.0, 50.0, 10.0],
        "idle_us": [20.0, 30.0, 30.0], "comm_us": [30.0, 20.0, 10.0], "overlap_us": [20.0, 0.0, 0.0],
        "exposed_comm_us": [10.0, 20.0, 10.0],
    })
    fig = build_breakdown_figure(bd, ["b", "a"])
    assert [t.name for t in fig.data] == ["compute", "overlapped comm", "exposed comm", "other busy", "idle"]
    assert list(fig.data[0].x[0]) == ["b", "a", "a"] and list(fig.data[0].x[1]) == ["r0", "r0", "r1"]
    totals = [sum(t.y[i] for t in fig.data) for i in range(3)]
    assert totals == pytest.approx([100, 100, 100])
    assert list(fig.data[0].y) == pytest.approx([20, 40, 50])  # compute minus what overlaps comm


def test_pipeline_blocks_per_microbatch_and_ideal_order():
    # Two ranks, two microbatches, 1F1B-like: each rank runs F0 F1 B0 B1.
    rows = []
    for rank in (0, 1):
        t = rank * 1.0
        for act, mb in (("F", 0), ("F", 1), ("B", 0), ("B", 1)):
            rows.append({"run": "p", "rank": rank, "action": act, "microbatch": mb, "start_ms": t, "end_ms": t + 0.9})
            t += 1.0
    actions = pl.DataFrame(rows)
    ideal = actions.with_columns(slot=pl.int_range(pl.len()).over("rank"), stage=pl.col("rank")).drop("start_ms", "end_ms")
    summary = pl.DataFrame({"run": ["p"], "bubble_pct": [20.0], "theory_pct": [33.3], "ideal_pct": [25.0]})
    fig = build_pipeline_figure(actions, ideal, summary, ["p"])
    measured = [t for t in fig.data if t.xaxis == "x"]
    planned = [t for t in fig.data if t.xaxis == "x2"]
    assert [t.name for t in measured] == ["forward", "backward"] and len(planned) == 2
    for t in measured:  # one block per rank and microbatch, labelled by microbatch, coloured by action
        assert sorted(zip(t.y, t.text)) == [("r0", "0"), ("r0", "1"), ("r1", "0"), ("r1", "1")]
        assert t.marker.color == ACTION_COLORS[t.name[0].upper()]
    assert list(planned[0].base) == [0, 1, 0, 1]  # the ideal panel is slots in schedule order
    title = fig.layout.annotations[0].text
    assert "bubble 20%" in title and "theory 33%" in title


def test_pipeline_draws_pipedreams_weight_updates():
    # pipedream's U (the AdamW step after each backward) is its own block, named and coloured.
    actions = pl.DataFrame({"run": ["pd"] * 3, "rank": [0] * 3, "action": ["F", "B", "U"], "microbatch": [1, 0, 0],
                            "start_ms": [0.0, 1.0, 2.0], "end_ms": [0.9, 1.9, 2.5]})
    ideal = actions.with_columns(slot=pl.int_range(pl.len()), stage=pl.lit(0)).drop("start_ms", "end_ms")
    fig = build_pipeline_figure(actions, ideal, None, ["pd"])
    (u,) = [t for t in fig.data if t.xaxis == "x" and t.name == "weight update (pipedream)"]
    assert u.marker.color == ACTION_COLORS["U"] and list(u.base) == [2.0]
    assert ACTION_COLORS["U"] not in (ACTION_COLORS["F"], ACTION_COLORS["B"], ACTION_COLORS["L"])


def test_pipeline_without_pipeline_runs_says_so():
    empty = pl.DataFrame(schema={"run": pl.String})
    fig = build_pipeline_figure(empty, empty, None, ["ddp"])
    assert not fig.data and "no pipeline" in fig.layout.annotations[0].text


def test_memory_curves_and_peaks():
    curves = pl.DataFrame({"run": ["a"] * 3 + ["b"] * 2, "rank": [0, 0, 0, 0, 0], "mem_device": ["cpu"] * 5,
                           "t_ms": [0.0, 1.0, 2.0, 0.0, 1.0], "allocated_bytes": [0, 2 * 2**20, 2**20, 0, 3 * 2**20]})
    peaks = pl.DataFrame({"run": ["a", "b"], "rank": [0, 0], "mem_device": ["cpu", "cpu"], "peak_t_ms": [1.0, 1.0],
                          "peak_allocated_bytes": [2 * 2**20, 3 * 2**20]})
    fig = build_memory_figure(curves, peaks, ["a", "b"])
    assert [t.mode for t in fig.data] == ["lines", "markers", "lines", "markers"]
    assert list(fig.data[0].y) == [0, 2, 1] and list(fig.data[3].y) == [3]
    assert fig.data[0].line.color != fig.data[2].line.color  # runs told apart by colour


def test_persistent_memory_stacked_per_rank():
    p = pl.DataFrame({"run": ["ddp", "ddp", "fsdp", "fsdp"], "rank": [0, 1, 0, 1],
                      "params_bytes": [4 * 2**20] * 2 + [2 * 2**20] * 2, "grads_bytes": [4 * 2**20] * 2 + [2 * 2**20] * 2,
                      "optimizer_bytes": [8 * 2**20] * 2 + [4 * 2**20] * 2})
    fig = build_persistent_figure(p)
    assert [t.name for t in fig.data] == ["parameters", "gradients", "optimizer state"]
    assert list(fig.data[2].y) == [8, 8, 4, 4] and fig.layout.barmode == "stack"
    # pipedream's stashed weight copies are persistent too: a fourth part, only where a run holds them.
    pd = p.with_columns(stashed_params_bytes=pl.Series([None, None, 2 * 2**20, 0], dtype=pl.Int64))
    fig = build_persistent_figure(pd)
    assert [t.name for t in fig.data] == ["parameters", "gradients", "optimizer state", "stashed weights (pipedream)"]
    assert list(fig.data[3].y) == [0, 0, 2, 0]
    assert len(build_persistent_figure(p.with_columns(stashed_params_bytes=pl.lit(None, pl.Int64))).data) == 3


def test_step_times_and_collectives_table():
    steps = pl.DataFrame({"run": ["a", "a", "b"], "rank": [0, 1, 0], "step": [1, 1, 1], "dur_us": [1000.0, 3000.0, 500.0]})
    fig = build_step_time_figure(steps)
    assert [t.name for t in fig.data] == ["a", "b"] and list(fig.data[0].y) == [1.0, 3.0]
    stats = pl.DataFrame({"run": ["a", "a"], "rank": [0, 1], "collective": ["all_reduce"] * 2, "count": [2, 2],
                          "total_bytes": [2 * 2**20, 2 * 2**20], "total_us": [1000.0, 3000.0], "busbw_gbps": [2.0, 1.0]})
    skew = pl.DataFrame({"run": ["a", "a"], "collective": ["all_reduce"] * 2, "spread_us": [100.0, 300.0]})
    (row,) = build_collectives_table(stats, skew)
    assert row == {"run": "a", "collective": "all_reduce", "count": 2.0, "size_mib": 2.0, "time_ms": 2.0, "mean_ms": 1.0,
                   "busbw_gbps": 1.25, "skew_mean_ms": 0.2, "skew_max_ms": 0.3}
    json.dumps(row)  # what Dash sends must be JSON
