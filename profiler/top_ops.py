"""Top CPU operators by self time and top GPU kernels by total time.

Self time of a CPU event is its duration minus that of the events nested directly inside it on
the same thread. It is found without walking a call tree: on each thread, the running count of
open events at any instant is the nesting depth, and the time between two consecutive boundaries
belongs to the most recent event that opened at that depth.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from profiler.intervals import varying
from profiler.steps import KEYS

THREAD = [*KEYS, "pid", "tid"]
CPU_SPAN_KINDS = ["op", "enqueue", "runtime", "annotation"]
CPU_OP_KINDS = ["op", "enqueue", "runtime"]


def self_times(events: pl.DataFrame) -> pl.DataFrame:
    """CPU spans with a `self_us` column (run, rank, pid, tid, name, kind, ts_us, dur_us, self_us)."""
    spans = _cpu_spans(events)
    return spans.with_columns(self_us=_self_us([spans])).drop("end_us")


def _cpu_spans(events: pl.DataFrame) -> pl.DataFrame:
    return (
        events.lazy()  # lazy: only the columns used are filtered
        .filter((pl.col("device") == "cpu") & (pl.col("ph") == "X") & pl.col("kind").is_in(CPU_SPAN_KINDS))
        .select(*THREAD, "name", "kind", "ts_us", "dur_us", "end_us")
        .collect()
    )


def _self_us(holder: list[pl.DataFrame]) -> pl.Series:
    """Each span's self time, by the boundary sweep of the module docstring, of the spans frame
    in `holder` (a list of one: it is taken out once read, so where the caller keeps no other
    reference to it, top_operators, its columns are freed before the sweep's largest arrays).

    The sorts are numpy's stable ones on one key at a time (Kineto writes a thread's spans in
    start order, and timsort takes such runs in linear time: a tenth of a multi-column sort).
    Memory: about twenty arrays of one or two values per span take part, and held all at once
    they were the largest transient of a rank's analyses (~45 MB on a 100 MB trace); each is
    dropped (`del`) once read for the last time, and the 0/1 and index ones are kept narrow.
    """
    spans = holder.pop()
    # Zero-length spans own no time (self 0 below); left in, a close-before-open tie would hand
    # one the rest of its parent's time.
    dur_all = spans.get_column("dur_us").to_numpy()
    op = np.flatnonzero(dur_all > 0).astype(np.int32)
    n_op = op.size
    ts = spans.get_column("ts_us").to_numpy()[op]
    # One small integer per thread (only the columns of THREAD that vary: one rank's frame has one
    # run and one rank).
    by = varying(spans, THREAD)
    thr = _thread_codes(spans, by)[op] if by else np.zeros(n_op, np.uint32)
    thr = thr.astype(np.uint16 if n_op == 0 or thr.max() < 2**16 else np.uint32)  # 16 bits: a radix sort
    # The end times, closes first (`t`: every boundary's time, below); then the frame is let go
    # (`dur_all`, a view of one column, keeps only that column).
    t = np.empty(2 * n_op)
    spans.get_column("end_us").to_numpy().take(op, out=t[:n_op], mode="clip")  # (no buffer: `op` is in range)
    height = spans.height
    del spans
    # Boundaries in the order (thread, time; at one instant closes first, so back-to-back siblings
    # do not nest; opens longer first, so a parent opens before the child that starts with it;
    # then trace order, so two identical spans nest the same way on every load). Opens are put in
    # (start, longer first, trace order) on each thread and closes stay in trace order; one
    # stable sort by time of [closes, opens] then one by thread give that order (how the opens
    # of different threads interleave does not matter: the sort by thread parts them).
    opens = np.argsort(ts, kind="stable").astype(np.int32)
    start = ts[opens]
    tie = np.flatnonzero(start[1:] == start[:-1])
    if by and tie.size > start.size // 8:
        # Starts tie across threads by the thousand (a batch of ranks recorded together, their
        # clocks alike): only a thread's own ties need an order, so the opens are put by thread
        # first (stably: a radix sort of 16-bit codes) and only those are ordered, where sorting
        # every cross-thread tie was half the sweep of a 32-rank batch.
        opens = opens[np.argsort(thr[opens], kind="stable")]
        start = ts[opens]
        tie = np.flatnonzero((start[1:] == start[:-1]) & (thr[opens[1:]] == thr[opens[:-1]]))
    del ts
    if tie.size:  # spans starting together: longest first, within each run of one start (and thread)
        # The tied positions, sorted and unique: np.union1d(tie, tie + 1) without its sort.
        in_tie = np.zeros(start.size, bool)
        in_tie[tie] = True
        in_tie[tie + 1] = True
        at = np.flatnonzero(in_tie)
        del in_tie
        # A run: consecutive tied positions of one start (with the opens put by thread, it may
        # hold two threads' ties of one start, side by side: each thread's keep their order).
        run = np.cumsum(np.r_[True, start[at[1:]] != start[at[:-1]]] | np.r_[True, at[1:] != at[:-1] + 1])
        opens[at] = opens[at][np.lexsort((-dur_all[op[opens[at]]], run))]  # (`start` is unchanged: equal in a run)
        del at, run
    del tie
    # Into op: the closes (trace order), then the opens; `t` and `thr_s` alike.
    which = np.concatenate([np.arange(n_op, dtype=np.int32), opens])
    t[n_op:] = start
    del start, dur_all
    thr_s = np.concatenate([thr, thr[opens]])
    del thr, opens
    order = np.argsort(t, kind="stable").astype(np.int32)
    # Then stably by thread; a few threads (most traces: codes 1..K) one pass each, which holds no
    # 64-bit permutation of every boundary (argsort's) at the sweep's fullest point.
    n_thr = int(thr_s.max()) + 1 if thr_s.size else 0
    if n_thr > 8:
        order = order[np.argsort(thr_s[order], kind="stable")]
    elif n_thr > 1:
        key = thr_s[order]
        order = np.concatenate([order[key == k] for k in range(n_thr)])
        del key
    which = which[order]
    t = t[order]
    thr_s = thr_s[order]
    is_open = order >= n_op
    del order
    # Each thread's opens and closes balance, so a running sum over the whole sorted frame is each
    # thread's nesting depth.
    depth = np.cumsum(np.where(is_open, np.int8(1), np.int8(-1)), dtype=np.int32)
    # The segments that can have an owner: from a boundary to the next one on the same thread,
    # of some length, inside a span; their lengths are all that is kept of the times.
    seg = np.zeros(t.size)
    np.subtract(t[1:], t[:-1], out=seg[:-1])
    del t
    cand = np.flatnonzero((np.r_[thr_s[1:] == thr_s[:-1], False]) & (depth > 0) & (seg > 0)).astype(np.int32)
    seg = seg[cand]
    # The time from a boundary to the next one on the thread belongs to the event open at that
    # depth, which is the latest open among the boundaries that left the thread at that depth
    # (had it closed, the depth would have dropped below and a newer open would come later).
    # (thread, depth) as one integer (depth < 2^32: it never exceeds the spans on a thread; 16
    # bits each where both fit, as on any real trace): a window over one key costs half of one
    # over two.
    if depth.size and depth.min() >= 0 and depth.max() < 2**16 and thr_s.max() < 2**16:
        at_depth = thr_s.astype(np.uint32)
        at_depth <<= 16
    else:
        at_depth = thr_s.astype(np.int64)
        at_depth <<= 32
    del thr_s
    at_depth += depth.astype(at_depth.dtype)
    del depth
    opened = op[which]
    del which
    opened[~is_open] = -1
    del is_open
    bounds = pl.DataFrame({"at_depth": at_depth, "opened": opened})
    del at_depth, opened
    owner = bounds.select(pl.when(pl.col("opened") >= 0).then(pl.col("opened")).forward_fill().over("at_depth")).to_series()
    del bounds
    owner = owner.gather(cand).fill_null(-1).to_numpy()
    del cand
    own = np.flatnonzero(owner >= 0)
    owner, seg = owner[own], seg[own]
    del own
    # Sums per owner, exactly as polars' group_by sums them: most spans own one or two segments,
    # whose sum is the same in any order (added here); the rest go through that group_by.
    n = np.bincount(owner, minlength=height)
    out = np.bincount(owner, weights=seg, minlength=height)
    many = n[owner] > 2
    del n
    if many.any():
        sums = pl.DataFrame({"owner": owner[many], "seg_us": seg[many]}).group_by("owner").agg(pl.col("seg_us").sum())
        out[sums["owner"].to_numpy()] = sums["seg_us"].to_numpy()
    return pl.Series("self_us", out, pl.Float64)


def _thread_codes(spans: pl.DataFrame, by: list[str]) -> np.ndarray:
    """1, 2, ... per span naming its thread (the columns `by`): ranked once per run of
    consecutive spans of one thread, not per span (a trace lists a thread's events in runs)."""
    run = spans.select(pl.struct(by).rle_id()).to_series().to_numpy()
    first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])  # run k starts at first[k]
    return spans.select(by)[first].select(pl.struct(by).rank("dense")).to_series().to_numpy()[run]


def top_operators(events: pl.DataFrame, *, n: int = 20) -> pl.DataFrame:
    """Per rank, the `n` CPU operators (aten ops, runtime calls, enqueues) with the most self time."""
    # self_times' spans, but the frame the sweep reads is freed before its largest arrays (only
    # the columns of the operator table are kept meanwhile).
    spans = [_cpu_spans(events)]
    ops = spans[0].select(*KEYS, "name", "dur_us", is_op=pl.col("kind").is_in(CPU_OP_KINDS))
    ops = ops.with_columns(self_us=_self_us(spans)).filter("is_op").select(*KEYS, "name", "self_us", "dur_us")
    return (
        # In order of first appearance and a stable sort: operators with equal times are listed
        # (and cut at n) the same way on every load, not in a hashed order. (Grouped by all three
        # keys even where run and rank are constant: polars sums a group of one key otherwise,
        # to other last digits.)
        ops.group_by(*KEYS, "name", maintain_order=True)
        .agg(count=pl.len(), self_us=pl.col("self_us").sum(), total_us=pl.col("dur_us").sum())
        .sort(*KEYS, "self_us", descending=[False, False, True], maintain_order=True)
        .group_by(KEYS, maintain_order=True)
        .head(n)
        .with_columns(pl.col("name").cast(pl.String))
    )


def top_kernels(events: pl.DataFrame, *, n: int = 20) -> pl.DataFrame:
    """Per rank, the `n` GPU kernels / copies with the most total time (a kernel's self time is its
    duration: nothing nests inside a kernel)."""
    rows = events.select(*KEYS, "device", "kind", "name", "dur_us")
    if not varying(rows, KEYS):
        return _top_kernels(rows, n)
    # Several ranks (a batch, profiler/batchmap.py): polars' streaming engine sums a group in
    # morsels whose cuts depend on where the rank's rows sit in the frame (and on the thread
    # count), so beside other ranks a rank would get other last digits than alone. Where every
    # addition is exact, any order gives the one sum: all ranks at once (`_top_kernels_exact`);
    # else rank by rank, each rank's rows as a frame of their own, as alone.
    kernels = rows.filter(_IS_KERNEL).drop("device")
    if kernels.is_empty():  # CPU ranks: one empty table (every rank's is empty)
        return _top_kernels(rows.clear(), n)
    exact = _top_kernels_exact(kernels, rows.select(KEYS).unique(maintain_order=True), n)
    if exact is not None:
        return exact
    return pl.concat([_top_kernels(p, n) for p in rows.partition_by(KEYS, maintain_order=True)], how="vertical")


_IS_KERNEL = (pl.col("device") == "gpu") & (pl.col("kind") != "annotation")


def _top_kernels(events: pl.DataFrame, n: int) -> pl.DataFrame:
    return (
        events.lazy()
        .filter(_IS_KERNEL)
        .group_by(*KEYS, "name", "kind", maintain_order=True)  # ties: as top_operators
        .agg(count=pl.len(), total_us=pl.col("dur_us").sum(), mean_us=pl.col("dur_us").mean())
        .sort(*KEYS, "total_us", descending=[False, False, True], maintain_order=True)
        .group_by(KEYS, maintain_order=True)
        .head(n)
        .with_columns(pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String))
        .collect()
    )


# Whole numbers below this are exact in a float64, and so is every sum of them staying below it.
EXACT_SUM = 2.0**53


def _top_kernels_exact(kernels: pl.DataFrame, ranks: pl.DataFrame, n: int) -> pl.DataFrame | None:
    """`_top_kernels` of each rank's kernels (run, rank, kind, name, dur_us), concatenated in the
    order of `ranks` (run, rank), in one pass over all of them; None where an addition could
    round: a duration that is not a whole number of µs (or not finite), or so many so long that
    their sum could reach 2^53 µs (their count times the longest).

    Otherwise every partial sum is a whole number below 2^53, so every addition is exact and the
    sums (and the means, sum / count of durations) are those of any order polars adds them in:
    bit for bit each rank's alone. Traces recorded at µs resolution take this path (ns ones have
    fractions). Groups, their order (first appearance), the sort (total, ties in that order) and
    the cut at n are _top_kernels' own.
    """
    dur = kernels.get_column("dur_us")
    w = dur.fill_null(0.0).to_numpy()  # polars' sum adds nothing for a null duration (its count counts it)
    # (n times the largest duration bounds every partial sum without adding anything up.)
    if not (np.isfinite(w).all() and (w == np.floor(w)).all() and np.abs(w).max(initial=0.0) * w.size < EXACT_SUM):
        return None
    # One number per (run, rank, name, kind), in order of first appearance.
    code = kernels.select(pl.struct(*KEYS, "name", "kind").rank("dense")).to_series().to_numpy()
    _, first, group = np.unique(code, return_index=True, return_inverse=True)
    by_first = np.argsort(first)
    renumber = np.empty_like(by_first)
    renumber[by_first] = np.arange(by_first.size)
    group, first = renumber[group.ravel()], first[by_first]
    total = np.bincount(group, weights=w, minlength=first.size)
    valid = np.bincount(group, weights=dur.is_not_null().to_numpy(), minlength=first.size)  # mean's count
    mean = np.divide(total, valid, out=np.zeros_like(total), where=valid > 0)
    table = kernels[first].select(
        *KEYS, pl.col("name").cast(pl.String), pl.col("kind").cast(pl.String),
        count=pl.Series(np.bincount(group, minlength=first.size), dtype=pl.get_index_type()),
        total_us=pl.Series(total, dtype=pl.Float64),
        mean_us=pl.when(pl.Series(valid > 0)).then(pl.Series(mean, dtype=pl.Float64)),
    )
    return (
        table.join(ranks.with_row_index("_rank_at"), on=KEYS, how="left", maintain_order="left")
        .sort("_rank_at", "total_us", descending=[False, True], maintain_order=True)
        .group_by("_rank_at", maintain_order=True)
        .head(n)
        .drop("_rank_at")
    )
