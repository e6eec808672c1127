"""The analytical step-time model of a transformer layout on a cluster (`ptprof plan`, and
`ptprof project` with the compute a trace measured): compute from FLOPs at a size-dependent
efficiency (roofline, profiler.costmodel_ops), communication from profiler.commcost, overlap as
each paradigm schedules it, the pipeline bubble, and memory per GPU (profiler.plan_memory).
docs/whatif.md, "Compute".

The step of one GPU of the slowest pipeline stage (the last: it also runs the head):
    step = m · t_mb + bubble + dp_exposed + optimizer,   bubble = (p − 1)/v · t_mb
where t_mb is one microbatch's forward + backward (+ recomputation) with its exposed tp / ep / cp
/ pp / ZeRO-3 communication. Per-microbatch costs depend only on (spec, cluster, microbatch, tp,
cp, sp, recompute, ...) and are cached, so an estimate is a few dozen float operations.
"""

from __future__ import annotations

from functools import lru_cache

from profiler import commcost
from profiler.cluster import Cluster
from profiler.costmodel_ops import (ATTN_CORE, gemm_flops, gemm_pass_times, gemm_time_s, head_gemms,
                                    head_memory_bound_bytes, layer_gemms, layer_memory_bound_bytes,
                                    memory_bound_time_s, model_flops_per_sequence, sm_count)
from profiler.layout import Estimate, Layout, ModelSpec, group_stride
from profiler.plan_memory import memory_per_gpu

__all__ = ["estimate", "gemm_time_s", "memory_bound_time_s", "microbatch_costs", "BREAKDOWN_KEYS"]

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb = 25: the last bucket's reduce is never hidden
BWD_MEM_FACTOR = 2.0  # a backward elementwise op reads the saved input and the output gradient, writes the input gradient
PERTURB = 0.20  # the ±20 % moved on each assumed efficiency to name the dominant one
# The keys of Estimate.breakdown_s, summing to step_s (docs/whatif.md "Compute" explains each).
BREAKDOWN_KEYS = ("compute", "recompute", "comm_exposed:tp", "comm_exposed:cp", "comm_exposed:ep",
                  "comm_exposed:pp", "comm_exposed:dp", "bubble", "optimizer")


def _coll(kind: str, nbytes: float, n: int, link, cluster: Cluster, algorithm: str = "ring") -> float:
    return commcost.collective_s(kind, nbytes, n, link, efficiency=cluster.link_efficiency, algorithm=algorithm)


@lru_cache(maxsize=16384)
def microbatch_costs(spec: ModelSpec, cluster: Cluster, b: int, t: int, cp: int, sp: bool, recompute: str,
                     ep: int, tp_stride: int, cp_stride: int, ep_stride: int) -> dict[str, float]:
    """Seconds of one microbatch on one GPU, per layer (`dense_*`, `moe_*`) and for the head:
    gemm_f / gemm_b (GEMMs forward / backward), mem_f / mem_b (memory-bound ops), rc (what
    recomputation adds to backward), attn_f (the attention core's forward), tp / ep / cp
    (communication of the layer, forward + backward + recomputation; cp: what ring attention does
    not hide under the attention core), head_gemm / head_mem (output layer + loss, both passes)."""
    h, a, f, s = spec.hidden, spec.heads, spec.ffn, spec.seq
    out: dict[str, float] = {}
    act = spec.param_bytes * b * (s // cp) * h  # one b·s·h activation (the tp collectives' buffer)
    one_tp = 0.0
    if t > 1:
        link = commcost.group_link(cluster, t, tp_stride)
        # one all-reduce, or sp's all-gather + reduce-scatter pair that replaces it (the same traffic)
        one_tp = (_coll("all_gather", act, t, link, cluster) + _coll("reduce_scatter", act, t, link, cluster)
                  if sp else _coll("all_reduce", act, t, link, cluster))
    n_fwd_coll = 4 if recompute != "full" else 6  # 2 forward, 2 backward, and the forward's 2 again in recompute
    for kind, top_k in (("dense", 0), ("moe", spec.top_k if spec.moe else 0)):
        if kind == "moe" and not spec.moe:
            out.update({k.replace("dense_", "moe_"): v for k, v in list(out.items())})
            continue
        shapes = layer_gemms(b, s, h, a, f, t, cp, top_k)
        gf, gb = gemm_pass_times(shapes, cluster)
        core_f, _ = gemm_pass_times({k: shapes[k] for k in ATTN_CORE}, cluster)
        mb = layer_memory_bound_bytes(b, s, h, a, f, t, cp, sp, top_k, spec.param_bytes)
        mf = memory_bound_time_s(mb["attn_core"] + mb["other"], cluster)
        rc = {"full": gf + mf, "selective": core_f + memory_bound_time_s(mb["attn_core"], cluster)}.get(recompute, 0.0)
        # tp: 2 all-reduces of b·s·h forward, 2 backward (sp: all-gather + reduce-scatter pairs, the
        # same traffic); full recomputation repeats the forward's 2. Not overlapped (Megatron default).
        n_tp = one_tp * n_fwd_coll
        # ep: dispatch + combine all-to-alls of the k·T routed tokens, forward and backward.
        n_ep = 0.0
        if top_k and ep > 1:
            link = commcost.group_link(cluster, ep, ep_stride)
            n_ep = _coll("all_to_all", act * top_k, ep, link, cluster) * n_fwd_coll
        # cp: ring attention passes K and V (2·T·h/t bytes) cp-1 times forward, K, V, dK, dV
        # backward (3 forward-sized passes in all), each step under the attention core it feeds.
        n_cp = 0.0
        if cp > 1:
            link = commcost.group_link(cluster, cp, cp_stride)
            n_cp = max(0.0, 3 * ((cp - 1) * _coll("send_recv", 2 * act / t, cp, link, cluster) - core_f))
        for key, val in (("gemm_f", gf), ("gemm_b", gb), ("mem_f", mf), ("mem_b", BWD_MEM_FACTOR * mf), ("rc", rc),
                         ("attn_f", core_f), ("tp", n_tp), ("ep", n_ep), ("cp", n_cp)):
            out[f"{kind}_{key}"] = val
    hg_f, hg_b = gemm_pass_times(head_gemms(b, s, h, spec.vocab, t, cp), cluster)
    hm = memory_bound_time_s(head_memory_bound_bytes(b, s, h, spec.vocab, t, cp, sp, spec.param_bytes), cluster)
    out["head_gemm"], out["head_mem"] = hg_f + hg_b, hm * (1 + BWD_MEM_FACTOR)
    return out


@lru_cache(maxsize=4096)
def _spec_consts(spec: ModelSpec) -> tuple[float, float]:
    """(model FLOPs per sequence without recomputation, share of MoE layers)."""
    moe_layers = spec.layers // spec.moe_every if spec.moe else 0
    fl = model_flops_per_sequence(spec.layers, spec.seq, spec.hidden, spec.heads, spec.ffn, spec.vocab,
                                  spec.top_k if spec.moe else 0, moe_layers)
    return fl, (moe_layers / spec.layers if spec.layers else 0.0)


@lru_cache(maxsize=65536)
def _stage_param_counts(spec: ModelSpec, layout: Layout) -> tuple[float, float, float]:
    """(dense, expert, one layer's) parameters on a GPU of the most loaded stage (first or last)."""
    from profiler.plan_memory import _stage_params
    return max((_stage_params(spec, layout, st) for st in {0, layout.pp - 1}), key=lambda x: x[0] + x[1])


def _assemble(spec: ModelSpec, layout: Layout, cluster: Cluster, compute_scale: float) -> dict[str, float]:
    """breakdown_s (BREAKDOWN_KEYS) of one step; their sum is the step."""
    lay = layout
    t, p, m, cp, ep = lay.tp, lay.pp, lay.microbatches, lay.cp, lay.ep
    c = microbatch_costs(spec, cluster, lay.microbatch, t, cp, lay.sp, lay.recompute, ep,
                         1, group_stride(lay, "cp"), group_stride(lay, "ep"))
    _, moe = _spec_consts(spec)
    n = spec.layers / p  # layers of this GPU (all its interleaved chunks)
    nd, nm = n * (1 - moe), n * moe

    def lay_sum(key: str) -> float:
        return nd * c["dense_" + key] + nm * c["moe_" + key]

    fwd = lay_sum("gemm_f") + lay_sum("mem_f")
    bwd = lay_sum("gemm_b") + lay_sum("mem_b")
    head = c["head_gemm"] + c["head_mem"]  # on the last stage, which sets the pipeline's pace
    comp = (fwd + bwd + head) * compute_scale
    rc = lay_sum("rc") * compute_scale
    tp, cpc, epc = lay_sum("tp"), lay_sum("cp"), lay_sum("ep")
    # pp: each microbatch sends its b·s·h/t activation (Megatron's scatter/gather of the tp-split
    # activation, or sp's shard) forward and its gradient back, once per chunk (v interleaved).
    pp = 0.0
    if p > 1:
        link = commcost.group_link(cluster, p, group_stride(lay, "pp"))
        nbytes = spec.param_bytes * lay.microbatch * (spec.seq // cp) * spec.hidden / t
        pp = 2 * lay.stages_per_rank * _coll("send_recv", nbytes, 2, link, cluster)
    # data parallel (over dp·cp replicas; experts over dp·cp/ep)
    dense, expert, layer = _stage_param_counts(spec, lay)
    n_dp = lay.dp * cp
    dp_link = commcost.group_link(cluster, n_dp, t)
    z3 = 0.0
    dp_exposed = 0.0
    gb, pb = spec.grad_bytes, spec.param_bytes
    bwd_mb = (bwd + lay_sum("rc")) * compute_scale
    if n_dp > 1:
        grad_bytes = (dense + expert) * gb  # expert grads reduce over dp/ep of the replicas: taken at dp (a slight over-estimate)
        if lay.zero >= 3:
            # FSDP: per layer per microbatch, all-gather the layer forward and again backward (the
            # next one prefetched under the current one), reduce-scatter its gradients backward.
            ag = _coll("all_gather", layer * pb, n_dp, dp_link, cluster)
            rs = _coll("reduce_scatter", layer * gb, n_dp, dp_link, cluster)
            lf, lb = (fwd / n if n else 0.0) * compute_scale, (bwd_mb / n if n else 0.0)
            z3 = n * (max(0.0, ag - lf) + max(0.0, ag + rs - lb)) + ag
        else:
            kind = "all_reduce" if lay.zero == 0 else "reduce_scatter"
            red = _coll(kind, grad_bytes, n_dp, dp_link, cluster, "auto" if kind == "all_reduce" else "ring")
            # buckets under the last microbatch's backward: hidden but for the last bucket's share
            last = red * min(1.0, DDP_BUCKET_BYTES / grad_bytes) if grad_bytes else 0.0
            dp_exposed = max(last, red - bwd_mb * (1 - min(1.0, DDP_BUCKET_BYTES / grad_bytes)))
            if lay.zero in (1, 2):  # updated parameter shards all-gathered after the step (exposed)
                dp_exposed += _coll("all_gather", (dense + expert) * pb, n_dp, dp_link, cluster)
    t_mb = comp + rc + tp + cpc + epc + pp + z3
    if p > 1 and lay.schedule != "zero-bubble":
        bubble = (p - 1) / lay.stages_per_rank * t_mb
    else:
        bubble = 0.0
    shard = n_dp if lay.zero >= 1 else 1
    local = dense / shard + expert / max(1, shard // ep if lay.zero >= 1 else 1)
    opt = memory_bound_time_s(local * (2 * spec.optimizer_bytes_per_param + gb + pb), cluster)
    return {"compute": m * comp, "recompute": m * rc, "comm_exposed:tp": m * tp, "comm_exposed:cp": m * cpc,
            "comm_exposed:ep": m * epc, "comm_exposed:pp": m * pp, "comm_exposed:dp": dp_exposed + m * z3,
            "bubble": bubble, "optimizer": opt}


@lru_cache(maxsize=64)
def _perturbed(cluster: Cluster) -> dict[str, tuple[Cluster, Cluster]]:
    """The cluster with each assumed efficiency moved by ∓PERTURB (capped at 1)."""
    from dataclasses import replace
    out = {}
    for key in ("gemm_efficiency", "hbm_efficiency", "link_efficiency"):
        e = getattr(cluster, key)
        out[key] = (replace(cluster, **{key: e * (1 - PERTURB)}), replace(cluster, **{key: min(1.0, e * (1 + PERTURB))}))
    return out


def _dominant(spec, layout, cluster, compute_scale, step: float) -> str:
    best = None
    for key, (lo, hi) in _perturbed(cluster).items():
        s_lo = sum(_assemble(spec, layout, lo, compute_scale).values())
        s_hi = sum(_assemble(spec, layout, hi, compute_scale).values())
        spread = max(abs(s_lo - step), abs(s_hi - step))
        if best is None or spread > best[0]:
            best = (spread, key, s_lo, s_hi)
    spread, key, s_lo, s_hi = best
    return (f"{key} ±{PERTURB:.0%}: step {step:.4g} s -> {s_lo:.4g} s (-{PERTURB:.0%}) / {s_hi:.4g} s "
            f"(+{PERTURB:.0%}), {100 * spread / step:.1f} %")


def _assumptions(spec: ModelSpec, layout: Layout, cluster: Cluster, compute_scale: float | None) -> list[str]:
    sms = sm_count(cluster)
    out = [
        f"GEMMs at gemm_efficiency {cluster.gemm_efficiency:.2f} of {cluster.peak_tflops:g} TFLOP/s"
        + (f" x wave quantization over {sms} SMs (256x128 tiles)" if sms else " (SM count unknown: no wave quantization)")
        + f", or HBM-bound at {cluster.hbm_efficiency:.2f} x {cluster.hbm_gbps:g} GB/s (roofline)",
        f"memory-bound ops (layernorm, softmax, dropout, GELU, residual, Adam) stream their tensors once at "
        f"hbm_efficiency {cluster.hbm_efficiency:.2f}; attention without flash (Korthikanti et al. 2022 accounting)",
        f"collectives at link_efficiency {cluster.link_efficiency:.2f} of {cluster.intra.name} "
        f"{cluster.intra.bw_gbps:g} GB/s / {cluster.inter.name} {cluster.inter.bw_gbps:g} GB/s, ring (tree latency for dp all-reduce)",
        "tp / ep communication not overlapped with compute (Megatron default); pp sends on the critical path",
    ]
    if layout.dp * layout.cp > 1:
        out.append("dp gradient reduction in 25 MB buckets under the last microbatch's backward" if layout.zero < 3
                   else "FSDP: each layer's all-gather prefetched under the previous layer's compute")
    if layout.pp > 1:
        out.append("pipeline bubble (p-1)/v of a microbatch's time, uniform stages paced by the last (head) stage"
                   if layout.schedule != "zero-bubble" else "zero-bubble schedule: no bubble")
    out.append("compute efficiency assumed (no trace informs it)" if compute_scale is None
               else f"compute scaled by {compute_scale:.3g} (measured / predicted on the source run)")
    return out


def estimate(spec: ModelSpec, layout: Layout, cluster: Cluster, *, compute_scale: float | None = None,
             detail: bool = True) -> Estimate:
    """Predicted step of `layout` for `spec` on `cluster`. compute_scale: a measured correction of
    the analytical compute time (project: measured/predicted on the source); None: assumed
    efficiencies only (said in the assumptions). detail=False skips the assumptions and the
    dominant-assumption search (6 more assemblies): for ranking many layouts."""
    scale = 1.0 if compute_scale is None else float(compute_scale)
    breakdown = _assemble(spec, layout, cluster, scale)
    step = sum(breakdown.values())
    flops_seq, _ = _spec_consts(spec)
    peak = layout.gpus * cluster.peak_tflops * 1e12
    mfu = 100.0 * flops_seq * spec.global_batch / (step * peak) if step > 0 else None
    mem = memory_per_gpu(spec, layout)
    hbm = cluster.hbm_bytes
    return Estimate(layout=layout, step_s=step, breakdown_s=breakdown, mfu_pct=mfu, memory_bytes=mem, hbm_bytes=hbm,
                    fits=mem["total"] <= hbm,
                    assumptions=_assumptions(spec, layout, cluster, compute_scale) if detail else [],
                    dominant=_dominant(spec, layout, cluster, scale, step) if detail else None)
