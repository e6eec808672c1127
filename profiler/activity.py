"""Per-rank activity: how busy each lane was, per category, in fixed time bins (issue 16: a viewer
that draws 1,024 ranks without holding their events).

    act = activity(events)   # run, rank, lane, lane_key, category, t0_us, bin_us, bin, busy

Lanes and categories are the viewer's timeline rules, kept here once (viewer/aggregate.py imports
them): per rank, `main` (the thread with the ProfilerStep spans; every CPU thread when there is no
such span), `comm` (other CPU threads running communication spans, gloo's workers), `threads` (any
other CPU thread) and `gpu s<stream>` per GPU stream; categories are the profiler's `kind` grouped
for the eye: compute (compute, op), comm (comm, enqueue), memory, other (runtime, other).
Annotations (ph != "X"), zero-length spans and [memory] instants are not activity. A gloo send or
receive is drawn only outside the pipeline's action spans (breakdown.cpu_comm: asynchronous, it is
no communication time while the rank runs an action).

The rank's window is [its first drawn start, its last drawn end] in absolute µs, cut into
`n_bins` equal bins (bin_us = window / n_bins; t0_us = the window's start). `busy` is the share of
the bin covered by the union of that (lane, category)'s spans (0 < busy <= 1): overlapping spans
of one category count once. Rows are sparse: only bins with activity. A rank without drawn spans
has no rows. Runs in the map (rankmap.analyze_rank) on one rank's events; a frame of several ranks
is handled per (run, rank), each with its own window.
"""

from __future__ import annotations

import polars as pl

from profiler.breakdown import THREAD, blocking_waits, gloo_worker_threads, pipeline_actions_spans
from profiler.intervals import subtract, union
from profiler.steps import GLOO_P2P_RE, PROFILER_STEP_RE, names_matching

KIND_CATEGORY = {"compute": "compute", "op": "compute", "comm": "comm", "enqueue": "comm", "memory": "memory",
                 "runtime": "other", "other": "other"}
CATEGORIES = ["compute", "comm", "memory", "other"]
LANE_ORDER = {"main": 0, "threads": 1, "comm": 2}  # GPU streams come after, by stream id (lane_key 10 + stream)
N_BINS = 1000  # per rank window: ~1 ms bins on a 1 s window; a few hundred KB per rank at most
ACTIVITY_COLUMNS = {"run": pl.Categorical, "rank": pl.Int32, "lane": pl.String, "lane_key": pl.Int64, "category": pl.String,
                    "t0_us": pl.Float64, "bin_us": pl.Float64, "bin": pl.Int32, "busy": pl.Float32}


def lane_spans(events: pl.DataFrame, *, names: bool = True) -> pl.DataFrame:
    """The spans lanes are drawn from: run, rank, lane, lane_key, category, name (unless `names`
    is False), ts_us, end_us, one per complete event with a duration and a known kind."""
    c = pl.col
    # Only the columns drawn (not a copy of every column of every span); the step spans found
    # by their few distinct names, not by a regex over every span's.
    spans = (events.lazy().filter((c("ph") == "X") & (c("dur_us") > 0))
             .select("run", "rank", "tid", "stream", "device", "kind", "name", "ts_us", "end_us").collect())
    main = (
        spans.filter(c("name").is_in(names_matching(spans, PROFILER_STEP_RE)))
        .group_by("run", "rank").agg(main_tid=c("tid").first())
    )
    comm_tids = spans.filter((c("device") == "cpu") & (c("kind") == "comm")).select("run", "rank", "tid").unique().with_columns(is_comm=pl.lit(True))
    kinds = pl.DataFrame({"kind": list(KIND_CATEGORY), "category": list(KIND_CATEGORY.values())}).with_columns(c("kind").cast(pl.Categorical))
    drawn = (
        spans.select("run", "rank", "tid", "stream", "device", "kind", "name", "ts_us", "end_us")
        .join(kinds, on="kind", how="inner")
        .join(main, on=["run", "rank"], how="left")
        .join(comm_tids, on=["run", "rank", "tid"], how="left")
    )
    gpu = c("device") == "gpu"
    lane = (
        pl.when(gpu).then(pl.lit("gpu s") + c("stream").fill_null(c("tid")).cast(pl.String))
        # The main thread first: gloo runs point-to-point ops (pipeline send/recv) on it.
        .when((c("tid") == c("main_tid")) | c("main_tid").is_null()).then(pl.lit("main"))
        .when(c("is_comm").fill_null(False)).then(pl.lit("comm"))
        .otherwise(pl.lit("threads"))
    )
    lane_key = pl.when(gpu).then(10 + c("stream").fill_null(c("tid")).cast(pl.Int64)).otherwise(
        lane.replace_strict(LANE_ORDER, default=9, return_dtype=pl.Int64)
    )
    named = {"name": c("name").cast(pl.String)} if names else {}
    out = drawn.select("run", "rank", lane=lane, lane_key=lane_key, category="category", **named, ts_us="ts_us",
                       end_us="end_us", _p2p=c("name").is_in(names_matching(drawn, GLOO_P2P_RE)) & ~gpu)
    # gloo's sends and receives are asynchronous: their span runs from the post to the wait that
    # completes it while the rank runs its pipeline actions. As in the breakdown (cpu_comm), the
    # part inside an action span is no communication: drawn whole, an open send painted a zbv
    # rank's whole step as communication.
    out = _waits_drawn(events, out)
    p2p = out.filter(c("_p2p"))
    actions = pipeline_actions_spans(events) if p2p.height else None
    if actions is None or actions.is_empty():
        return out.drop("_p2p")
    cut = subtract(p2p.rename({"ts_us": "start_us"}), actions.select("run", "rank", start_us="ts_us", end_us="end_us"),
                   ["run", "rank"]).rename({"start_us": "ts_us"})
    return pl.concat([out.filter(~c("_p2p")), cut]).drop("_p2p")


def _waits_drawn(events: pl.DataFrame, out: pl.DataFrame) -> pl.DataFrame:
    """The lanes with a CPU rank's blocking waits (breakdown.blocking_waits: an operator around a
    synchronous collective runs on through its wait) cut out of the main lane's compute and drawn
    there as communication, as the breakdown counts them."""
    c = pl.col
    # Lazy, the few columns: a GPU rank (no gloo span) pays one filter, not a copy of its CPU events.
    comm = (events.lazy().filter((c("device") == "cpu") & (c("kind") == "comm") & (c("ph") == "X"))
            .select(*THREAD, "name", "ts_us", "end_us").collect())
    comm = comm.filter(~c("name").is_in(names_matching(comm, GLOO_P2P_RE)))
    if comm.is_empty():
        return out
    ops = (events.lazy().filter((c("device") == "cpu") & (c("ph") == "X") & c("kind").is_in(["op", "enqueue"]))
           .select(*THREAD, "name", "kind", "ts_us", "end_us").collect()
           .join(gloo_worker_threads(events), on=THREAD, how="anti"))
    waits = blocking_waits(ops, comm)
    if waits.is_empty():
        return out
    main = (c("lane") == "main") & (c("category") == "compute")
    cut = subtract(out.filter(main).rename({"ts_us": "start_us"}), waits, ["run", "rank"]).rename({"start_us": "ts_us"})
    drawn = waits.cast({"run": out.schema["run"], "rank": out.schema["rank"]}).select(
        "run", "rank", lane=pl.lit("main"), lane_key=pl.lit(LANE_ORDER["main"], pl.Int64), category=pl.lit("comm"),
        **({"name": pl.lit("(waiting for a collective)")} if "name" in out.columns else {}),
        ts_us="start_us", end_us="end_us", _p2p=pl.lit(False))
    return pl.concat([out.filter(~main), cut.select(out.columns), drawn.select(out.columns)])


def activity(events: pl.DataFrame, n_bins: int = N_BINS) -> pl.DataFrame:
    """Busy share per (run, rank, lane, category) in `n_bins` bins of each rank's window (see the
    module docstring); ACTIVITY_COLUMNS, sorted."""
    spans = lane_spans(events, names=False)
    if spans.is_empty():
        return pl.DataFrame(schema=ACTIVITY_COLUMNS)
    keys = ["run", "rank", "lane", "lane_key", "category"]
    merged = union(spans.select(*keys, start_us="ts_us", end_us="end_us"), keys)
    return bin_busy(merged, keys, n_bins)


def bin_busy(merged: pl.DataFrame, keys: list[str], n_bins: int) -> pl.DataFrame:
    """Disjoint intervals (keys..., start_us, end_us; disjoint within each key) cut into n_bins bins
    of each (run, rank)'s extent: keys..., t0_us, bin_us, bin, busy (sparse)."""
    c = pl.col
    window = merged.group_by("run", "rank").agg(t0_us=c("start_us").min(), t1_us=c("end_us").max())
    # In Python, one row per rank: polars may divide a column by a scalar through its reciprocal,
    # which rounds differently with the frame's length, and a rank's bins must not depend on which
    # other ranks share the frame. A window of one instant cannot happen (spans have dur > 0).
    window = window.with_columns(bin_us=pl.Series([max((t1 - t0) / n_bins, 1e-9) for t0, t1 in window.select("t0_us", "t1_us").iter_rows()],
                                                  dtype=pl.Float64))
    # Times in bin units by the reciprocal, spelled out: a column divided by one value (one
    # rank's frame: the joined bin_us is a single value) is multiplied by its reciprocal, and
    # divided element by element beside other ranks; the last bit differed, and with it a bin's
    # edge (the batched map analyses several ranks in one frame: profiler/batchmap.py).
    window = window.with_columns(per_bin=pl.Series([1.0 / b for b in window["bin_us"]], dtype=pl.Float64))
    x = (c("start_us") - c("t0_us")) * c("per_bin")
    y = (c("end_us") - c("t0_us")) * c("per_bin")
    cut = (
        merged.join(window.select("run", "rank", "t0_us", "bin_us", "per_bin"), on=["run", "rank"])
        .with_columns(b0=x.floor().cast(pl.Int64).clip(0, n_bins - 1), b1=(y.ceil().cast(pl.Int64) - 1).clip(0, n_bins - 1))
        .with_columns(bin=pl.int_ranges(c("b0"), pl.max_horizontal("b0", "b1") + 1))
        .explode("bin")
        # Covered share of the bin, in bin units: overlap of [x, y) with [bin, bin + 1).
        .with_columns(cover=pl.min_horizontal(y, c("bin") + 1) - pl.max_horizontal(x, c("bin")))
        .filter(c("cover") > 0)
    )
    out = cut.group_by(*keys, "t0_us", "bin_us", "bin").agg(busy=c("cover").sum().clip(0.0, 1.0))
    return out.select(list(ACTIVITY_COLUMNS)).cast(ACTIVITY_COLUMNS).sort("run", "rank", "lane_key", "category", "bin")
