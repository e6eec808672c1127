"""Training steps: the `ProfilerStep#<k>` windows of each rank, and which step each event is in.

torch.profiler marks every scheduled step with a `ProfilerStep#<k>` span on the main thread. A trace
recorded without a schedule has none: it is then one window, step NO_STEP (-1), spanning the whole
trace, and analyses say so (`has_profiler_steps` is False).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from profiler.errors import TraceError
from profiler.intervals import varying

NO_STEP = -1  # the step number of a trace's single window when it has no ProfilerStep spans
PROFILER_STEP_RE = r"^ProfilerStep\s*#\s*(\d+)$"
# A pipeline runner's action span (runners/harness.py PP_ACTION, `ptprof/pp/F s0 mb1`): the rank
# running one stage's forward, backward or weight-gradient work on one microbatch.
PP_ACTION_RE = r"^ptprof/pp/[FBIWLU] "
# gloo's point-to-point spans (pipelines' and ring attention's sends and receives).
GLOO_P2P_RE = r"^gloo:(send|recv)"
KEYS = ["run", "rank"]


def names_matching(events: pl.DataFrame, pattern: str) -> list[str]:
    """The distinct event names that match `pattern` (the regex runs over those, not every event's)."""
    names = events.get_column("name").unique().cast(pl.String).drop_nulls()
    return names.filter(names.str.contains(pattern)).to_list()


def profiler_steps(events: pl.DataFrame, *, keep_empty: bool = False) -> pl.DataFrame:
    """One row per (run, rank, step): start_us, end_us, dur_us and has_profiler_steps.

    Ranks without ProfilerStep spans get a single NO_STEP window over all their events. A rank's
    last step that holds nothing (`empty_last_steps`) is left out, unless `keep_empty`.
    """
    return steps_and_empty(events, keep_empty=keep_empty)[0]


def steps_and_empty(events: pl.DataFrame, *, keep_empty: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(`profiler_steps`, `empty_last_steps`) of the events, their ProfilerStep spans found once."""
    step_names = names_matching(events, PROFILER_STEP_RE)
    marked = _marked(events, step_names)
    empty = _empty_last(events, marked, step_names)
    if not keep_empty:
        marked = marked.join(empty.select(*KEYS, "step"), on=[*KEYS, "step"], how="anti")
    spans = events.lazy().filter(pl.col("kind") != "memory_event")
    if varying(events, KEYS):
        spans = spans.group_by(KEYS).agg(start_us=pl.col("ts_us").min(), end_us=pl.col("end_us").max())
    else:  # one rank: its extent, no group_by (and no row where it has no events)
        spans = (spans.select(pl.col(KEYS).first(), start_us=pl.col("ts_us").min(), end_us=pl.col("end_us").max(), _n=pl.len())
                 .filter(pl.col("_n") > 0).drop("_n"))
    extent = (
        spans
        .join(marked.lazy().select(KEYS).unique(), on=KEYS, how="anti")
        .with_columns(step=pl.lit(NO_STEP, pl.Int64))
        .collect()
    )
    steps = (
        pl.concat([
            marked.with_columns(has_profiler_steps=pl.lit(True)),
            extent.select(marked.columns).with_columns(has_profiler_steps=pl.lit(False)),
        ])
        .with_columns(dur_us=pl.col("end_us") - pl.col("start_us"))
        .select(*KEYS, "step", "start_us", "end_us", "dur_us", "has_profiler_steps")
        .sort(*KEYS, "step")
    )
    return steps, empty


def empty_last_steps(events: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, step, dur_us): each rank's last ProfilerStep that holds nothing (of two or more): 0 µs long, or
    no event of the rank but GPU activity (no operator, runtime call, annotation or [memory]
    instant) runs past its start: nothing starts in it, nothing started before runs on into it.

    torch.profiler's `prof.step()` at the end of each iteration opens a step that the next one
    closes; after the loop's last iteration the step it opens holds nothing but the profiler's
    own stop. Counted as a step, it put a 0 µs step into the mean step time (17.2 -> 11.5 ms on a
    sample run given one) and stretched a CPU rank's window; `profiler_steps` leaves it out and
    the report says so (report.empty_step_warnings). GPU activity does not count: a kernel
    still running then belongs to the step that launched it (assign_steps)."""
    step_names = names_matching(events, PROFILER_STEP_RE)
    return _empty_last(events, _marked(events, step_names), step_names)


def _marked(events: pl.DataFrame, step_names) -> pl.DataFrame:
    """(run, rank, step, start_us, end_us) of each ProfilerStep span. TraceError (no path: the map
    names the file) where a rank has two spans of one step number: taken as one, they made one
    step of both and everything after them (34.4 ms for a 19.6 and a 14.8 ms step), and per-step
    volumes twice their size; torch.profiler numbers each step once."""
    marked = (
        events.lazy()
        .filter(pl.col("name").is_in(step_names) & (pl.col("device") == "cpu") & (pl.col("ph") == "X"))
        .with_columns(step=pl.col("name").cast(pl.String).str.extract(PROFILER_STEP_RE, 1).cast(pl.Int64))
        .group_by(*KEYS, "step")
        .agg(start_us=pl.col("ts_us").min(), end_us=pl.col("end_us").max(), _n=pl.len())
        .collect()
    )
    twice = marked.filter(pl.col("_n") > 1)
    if twice.height:
        step, n = twice.sort(*KEYS, "step").select("step", "_n").row(0)  # the load's line names the file and rank
        more = f" (and {twice.height - 1} other step numbers)" if twice.height > 1 else ""
        raise TraceError(None, f"ProfilerStep#{step} appears {n} times{more}: spans of one step number "
                               f"cannot be told apart (torch.profiler numbers each step once); rename or drop the extra spans")
    return marked.drop("_n")


def _empty_last(events: pl.DataFrame, marked: pl.DataFrame, step_names) -> pl.DataFrame:
    """(run, rank, step, dur_us) of each rank's last marked step that holds nothing (empty_last_steps)."""
    if marked.is_empty():
        return marked.select(*KEYS, "step", dur_us=pl.col("end_us") - pl.col("start_us"))
    # A rank's only step stays a step (left out, the rank would have none: one window over its events).
    last = (marked.sort("start_us", "step").group_by(KEYS, maintain_order=True)
            .agg(pl.all().last(), _n=pl.len()).filter(pl.col("_n") > 1).drop("_n"))
    work = events.lazy().filter((pl.col("device") != "gpu") & ~pl.col("name").is_in(step_names).fill_null(False))
    if varying(events, KEYS):
        ends = work.group_by(KEYS).agg(last_end_us=pl.col("end_us").max())
    else:  # one rank: no group_by (and no row where it has no such event)
        ends = (work.select(pl.col(KEYS).first(), last_end_us=pl.col("end_us").max(), _n=pl.len())
                .filter(pl.col("_n") > 0).drop("_n"))
    return (
        last.lazy().join(ends, on=KEYS, how="left")
        .filter((pl.col("end_us") <= pl.col("start_us")) | pl.col("last_end_us").is_null()
                | (pl.col("last_end_us") <= pl.col("start_us")))
        .select(*KEYS, "step", dur_us=pl.col("end_us") - pl.col("start_us"))
        .sort(KEYS)
        .collect()
    )


def assign_steps(events: pl.DataFrame, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """`events` plus a `step` column (null outside every step).

    CPU events belong to the step whose span holds their start; GPU activity belongs to the step
    of the runtime call that launched it (linked by `correlation`), since a kernel may run after
    its step's CPU span has ended. Activity whose `correlation` names no runtime call in the trace
    was launched before profiling began (an iteration that was not traced): it has no step, as in
    HTA (`_filter_irrelevant_gpu_kernels`), so the first step's window does not absorb the previous
    iteration's tail (4.5 % of the window on ../shared/traces/single/v100_rank1_of_2). Activity
    with no correlation at all (some ROCm and annotation events) goes by its own start. A rank
    with fewer than two ProfilerSteps keeps all its device activity in its one window, as HTA
    does (`_single_window`).

    Events that already carry a `step` column (an earlier assign_steps) are returned as they are,
    so one assignment of a large frame serves every analysis.
    """
    if "step" in events.columns:
        return events
    steps = profiler_steps(events) if steps is None else steps
    # Work on a narrow copy (a few columns) and attach the result: joins on the whole frame
    # would copy every column of every event.
    narrow = events.select(*KEYS, "ts_us", "device", "kind", "correlation")
    # Joined on the keys that vary only: one rank's events are matched on correlation alone (a
    # join on one integer column, not three).
    keys = varying(narrow, KEYS)
    # Several ranks, each one run of rows (a batch, profiler/batchmap.py): each rank's steps and
    # launches found by binary search in its own rows, as for one rank (one sort of the whole
    # batch by time, and one join, cost most of the assignment).
    blocks = rank_blocks(narrow) if keys else None
    by_time = _step_at(narrow.select(*KEYS, "ts_us"), steps, blocks)
    # Only device activity takes another step than its start's: those rows alone are matched.
    device = narrow.with_columns(step=by_time).with_row_index("_row").filter(pl.col("device") == "gpu")
    if keys:
        launched = _launch_of(narrow, by_time, device, blocks) if blocks is not None else None
        if launched is not None:
            device = device.with_columns(*launched)
        else:
            launches = (
                narrow.with_columns(step=by_time)
                .filter((pl.col("device") == "cpu") & pl.col("correlation").is_not_null() & (pl.col("kind") == "runtime"))
                .group_by(*keys, "correlation")
                .agg(launch_step=pl.col("step").first(), _launched=pl.lit(True))
            )
            device = device.join(launches, on=[*keys, "correlation"], how="left", maintain_order="left")
        device = device.join(_single_window(events, steps), on=KEYS, how="left", maintain_order="left")
    else:  # one rank: launches by binary search, and _single_window's one row (or none) as constants
        only_step, single = _single_one_rank(events, steps)
        device = device.with_columns(*_launch_of(narrow, by_time, device),
                                     _only_step=pl.lit(only_step, pl.Int64), _single=pl.lit(single, pl.Boolean))
    device_step = device.select(
        "_row",
        step=pl.when(pl.col("_single")).then(pl.col("_only_step"))
        .when(pl.col("correlation").is_not_null())
        .then(pl.when(pl.col("_launched")).then(pl.col("launch_step")))
        .otherwise(pl.col("step")),
    )
    step = by_time.scatter(device_step["_row"], device_step["step"]) if device_step.height else by_time
    return events.with_columns(step=step)


def _launch_of(narrow: pl.DataFrame, by_time: pl.Series, device: pl.DataFrame,
               blocks: list[tuple[str, int, int, int]] | None = None) -> list[pl.Series] | None:
    """`launch_step` and `_launched` of `device`'s rows: the step (by time) of the first runtime
    call of the row's rank with the row's correlation, found by binary search in the runtime
    calls' sorted correlations (what a group_by(rank, correlation).first() and a join give).

    blocks: `rank_blocks(narrow)` where the frame holds several ranks, each searched among its
    own calls (None where it holds one); None back where (block, correlation) does not fit one
    integer (a correlation id near 2^62: the caller joins instead).
    """
    is_call = narrow.select((pl.col("device") == "cpu") & pl.col("correlation").is_not_null() & (pl.col("kind") == "runtime"))
    calls = np.flatnonzero(is_call.to_series().fill_null(False).to_numpy())
    corr = narrow.get_column("correlation").fill_null(0).to_numpy()[calls]
    wanted = device.get_column("correlation")
    value = wanted.fill_null(0).to_numpy()
    if blocks is not None and calls.size and value.size:
        # (block, correlation) as one integer, block by block in increasing order.
        low, high = int(min(corr.min(), value.min())), int(max(corr.max(), value.max()))
        span = high - low + 1
        if span * len(blocks) >= 2**62:
            return None
        block = np.repeat(np.arange(len(blocks), dtype=np.int64), [n for *_, n in blocks])
        corr = block[calls] * span + (corr - low)
        value = block[device.get_column("_row").to_numpy()] * span + (value - low)
    order = np.argsort(corr, kind="stable")  # each correlation's calls in trace order: the first is the one
    corr = corr[order]
    first = np.ones(corr.size, bool)
    first[1:] = corr[1:] != corr[:-1]
    known, call = corr[first], calls[order[first]]
    if not known.size or not wanted.len():
        return [pl.Series("launch_step", [None] * wanted.len(), pl.Int64), pl.Series("_launched", [None] * wanted.len(), pl.Boolean)]
    at = np.minimum(np.searchsorted(known, value), known.size - 1)
    hit = wanted.is_not_null().to_numpy() & (known[at] == value)
    return [by_time.gather(call[at]).alias("launch_step"), pl.Series("_launched", hit).replace(False, None)]


def rank_blocks(frame: pl.DataFrame) -> list[tuple[str, int, int, int]] | None:
    """(run, rank, first row, rows) of each (run, rank) of `frame` where each one's rows are one
    run of rows (a batch's frame: its files' events one after the other), else None."""
    runs = frame.select(pl.struct(KEYS).rle().alias("r")).unnest("r").unnest("value")  # a categorical run lists as text
    keys = list(zip(runs.get_column("run").to_list(), runs.get_column("rank").to_list()))
    if len(set(keys)) != len(keys) or any(run is None or rank is None for run, rank in keys):
        return None
    lengths = runs.get_column("len").to_list()
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    return [(run, rank, at, n) for (run, rank), at, n in zip(keys, starts, lengths)]


def _single_one_rank(events: pl.DataFrame, steps: pl.DataFrame) -> tuple[int | None, bool | None]:
    """_single_window of a frame of one (run, rank), as (its _only_step, its _single): (None,
    None) where it has two or more ProfilerSteps (or no events)."""
    if events.is_empty():
        return None, None
    names = names_matching(events, PROFILER_STEP_RE)
    n = (events.lazy().filter(pl.col("name").is_in(names) & (pl.col("device") == "cpu") & (pl.col("ph") == "X"))
         .select(pl.col("name").n_unique()).collect().item())
    if n >= 2:
        return None, None
    run, rank = events.select(KEYS).row(0)
    mine = steps.filter((pl.col("run").cast(pl.String) == str(run)) & (pl.col("rank") == rank))
    return (mine.get_column("step")[0] if mine.height else None), True


def _single_window(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, _single, _only_step) for ranks whose trace has fewer than two ProfilerSteps.

    HTA drops device activity launched outside the profiled steps only when the trace has two or
    more ProfilerSteps (`Trace._filter_irrelevant_gpu_kernels`); with one or none it cannot tell
    which iteration launched what, and keeps all of it. So do we: all of such a rank's device
    activity belongs to its one window (`_only_step`), whether or not its launch is in the trace.
    Counted on the events, not on `steps`, which may hold only the step an analysis selected.
    """
    names = names_matching(events, PROFILER_STEP_RE)
    counts = (
        events.lazy()
        .filter(pl.col("name").is_in(names) & (pl.col("device") == "cpu") & (pl.col("ph") == "X"))
        .group_by(KEYS)
        .agg(n=pl.col("name").n_unique())
    )
    # The ranks present (one rank's frame: its first row, not a hash of every event's keys).
    present = events.lazy().select(KEYS).unique() if varying(events, KEYS) else events.lazy().select(KEYS).head(1)
    return (
        present
        .join(counts, on=KEYS, how="left")
        .filter(pl.col("n").fill_null(0) < 2)
        .join(steps.lazy().group_by(KEYS).agg(_only_step=pl.col("step").first()), on=KEYS, how="left")
        .select(*KEYS, "_only_step", _single=pl.lit(True))
        .collect()
    )


def _step_at(points: pl.DataFrame, steps: pl.DataFrame, blocks: list[tuple[str, int, int, int]] | None = None) -> pl.Series:
    """`step`: for each point (in order), the step whose [start_us, end_us) holds its ts_us (steps
    do not overlap), else null. blocks: `rank_blocks(points)`, or None."""
    table = steps.select(*KEYS, "step", "start_us", "end_us")
    keys = varying(points, KEYS)
    if not keys and points.height:  # one rank: its own steps, then nothing to match per row
        table = table.join(points.select(KEYS).head(1), on=KEYS, how="semi").drop(KEYS).sort("start_us")
        values, hit = _search_steps(points.get_column("ts_us").to_numpy(),
                                    *(table.get_column(c).to_numpy() for c in ("start_us", "end_us", "step")))
        return pl.Series("step", values, pl.Int64).scatter(np.flatnonzero(~hit), None)
    found = _step_at_blocks(points.get_column("ts_us").to_numpy(), blocks, table) if blocks is not None else None
    if found is not None:
        return found
    table = table.sort("start_us")
    return (
        points.with_row_index("_row").sort("ts_us")
        .join_asof(table, left_on="ts_us", right_on="start_us", by=keys or None, strategy="backward", check_sortedness=False)
        .select("_row", step=pl.when(pl.col("ts_us") < pl.col("end_us")).then(pl.col("step")))
        .sort("_row").get_column("step")
    )


def _step_at_blocks(ts: np.ndarray, blocks: list[tuple[str, int, int, int]], table: pl.DataFrame) -> pl.Series | None:
    """_step_at of points of several ranks, each rank one block of rows (`rank_blocks`), by a
    binary search in each rank's steps; None where a rank has two steps starting together (which
    of them join_asof takes is its sort's business) or a step without its times."""
    if any(table.get_column(c).null_count() for c in ("step", "start_us", "end_us")) or table.get_column("start_us").is_nan().any():
        return None
    start, end, step = (table.get_column(c).to_numpy() for c in ("start_us", "end_us", "step"))
    own: dict[tuple[str, int], list[int]] = {}
    for i, key in enumerate(zip(table.get_column("run").cast(pl.String).to_list(), table.get_column("rank").to_list())):
        own.setdefault(key, []).append(i)
    values = np.zeros(ts.size, np.int64)
    hit = np.zeros(ts.size, bool)
    for run, rank, first, n in blocks:
        mine = np.array(own.get((run, rank), []), np.int64)
        if not mine.size:
            continue  # a rank without steps: no point in one
        mine = mine[np.argsort(start[mine], kind="stable")]
        if (start[mine][1:] == start[mine][:-1]).any():
            return None
        values[first:first + n], hit[first:first + n] = _search_steps(ts[first:first + n], start[mine], end[mine], step[mine])
    return pl.Series("step", values, pl.Int64).scatter(np.flatnonzero(~hit), None)


def _search_steps(ts: np.ndarray, starts: np.ndarray, ends: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(step, hit) of each point of one rank among its steps sorted by start: join_asof's backward
    match by binary search (the last start at or before the point, the last of equal starts as
    join_asof takes it), a hit where that step ends after the point."""
    at = np.searchsorted(starts, ts, side="right") - 1
    found = at >= 0
    if not starts.size:
        return np.zeros(ts.size, np.int64), found
    at = np.where(found, at, 0)
    return steps[at], found & (ts < ends[at])


# A rank's last step running on past the rank's last event by more than this share of the step:
# a trace cut short (report.cut_trace_warnings). On whole traces the tail is the Python between the
# optimizer's last operator and the next `prof.step()`: under 1 % of the step (4.4 ms of 623 ms on
# ../shared/traces/gpu_nccl_2_of_128, 0.05 ms of 39 ms on traces/sample-1f1b-2r).
CUT_TAIL_PCT = 5.0


def step_tails(events: pl.DataFrame, steps: pl.DataFrame, empty: pl.DataFrame | None = None) -> pl.DataFrame:
    """(run, rank, step, dur_us, tail_us): each rank's last ProfilerStep of `steps` and how long its
    span runs on past the rank's last other event (any event, memory instants included; 0 when
    one ends at or after the span; null when none ends inside it: an empty step, not a cut one).
    No row for a rank in `empty` (empty_last_steps): a step, left out, follows its last: not cut.

    torch.profiler records a ProfilerStep as one span with its duration. A trace cut short (its
    JSON whole but its last events missing: one cut at a size as bench_profiler.build_trace_set
    cuts its last copy; a file cut mid-JSON is refused by the parse) keeps the span of the step it was cut in and loses the events after the
    cut: that step's time then counts time with no event recorded, which no breakdown can split.
    Ranks without ProfilerStep spans (one window over their events) have no row."""
    names = names_matching(events, PROFILER_STEP_RE)
    other = events.lazy().filter(~pl.col("name").is_in(names).fill_null(False))
    last_us = pl.max_horizontal(pl.col("end_us").max(), pl.col("ts_us").max()).alias("last_us")
    if varying(events, KEYS):
        last = other.group_by(KEYS).agg(last_us)
    else:  # one rank: its last event, no group_by (and no row where it has none)
        last = other.select(pl.col(KEYS).first(), last_us, _n=pl.len()).filter(pl.col("_n") > 0).drop("_n")
    tails = (
        steps.lazy().filter("has_profiler_steps").sort("end_us").group_by(KEYS).last()
        .join(last, on=KEYS, how="left")
        # From the step's last event, or none (null): a step with no event in it is empty, not cut
        # (the step `prof.step()` opens after the loop's last iteration holds nothing, on whole traces).
        .select(*KEYS, "step", "dur_us", tail_us=pl.when(pl.col("last_us") > pl.col("start_us"))
                .then((pl.col("end_us") - pl.col("last_us")).clip(0)))
        .sort(KEYS)
        .collect()
    )
    return tails if empty is None else tails.join(empty.select(KEYS), on=KEYS, how="anti")


def step_time_stats(steps: pl.DataFrame) -> pl.DataFrame:
    """Per rank: number of steps and their mean / median / min / max / std duration (µs)."""
    d = pl.col("dur_us")
    return (
        steps.group_by(KEYS)
        .agg(
            n_steps=pl.len(),
            mean_us=d.mean(), median_us=d.median(), min_us=d.min(), max_us=d.max(), std_us=d.std(),
            has_profiler_steps=pl.col("has_profiler_steps").all(),
        )
        .sort(KEYS)
    )
