"""`ptprof project RUN --cluster C [--nodes N] [--layout ...]`: the step a profiled run would take
on a target cluster, in its own layout or another: compute from the run's measured per-op work
(FLOPs from recorded shapes, profiler.workload), communication from the theory's volumes under the
target's α–β, overlap as the run scheduled it, pipelines by replaying the schedule
(profiler.pipeline.simulate_order). docs/whatif.md, "Project".

Own layout, per rank r and profiled step s (measured: window W, compute C, overlap O of
communication under compute, exposed communication E; ρ = Σ target time / Σ measured time of the
step's ops of known work):
    compute_t = ρ·C                      (ops of unknown work and op-free compute scaled at ρ)
    comm_t    = Σ rows calls · collective_s(kind, bytes/calls, group, link by rank layout)
    exposed_t = comm_t − min(comm_t, ρ·O) (the compute that hid communication shrinks with it)
    other     = W − C − E                (host gaps and waits with neither: carried over as measured)
    step_t    = compute_t + exposed_t + other
Pipelines: the schedule's order replayed with each action's op time × its own ρ and the rest of
its span (host time) as measured (makespan M), the compute outside the actions' ops N = C − their
op time scaled at ρ, and the rest of the measured step beyond the replay, R = W − M_src − N − P_src,
carried over with its p2p time P re-timed on the target:
    step_t = M_t + ρ·N + R + P_t
    compute = the actions' re-timed op time + ρ·N; other = R + the actions' host time;
    bubble = M_t − the actions' busy time
The job's step: the slowest rank's mean over the profiled steps; measured: the same statistic of
the windows (the slowest rank's mean window).
"""

from __future__ import annotations

import math

from pathlib import Path

import polars as pl

from profiler import costmodel
from profiler.cluster import Cluster
from profiler.commcost import TRAFFIC_FACTOR, collective_s, group_link
from profiler.costmodel_ops import model_flops_per_sequence, sm_count
from profiler.discover import read_manifest
from profiler.errors import TraceError
from profiler.layout import Estimate, Layout, LayoutError, ModelSpec, group_stride
from profiler.plan_memory import memory_per_gpu
from profiler.pipeline import pp_coordinates, simulate_order
from profiler.pipeline_order import action_durations, ideal_order
from profiler.project_run import fill_layout, run_layout, run_spec  # noqa: F401 (re-exported)
from profiler.project_measure import FLOP_CLASSES, NO_RUN_JSON, RunWork, calibrate, measure_run, with_target_time
from profiler.theory import predict_run
from profiler.theory_pipeline import PIPELINE_PARADIGMS

P2P = ("send", "recv", "send_recv")


def run_manifest(run_dir: str) -> dict:
    """The run.json of a run folder; TraceError saying what project needs where there is none."""
    path = Path(run_dir)
    if not path.is_dir():
        raise TraceError(path, "not a run folder (`ptprof run` writes rank*.json.gz + run.json)")
    manifest = read_manifest(path)
    if not isinstance(manifest, dict):
        raise TraceError(path, NO_RUN_JSON)
    return manifest


def calibrate_cluster(run_dir: str) -> Cluster:
    """The "cluster" a run was measured on, from its own traces: peak = Σ FLOPs / Σ time of its
    matmul and attention ops (efficiency 1), memory rate = Σ bytes / Σ time of its memory-bound
    ops (efficiency 1), one link fitted α–β to its collectives (a CPU/gloo run: one node of
    `world_size` ranks, the inter-node link the same)."""
    return calibrate(measure_run(run_dir))


# ---------------------------------------------------------------------------------------------
# Communication of the run's own layout on a cluster


def comm_rows(work: RunWork, layout: Layout) -> pl.DataFrame:
    """The theory's rows (profiler.theory.predict_run) of the run: rank, dim, phase, collective,
    group_size, calls, bytes, step, with the stride of the dim's groups in the rank order."""
    rows, facts = predict_run(work.manifest)
    schema = {"rank": pl.Int32, "dim": pl.String, "phase": pl.String, "collective": pl.String, "group_size": pl.Int64,
              "calls": pl.Int64, "bytes": pl.Int64, "step": pl.Int64}
    frame = pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema, orient="row")
    # theory's "sp" rows: Megatron's sequence parallelism rides on the tp group; Ulysses' sequence
    # group is the layout's cp (project_run.py), where they were placed and named as tp (a trial).
    frame = frame.with_columns(dim=pl.col("dim").replace({"sp": "cp" if layout.cp > 1 and not layout.sp else "tp"}))
    strides = {}
    for dim in frame["dim"].unique().to_list():
        try:
            strides[dim] = group_stride(layout, dim)
        except LayoutError:
            strides[dim] = 1
    why = facts.get("why") or (None if frame.height else "profiler.theory.predict_run gives no rows")
    return frame.with_columns(stride=pl.col("dim").replace_strict(strides, default=1, return_dtype=pl.Int64)), why


def comm_seconds(rows: pl.DataFrame, cluster: Cluster, world: int | None = None) -> pl.DataFrame:
    """rows plus `target_s`: calls × the α–β time of one call of bytes/calls on the group's link."""
    out = []
    for kind, n, calls, nbytes, stride in rows.select("collective", "group_size", "calls", "bytes", "stride").iter_rows():
        if kind not in TRAFFIC_FACTOR or not calls or nbytes is None:
            out.append(None)
            continue
        link = group_link(cluster, n or 1, stride or 1, world_size=world,
                          p2p=kind in ("send", "recv", "send_recv"))
        out.append(calls * collective_s(kind, nbytes / calls, n or 1, link, efficiency=cluster.link_efficiency))
    return rows.with_columns(target_s=pl.Series(out, dtype=pl.Float64))


def _comm_per_step(rows: pl.DataFrame, steps: pl.DataFrame, *, p2p: bool | None) -> pl.DataFrame:
    """(rank, step) -> comm_s of the rows that run every step (or that step): p2p only, none, or all (None)."""
    sel = rows if p2p is None else rows.filter(pl.col("collective").is_in(P2P) == p2p)
    keys = steps.select("rank", "step")
    every = sel.filter(pl.col("step").is_null()).group_by("rank").agg(_a=pl.col("target_s").sum())
    once = sel.filter(pl.col("step").is_not_null()).group_by("rank", "step").agg(_b=pl.col("target_s").sum())
    return (keys.join(every, on="rank", how="left").join(once, on=["rank", "step"], how="left")
            .select("rank", "step", comm_s=pl.col("_a").fill_null(0.0) + pl.col("_b").fill_null(0.0)))


# ---------------------------------------------------------------------------------------------
# Own-layout projection


def _rho(ops: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """by + rho: Σ target / Σ measured time of the ops of known work."""
    known = ops.filter(pl.col("target_us").is_not_null())
    return known.group_by(by).agg(rho=pl.col("target_us").sum() / pl.col("dur_us").sum())


def own_layout_step(work: RunWork, cluster: Cluster, source: Cluster, layout: Layout) -> dict:
    """The per-rank, per-step projection of the run's own layout (module docstring): a dict of
    step_s, breakdown_s, per_step frame, measured_step_s, compute_scale facts."""
    ops = with_target_time(work.ops, cluster, source if work.has_gpu else None)
    rho = _rho(ops, ["rank", "step"])
    overall = _rho(ops.with_columns(_k=pl.lit(1)), ["_k"])["rho"]
    if not overall.len() or not math.isfinite(overall[0] or math.nan):
        raise ValueError(f"{work.run_dir}: no ops with shapes (profile with record_shapes=True)")
    rho_all = float(overall[0])
    rows, why = comm_rows(work, layout)
    rows_t, rows_src = comm_seconds(rows, cluster, layout.gpus), comm_seconds(rows, source, layout.gpus)
    st = work.steps.join(rho, on=["rank", "step"], how="left").with_columns(pl.col("rho").fill_null(rho_all))
    pipeline = work.manifest.get("paradigm") in PIPELINE_PARADIGMS or (work.actions.height > 0)
    comm_t = _comm_per_step(rows_t, st, p2p=False if pipeline else None).rename({"comm_s": "comm_t_s"})
    st = st.join(comm_t, on=["rank", "step"], how="left")
    us = 1e-6
    if not pipeline:
        st = st.with_columns(compute_t=pl.col("compute_us") * us * pl.col("rho"),
                             other=(pl.col("window_us") - pl.col("compute_us") - pl.col("exposed_comm_us")).clip(0) * us)
        st = st.with_columns(hidden=pl.min_horizontal("comm_t_s", pl.col("overlap_us") * us * pl.col("rho")))
        st = st.with_columns(exposed=pl.col("comm_t_s") - pl.col("hidden"), bubble=pl.lit(0.0))
    else:
        st = _pipeline_terms(work, ops, st, rows_t, rows_src)
    st = st.with_columns(step_t=pl.col("compute_t") + pl.col("exposed") + pl.col("bubble") + pl.col("other"))
    # The job's step: the slowest rank's mean over the profiled steps (the others wait for it). The
    # measured step beside it is the same statistic of the measured windows (the slowest rank's
    # mean window), so a self-projection compares like with like; the per-rank spread is kept.
    cols = ["step_t", "compute_t", "exposed", "bubble", "other", "comm_t_s", "window_us"]
    per_rank = st.group_by("rank").agg(pl.col(cols).mean()).sort("rank")
    slow = per_rank.sort("step_t", "rank", descending=[True, False]).head(1)
    parts = {"compute": slow["compute_t"].mean(), **_by_dim(slow["exposed"].mean(), rows_t),
             "bubble": slow["bubble"].mean(), "other": slow["other"].mean()}
    measured = per_rank["window_us"].max() * us
    spread = {"projected_s": [float(x) for x in per_rank["step_t"]],
              "measured_s": [float(x) * us for x in per_rank["window_us"]], "ranks": per_rank["rank"].to_list()}
    return {"step_s": float(slow["step_t"].mean()), "breakdown_s": {k: float(v) for k, v in parts.items() if v},
            "measured_step_s": float(measured), "per_step": st, "rho": rho_all, "comm_why": why,
            "comm_t_s": float(slow["comm_t_s"].mean()), "pipeline": pipeline, "per_rank": spread}


def _by_dim(exposed_s: float, rows_t: pl.DataFrame) -> dict[str, float]:
    """The exposed communication as `comm_exposed:<dim>` keys (as profiler.costmodel's), split in
    proportion to each dim's predicted communication time (sp's rows are named by comm_rows)."""
    per = (rows_t.filter(pl.col("target_s").is_not_null() & pl.col("step").is_null())  # every step's rows
           .group_by("dim").agg(pl.col("target_s").sum()).filter(pl.col("target_s") > 0))
    total = per["target_s"].sum() if per.height else 0.0
    if not exposed_s or total <= 0:
        return {"comm_exposed": exposed_s or 0.0}
    return {f"comm_exposed:{d}": exposed_s * t / total for d, t in per.sort("dim").iter_rows()}


def _pipeline_terms(work: RunWork, ops: pl.DataFrame, st: pl.DataFrame, rows_t: pl.DataFrame,
                    rows_src: pl.DataFrame) -> pl.DataFrame:
    """compute_t, exposed, bubble, other of pipeline ranks (module docstring)."""
    acts = work.actions.with_columns(pl.col("rank").cast(pl.Int32))
    cfg = work.manifest.get("pipeline") if isinstance(work.manifest.get("pipeline"), dict) else {}
    last_stage = cfg.get("loss_stage") if isinstance(cfg.get("loss_stage"), int) else acts["stage"].max()
    ideal = ideal_order(work.manifest)
    # Each action re-timed by its own ops (those starting inside its span): its op time x the ρ of
    # its ops of known work; the rest of the span (Python between ops, a hybrid's FSDP waits inside
    # it) kept as measured.
    a = acts.with_row_index("_a")
    joined = (ops.select("rank", "ts_us", "dur_us", "target_us")
              .join_where(a.select("_a", "rank", "start_us", "end_us"), pl.col("rank") == pl.col("rank_right"),
                          pl.col("ts_us") >= pl.col("start_us"), pl.col("ts_us") < pl.col("end_us")))
    known = pl.col("target_us").is_not_null()
    arho = joined.group_by("_a").agg(
        op_us=pl.col("dur_us").sum(),
        arho=pl.col("target_us").filter(known).sum() / pl.col("dur_us").filter(known).sum())
    a = (a.join(arho, on="_a", how="left").join(st.select("rank", "step", "rho"), on=["rank", "step"], how="left")
         .with_columns(pl.col("op_us").fill_null(0.0).clip(0, pl.col("dur_us")))
         .with_columns(op_t_us=pl.col("op_us") * pl.coalesce("arho", "rho", pl.lit(1.0)))
         .with_columns(t_us=pl.col("dur_us") - pl.col("op_us") + pl.col("op_t_us")))
    p2p_t = _comm_per_step(rows_t, st, p2p=True).rename({"comm_s": "p2p_t"})
    p2p_src = _comm_per_step(rows_src, st, p2p=True).rename({"comm_s": "p2p_src"})
    # one replay per pipeline: a hybrid run has dp replicas of it (run.json hybrid.groups.pp)
    coords = pp_coordinates(work.manifest) or {r: (0, r) for r in range(work.world)}
    pipes: dict[int, dict[int, int]] = {}
    for r, (k, c) in coords.items():
        pipes.setdefault(k, {})[c] = r
    out = []
    for step in st["step"].unique().sort().to_list():
        for members in pipes.values():  # pp coordinate -> global rank
            sa = a.filter((pl.col("step") == step) & pl.col("rank").is_in(list(members.values())))
            if sa.is_empty():
                continue
            ran = [[(x, s, i) for x, s, i in sa.filter((pl.col("rank") == members.get(c, -1)) & pl.col("slot").is_not_null())
                    .sort("slot").select("action", "stage", "microbatch").iter_rows()] for c in range(max(members) + 1)]
            plan = ideal if ideal is not None and len(ideal) == len(ran) else ran
            src = simulate_order(plan, action_durations(sa, plan, last_stage), last_stage=last_stage)
            tgt = simulate_order(plan, action_durations(sa.with_columns(dur_us=pl.col("t_us")), plan, last_stage),
                                 last_stage=last_stage)
            if src is None or tgt is None:
                raise ValueError(f"{work.run_dir}: the pipeline order of step {step} does not replay (deadlock)")
            busy = sa.group_by("rank").agg(pl.col("dur_us").sum(), pl.col("t_us").sum(), pl.col("op_us").sum(),
                                           pl.col("op_t_us").sum())
            for r, b_src, b_t, op_src, op_t in busy.iter_rows():
                out.append({"rank": r, "step": step, "m_src": src[1] * 1e-6, "m_t": tgt[1] * 1e-6,
                            "a_src": b_src * 1e-6, "a_t": b_t * 1e-6, "op_src": op_src * 1e-6, "op_t": op_t * 1e-6})
    rep = pl.DataFrame(out, schema={"rank": pl.Int32, "step": pl.Int64, "m_src": pl.Float64, "m_t": pl.Float64,
                                    "a_src": pl.Float64, "a_t": pl.Float64, "op_src": pl.Float64, "op_t": pl.Float64})
    us = 1e-6
    st = (st.join(rep, on=["rank", "step"], how="left").join(p2p_t, on=["rank", "step"], how="left")
          .join(p2p_src, on=["rank", "step"], how="left").fill_null(0.0))
    # compute outside the actions' ops (the optimizer, the loss outside a span): the breakdown's
    # compute less the op time inside the actions, re-timed at the step's ρ. An action's span beyond
    # its ops (Python between them) is host time: kept as measured in the replay, shown as "other".
    n = (pl.col("compute_us") * us - pl.col("op_src")).clip(0)
    resid = (pl.col("window_us") * us - pl.col("m_src") - n - pl.col("p2p_src")).clip(0)
    return st.with_columns(compute_t=pl.col("op_t") + n * pl.col("rho"),
                           bubble=(pl.col("m_t") - pl.col("a_t")).clip(0),
                           exposed=pl.col("p2p_t") + pl.col("comm_t_s"),
                           other=resid + pl.col("a_t") - pl.col("op_t"))


# ---------------------------------------------------------------------------------------------
# Public entry points


def model_flops_per_step(spec: ModelSpec) -> float:
    """Model FLOPs of one step: the cost model's definition (profiler.costmodel_ops.
    model_flops_per_sequence: 3 x the forward GEMMs of every layer, attention's QK^T and PV and the
    head; a MoE layer counts its top_k experts, not all of them) x the global batch."""
    return model_flops_per_sequence(spec.layers, spec.seq, spec.hidden, spec.heads, spec.ffn, spec.vocab,
                                    spec.top_k if spec.moe else 0, spec.moe_layers) * spec.global_batch


def memory_of(spec: ModelSpec, layout: Layout) -> dict[str, int]:
    """Memory per GPU from profiler.plan_memory (the cost model's), in whole bytes."""
    return {k: int(v) for k, v in memory_per_gpu(spec, layout).items()}


def project_details(run_dir: str, cluster: Cluster, *, nodes: int | None = None, layout: Layout | str | None = None,
                    work: RunWork | None = None) -> dict:
    """The projection with what the CLI shows beside it: estimate (Estimate), measured_step_s,
    coverage, source (the calibrated cluster), inputs. ValueError with one line where it cannot be."""
    where = f"{run_dir}/run.json"
    manifest = work.manifest if work else run_manifest(run_dir)
    # run.json first: a model, layout or --nodes that cannot be is said before any trace is read
    spec = run_spec(manifest, where)
    own = run_layout(manifest, spec, where)
    target = fill_layout(layout, spec, own) if isinstance(layout, str) else (layout or own)
    target.check(spec)
    gpn = cluster.gpus_per_node
    need_nodes = math.ceil(target.gpus / gpn)
    if nodes is not None and nodes < need_nodes:
        raise ValueError(f"--nodes {nodes}: layout {target.short()} needs {target.gpus} GPUs = {need_nodes} node(s) of "
                         f"{gpn} on {cluster.name}")
    if nodes is not None and nodes > need_nodes:  # ranks are packed onto the nodes they fill: extra ones idle
        raise ValueError(f"--nodes {nodes}: layout {target.short()} uses {target.gpus} GPUs = {need_nodes} node(s) of "
                         f"{gpn} (a larger --layout uses more)")
    work = work or measure_run(run_dir)
    source = calibrate(work)
    proj = own_layout_step(work, cluster, source, own)
    compute_us = float(work.steps["compute_us"].sum())
    known = work.ops.filter(pl.col("flops").is_not_null() | pl.col("bytes").is_not_null())
    cov = {"compute_us": compute_us, "ops_us": float(work.ops["dur_us"].sum()),
           "known_us": float(known["dur_us"].sum()),
           "flop_ops_us": float(known.filter(pl.col("klass").is_in(FLOP_CLASSES))["dur_us"].sum()),
           "memory_ops_us": float(known.filter(pl.col("klass") == "memory")["dur_us"].sum())}
    cov["known_pct"] = 100.0 * cov["known_us"] / compute_us if compute_us > 0 else None
    cov["conv_us"] = float(work.ops.filter(pl.col("klass") == "conv")["dur_us"].sum())
    assumptions = [
        f"compute: the run's measured ops re-timed on {cluster.name} by the cost model's roofline "
        f"(GEMMs at gemm_efficiency {cluster.gemm_efficiency:g} of peak "
        + (f"with wave quantization over {sms} SMs" if (sms := sm_count(cluster)) else
           "without wave quantization (no SM count: a CPU or an unknown GPU)") + ", or HBM-bound; "
        f"memory-bound ops at hbm_efficiency {cluster.hbm_efficiency:g}); "
        f"{cov['known_pct'] or 0:.0f} % of the measured compute time has its work known from shapes, the rest is "
        f"scaled by the same ratio (target/measured = {proj['rho']:.3g})",
        "communication: the theory's per-step volumes per rank (profiler.theory, docs/theory.md) under the target's α–β, groups placed on "
        "the intra- or inter-node link by rank layout (tp innermost, then cp, dp, pp)",
        "overlap: the communication the run hid under compute stays hidden up to the re-timed compute that hid it",
        "other: host time with neither compute nor communication (Python, dispatch gaps, waits) carried over as "
        "measured; no per-kernel launch overhead is added",
    ]
    if cov["conv_us"] > 0:
        assumptions.append(f"convolutions: {cov['conv_us'] / 1e3:.3g} ms of measured time whose FLOPs the trace does not "
                           "give (strides, padding): scaled by the same ratio as the rest")
    if proj["comm_why"] and work.world > 1:  # a multi-rank step without its communication: wrong, not partial
        raise ValueError(f"{where}: no communication predicted for {work.world} ranks: {proj['comm_why']}")
    if proj["comm_why"]:
        assumptions.append(f"no communication predicted: {proj['comm_why']}")
    if proj["pipeline"]:
        ps = proj["per_step"]
        a_src = float(ps["a_src"].sum()) if "a_src" in ps.columns else 0.0
        host = f"; here {100 * (1 - float(ps['op_src'].sum()) / a_src):.0f} % of the actions' measured time" if a_src > 0 else ""
        # A trial's gpipe run projected a 1.04 ms bubble beside 0.11 ms of compute: host time inside
        # the actions, which the replay keeps, so the bubble is host-bound too. Said with its size.
        assumptions.append("pipeline: the schedule's order replayed (simulate_order) with each action's ops re-timed and "
                           "the rest of its span (Python between the ops) kept as measured, so the bubble of host-bound "
                           f"actions is host-bound too{host} is such host time; p2p re-timed under α–β, the rest of the "
                           "measured step carried over")
    mem = memory_of(spec, target)
    if target == own:
        step_s, breakdown = proj["step_s"], proj["breakdown_s"]
    else:
        step_s, breakdown, extra, other_dominant = _other_layout(spec, own, target, cluster, proj)
        assumptions += extra
    peak = cluster.peak_tflops * 1e12
    mfu = 100.0 * model_flops_per_step(spec) / (step_s * target.gpus * peak) if step_s > 0 else None
    if not (math.isfinite(step_s) and step_s > 0) or any(not math.isfinite(v) or v < 0 for v in breakdown.values()):
        raise ValueError(f"{run_dir}: the projection gives no usable step ({step_s!r} s; breakdown {breakdown}): "
                         "a damaged trace or cluster?")
    if mfu is not None and mfu > 100:  # more model FLOPs per second than the target's peak: impossible
        raise ValueError(f"{run_dir}: MFU {mfu:.3g} % > 100 % (step {step_s * 1e3:.3g} ms): its compute is implausibly short")
    ours = _dominant(breakdown, step_s, cov)
    # another layout: the cost model names its own dominant efficiency, unless the carried-over host time outweighs it
    dominant = ours if target == own or max(breakdown, key=breakdown.get) == "other" else other_dominant
    est = Estimate(layout=target, step_s=step_s, breakdown_s=breakdown, mfu_pct=mfu, memory_bytes=mem,
                   hbm_bytes=cluster.hbm_bytes, usable_hbm_bytes=cluster.usable_hbm_bytes,
                   fits=(mem.get("total", 0) <= cluster.usable_hbm_bytes) if mem else True,
                   assumptions=assumptions, dominant=dominant)
    return {"estimate": est, "measured_step_s": proj["measured_step_s"], "per_rank": proj["per_rank"], "coverage": cov, "source": source,
            "own_layout": own, "spec": spec, "work": work, "nodes": nodes or need_nodes, "own_step_s": proj["step_s"]}


def _other_layout(spec: ModelSpec, own: Layout, target: Layout, cluster: Cluster, proj: dict):
    """(step_s, breakdown, assumptions, dominant) of another layout: costmodel.estimate with compute_scale =
    trace-driven compute on the target / analytical compute of the run's own layout on the target."""
    analytic_own = costmodel.estimate(spec, own, cluster)
    a_compute = analytic_own.breakdown_s.get("compute", 0.0)
    t_compute = proj["breakdown_s"].get("compute", 0.0)
    scale = t_compute / a_compute if a_compute > 0 else None
    est = costmodel.estimate(spec, target, cluster, compute_scale=scale)
    breakdown = dict(est.breakdown_s)
    other = proj["breakdown_s"].get("other", 0.0)
    if other > 0:  # the host time the run's own step carried over: per step, whatever the layout
        breakdown["other"] = other
    why = [f"layout {target.short()}: the analytical cost model (profiler.costmodel) with compute_scale = "
           f"{scale if scale is None else f'{scale:.3g}'} = trace-driven compute of the run's own layout on {cluster.name} "
           f"({t_compute * 1e3:.3g} ms) / the model's analytical compute of that layout ({a_compute * 1e3:.3g} ms)"]
    why.append(f"other: the {other * 1e3:.3g} ms of host time per step the run's own layout carries over (above) "
               "is added unchanged to the model's step")
    # the cost model's own line on compute_scale ("measured / predicted on the source run") is
    # replaced by the definition above (both terms on the target)
    theirs = [a for a in est.assumptions if not a.startswith("compute scaled by")]
    return sum(breakdown.values()), breakdown, why + theirs, est.dominant


def _dominant(breakdown: dict[str, float], step_s: float, cov: dict) -> str | None:
    """The assumption whose error would move the step most: the largest part of the breakdown, with why."""
    if not breakdown or step_s <= 0:
        return None
    key = max(breakdown, key=lambda k: breakdown[k])
    share = 100.0 * breakdown[key] / step_s
    why = {"compute": f"op re-timing at a flat efficiency ({cov.get('known_pct') or 0:.0f} % of compute time from "
                      "recorded shapes; small ops' target times ignore launch overhead)",
           "other": "host time carried over as measured (on a GPU it may hide under device work, or not)",
           "comm_exposed": "the α–β of the target's links and how much of it overlaps",
           "bubble": "the replayed schedule with re-timed actions (stage imbalance carried from the trace)"}
    return f"{key} ({share:.0f} % of the step): {why.get(key.split(':')[0], 'the cost model')}"


def project_run(run_dir: str, cluster: Cluster, *, nodes: int | None = None, layout: Layout | None = None) -> Estimate:
    """Predicted step of the run in `run_dir` on `cluster` (its own layout unless `layout`)."""
    return project_details(run_dir, cluster, nodes=nodes, layout=layout)["estimate"]
