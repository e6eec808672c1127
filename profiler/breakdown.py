"""Temporal breakdown: where each rank's time went, HTA's definition, plus exposed communication.

GPU ranks (HolisticTraceAnalysis's `get_temporal_breakdown`): the window runs from the first to the
last end of the GPU activity launched during the profiled steps (include_last_profiler_step=True),
all streams together. `compute_us` is the union of compute kernels, `non_compute_us` the rest of the
busy time (communication, memory copies/sets, unclassified kernels, minus what compute covers), and
`idle_us` the window with no GPU activity at all.

CPU ranks (gloo): the window is the ProfilerStep span. Compute is operator time on the process's
own threads (main and autograd) outside the collective enqueues (`c10d::<op>`) and the blocking
waits after them (`blocking_waits`: an operator around a synchronous collective runs on through
its wait); communication is
the `gloo:<op>` spans, which gloo records on its worker threads for collectives and on the main
thread for point-to-point send/recv (pipelines); a worker thread's operators are part of its
collective, not compute. A send or receive is asynchronous: its span runs from the post to the
wait that completes it, so the part inside a pipeline action span (`ptprof/pp/...`, the rank
running that action) is not communication time (`cpu_comm`). Idle is time with neither, which on
the main thread includes the blocking waits for collectives (gloo records those only as gaps).

Both: `comm_us` is the union of communication, `overlap_us` its part under compute,
`exposed_comm_us` its part with no compute under it, `overlap_pct` = overlap / comm * 100.

One process driving several GPUs (torch.nn.DataParallel: run.json `gpus_per_process` > 1; its
trace holds every GPU's kernels, pid = the GPU's index) has one timeline per GPU, not one per rank:
swept together they would be one made-up GPU. Such ranks get no breakdown row (and no exposed
communication, profiler/exposed.py); `multi_gpu_ranks` names them for the report's warning. A
per-GPU breakdown of a multi-GPU process is not supported yet.
"""

from __future__ import annotations

import polars as pl

from profiler.intervals import clip, sweep, varying
from profiler.steps import GLOO_P2P_RE, KEYS, PP_ACTION_RE, PROFILER_STEP_RE, assign_steps, names_matching, profiler_steps

GPU_LABELS = ["compute", "comm", "memory", "other"]
CPU_LABELS = ["op", "enqueue", "wait", "comm", "p2p", "action", "window"]
# The enqueues of collectives whose main thread may block on them (blocking_waits): not a send or
# receive (a pipeline's, handled by its action spans), not the functional collectives' own wait.
C10D_COLLECTIVE_RE = r"^c10d::"
C10D_P2P_RE = r"^c10d::(send|recv)"
THREAD = [*KEYS, "pid", "tid"]


def temporal_breakdown(events: pl.DataFrame, *, per_step: bool = False, steps: pl.DataFrame | None = None) -> pl.DataFrame:
    """One row per rank (per step with per_step=True): window_us split into compute / non-compute /
    idle, and comm_us, overlap_us, exposed_comm_us, overlap_pct, memory_us.

    `device` says which accounting a rank got: "gpu" where it has GPU activity, else "cpu".
    """
    return _breakdown(_intervals(events, steps, multi_gpu_ranks(events), None), per_step)


def temporal_breakdowns(events: pl.DataFrame, *, steps: pl.DataFrame | None = None, multi: pl.DataFrame | None = None,
                        gloo_threads: pl.DataFrame | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """temporal_breakdown per rank and per step, from one pass over the events: both sweep the same
    labelled intervals (the filters of the event frame are most of the cost on a small rank).

    multi, gloo_threads: multi_gpu_ranks(events) and gloo_worker_threads(events), where the caller
    has them already.
    """
    intervals = _intervals(events, steps, multi_gpu_ranks(events) if multi is None else multi, gloo_threads)
    return _breakdown(intervals, False), _breakdown(intervals, True)


def _intervals(events: pl.DataFrame, steps: pl.DataFrame | None, multi: pl.DataFrame,
               gloo_threads: pl.DataFrame | None) -> dict | None:
    """What both breakdowns sweep: each accounting's labelled intervals (with their step) and the
    step windows; None when no rank is left (every one drives several GPUs)."""
    steps = profiler_steps(events) if steps is None else steps
    if not multi.is_empty():  # refused: one timeline per GPU, not per rank
        events = events.join(multi.select(KEYS), on=KEYS, how="anti")
        if events.is_empty():
            return None
    if varying(events, KEYS):
        has_gpu = events.lazy().group_by(KEYS).agg(gpu=(pl.col("device") == "gpu").any()).collect()
        all_gpu, any_gpu = has_gpu["gpu"].all(), has_gpu["gpu"].any()
    else:  # one rank (or none): a test of its events, no group_by
        all_gpu = any_gpu = bool((events.get_column("device") == "gpu").any())
    if all_gpu:  # the usual cases: one accounting for every rank, no copy of the frame
        gpu_events, cpu_events = events, events.clear()
    elif not any_gpu:
        gpu_events, cpu_events = events.clear(), events
    else:
        gpu_ranks = has_gpu.filter("gpu").select(KEYS)
        gpu_events = events.join(gpu_ranks, on=KEYS, how="semi")
        cpu_events = events.join(gpu_ranks, on=KEYS, how="anti")
    return {"steps": steps, "gpu": _gpu_intervals(gpu_events, steps), "cpu": _cpu_intervals(cpu_events, steps, gloo_threads)}


def _breakdown(intervals: dict | None, per_step: bool) -> pl.DataFrame:
    if intervals is None:
        return pl.DataFrame(schema=_schema(per_step))
    steps = intervals["steps"]
    gpu = _gpu_breakdown(intervals["gpu"], per_step)
    cpu = _cpu_breakdown(intervals["cpu"], per_step)
    by = [*KEYS, "step"] if per_step else KEYS
    flags = steps.group_by(by).agg(pl.col("has_profiler_steps").all())
    both = pl.concat([gpu, cpu], how="diagonal_relaxed")
    if not both.width:  # no interval at all (a 0 µs step asked for with --step): no row, not an error
        return pl.DataFrame(schema=_schema(per_step))
    return (
        both
        .join(flags, on=by, how="left")
        .with_columns(
            exposed_comm_us=pl.col("comm_us") - pl.col("overlap_us"),
            overlap_pct=pl.when(pl.col("comm_us") > 0).then(100 * pl.col("overlap_us") / pl.col("comm_us")),
        )
        .select(*by, "device", "window_us", "compute_us", "non_compute_us", "idle_us", "comm_us", "overlap_us",
                "exposed_comm_us", "overlap_pct", "memory_us", "has_profiler_steps")
        .sort(by)
    )


def multi_gpu_ranks(events: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, gpus) of the ranks whose GPU activity is on more than one GPU (the trace's GPU
    pid is the device index): one process driving several GPUs, as torch.nn.DataParallel does."""
    return (
        events.lazy().filter(pl.col("device") == "gpu").group_by(KEYS).agg(gpus=pl.col("pid").n_unique())
        .filter(pl.col("gpus") > 1).sort(KEYS).collect()
    )


def _schema(per_step: bool) -> dict:
    """The columns of an empty temporal_breakdown."""
    keys = {"run": pl.Categorical, "rank": pl.Int32, **({"step": pl.Int64} if per_step else {})}
    us = ["window_us", "compute_us", "non_compute_us", "idle_us", "comm_us", "overlap_us", "exposed_comm_us",
          "overlap_pct", "memory_us"]
    return {**keys, "device": pl.String, **{c: pl.Float64 for c in us}, "has_profiler_steps": pl.Boolean}


def _totals(segments: pl.DataFrame, by: list[str], *, compute: pl.Expr, comm: pl.Expr, busy: pl.Expr, memory: pl.Expr) -> pl.DataFrame:
    d = pl.col("dur_us")
    return segments.group_by(by).agg(
        window_us=d.sum(),
        busy_us=d.filter(busy).sum(),
        compute_us=d.filter(compute).sum(),
        comm_us=d.filter(comm).sum(),
        overlap_us=d.filter(comm & compute).sum(),
        memory_us=d.filter(memory).sum(),
    ).with_columns(
        non_compute_us=pl.col("busy_us") - pl.col("compute_us"),
        idle_us=pl.col("window_us") - pl.col("busy_us"),
    )


def _gpu_intervals(events: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame | None:
    """The GPU ranks' labelled activity in a profiled step (run, rank, step, label, start_us, end_us)."""
    if events.is_empty():
        return None
    return (
        assign_steps(events, steps).lazy()  # lazy: only the few columns used are filtered
        .filter((pl.col("device") == "gpu") & pl.col("kind").is_in(GPU_LABELS) & pl.col("step").is_not_null())
        .select(*KEYS, "step", label="kind", start_us="ts_us", end_us="end_us")
        .collect()
    )


def _gpu_breakdown(kernels: pl.DataFrame | None, per_step: bool) -> pl.DataFrame:
    if kernels is None:
        return pl.DataFrame()
    by = [*KEYS, "step"] if per_step else KEYS
    segments = sweep(kernels, by, GPU_LABELS)
    c = pl.col
    return _totals(
        segments, by,
        compute=c("compute"), comm=c("comm"), busy=c("compute") | c("comm") | c("memory") | c("other"), memory=c("memory"),
    ).with_columns(device=pl.lit("gpu"))


def _cpu_intervals(events: pl.DataFrame, steps: pl.DataFrame, gloo_threads: pl.DataFrame | None) -> dict | None:
    """The CPU ranks' labelled intervals (op, enqueue, comm) and their step windows."""
    if events.is_empty():
        return None
    windows = steps.join(events.select(KEYS).unique(), on=KEYS, how="semi")
    # gloo's worker threads run collectives only; any operator they record is part of the
    # collective, not the model's compute. Point-to-point ops (pipeline send/recv) put their gloo
    # spans on the main thread instead, whose operators stay compute.
    ops = (
        events.lazy().filter(pl.col("ph") == "X").select(*THREAD, "name", "kind", "ts_us", "end_us").collect()
        .join(gloo_worker_threads(events) if gloo_threads is None else gloo_threads, on=THREAD, how="anti")
    )
    comm = events.filter(pl.col("kind") == "comm")
    p2p = pl.col("name").is_in(names_matching(comm, GLOO_P2P_RE))
    labelled = pl.concat([
        ops.filter(pl.col("kind") == "op").select(*KEYS, label=pl.lit("op"), start_us="ts_us", end_us="end_us"),
        ops.filter(pl.col("kind") == "enqueue").select(*KEYS, label=pl.lit("enqueue"), start_us="ts_us", end_us="end_us"),
        blocking_waits(ops, comm.filter(~p2p)).select(*KEYS, "start_us", "end_us", label=pl.lit("wait")).select(*KEYS, "label", "start_us", "end_us"),
        comm.filter(~p2p).select(*KEYS, label=pl.lit("comm"), start_us="ts_us", end_us="end_us"),
        comm.filter(p2p).select(*KEYS, label=pl.lit("p2p"), start_us="ts_us", end_us="end_us"),
        pipeline_actions_spans(events).select(*KEYS, label=pl.lit("action"), start_us="ts_us", end_us="end_us"),
    ])
    return {"windows": windows, "labelled": labelled}


def blocking_waits(ops: pl.DataFrame, comm: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, start_us, end_us): where a CPU rank's thread waits for a collective it called
    synchronously, inside an operator that is not compute (a custom autograd Function around
    `dist.all_to_all_single`, Ulysses' `_AllToAll`: its span ran on through the wait, and a trial's
    Ulysses run read 63 % of its all-to-alls "hidden by compute", 78 % on rank 0). gloo records the wait itself
    as no op: after the collective's enqueue (`c10d::<op>_`) the thread starts nothing until the
    collective ends. So: from an enqueue's end to the end of the gloo span of the first collective
    starting after the enqueue began, where the thread's next operator starts only after that end.
    An asynchronous call (DDP's buckets, the functional collectives, an operator that goes on
    working after its enqueue) has the thread start operators while the collective runs: no wait.
    (Measured on a trial's runs: Ulysses' and ep's all-to-alls, every call's next operator 25-70 µs
    after the collective's end; tp+sp's and a hybrid's functional collectives, 96 % of the calls'
    next operator before it, by a median of 0.3-1.5 ms.)

    ops: the ranks' own threads' X spans (THREAD, name, kind, ts_us, end_us); comm: their
    collectives' gloo spans (point-to-point left out). A wait is the rank's, not its thread's: it
    takes compute from any thread of the rank during it (a gloo rank trains on one thread; autograd's
    CPU work runs on it too)."""
    schema = {"run": ops.schema["run"], "rank": ops.schema["rank"], "start_us": pl.Float64, "end_us": pl.Float64}
    name = pl.col("name").cast(pl.String)
    enq = ops.filter((pl.col("kind") == "enqueue") & name.str.contains(C10D_COLLECTIVE_RE) & ~name.str.contains(C10D_P2P_RE))
    if enq.is_empty() or comm.is_empty():
        return pl.DataFrame(schema=schema)
    # operators only (every caller passes other spans too or not: the breakdown's are all X spans),
    # so the breakdown, exposed and the viewer's lanes find the same waits
    starts = ops.filter(pl.col("kind").is_in(["op", "enqueue"])).select(*THREAD, next_us="ts_us").sort("next_us")
    colls = comm.select(*KEYS, c_start="ts_us", c_end="end_us").sort("c_start")
    waits = (
        enq.select(*THREAD, e_start="ts_us", e_end="end_us").sort("e_end")
        .join_asof(starts, left_on="e_end", right_on="next_us", by=THREAD, strategy="forward", check_sortedness=False)
        .sort("e_start")
        .join_asof(colls, left_on="e_start", right_on="c_start", by=KEYS, strategy="forward", check_sortedness=False)
        .filter(pl.col("c_end").is_not_null() & (pl.col("next_us").is_null() | (pl.col("next_us") >= pl.col("c_end"))))
        .select(*KEYS, start_us="e_end", end_us="c_end")
        .filter(pl.col("end_us") > pl.col("start_us"))
    )
    return waits.cast(schema)


def pipeline_actions_spans(events: pl.DataFrame) -> pl.DataFrame:
    """The pipeline action spans (`ptprof/pp/...`, steps.PP_ACTION_RE) as (KEYS, ts_us, end_us)."""
    actions = events.filter((pl.col("kind") == "annotation") & (pl.col("ph") == "X"))
    return actions.filter(pl.col("name").is_in(names_matching(actions, PP_ACTION_RE))).select(*KEYS, "ts_us", "end_us")


def cpu_comm() -> pl.Expr:
    """A CPU rank's communication in a sweep's segment: a collective's gloo span, or a send or
    receive outside the pipeline's actions. gloo's send and recv are asynchronous (isend/irecv):
    a span runs from the post to the wait that completes it while the rank goes on; inside an
    action span the rank is running that action (operators, and the Python between them), not
    waiting, so the open transfer there is no communication time. Between actions it is: the
    rank waits for it, or for the peer that sends it."""
    c = pl.col
    return c("comm") | (c("p2p") & ~c("action"))


def _cpu_breakdown(intervals: dict | None, per_step: bool) -> pl.DataFrame:
    if intervals is None:
        return pl.DataFrame()
    by = [*KEYS, "step"] if per_step else KEYS
    windows, labelled = intervals["windows"], intervals["labelled"]
    if not per_step:
        windows = windows.group_by(KEYS).agg(start_us=pl.col("start_us").min(), end_us=pl.col("end_us").max())
    windows = windows.rename({"start_us": "window_start_us", "end_us": "window_end_us"})
    clipped = clip(labelled, windows, KEYS) if not per_step else _clip_per_step(labelled, windows)
    whole = windows.select(*by, label=pl.lit("window"), start_us="window_start_us", end_us="window_end_us")
    segments = sweep(pl.concat([clipped.select(whole.columns), whole]), by, CPU_LABELS)
    c = pl.col
    compute = c("op") & ~c("enqueue") & ~c("wait")
    return _totals(
        segments, by, compute=compute, comm=cpu_comm(), busy=compute | cpu_comm(), memory=pl.lit(False),
    ).with_columns(device=pl.lit("cpu"))


def gloo_worker_threads(events: pl.DataFrame) -> pl.DataFrame:
    """(run, rank, pid, tid) of threads carrying gloo spans other than the training loop's.

    The training loop's thread is the one with ProfilerStep spans; in a rank without them, the
    thread with the most operator time.
    """
    cpu_spans = events.lazy().filter((pl.col("device") == "cpu") & (pl.col("ph") == "X"))
    gloo = cpu_spans.filter(pl.col("kind") == "comm").select(THREAD).unique().collect()
    if gloo.is_empty():  # no gloo spans (an NCCL rank): no thread to find
        return gloo
    spans = cpu_spans.select(*THREAD, "name", "kind", "dur_us").collect()
    is_step = pl.col("name").is_in(names_matching(events, PROFILER_STEP_RE))
    stepped = spans.filter((pl.col("kind") == "annotation") & is_step).select(THREAD).unique()
    busiest = (
        spans.filter(pl.col("kind") == "op")
        .group_by(THREAD).agg(op_us=pl.col("dur_us").sum())
        .join(stepped.select(KEYS).unique(), on=KEYS, how="anti")
        .sort("op_us", descending=True)
        .group_by(KEYS).first()
        .select(THREAD)
    )
    main = pl.concat([stepped, busiest])
    return gloo.join(main, on=THREAD, how="anti")


def _clip_per_step(labelled: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Cut intervals to the step windows they touch: the step of their start and of their end.

    (An interval spanning three or more steps loses the middle ones; with torch.profiler's
    schedule no operator or collective outlives a whole step.)
    """
    table = windows.sort("window_start_us")
    rows = labelled.with_row_index("_iv")
    touched = pl.concat([
        rows.sort(t).join_asof(table, left_on=t, right_on="window_start_us", by=KEYS, strategy="backward", check_sortedness=False)
        for t in ("start_us", "end_us")
    ]).filter(pl.col("step").is_not_null()).unique(["_iv", "step"])
    return (
        touched.with_columns(
            start_us=pl.max_horizontal("start_us", "window_start_us"), end_us=pl.min_horizontal("end_us", "window_end_us")
        )
        .filter(pl.col("end_us") > pl.col("start_us"))
        .drop("_iv", "window_start_us", "window_end_us")
    )
