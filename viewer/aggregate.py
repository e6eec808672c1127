"""What the browser receives: trace events cut down to lanes and to the visible time range.

A 100 MB trace holds millions of events; drawing each is hopeless. The timeline is drawn from
`visible_timeline(...)`, which returns either the events themselves (when few are visible, so
hover shows operator names) or, per lane, at most `max_bins` bins of the visible range, each
labelled with the category that covered most of it and how busy it was, with runs of equal bins
merged. Either way the payload is bounded by lanes x bins, not by the trace.

Lanes are per rank (the rules are profiler/activity.py's): `main` (the thread with the ProfilerStep spans), `comm` (gloo's worker
threads, the other threads with gloo spans), `threads` (any other CPU thread) and `gpu s<stream>` per GPU stream. Categories are
the profiler's `kind` grouped for the eye: compute, comm, memory, other, and idle (no activity).
Times are ms from the run's first profiled step (`origin_us`), so runs line up.
"""

from __future__ import annotations

import polars as pl

# The lane and category rules live with the per-rank activity summary the map computes, once.
from profiler.activity import KIND_CATEGORY, LANE_ORDER, lane_spans  # noqa: F401  (re-exported)
from profiler.intervals import union

MAX_BINS = 400  # per lane, over the visible range
RAW_LIMIT = 4000  # at most this many events in view: send them as they are, names and all

_KEYS = ["run", "rank", "lane"]


def timeline_intervals(events: pl.DataFrame, *, origin_us: float = 0.0) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(intervals, merged) from an event frame.

    intervals: run, rank, lane, lane_key, category, name, start_ms, end_ms, one per complete event
    with a duration and a category (annotations and [memory] instants are not drawn).
    merged: the union of intervals per (run, rank, lane, category), the input of binning.
    """
    c = pl.col
    drawn = lane_spans(events)
    intervals = drawn.select(
        c("run").cast(pl.String),
        "rank",
        "lane",
        "lane_key",
        "category",
        "name",
        start_ms=(c("ts_us") - origin_us) / 1e3,
        end_ms=(c("end_us") - origin_us) / 1e3,
    ).sort("run", "rank", "lane_key", "start_ms")
    merged = union(
        intervals.select(*_KEYS, "lane_key", "category", start_us="start_ms", end_us="end_ms"),
        [*_KEYS, "lane_key", "category"],
    ).rename({"start_us": "start_ms", "end_us": "end_ms"})
    return intervals, merged


def lanes(intervals: pl.DataFrame) -> pl.DataFrame:
    """run, rank, lane, label in drawing order (top to bottom)."""
    return (
        intervals.select("run", "rank", "lane", "lane_key").unique()
        .sort("run", "rank", "lane_key")
        .with_columns(label=pl.format("r{} {}", "rank", "lane"))
        .drop("lane_key")
    )


def extent(intervals: pl.DataFrame) -> tuple[float, float]:
    """(first start, last end) in ms, (0, 1) when empty."""
    if intervals.is_empty():
        return 0.0, 1.0
    return float(intervals["start_ms"].min()), float(intervals["end_ms"].max())


def visible_timeline(
    intervals: pl.DataFrame,
    merged: pl.DataFrame,
    x_range: tuple[float, float] | None = None,
    *,
    max_bins: int = MAX_BINS,
    raw_limit: int = RAW_LIMIT,
) -> pl.DataFrame:
    """The segments to draw in `x_range` (ms; None = everything): run, rank, lane, label,
    category, start_ms, end_ms, busy (0..1 share of the segment with activity), text (hover).

    Raw events when at most `raw_limit` are in range, else bins; idle gaps are segments too.
    """
    x0, x1 = x_range if x_range is not None else extent(intervals)
    if x1 <= x0:
        x1 = x0 + 1e-3
    lane_list = lanes(intervals)
    in_view = intervals.filter((pl.col("end_ms") > x0) & (pl.col("start_ms") < x1))
    if in_view.height <= raw_limit:
        segments = _raw(in_view, merged, x0, x1)
    else:
        segments = _binned(merged, lane_list, x0, x1, max_bins)
    return segments.join(lane_list, on=_KEYS, how="left").select(
        "run", "rank", "lane", "label", "category", "start_ms", "end_ms", "busy", "text"
    )


def _clip(frame: pl.DataFrame, x0: float, x1: float) -> pl.DataFrame:
    return frame.with_columns(start_ms=pl.col("start_ms").clip(x0, x1), end_ms=pl.col("end_ms").clip(x0, x1)).filter(
        pl.col("end_ms") > pl.col("start_ms")
    )


def _raw(in_view: pl.DataFrame, merged: pl.DataFrame, x0: float, x1: float) -> pl.DataFrame:
    events = _clip(in_view, x0, x1).select(
        *_KEYS, "category", "start_ms", "end_ms", busy=pl.lit(1.0), text=pl.col("name")
    )
    return pl.concat([events, _idle_gaps(merged, x0, x1)], how="vertical_relaxed")


def _idle_gaps(merged: pl.DataFrame, x0: float, x1: float) -> pl.DataFrame:
    """Per lane, the parts of [x0, x1] no interval covers."""
    busy = union(
        _clip(merged.filter((pl.col("end_ms") > x0) & (pl.col("start_ms") < x1)), x0, x1)
        .select(*_KEYS, start_us="start_ms", end_us="end_ms"),
        _KEYS,
    ).sort(*_KEYS, "start_us")
    lanes_all = merged.select(_KEYS).unique()
    gaps = busy.with_columns(
        gap_start=pl.col("end_us"), gap_end=pl.col("start_us").shift(-1).over(_KEYS).fill_null(x1)
    ).select(*_KEYS, start_ms="gap_start", end_ms="gap_end")
    heads = busy.group_by(_KEYS).agg(end_ms=pl.col("start_us").min()).with_columns(start_ms=pl.lit(x0))
    empty = lanes_all.join(busy.select(_KEYS).unique(), on=_KEYS, how="anti").with_columns(start_ms=pl.lit(x0), end_ms=pl.lit(x1))
    return (
        pl.concat([gaps, heads.select(gaps.columns), empty.select(gaps.columns)])
        .filter(pl.col("end_ms") > pl.col("start_ms"))
        .with_columns(category=pl.lit("idle"), busy=pl.lit(0.0), text=pl.lit("idle"))
        .select(*_KEYS, "category", "start_ms", "end_ms", "busy", "text")
    )


def _binned(merged: pl.DataFrame, lane_list: pl.DataFrame, x0: float, x1: float, n: int) -> pl.DataFrame:
    w = (x1 - x0) / n
    c = pl.col
    covered = (
        _clip(merged.filter((c("end_ms") > x0) & (c("start_ms") < x1)), x0, x1)
        .with_columns(
            b0=((c("start_ms") - x0) / w).floor().cast(pl.Int64).clip(0, n - 1),
            b1=((c("end_ms") - x0) / w).ceil().cast(pl.Int64).clip(1, n) - 1,
        )
        .with_columns(bin=pl.int_ranges(c("b0"), pl.max_horizontal("b0", "b1") + 1))
        .explode("bin")
        .with_columns(
            cover=pl.min_horizontal(c("end_ms"), x0 + (c("bin") + 1) * w) - pl.max_horizontal(c("start_ms"), x0 + c("bin") * w)
        )
        .filter(c("cover") > 0)
        .group_by(*_KEYS, "bin", "category")
        .agg(c("cover").sum())
    )
    # Per bin: the category covering most of it, and how busy the bin was (categories of one lane
    # rarely overlap; capped at 1 when they do).
    top = covered.sort("cover", descending=True).group_by(*_KEYS, "bin").agg(
        category=c("category").first(), busy=(c("cover").sum() / w).clip(0.0, 1.0)
    )
    grid = lane_list.select(_KEYS).join(pl.DataFrame({"bin": pl.int_range(0, n, eager=True)}), how="cross")
    bins = (
        grid.join(top, on=[*_KEYS, "bin"], how="left")
        .with_columns(
            category=c("category").fill_null("idle"),
            busy=c("busy").fill_null(0.0),
        )
        # Nearly empty bins read as idle; busy is shown in steps of 1/4 so that equal runs merge.
        .with_columns(category=pl.when(c("busy") < 0.05).then(pl.lit("idle")).otherwise(c("category")))
        .with_columns(level=pl.when(c("category") == "idle").then(0.0).otherwise((c("busy") * 4).ceil() / 4))
        .sort(*_KEYS, "bin")
        .with_columns(seg=pl.struct("category", "level").rle_id().over(_KEYS))
    )
    return (
        bins.group_by(*_KEYS, "seg")
        .agg(category=c("category").first(), b0=c("bin").min(), b1=c("bin").max(), busy=c("busy").mean())
        .select(
            *_KEYS, "category",
            start_ms=x0 + c("b0") * w,
            end_ms=x0 + (c("b1") + 1) * w,
            busy="busy",
            text=pl.when(c("category") == "idle").then(pl.lit("idle")).otherwise(
                pl.format("{} · {}% busy", "category", (c("busy") * 100).round(0).cast(pl.Int64))
            ),
        )
    )


def decimate_curve(frame: pl.DataFrame, *, by: list[str], x: str, y: str, max_points: int = 1500) -> pl.DataFrame:
    """At most ~2 * max_points rows per `by` group: each of max_points time bins keeps its rows
    with the largest and smallest `y`, so peaks and troughs survive (memory curves)."""
    if frame.is_empty():
        return frame
    c = pl.col
    span = frame.group_by(by).agg(_x0=c(x).min(), _x1=c(x).max())
    return (
        frame.join(span, on=by)
        .with_columns(_bin=((c(x) - c("_x0")) / (c("_x1") - c("_x0") + 1e-9) * max_points).floor())
        .with_columns(_rank_hi=c(y).rank("ordinal", descending=True).over(*by, "_bin"),
                      _rank_lo=c(y).rank("ordinal").over(*by, "_bin"))
        .filter((c("_rank_hi") == 1) | (c("_rank_lo") == 1))
        .drop("_x0", "_x1", "_bin", "_rank_hi", "_rank_lo")
        .sort(*by, x)
    )
