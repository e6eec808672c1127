"""Exposed communication per collective: the part of each collective's time with no compute under it.

The temporal breakdown (profiler/breakdown.py) says how much of a rank's communication is exposed;
this says which collectives (and phases) that time belongs to. The same sets are used: on GPU
ranks, communication is the comm kernels and compute the compute kernels; on CPU (gloo) ranks,
communication is the `gloo:<op>` spans and compute the operators of the process's own threads
outside the collective enqueues (`c10d::<op>`), gloo's worker threads left out.

Each collective row of profiler.collectives (one per comm kernel or gloo span, with start_us and
end_us) is cut into constant-state segments by a sweep over every communication and compute
interval of its rank; a segment with communication and no compute is exposed. Where two
collectives run at once (two streams, two gloo workers), an exposed segment is split evenly
between them, so a rank's exposed_us summed over its collectives is the union of its exposed
communication: the breakdown's exposed_comm_us, up to communication that crosses a step boundary
(the breakdown clips CPU intervals to the step window; a collective here is counted whole in the
step it started in).
"""

from __future__ import annotations

import polars as pl

from profiler.breakdown import THREAD, _gloo_worker_threads
from profiler.intervals import sweep
from profiler.steps import KEYS

EXPOSED_COLUMNS = {
    "run": pl.Categorical, "rank": pl.Int32, "step": pl.Int64, "collective": pl.String, "phase": pl.String,
    "calls": pl.Int64, "comm_us": pl.Float64, "exposed_us": pl.Float64,
}


def exposed_comm(events: pl.DataFrame, colls: pl.DataFrame) -> pl.DataFrame:
    """Per (run, rank, step, collective, phase): calls, comm_us (summed durations) and exposed_us.

    colls: profiler.collectives rows of the same ranks; `phase` is null where they carry none.
    """
    if colls.is_empty():
        return pl.DataFrame(schema=EXPOSED_COLUMNS)
    calls = colls.with_row_index("_call").with_columns(
        phase=pl.col("phase").cast(pl.String) if "phase" in colls.columns else pl.lit(None, pl.String)
    )
    compute = pl.concat([_gpu_compute(events, calls), _cpu_compute(events, calls)], how="vertical_relaxed")
    intervals = pl.concat([
        compute.select(*KEYS, label=pl.lit("compute"), start_us="start_us", end_us="end_us"),
        calls.select(*KEYS, label=pl.lit("comm"), start_us="start_us", end_us="end_us"),
    ]).filter(pl.col("end_us") > pl.col("start_us"))
    exposed = sweep(intervals, KEYS, ["compute", "comm"]).filter(pl.col("comm") & ~pl.col("compute"))
    # Segment boundaries include every call's ends, so a call covers a segment whole or not at all.
    pairs = (
        calls.select(*KEYS, "_call", c_start="start_us", c_end="end_us")
        .join_where(exposed.select(pl.col("run").cast(calls.schema["run"]), pl.col("rank").cast(calls.schema["rank"]),
                                   s_start="start_us", s_end="end_us", s_dur="dur_us")
                    .rename({"run": "s_run", "rank": "s_rank"}),
                    pl.col("run") == pl.col("s_run"), pl.col("rank") == pl.col("s_rank"),
                    pl.col("c_start") <= pl.col("s_start"), pl.col("c_end") >= pl.col("s_end"))
        .with_columns(share_us=pl.col("s_dur") / pl.len().over("s_run", "s_rank", "s_start"))
        .group_by("_call").agg(exposed_us=pl.col("share_us").sum())
    )
    return (
        calls.join(pairs, on="_call", how="left")
        .group_by(*KEYS, "step", "collective", "phase")
        .agg(calls=pl.len(), comm_us=pl.col("dur_us").sum(), exposed_us=pl.col("exposed_us").fill_null(0.0).sum())
        .select(list(EXPOSED_COLUMNS))
        .cast(EXPOSED_COLUMNS)
        .sort(*KEYS, "step", "exposed_us", descending=[False, False, False, True])
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


def _cpu_compute(events: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """Operator time outside the collective enqueues, on the ranks' own threads (breakdown's CPU compute)."""
    cpu = calls.filter(pl.col("source") == "gloo").select(KEYS).unique()
    if cpu.is_empty():
        return pl.DataFrame(schema={"run": events.schema["run"], "rank": events.schema["rank"], "start_us": pl.Float64,
                                    "end_us": pl.Float64})
    ev = events.join(cpu, on=KEYS, how="semi")
    ops = (
        ev.lazy().filter((pl.col("ph") == "X") & pl.col("kind").is_in(["op", "enqueue"]))
        .select(*THREAD, "kind", "ts_us", "end_us").collect()
        .join(_gloo_worker_threads(ev), on=THREAD, how="anti")
    )
    # op minus enqueue, as the breakdown counts it: the segments an op covers and no enqueue does.
    segs = sweep(ops.select(*KEYS, label=pl.col("kind").cast(pl.String), start_us="ts_us", end_us="end_us"), KEYS, ["op", "enqueue"])
    return segs.filter(pl.col("op") & ~pl.col("enqueue")).select(*KEYS, "start_us", "end_us")
