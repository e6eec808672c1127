"""Timeline aggregation: what the browser receives stays bounded however big the trace."""

from __future__ import annotations

import polars as pl

from viewer import aggregate
from viewer.figures import build_timeline_figure

RANKS, LANE_EVENTS = 8, 125_000  # a million ops over 8 ranks


def _big() -> tuple[pl.DataFrame, pl.DataFrame]:
    n = RANKS * LANE_EVENTS
    i = pl.int_range(n, eager=True)
    intervals = pl.DataFrame({
        "run": ["big"] * n,
        "rank": (i // LANE_EVENTS).cast(pl.Int32),
        "lane": ["main"] * n,
        "lane_key": [0] * n,
        "category": pl.Series(["compute", "comm"] * (n // 2)),
        "name": ["aten::mm"] * n,
        "start_ms": (i % LANE_EVENTS).cast(pl.Float64) * 0.01,
        "end_ms": (i % LANE_EVENTS).cast(pl.Float64) * 0.01 + 0.007,
    })
    merged = intervals.drop("name")
    return intervals, merged


def test_payload_is_bounded_by_bins_not_events():
    intervals, merged = _big()
    seg = aggregate.visible_timeline(intervals, merged, max_bins=400)
    assert seg.height <= RANKS * 400
    fig = build_timeline_figure(seg)
    payload = len(fig.to_json())
    assert payload < 1_000_000, payload  # vs ~100 MB for a million bars
    # Zoomed to 1 ms: 100 events per lane, sent as they are.
    zoomed = aggregate.visible_timeline(intervals, merged, (100.0, 101.0))
    assert zoomed.filter(pl.col("category") != "idle").height == RANKS * 100
    assert set(zoomed.filter(pl.col("category") != "idle")["text"]) == {"aten::mm"}


def test_bins_report_how_busy():
    intervals, merged = _big()
    seg = aggregate.visible_timeline(intervals, merged, (0.0, 10.0), max_bins=10, raw_limit=0)
    busy = seg.filter(pl.col("rank") == 0)
    # Each 1 ms bin holds 100 events of 7 µs every 10 µs: 70 % busy, compute and comm alike.
    assert busy["busy"].round(2).unique().to_list() == [0.7]


def test_decimate_keeps_the_peak():
    n = 100_000
    curve = pl.DataFrame({"run": "a", "rank": 0, "t_ms": pl.int_range(n, eager=True).cast(pl.Float64),
                          "bytes": pl.int_range(n, eager=True) % 977})
    curve = curve.with_columns(bytes=pl.when(pl.col("t_ms") == 54321).then(10**9).otherwise(pl.col("bytes")))
    small = aggregate.decimate_curve(curve, by=["run", "rank"], x="t_ms", y="bytes", max_points=500)
    assert small.height <= 2 * 501
    assert small["bytes"].max() == 10**9 and small["bytes"].min() == 0
