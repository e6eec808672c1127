"""Interval arithmetic over frames: union and a labelled sweep line, as expressions.

Every time-accounting analysis reduces to "how long was set A busy while set B was (not)":
`sweep` turns labelled intervals into constant-state segments, after which any such question is a
filtered sum of segment lengths.
"""

from __future__ import annotations

import numpy as np
import polars as pl


def union(intervals: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Merge overlapping [start_us, end_us) intervals within each `by` group.

    An interval opens a new merged block when it starts after every earlier end (sorted by start,
    cumulative max of the previous ends), HTA's algorithm.
    """
    # Sorted by the columns of `by` that vary only, by sorted_by's one-column sorts (a sort on
    # several columns, texts among them, cost most of a rank's activity bins); each group is then
    # one run of rows, numbered once. Intervals starting together may come in any order: the
    # first of them opens a block or not, the others join it (every end is at or after its start).
    keys = varying(intervals, by)
    ordered = sorted_by(intervals.select(*by, "start_us", "end_us"), keys, "start_us")
    return (
        ordered.with_columns(_g=pl.struct(keys).rle_id() if keys else pl.lit(0, pl.UInt32))
        .with_columns(_opens=(pl.col("start_us") > pl.col("end_us").shift(1).cum_max().over("_g")).fill_null(True))
        .with_columns(_block=pl.col("_opens").cast(pl.Int32).cum_sum().over("_g"))
        .group_by("_g", "_block", maintain_order=True)
        .agg(pl.col(by).first(), pl.col("start_us").min(), pl.col("end_us").max())
        .drop("_g", "_block")
    )


def varying(frame: pl.DataFrame, by: list[str]) -> list[str]:
    """The columns of `by` that take more than one value in `frame`.

    Sorting or windowing by a column that holds one value changes nothing, and a sort on several
    columns costs several times one on a single column: a per-rank frame has one run and one rank.
    """
    if frame.height < 2 or not by:
        return []
    counts = frame.select(pl.col(by).n_unique()).row(0)
    return [c for c, n in zip(by, counts) if n > 1]


def sorted_by(frame: pl.DataFrame, keys: list[str], t: str) -> pl.DataFrame:
    """`frame` sorted by (keys..., t), stably (ties keep their order in `frame`).

    The same rows in the same order as `frame.sort(*keys, t, maintain_order=True)`, by numpy's
    stable sorts on one column at a time: time-ordered bounds come in a few sorted runs (starts in
    trace order, ends nearly so), which timsort takes in linear time, and integer keys (rank,
    step) with few values sort in one pass; a multi-column polars sort costs several times as much
    on a large rank. Other keys (a categorical run, nulls) are left to polars.
    """
    if frame.height < 2:
        return frame
    cols = [_sort_codes(frame.get_column(k)) for k in keys]
    if any(c is None for c in cols) or frame.get_column(t).null_count():
        return frame.sort(*keys, t, maintain_order=True)
    order = np.argsort(frame.get_column(t).to_numpy(), kind="stable")
    for c in reversed(cols):  # least significant first: each stable pass keeps the order of the last
        order = order[np.argsort(_narrow(c)[order], kind="stable")]
    return frame[order]


def _narrow(codes: np.ndarray) -> np.ndarray:
    """Integer codes in 16 bits where their range allows (numpy's stable sort of those is a radix
    sort, linear), else as they are: the same order either way."""
    low, high = int(codes.min()), int(codes.max())
    return (codes - low).astype(np.uint16) if high - low < 2**16 else codes


def _sort_codes(column: pl.Series) -> np.ndarray | None:
    """Integers that sort as `column` sorts in polars (nulls first), or None where that is not
    known here (a categorical, whose order is polars' own business)."""
    if column.dtype.is_integer() and not column.null_count():
        return column.to_numpy()
    if column.dtype == pl.String:  # a few distinct texts (a memory device): their rank among those
        values = column.unique().sort()  # polars' own order of texts; a null first
        return column.replace_strict(values, pl.int_range(values.len(), eager=True), return_dtype=pl.Int64).to_numpy()
    return None


def over(expr: pl.Expr, by: list[str]) -> pl.Expr:
    """`expr` per group of `by`; over the whole frame when `by` is empty (one group)."""
    return expr.over(by) if by else expr


def last_at_instant(by: list[str], t: str = "t") -> pl.Expr:
    """On a frame sorted by (by, t): True on the last row of each (group, instant)."""
    same = pl.all_horizontal([pl.col(c).shift(-1) == pl.col(c) for c in [*by, t]])
    return ~same.fill_null(False)


def sweep(intervals: pl.DataFrame, by: list[str], labels: list[str]) -> pl.DataFrame:
    """Constant-state segments of labelled intervals.

    intervals: columns by..., label (one of `labels`), start_us, end_us; may overlap freely.
    Returns by..., start_us, end_us, dur_us and one boolean column per label: whether any interval
    of that label covers the segment. Segments cover [first start, last end] of each group.
    """
    # One +1 / -1 column per label, decided once per interval (not per bound, and no string
    # compare in the running sums).
    label = pl.col("label")  # text or categorical: compared with each label as it is, no text built per interval
    opens = {f"_n_{lab}": (label == lab).fill_null(False).cast(pl.Int32) for lab in labels}
    # Sorted by the columns of `by` that vary only; the others (one rank's run and rank) are not
    # carried through the sort but put back as constants.
    groups = varying(intervals, by)
    bounds = pl.concat([
        intervals.select(*groups, t=pl.col("start_us"), **opens),
        intervals.select(*groups, t=pl.col("end_us"), **{c: -e for c, e in opens.items()}),
    ])
    counts = [f"_n_{lab}" for lab in labels]
    # Every group's opens and closes balance, so after sorting by (group, t) a running sum over the
    # whole frame restarts at zero in each group: no per-group window needed. (Bounds at one
    # instant may come in any order: only the last one's counts are kept, the same in any order.)
    bounds = (sorted_by(bounds, groups, "t") if groups else bounds.sort("t")).with_columns(pl.col(counts).cum_sum())
    # Several bounds at one instant: the last one's running counts hold until the next instant.
    same_group = pl.all_horizontal([pl.col(c).shift(-1) == pl.col(c) for c in groups]) if groups else pl.lit(True)
    const = {c: pl.lit(intervals.get_column(c)[0] if intervals.height else None, intervals.schema[c])
             for c in by if c not in groups}
    return (
        bounds.filter(last_at_instant(groups))  # a filter, not a group_by: the frame is sorted by (group, t)
        .with_columns(end_us=pl.when(same_group).then(pl.col("t").shift(-1)))
        .filter(pl.col("end_us").is_not_null())
        .select(
            *[const[c].alias(c) if c in const else pl.col(c) for c in by],
            start_us=pl.col("t"),
            end_us=pl.col("end_us"),
            dur_us=pl.col("end_us") - pl.col("t"),
            **{lab: pl.col(f"_n_{lab}") > 0 for lab in labels},
        )
    )


def clip(intervals: pl.DataFrame, windows: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """Intervals cut to their window (window_start_us, window_end_us joined on `on`), empty ones dropped."""
    return (
        intervals.join(windows.select(*on, "window_start_us", "window_end_us"), on=on, how="inner")
        .with_columns(
            start_us=pl.max_horizontal("start_us", "window_start_us"),
            end_us=pl.min_horizontal("end_us", "window_end_us"),
        )
        .filter(pl.col("end_us") > pl.col("start_us"))
        .drop("window_start_us", "window_end_us")
    )


def subtract(spans: pl.DataFrame, cover: pl.DataFrame, on: list[str]) -> pl.DataFrame:
    """The parts of each span (on..., start_us, end_us, any other columns) outside the union of
    `cover` (on..., start_us, end_us) of the same `on` keys: a span cut by covers becomes the
    pieces between them, each with the span's other columns; a span no cover touches is kept whole."""
    if spans.is_empty() or cover.is_empty():
        return spans
    c = pl.col
    cols = spans.columns
    # The union's covers are disjoint, so sorted by start they are sorted by end too: a span's
    # covers are one run of them, from the first that ends at or after its start to the last that
    # starts at or before its end (two look-ups, not a span x cover join). Covers that only touch
    # a span give empty pieces, dropped below.
    u = (union(cover.select(*on, "start_us", "end_us"), on).cast({k: spans.schema[k] for k in on})
         .sort(*on, "start_us").with_row_index("_i").rename({"start_us": "_c0", "end_us": "_c1"}))
    ided = spans.with_row_index("_span")
    first = ided.sort("start_us").join_asof(u.select(*on, "_i", "_c1"), left_on="start_us", right_on="_c1", by=on,
                                            strategy="forward", check_sortedness=False).select("_span", i0="_i")
    last = ided.sort("end_us").join_asof(u.select(*on, "_i", "_c0"), left_on="end_us", right_on="_c0", by=on,
                                         strategy="backward", check_sortedness=False).select("_span", i1="_i")
    ranges = first.join(last, on="_span").filter(c("i0").is_not_null() & c("i1").is_not_null() & (c("i1") >= c("i0")))
    hit = (ided.join(ranges, on="_span").with_columns(_i=pl.int_ranges("i0", c("i1") + 1, dtype=pl.UInt32)).explode("_i")
           .join(u.select("_i", "_c0", "_c1"), on="_i").sort("_span", "_c0"))
    # Between consecutive covers of a span: a piece from the last cover's end (the span's start
    # before the first) to the next cover's start, and one from the last cover's end to the span's end.
    inner = hit.with_columns(start_us=c("_c1").shift(1).over("_span").fill_null(c("start_us")),
                             end_us=pl.min_horizontal("_c0", "end_us"))
    tail = hit.group_by("_span").agg(c("_c1").max()).join(ided, on="_span").with_columns(start_us=c("_c1"))
    pieces = pl.concat([inner.select("_span", *cols), tail.select("_span", *cols)])
    whole = ided.join(ranges.select("_span"), on="_span", how="anti")
    return (pl.concat([whole, pieces]).filter(c("end_us") > c("start_us")).sort("_span", "start_us").drop("_span")
            .select(cols))
