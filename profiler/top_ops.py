"""Top CPU operators by self time and top GPU kernels by total time.

Self time of a CPU event is its duration minus that of the events nested directly inside it on
the same thread. It is found without walking a call tree: on each thread, the running count of
open events at any instant is the nesting depth, and the time between two consecutive boundaries
belongs to the most recent event that opened at that depth.
"""

from __future__ import annotations

import polars as pl

from profiler.intervals import varying
from profiler.steps import KEYS

THREAD = [*KEYS, "pid", "tid"]
CPU_SPAN_KINDS = ["op", "enqueue", "runtime", "annotation"]
CPU_OP_KINDS = ["op", "enqueue", "runtime"]


def self_times(events: pl.DataFrame) -> pl.DataFrame:
    """CPU spans with a `self_us` column (run, rank, pid, tid, name, kind, ts_us, dur_us, self_us)."""
    spans = (
        events.lazy()  # lazy: only the columns used are filtered
        .filter((pl.col("device") == "cpu") & (pl.col("ph") == "X") & pl.col("kind").is_in(CPU_SPAN_KINDS))
        .select(*THREAD, "name", "kind", "ts_us", "dur_us", "end_us")
        .with_row_index("_op")
        .collect()
    )
    # One integer per thread keeps the sorts below on three plain columns.
    threads = spans.select(THREAD).unique().with_row_index("_thr")
    # Zero-length spans own no time (self 0 below); left in, a close-before-open tie would hand
    # one the rest of its parent's time.
    keyed = (spans.filter(pl.col("dur_us") > 0).join(threads, on=THREAD, maintain_order="left")
             .select("_op", "_thr", "ts_us", "dur_us", "end_us"))
    # Closes sort before opens at the same instant (back-to-back siblings do not nest); a parent
    # opens before the child that starts with it (longer first). Each thread's opens and closes
    # balance, so a running sum over the whole sorted frame is each thread's nesting depth. The
    # sort is stable: two spans with the same start and duration nest in the order the trace
    # lists them, the same way on every load.
    bounds = pl.concat([
        keyed.select("_thr", "_op", t=pl.col("ts_us"), delta=pl.lit(1, pl.Int32), order=-pl.col("dur_us")),
        keyed.select("_thr", "_op", t=pl.col("end_us"), delta=pl.lit(-1, pl.Int32), order=pl.lit(-float("inf"))),
    ]).sort("_thr", "t", "order", maintain_order=True).with_columns(depth=pl.col("delta").cum_sum())
    # The time from a boundary to the next one on the thread belongs to the event open at that
    # depth, which is the latest open among the boundaries that left the thread at that depth
    # (had it closed, the depth would have dropped below and a newer open would come later).
    # (thread, depth) as one integer (depth < 2^32: it never exceeds the spans on a thread): a
    # window over one key costs half of one over two.
    at_depth = pl.col("_thr").cast(pl.Int64) * 2**32 + pl.col("depth")
    owned = bounds.with_columns(
        owner=pl.when(pl.col("delta") == 1).then(pl.col("_op")).forward_fill().over(at_depth),
        seg_us=pl.when(pl.col("_thr").shift(-1) == pl.col("_thr")).then(pl.col("t").shift(-1) - pl.col("t")),
    ).filter((pl.col("depth") > 0) & (pl.col("seg_us") > 0))
    self_us = owned.filter(pl.col("owner").is_not_null()).group_by("owner").agg(self_us=pl.col("seg_us").sum())
    # Owners are row numbers of `spans`: each sum goes straight to its row (no join); a span that
    # owns no time keeps 0.
    column = pl.zeros(spans.height, pl.Float64, eager=True).scatter(self_us["owner"], self_us["self_us"])
    return spans.with_columns(self_us=column).drop("_op", "end_us")


def top_operators(events: pl.DataFrame, *, n: int = 20) -> pl.DataFrame:
    """Per rank, the `n` CPU operators (aten ops, runtime calls, enqueues) with the most self time."""
    return (
        self_times(events)
        .filter(pl.col("kind").is_in(CPU_OP_KINDS))
        # In order of first appearance and a stable sort: operators with equal times are listed
        # (and cut at n) the same way on every load, not in a hashed order.
        .group_by(*KEYS, "name", maintain_order=True)
        .agg(count=pl.len(), self_us=pl.col("self_us").sum(), total_us=pl.col("dur_us").sum())
        .sort(*KEYS, "self_us", descending=[False, False, True], maintain_order=True)
        .group_by(KEYS, maintain_order=True)
        .head(n)
        .with_columns(pl.col("name").cast(pl.String))
    )


def top_kernels(events: pl.DataFrame, *, n: int = 20) -> pl.DataFrame:
    """Per rank, the `n` GPU kernels / copies with the most total time (a kernel's self time is its
    duration: nothing nests inside a kernel)."""
    # Rank by rank: polars' streaming engine sums a group in morsels whose cuts depend on where
    # the rank's rows sit in the frame, so a rank analysed beside others (the batched map,
    # profiler/batchmap.py) would get other last digits than alone. Each rank's rows as a frame
    # of their own give the sums of the rank alone, bit for bit.
    rows = events.select(*KEYS, "device", "kind", "name", "dur_us")
    parts = rows.partition_by(KEYS, maintain_order=True) if varying(rows, KEYS) else [rows]
    return pl.concat([_top_kernels(p, n) for p in parts or [rows]], how="vertical")


def _top_kernels(events: pl.DataFrame, n: int) -> pl.DataFrame:
    return (
        events.lazy()
        .filter((pl.col("device") == "gpu") & (pl.col("kind") != "annotation"))
        .group_by(*KEYS, "name", "kind", maintain_order=True)  # ties: as top_operators
        .agg(count=pl.len(), total_us=pl.col("dur_us").sum(), mean_us=pl.col("dur_us").mean())
        .sort(*KEYS, "total_us", descending=[False, False, True], maintain_order=True)
        .group_by(KEYS, maintain_order=True)
        .head(n)
        .with_columns(pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String))
        .collect()
    )
