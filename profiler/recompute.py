"""Recomputation (activation checkpointing, `ptprof run ... --recompute`): per rank and step, the
time of the forward, of the forward recomputed inside backward (`ptprof/recompute` spans), and of the
backward, with the measured recompute/forward ratio beside the predicted one
(profiler.theory_recompute: the blocks' share of the forward FLOPs, ≈ 1: "recomputation costs about
one more forward"). docs/report.md, "recompute".

Times are the CPU spans' wall time, summed over the step: forward = `ptprof/forward` (pipelines: F
and L actions), backward = `ptprof/backward` (B, I, W actions) including the recompute spans nested
in it. On CPU (gloo) ranks that is the compute (and the blocking collective waits inside, which the
recomputation repeats too). On a GPU rank the spans time kernel launches, not kernels: no numbers.
"""

from __future__ import annotations

import polars as pl

from profiler.collectives import RECOMPUTE_SPAN  # noqa: F401 (one definition of the span name; re-exported)
from profiler.steps import KEYS
from profiler.theory_recompute import recompute_compute, recompute_on

FORWARD_RE = r"^(ptprof/forward$|ptprof/pp/[FL] )"
BACKWARD_RE = r"^(ptprof/backward$|ptprof/pp/[BIW] )"
RECOMPUTE_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "step": pl.Int64, "device": pl.String, "recompute_spans": pl.Int64,
    "forward_us": pl.Float64, "recompute_us": pl.Float64, "backward_us": pl.Float64,
    "forward_comm_us": pl.Float64, "recompute_comm_us": pl.Float64,
    "recompute_over_forward": pl.Float64, "predicted_over_forward": pl.Float64, "note": pl.String,
}


def recompute_time(events: pl.DataFrame) -> pl.DataFrame:
    """RECOMPUTE_COLUMNS (without the prediction) for one or more ranks whose events carry `step`
    (profiler.steps.assign_steps); only ranks with at least one `ptprof/recompute` span."""
    name = pl.col("name").cast(pl.String)
    spans = (events.lazy()
             .filter((pl.col("kind") == "annotation") & (pl.col("device") == "cpu") & (pl.col("ph") == "X")
                     & pl.col("step").is_not_null())
             .with_columns(_n=name)
             .with_columns(_what=pl.when(pl.col("_n") == RECOMPUTE_SPAN).then(pl.lit("recompute"))
                           .when(pl.col("_n").str.contains(FORWARD_RE)).then(pl.lit("forward"))
                           .when(pl.col("_n").str.contains(BACKWARD_RE)).then(pl.lit("backward")))
             .filter(pl.col("_what").is_not_null())
             .collect())
    with_rc = spans.filter(pl.col("_what") == "recompute").select(KEYS).unique()
    if with_rc.is_empty():
        return pl.DataFrame(schema=RECOMPUTE_COLUMNS)
    gpu = events.lazy().group_by(KEYS).agg(_gpu=(pl.col("device") == "gpu").any()).collect()
    d = pl.col("dur_us")
    out = (spans.join(with_rc, on=KEYS, how="semi")
           .group_by(*KEYS, "step")
           .agg(recompute_spans=(pl.col("_what") == "recompute").sum().cast(pl.Int64),
                forward_us=d.filter(pl.col("_what") == "forward").sum(),
                recompute_us=d.filter(pl.col("_what") == "recompute").sum(),
                backward_us=d.filter(pl.col("_what") == "backward").sum())
           .join(gpu, on=KEYS, how="left"))
    on_gpu = pl.col("_gpu").fill_null(False)
    times = ["forward_us", "recompute_us", "backward_us"]
    return (out.with_columns(device=pl.when(on_gpu).then(pl.lit("gpu")).otherwise(pl.lit("cpu")),
                             **{c: pl.when(on_gpu).then(None).otherwise(pl.col(c)) for c in times},
                             note=pl.when(on_gpu).then(pl.lit("GPU rank: the CPU spans time kernel launches, not kernels")))
            .with_columns(recompute_over_forward=pl.when(pl.col("forward_us") > 0)
                          .then(pl.col("recompute_us") / pl.col("forward_us")),
                          predicted_over_forward=pl.lit(None, pl.Float64),
                          forward_comm_us=pl.lit(None, pl.Float64), recompute_comm_us=pl.lit(None, pl.Float64),
                          run=pl.col("run").cast(pl.String))
            .select(list(RECOMPUTE_COLUMNS)).cast(RECOMPUTE_COLUMNS).sort(*KEYS, "step"))


def with_prediction(frame: pl.DataFrame, runs: dict[str, dict | None]) -> pl.DataFrame:
    """`predicted_over_forward` from each run's run.json (profiler.theory_recompute.recompute_compute)."""
    pred = {run: (recompute_compute(m) or {}).get("recompute_over_forward")
            for run, m in runs.items() if isinstance(m, dict) and recompute_on(m)}
    if frame.is_empty() or not pred:
        return frame
    table = pl.DataFrame({"run": list(pred), "_p": list(pred.values())}, schema={"run": pl.String, "_p": pl.Float64})
    return (frame.join(table, on="run", how="left")
            .with_columns(predicted_over_forward=pl.coalesce("_p", "predicted_over_forward")).drop("_p"))


def with_compute(frame: pl.DataFrame, exposed: pl.DataFrame) -> pl.DataFrame:
    """The ratio on compute time: `forward_comm_us` / `recompute_comm_us`, the exposed communication
    (no compute under it; profiler.exposed) of phase forward / recompute in that rank's step, and
    `recompute_over_forward` = (recompute_us - recompute_comm_us) / (forward_us - forward_comm_us).

    A forward that waits on collectives (fsdp's all-gathers, DDP's step-1 broadcasts) has a wall
    time the recomputation does not repeat: their wall-time ratio would say nothing about compute."""
    if frame.is_empty():
        return frame
    keys = ["run", "rank", "step"]
    comm = (exposed.with_columns(pl.col("run").cast(pl.String)).filter(pl.col("phase").is_in(["forward", "recompute"]))
            .group_by(*keys).agg(_f=pl.col("exposed_us").filter(pl.col("phase") == "forward").sum(),
                                 _r=pl.col("exposed_us").filter(pl.col("phase") == "recompute").sum()))
    return (frame.join(comm.cast({"rank": pl.Int32, "step": pl.Int64}), on=keys, how="left")
            .with_columns(forward_comm_us=pl.when(pl.col("forward_us").is_not_null()).then(pl.col("_f").fill_null(0.0)),
                          recompute_comm_us=pl.when(pl.col("recompute_us").is_not_null()).then(pl.col("_r").fill_null(0.0)))
            .with_columns(recompute_over_forward=ratio_on_compute())
            .select(list(RECOMPUTE_COLUMNS)))


def ratio_on_compute() -> pl.Expr:
    """recompute/forward on compute time (with_compute), of columns that may be means over steps."""
    fwd = pl.col("forward_us") - pl.col("forward_comm_us").fill_null(0.0)
    return pl.when(fwd > 0).then((pl.col("recompute_us") - pl.col("recompute_comm_us").fill_null(0.0)) / fwd)
