"""Exposed communication per collective: the part of each collective's time with no compute under it.

The temporal breakdown (profiler/breakdown.py) says how much of a rank's communication is exposed;
this says which collectives (and phases) that time belongs to. The same sets are used: on GPU
ranks, communication is the comm kernels and compute the compute kernels; on CPU (gloo) ranks,
communication is the `gloo:<op>` spans and compute the operators of the process's own threads
outside the collective enqueues (`c10d::<op>`), gloo's worker threads left out.

Each collective row of profiler.collectives (one per comm kernel or gloo span, with start_us and
end_us) gets the part of its interval with no compute under it. A sweep over every communication
and compute bound of a rank counts, between two bounds, the calls running and whether compute
runs; an instant with calls and no compute is exposed and split evenly between the calls running
in it (two streams, two gloo workers). gloo's sends and receives are asynchronous: inside a
pipeline action span they do not run (breakdown.cpu_comm), and an instant goes to a send only where
no collective or receive runs (`_exposed_weight`). A class's running total W(t) at each bound
gives a call's exposed time as W(end) - W(start): no pairing of calls with segments, so it stays
linear in the number of events. A rank's exposed_us summed over its collectives is therefore the
union of its exposed communication: the breakdown's exposed_comm_us, up to communication that
crosses a step boundary (the breakdown clips CPU intervals to the step window; a collective here
is counted whole in the step it started in). A rank driving several GPUs (DataParallel) is left out, as
the breakdown leaves it out.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from profiler.breakdown import THREAD, blocking_waits, gloo_worker_threads, multi_gpu_ranks, pipeline_actions_spans
from profiler.collectives import POINT_TO_POINT
from profiler.intervals import last_at_instant, over, sweep, varying
from profiler.steps import GLOO_P2P_RE, KEYS

EXPOSED_COLUMNS = {
    "run": pl.Categorical, "rank": pl.Int32, "step": pl.Int64, "collective": pl.String, "phase": pl.String,
    "calls": pl.Int64, "comm_us": pl.Float64, "exposed_us": pl.Float64,
}


def exposed_comm(events: pl.DataFrame, colls: pl.DataFrame, *, multi: pl.DataFrame | None = None,
                 gloo_threads: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per (run, rank, step, collective, phase): calls, comm_us (summed durations) and exposed_us.

    colls: profiler.collectives rows of the same ranks; `phase` is null where they carry none.
    multi, gloo_threads: multi_gpu_ranks(events) and gloo_worker_threads(events), where the caller
    has them already.
    """
    multi = multi_gpu_ranks(events) if multi is None else multi
    if not multi.is_empty():  # several GPUs' timelines in one rank: refused
        colls = colls.join(multi.select(KEYS).cast({"run": colls.schema["run"], "rank": colls.schema["rank"]}),
                           on=KEYS, how="anti")
    if colls.is_empty():
        return pl.DataFrame(schema=EXPOSED_COLUMNS)
    calls = colls.with_row_index("_call").with_columns(
        phase=pl.col("phase").cast(pl.String) if "phase" in colls.columns else pl.lit(None, pl.String)
    )
    compute = pl.concat([_gpu_compute(events, calls), _cpu_compute(events, calls, gloo_threads)], how="vertical_relaxed")
    key_types = {"run": pl.String, "rank": pl.Int64}
    # gloo's sends and receives are asynchronous: inside a pipeline action span they are no
    # communication time (breakdown.cpu_comm), so they count apart and the actions bound them.
    gloo = pl.col("source") == "gloo"
    calls_k = calls.with_columns(pl.col("run").cast(pl.String), pl.col("rank").cast(pl.Int64),
                                 _class=pl.when(gloo & (pl.col("collective") == "send")).then(pl.lit("send"))
                                 .when(gloo & pl.col("collective").is_in(POINT_TO_POINT)).then(pl.lit("recv"))
                                 .otherwise(pl.lit("coll")))
    # Only the classes there are (NCCL, gloo collectives: "coll" alone, the sweep as lean as before).
    classes = tuple(k for k in CLASSES if k in set(calls_k.get_column("_class").unique()))
    counts = _counts(classes)
    one, zero = pl.lit(1, pl.Int32), pl.lit(0, pl.Int32)
    flag = lambda on: {k: one if k == on else zero for k in counts}  # noqa: E731
    parts = [compute.select(*KEYS, "start_us", "end_us", **flag("comp")).cast(key_types),
             calls_k.select(*KEYS, "start_us", "end_us", **{k: (pl.col("_class") == k).cast(pl.Int32) if k in classes
                                                             else zero for k in counts})]
    if "act" in counts:
        parts.append(_cpu_actions(events, calls_k).select(*KEYS, "start_us", "end_us", **flag("act")).cast(key_types))
    bounds = pl.concat(parts).filter(pl.col("end_us") > pl.col("start_us"))
    # The bounds are the calls' and the compute of the calls' ranks: the keys that vary among the
    # calls are the only ones that can vary among the bounds (sorting or windowing by one that
    # happens to be constant there changes nothing).
    keys = varying(calls_k, KEYS)
    weight = _exposed_weight(bounds, keys, classes)
    # W(t): exposed time, shared among the calls running, up to instant t. Every call's ends are
    # sweep bounds, so a call's exposed time is W(end) - W(start), two exact look-ups.
    # Each class of call has its own running total (_exposed_weight): W_coll, W_recv, W_send.
    if not keys:  # one rank: by binary search in W's instants (strictly increasing)
        t_w = weight.get_column("t").to_numpy()
        kind = calls_k.get_column("_class").to_numpy()
        exposed = np.zeros(calls_k.height)
        for k in classes:
            w_cum = weight.get_column(f"w_{k}").to_numpy()
            at = lambda t: _look_up(t_w, w_cum, calls_k.get_column(t).to_numpy())  # noqa: E731
            exposed += np.where(kind == k, at("end_us") - at("start_us"), 0.0)
        pairs = pl.DataFrame({"_call": calls_k.get_column("_call"), "exposed_us": exposed})
    else:
        mine = pl.coalesce([pl.when(pl.col("_class") == k).then(f"w_{k}") for k in classes])
        at = lambda t: calls_k.select("_call", *KEYS, "_class", t=t).sort("t").join_asof(  # noqa: E731
            weight, left_on="t", right_on="t", by=KEYS, strategy="backward", check_sortedness=False
        ).select("_call", w=mine.fill_null(0.0))
        pairs = (at("start_us").rename({"w": "w0"}).join(at("end_us").rename({"w": "w1"}), on="_call")
                 .select("_call", exposed_us=pl.col("w1") - pl.col("w0")))
    return (
        calls.join(pairs, on="_call", how="left")
        .group_by(*KEYS, "step", "collective", "phase")
        .agg(calls=pl.len(), comm_us=pl.col("dur_us").sum(), exposed_us=pl.col("exposed_us").fill_null(0.0).sum())
        .select(list(EXPOSED_COLUMNS))
        .cast(EXPOSED_COLUMNS)
        # Ties in exposed_us (two collectives both at 50 µs) by name and phase: the rows, and so
        # the report, come out in one order on every load (group_by's own order is a hash's).
        .sort(*KEYS, "step", "exposed_us", "collective", "phase", descending=[False, False, False, True, False, False])
    )


def _look_up(t_w: np.ndarray, w_cum: np.ndarray, t: np.ndarray) -> np.ndarray:
    """W at each of `t`: w_cum of the last instant at or before it (join_asof's backward match), 0 before the first."""
    at = np.searchsorted(t_w, t, side="right") - 1
    if not t_w.size:
        return np.zeros(t.size)
    return np.where(at >= 0, w_cum[np.maximum(at, 0)], 0.0)


CLASSES = ("coll", "recv", "send")


def _counts(classes: tuple[str, ...]) -> tuple[str, ...]:
    """The running counts the sweep keeps for these classes of call: compute, each class, and
    the pipeline's action spans where there are gloo sends or receives."""
    return ("comp", *classes, *(("act",) if set(classes) - {"coll"} else ()))


def _exposed_weight(bounds: pl.DataFrame, keys: list[str], classes: tuple[str, ...]) -> pl.DataFrame:
    """(run, rank, t, w_<class>... for `classes`): at each bound t, the exposed time before t
    that each class of call running takes, each instant divided by the number of calls that share
    it (a labelled sweep that counts, intervals.sweep's idea).

    A gloo send or receive runs only outside the pipeline's action spans (breakdown.cpu_comm). And
    it is asynchronous: the rank goes on after posting it and waits where it needs the data, on a
    receive. So an exposed instant is shared by the collectives and receives running in it, and
    falls to the sends running only where neither runs (at a step's end, the rank waits for its
    sends). Without gloo sends or receives (NCCL, collectives only) every call shares every instant
    it runs in: the classes change who takes an instant, never whether it is exposed."""
    counts = _counts(classes)
    edges = pl.concat([
        bounds.select(*KEYS, t="start_us", **{f"d_{k}": k for k in counts}),
        bounds.select(*KEYS, t="end_us", **{f"d_{k}": -pl.col(k) for k in counts}),
    ])
    c = pl.col
    n = lambda k: c(f"n_{k}") if k in counts else pl.lit(0, pl.Int32)  # noqa: E731
    free = n("act") == 0
    first = n("coll") + (pl.when(free).then(n("recv")).otherwise(0) if "recv" in classes else 0)  # collectives, receives
    exposed = c("n_comp") == 0
    shares = {"coll": pl.when(exposed & (first > 0)).then(c("dur") / first).otherwise(0.0)}
    if "recv" in classes:
        shares["recv"] = pl.when(free).then(shares["coll"]).otherwise(0.0)
    if "send" in classes:
        sends = pl.when(free).then(n("send")).otherwise(0)
        shares["send"] = pl.when(exposed & (first == 0) & (sends > 0)).then(c("dur") / sends).otherwise(0.0)
    # Sorted and windowed by `keys` only (those of KEYS that vary): one rank's frame has none.
    return (
        edges.sort(*keys, "t")
        .with_columns(**{f"n_{k}": over(c(f"d_{k}").cum_sum(), keys) for k in counts})
        .filter(last_at_instant(keys))  # each instant's last running counts (the frame is sorted by it)
        .with_columns(dur=over(c("t").shift(-1) - c("t"), keys).fill_null(0.0))
        .with_columns(**{f"_{k}": shares[k] for k in classes})
        # the weight of [t, next t) is reached at the next t
        .with_columns(**{f"w_{k}": over(c(f"_{k}").cum_sum() - c(f"_{k}"), keys) for k in classes})
        .select(*KEYS, "t", *(f"w_{k}" for k in classes))
    )


def _gpu_compute(events: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    # Compute kernels of the ranks whose collectives are NCCL kernels; with steps assigned, only
    # those of a profiled step, as the breakdown counts them (a kernel launched before profiling
    # began hides nothing there either).
    gpu = calls.filter(pl.col("source") != "gloo").select(KEYS).unique()
    in_step = pl.col("step").is_not_null() if "step" in events.columns else pl.lit(True)
    return (
        events.lazy().filter((pl.col("device") == "gpu") & (pl.col("kind") == "compute") & in_step)
        .select(*KEYS, start_us="ts_us", end_us="end_us").collect()
        .join(gpu, on=KEYS, how="semi")
    )


def _cpu_actions(events: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """The pipeline action spans of the ranks with gloo sends or receives (breakdown.cpu_comm)."""
    ranks = calls.filter(pl.col("_class") != "coll").select(KEYS).unique()
    if ranks.is_empty():
        return pl.DataFrame(schema={"run": pl.String, "rank": pl.Int64, "start_us": pl.Float64, "end_us": pl.Float64})
    # The action spans first (a few per microbatch), then those ranks': not a join over every event.
    actions = pipeline_actions_spans(events)
    return (actions.join(ranks.cast({"run": actions.schema["run"], "rank": actions.schema["rank"]}), on=KEYS, how="semi")
            .select(*KEYS, start_us="ts_us", end_us="end_us"))


def _cpu_compute(events: pl.DataFrame, calls: pl.DataFrame, gloo_threads: pl.DataFrame | None) -> pl.DataFrame:
    """Operator time outside the collective enqueues, on the ranks' own threads (breakdown's CPU compute)."""
    cpu = calls.filter(pl.col("source") == "gloo").select(KEYS).unique()
    if cpu.is_empty():
        return pl.DataFrame(schema={"run": events.schema["run"], "rank": events.schema["rank"], "start_us": pl.Float64,
                                    "end_us": pl.Float64})
    ev = events.join(cpu, on=KEYS, how="semi")
    ops = (
        ev.lazy().filter((pl.col("ph") == "X") & pl.col("kind").is_in(["op", "enqueue"]))
        .select(*THREAD, "name", "kind", "ts_us", "end_us").collect()
        # (a rank's gloo threads are found from its own events: those of every rank serve as well)
        .join(gloo_worker_threads(ev) if gloo_threads is None else gloo_threads, on=THREAD, how="anti")
    )
    comm = ev.filter((pl.col("kind") == "comm") & ~pl.col("name").cast(pl.String).str.contains(GLOO_P2P_RE))
    # op minus enqueue and the blocking waits, as the breakdown counts it: the segments an op covers and neither does.
    labelled = pl.concat([ops.select(*KEYS, label=pl.col("kind").cast(pl.String), start_us="ts_us", end_us="end_us"),
                          blocking_waits(ops, comm).select(*KEYS, "start_us", "end_us", label=pl.lit("wait")).select(*KEYS, "label", "start_us", "end_us")])
    segs = sweep(labelled, KEYS, ["op", "enqueue", "wait"])
    return segs.filter(pl.col("op") & ~pl.col("enqueue") & ~pl.col("wait")).select(*KEYS, "start_us", "end_us")
