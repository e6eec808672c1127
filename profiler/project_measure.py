"""What `ptprof project` reads of a profiled run: per rank and profiled step, the step window, the
compute / communication / overlap / idle split (profiler.breakdown), the counted work ops with
their FLOPs or bytes (profiler.workload), the collectives, and the pipeline action spans; and the
"cluster" the run was measured on (`calibrate`). docs/whatif.md, "Project".
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import numpy as np
import polars as pl

from profiler.breakdown import gloo_worker_threads, temporal_breakdown
from profiler.cluster import Cluster, Link, load_cluster, preset_names
from profiler.collectives import collectives
from profiler.commcost import TRAFFIC_FACTOR, collective_s, latency_steps
from profiler.costmodel_ops import gemm_time_s, memory_bound_time_s
from profiler.discover import run_name
from profiler.errors import TraceError
from profiler.load import load_traces
from profiler.pipeline import pipeline_actions
from profiler.steps import assign_steps, profiler_steps
from profiler.theory import predict_run
from profiler.theory_pipeline import PIPELINE_PARADIGMS
from profiler.workload import ops_in_steps, trace_ops

FLOP_CLASSES = ("matmul", "attention")
P2P_KINDS = ("send", "recv", "send_recv")
NO_RUN_JSON = "no run.json: project reads `ptprof run` folders (docs/run-layout.md)"
SMALL_RUN_BYTES = 8 << 20
STEP_COLUMNS = ["rank", "step", "window_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us"]


@dataclasses.dataclass(frozen=True)
class RunWork:
    """A run's measured work. ops: rank, step, ts_us, dur_us, name, klass, flops, bytes (workload's
    counted ops on the training threads, profiled steps only). steps: STEP_COLUMNS. actions:
    profiler.pipeline_actions rows (empty outside pipelines). colls: profiler.collectives rows."""

    run_dir: str
    manifest: dict
    ranks: pl.DataFrame
    steps: pl.DataFrame
    ops: pl.DataFrame
    actions: pl.DataFrame
    colls: pl.DataFrame
    has_gpu: bool

    @property
    def world(self) -> int:
        return int(self.manifest.get("world_size") or self.ranks.height)

    @property
    def run_id(self) -> str:
        return run_name(Path(self.run_dir))  # as `ptprof analyze` and the viewer name it: not run.json's run_id


def measure_run(run_dir: str | Path, *, workers: int | None = None) -> RunWork:
    """Load a run folder and measure its work. TraceError/ValueError with one line where project
    cannot use it (no run.json: a foreign trace; no profiled steps). workers: profiler.load's
    (1: parse in this process, quicker for a few small files)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceError(run_dir, "not a run folder (`ptprof run` writes rank*.json.gz + run.json)")
    if not (run_dir / "run.json").is_file():
        raise TraceError(run_dir, NO_RUN_JSON)
    if workers is None:  # small runs parse faster here than in worker processes (each imports polars)
        size = sum(f.stat().st_size for f in run_dir.glob("rank*.json*") if f.is_file())
        workers = 1 if size < SMALL_RUN_BYTES else None
    traces = load_traces(run_dir, progress=False, workers=workers)
    if traces.ranks["run"].n_unique() != 1:
        raise TraceError(run_dir, "holds several runs; pass one run folder")
    manifest = next(iter(traces.runs.values()))
    if not isinstance(manifest, dict):
        raise TraceError(run_dir / "run.json", "unreadable or not a ptprof run.json")
    if traces.problems:  # projecting from the ranks that loaded would be a silent wrong number
        p = traces.problems[0]
        more = f" (and {len(traces.problems) - 1} more)" if len(traces.problems) > 1 else ""
        raise TraceError(p.path, f"{_cut(p.problem, 60)}{more} (project needs every rank)")
    check_world(run_dir, manifest, traces.ranks.height)
    steps, ops, actions, colls = [], [], [], []
    for part, events in zip(traces.parts, traces.rank_events()):
        st = profiler_steps(events).filter(pl.col("has_profiler_steps"))
        if st.is_empty():
            continue
        ev = assign_steps(events, st)
        bd = temporal_breakdown(ev, per_step=True, steps=st)
        # the breakdown's window: the ProfilerStep span on CPU ranks, the GPU activity's on GPU ranks
        steps.append(bd.select(pl.col("rank").cast(pl.Int32), "step", "window_us", "compute_us", "comm_us",
                               "overlap_us", "exposed_comm_us"))
        gloo_threads = gloo_worker_threads(ev).select("pid", "tid")
        file = traces.ranks.filter(pl.col("rank") == part.rank)["file"][0]
        rank_ops = trace_ops(file).join(gloo_threads, on=["pid", "tid"], how="anti")
        bad = rank_ops.filter(pl.col("klass") == "bad_shape")
        if bad.height:  # no tensor has such a dim: the file is damaged, its ops' work cannot be trusted
            raise TraceError(file, f"{bad.height} ops ({bad['name'][0]}, ...) with a negative or absurd Input Dims")
        if (ev["device"] == "gpu").any():
            rank_ops = with_kernel_times(rank_ops, ev)
        ops.append(ops_in_steps(rank_ops, st.select("start_us", "end_us", "step")).with_columns(
            rank=pl.lit(part.rank, pl.Int32)))
        actions.append(_clipped(pipeline_actions(ev, steps=st, runs=traces.runs), st))
        colls.append(collectives(ev, traces.ranks))
    if not steps:
        raise TraceError(run_dir, "no ProfilerStep spans: project needs the profiled steps")
    ops = pl.concat(ops)
    # The functional collectives' waits are communication in the breakdown already (classify.py):
    # not compute, and the communication under them exposed. Out of the counted ops here too.
    steps = pl.concat(steps)
    ops = ops.filter(pl.col("klass") != "wait")
    acts = [a for a in actions if a.height]
    if traces.ranks["has_gpu"].any() and acts:
        raise TraceError(run_dir, "a GPU pipeline run: its action spans time launches, not kernels (docs/whatif.md)")
    return RunWork(str(run_dir), manifest, traces.ranks, steps, ops,
                   pl.concat(acts) if acts else actions[0], pl.concat([c for c in colls if c.width], how="diagonal_relaxed"),
                   bool(traces.ranks["has_gpu"].any()))


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def check_world(run_dir: Path, manifest: dict, n_ranks: int) -> None:
    """TraceError unless run.json's world_size is a whole number equal to the rank files loaded."""
    world = manifest.get("world_size")
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise TraceError(run_dir / "run.json", f"world_size is {world!r}: a whole number >= 1 is needed")
    if world != n_ranks:
        raise TraceError(run_dir / "run.json", f"world_size {world} but {n_ranks} rank file(s) loaded")


def _clipped(actions: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Pipeline actions cut to their step's window (a first step's action can start before its
    ProfilerStep span, lazy initialisation inside it): the replay compares them with that window."""
    if actions.is_empty():
        return actions
    win = steps.select(pl.col("rank").cast(actions.schema["rank"]), "step", _s="start_us", _e="end_us")
    return (actions.join(win, on=["rank", "step"], how="left")
            .with_columns(start_us=pl.max_horizontal("start_us", pl.col("_s").fill_null(pl.col("start_us"))),
                          end_us=pl.min_horizontal("end_us", pl.col("_e").fill_null(pl.col("end_us"))))
            .with_columns(dur_us=(pl.col("end_us") - pl.col("start_us")).clip(0))
            .drop("_s", "_e"))


def with_kernel_times(ops: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """A GPU rank's counted ops with `dur_us` = the summed duration of the compute and memory kernels
    they launched (runtime calls inside the op's span on its thread, linked to kernels by
    `correlation`); ops that launched none are dropped (their time is host time, not device work)."""
    gpu = pl.col("device") == "gpu"
    kernels = (events.filter(gpu & pl.col("kind").cast(pl.String).is_in(["compute", "memory"])
                             & pl.col("correlation").is_not_null())
               .group_by("correlation").agg(k_us=pl.col("dur_us").sum()))
    launches = (events.filter(~gpu & (pl.col("kind") == "runtime") & pl.col("correlation").is_not_null())
                .select("pid", "tid", "ts_us", "correlation").join(kernels, on="correlation")
                .select("pid", "tid", pl.col("ts_us").alias("t_us"), "k_us").sort("t_us"))
    spans = ops.with_row_index("_op").select("_op", "pid", "tid", "ts_us", end_us=pl.col("ts_us") + pl.col("dur_us")).sort("ts_us")
    # each launch to the latest counted op starting before it on its thread, if it is still running
    owned = (launches.join_asof(spans, left_on="t_us", right_on="ts_us", by=["pid", "tid"], strategy="backward",
                             check_sortedness=False)  # both sorted by time above
             .filter(pl.col("_op").is_not_null() & (pl.col("t_us") < pl.col("end_us")))
             .group_by("_op").agg(pl.col("k_us").sum()))
    return (ops.with_row_index("_op").join(owned, on="_op", how="inner")
            .with_columns(dur_us=pl.col("k_us")).drop("_op", "k_us"))


# ---------------------------------------------------------------------------------------------
# Roofline of one op on a cluster


SHAPE = ["klass", "flops", "bytes", "batch", "m", "n", "k", "elem_bytes"]


def op_seconds(klass: str, flops, nbytes, batch, m, n, k, elem, cluster: Cluster) -> float | None:
    """Seconds of one counted op on `cluster`, the cost model's roofline (profiler.costmodel_ops):
    a matmul is gemm_time_s(m, n, k, batch) -- max(FLOPs / (peak x gemm_efficiency x wave
    efficiency), bytes / (HBM x hbm_efficiency)); attention its two GEMMs (QK^T: Sq x Sk x D, PV:
    Sq x D x Sk; the backward twice the forward); a memory-bound op memory_bound_time_s(bytes).
    None where the work is unknown."""
    if klass == "matmul" and m:
        return gemm_time_s(m, n, k, cluster, elem or 4, batch=batch)
    if klass == "attention" and m and flops:
        fwd = gemm_time_s(m, n, k, cluster, elem or 4, batch=batch) + gemm_time_s(m, k, n, cluster, elem or 4, batch=batch)
        return fwd * flops / (4.0 * batch * m * n * k)
    if klass == "memory" and nbytes is not None:
        return memory_bound_time_s(nbytes, cluster)
    return None


def with_target_time(ops: pl.DataFrame, cluster: Cluster, source: Cluster | None = None) -> pl.DataFrame:
    """ops plus `target_us` (null for ops of unknown work), evaluated once per distinct shape: the
    roofline time on `cluster`, or with `source` (a GPU trace's own GPU) the measured kernel time
    × roofline on `cluster` / roofline on `source` -- what the op reached of its GPU's roofline,
    it reaches of the target's."""
    shapes = ops.select(SHAPE).unique()
    t = [op_seconds(*row, cluster) for row in shapes.iter_rows()]
    shapes = shapes.with_columns(_t=pl.Series([None if x is None else 1e6 * x for x in t], dtype=pl.Float64))
    if source is not None:
        src = [op_seconds(*row, source) for row in shapes.select(SHAPE).iter_rows()]
        shapes = shapes.with_columns(_s=pl.Series([None if x is None else 1e6 * x for x in src], dtype=pl.Float64))
    out = ops.join(shapes, on=SHAPE, how="left", nulls_equal=True)
    if source is None:
        return out.rename({"_t": "target_us"})
    return (out.with_columns(target_us=pl.when(pl.col("_s") > 0).then(pl.col("dur_us") * pl.col("_t") / pl.col("_s")))
            .drop("_t", "_s"))


def device_preset(work: RunWork) -> Cluster | None:
    """The preset of a GPU run's own GPU, by its device name ("NVIDIA H100 80GB HBM3" -> h100), or None."""
    if not work.has_gpu:
        return None
    names = " ".join(str(n) for n in work.ranks["device_name"].drop_nulls().to_list()).lower()
    for key in preset_names():
        if key in names:
            return load_cluster(key)
    return None


# ---------------------------------------------------------------------------------------------
# Calibration: the cluster a run was measured on


def fit_link(colls: pl.DataFrame, *, bw_prior_gbps: float | None = None) -> tuple[Link, str]:
    """One α–β link from a run's collectives (profiler.commcost's model): time = steps·α +
    traffic/bw, least squares over the fastest call of each (kind, size, group) -- a call that
    waited for a late peer (or a receive that waited out the peer's compute) is slower, never
    faster, than the transfer (as profiler.alphabeta's fastest_per_size), sends and receives pooled.
    Sizes that cannot separate α from β (one size, or a fit with a negative term): bw =
    `bw_prior_gbps` and α the rest where given, else α = 0. (link, how): what was fitted or assumed."""
    if colls.is_empty() or "size_bytes" not in colls.columns:
        return Link("none measured", 1.0, 0.0), "no collectives in the run: link 1 GB/s, 0 µs assumed (no communication to project)"
    c = (colls.filter(pl.col("collective").is_in(list(TRAFFIC_FACTOR)) & pl.col("size_bytes").is_not_null()
                      & (pl.col("size_bytes") > 0) & (pl.col("dur_us") > 0) & pl.col("group_size").is_not_null())
         .with_columns(collective=pl.when(pl.col("collective").is_in(P2P_KINDS)).then(pl.lit("send"))
                       .otherwise(pl.col("collective")))
         .group_by("collective", "size_bytes", "group_size").agg(pl.col("dur_us").min(), n=pl.len())
         .sort("collective", "size_bytes", "group_size"))  # a fixed order: the same fit every time
    if c.is_empty():
        return Link("none measured", 1.0, 0.0), "no sized collectives: link 1 GB/s, 0 µs assumed"
    kinds, sizes, groups, dur, n = (c[k].to_list() for k in ("collective", "size_bytes", "group_size", "dur_us", "n"))
    x_lat = np.array([latency_steps(k, max(g, 2)) for k, g in zip(kinds, groups)], float)
    x_bytes = np.array([TRAFFIC_FACTOR[k](max(g, 2)) * s for k, s, g in zip(kinds, sizes, groups)], float)
    t = np.array(dur, float) * 1e-6
    how = f"α–β least squares over the fastest of {sum(n)} calls ({len(t)} kind/size points)"
    if len(t) >= 2 and np.linalg.matrix_rank(np.c_[x_lat, x_bytes]) == 2:
        (a, b), *_ = np.linalg.lstsq(np.c_[x_lat, x_bytes], t, rcond=None)
        if a >= 0 and b > 0:
            return Link("measured (α–β fit)", float(1e-9 / b), float(a * 1e6)), how
    if bw_prior_gbps and (rest := t.sum() - x_bytes.sum() / (bw_prior_gbps * 1e9)) > 0:
        return (Link("measured (α, bandwidth assumed)", float(bw_prior_gbps), float(rest / x_lat.sum() * 1e6)),
                f"the fastest of {sum(n)} calls; their sizes do not separate α from β: bw = {bw_prior_gbps:.3g} GB/s "
                "assumed (the run's measured memory-bound rate: ranks of one host copy through memory), α the rest")
    return (Link("measured (bandwidth only)", float(x_bytes.sum() / t.sum() / 1e9), 0.0),
            f"the fastest of {sum(n)} calls; their sizes do not separate α from β: α = 0 assumed")


def _scaled_to_run(work: RunWork, link: Link, how: str) -> tuple[Link, str]:
    """The fitted link with α and 1/bw scaled by f = the run's measured communication time (the
    union of its calls per rank and step, profiler.breakdown's comm_us) / the theory's volumes of the
    run under the fitted link: on gloo, calls in flight together (ZeRO-1's broadcasts) and waits
    for late peers make the per-call fit miss what the steps paid. Not for pipelines, whose
    blocking receives also wait out the peer's compute (the schedule replay models that)."""
    if work.manifest.get("paradigm") in PIPELINE_PARADIGMS or work.actions.height:
        return link, how
    rows, _ = predict_run(work.manifest)
    model_s = 0.0
    for rank, step in work.steps.select("rank", "step").iter_rows():
        for r in rows:
            if r["rank"] != rank or (r.get("step") is not None and r["step"] != step):
                continue
            kind, n, calls, nbytes = r["collective"], r["group_size"] or 1, r["calls"], r["bytes"]
            if kind in TRAFFIC_FACTOR and calls and nbytes is not None:
                model_s += calls * collective_s(kind, nbytes / calls, n, link)
    measured_s = float(work.steps["comm_us"].sum()) * 1e-6
    if not (model_s > 0 and measured_s > 0):
        return link, how
    f = measured_s / model_s
    return (Link(link.name, link.bw_gbps / f, link.latency_us * f),
            f"{how}; α and 1/bw then x {f:.3g} so that the theory's volumes of the run take its measured "
            f"communication time ({measured_s * 1e3:.1f} ms over its ranks and steps)")


def host_memory_gib() -> float:
    """This machine's memory, the 'HBM' of a CPU run (its size, not its speed, matters: fits)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 16.0


def calibrate(work: RunWork) -> Cluster:
    """The measured 'cluster' (module docstring of profiler.project)."""
    ops = work.ops
    flop_ops = ops.filter(pl.col("klass").is_in(FLOP_CLASSES) & pl.col("flops").is_not_null() & (pl.col("flops") > 0))
    mem_ops = ops.filter((pl.col("klass") == "memory") & pl.col("bytes").is_not_null() & (pl.col("bytes") > 0))
    if flop_ops.is_empty() or flop_ops["dur_us"].sum() <= 0:
        raise ValueError(f"{work.run_dir}: no matmul ops with shapes (profile with record_shapes=True)")
    mem_gbps = (mem_ops["bytes"].sum() / (mem_ops["dur_us"].sum() * 1e-6) / 1e9) if mem_ops.height else None
    link, how = fit_link(work.colls, bw_prior_gbps=None if work.has_gpu else mem_gbps)
    world = work.world
    link, how = _scaled_to_run(work, link, how)
    own_gpu = device_preset(work)
    if own_gpu is not None:  # a known GPU: its preset's roofline (kernel times are re-timed by ratios to it)
        return dataclasses.replace(own_gpu, name=f"{own_gpu.name} (measured: {work.run_id})", gpus_per_node=world,
                                   intra=link, inter=dataclasses.replace(link), link_efficiency=1.0, source=str(work.run_dir),
                                   notes=(f"{own_gpu.name} preset's compute and HBM: the GPU the run's kernels ran on",
                                          f"link: {how}", "one node of world_size ranks: inter-node link = the measured one"))
    flat = flop_ops["flops"].sum() / (flop_ops["dur_us"].sum() * 1e-6) / 1e12
    hbm_gib = 80.0 if work.has_gpu else round(host_memory_gib(), 1)
    base = Cluster(name=f"measured:{work.run_id}", peak_tflops=flat, hbm_gib=hbm_gib,
                   hbm_gbps=mem_gbps or flat * 1e3, gpus_per_node=world, intra=link, inter=dataclasses.replace(link),
                   gemm_efficiency=1.0, hbm_efficiency=1.0, link_efficiency=1.0, source=str(work.run_dir))
    peak_tflops, peak_how = _fit_peak(flop_ops, base)
    notes = (f"calibrated from {work.run_id}: matmul/attention {flop_ops['flops'].sum():.3g} FLOP in "
             f"{flop_ops['dur_us'].sum() / 1e3:.1f} ms, memory-bound {mem_ops['bytes'].sum():.3g} B in "
             f"{mem_ops['dur_us'].sum() / 1e3:.1f} ms over {ops['rank'].n_unique()} ranks",
             f"link: {how}", "one node of world_size ranks: inter-node link = the measured one")
    notes += (f"peak: {peak_how}",
              "HBM size unknown: 80 GiB assumed" if work.has_gpu else "HBM size: this machine's memory")
    if not mem_gbps:
        notes += ("no memory-bound ops: HBM rate = 1000 x peak assumed",)
    return dataclasses.replace(base, peak_tflops=peak_tflops, notes=notes)


def _fit_peak(flop_ops: pl.DataFrame, base: Cluster) -> tuple[float, str]:
    """The peak at which the roofline times of the run's matmul/attention ops (op_seconds, with the
    measured memory rate) sum to their measured time: the roofline is non-increasing in the peak,
    so a bisection in log space finds it. Where the memory term alone exceeds the measured time,
    the flat rate Σ FLOPs / Σ time (said)."""
    measured_s = flop_ops["dur_us"].sum() * 1e-6
    # a fixed order: the same float sum every time
    shapes = flop_ops.group_by(SHAPE).agg(count=pl.len()).sort(SHAPE, nulls_last=True)

    def total(peak: float) -> float:
        c = dataclasses.replace(base, peak_tflops=peak)
        return sum(cnt * (op_seconds(*row, c) or 0.0) for *row, cnt in shapes.iter_rows())

    lo, hi = base.peak_tflops, base.peak_tflops
    if total(hi * 1e6) >= measured_s:
        return base.peak_tflops, "Σ FLOPs / Σ time (their memory term alone exceeds the measured time)"
    while total(lo) < measured_s:
        lo /= 2
    while total(hi) > measured_s:
        hi *= 2
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if total(mid) > measured_s else (lo, mid)
    return math.sqrt(lo * hi), "the peak at which the roofline times of its matmul/attention ops sum to their measured time"

