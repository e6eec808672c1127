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

from dataclasses import replace
from collections.abc import Mapping
from functools import lru_cache
from types import MappingProxyType

from profiler import commcost
from profiler.cluster import Cluster
from profiler.costmodel_ops import (ATTN_CORE, gemm_pass_parts, gemm_pass_times, gemm_time_s, head_gemms,
                                    head_memory_bound_bytes, layer_gemms, layer_memory_bound_bytes,
                                    memory_bound_time_s, model_flops_per_sequence, sm_count)
from profiler.layout import Estimate, Layout, ModelSpec, group_stride
from profiler.plan_memory import memory_per_gpu, stage_params

__all__ = ["NoStepError", "estimate", "gemm_time_s", "memory_bound_time_s", "microbatch_costs", "BREAKDOWN_KEYS"]

DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket_cap_mb = 25: the last bucket's reduce is never hidden
BWD_MEM_FACTOR = 2.0  # a backward elementwise op reads the saved input and the output gradient, writes the input gradient
PERTURB = 0.20  # the ±20 % moved on each assumed efficiency to name the dominant one
# The keys of Estimate.breakdown_s, summing to step_s (docs/whatif.md "Compute" explains each).
BREAKDOWN_KEYS = ("compute", "recompute", "comm_exposed:tp", "comm_exposed:cp", "comm_exposed:ep",
                  "comm_exposed:pp", "comm_exposed:dp", "bubble", "optimizer")


class NoStepError(ValueError):
    """The model gives no usable step for this input (not finite or not > 0): refused, never printed."""


def _coll(kind: str, nbytes: float, n: int, link, cluster: Cluster, algorithm: str = "ring") -> float:
    return commcost.collective_s(kind, nbytes, n, link, efficiency=cluster.link_efficiency, algorithm=algorithm)


def microbatch_costs(*args, **kwargs) -> Mapping[str, float]:
    """_microbatch_costs (below) as a read-only mapping: the dict is shared by the cache."""
    return MappingProxyType(_microbatch_costs(*args, **kwargs))


@lru_cache(maxsize=16384)
def _microbatch_costs(spec: ModelSpec, cluster: Cluster, b: int, t: int, cp: int, sp: bool, recompute: str,
                     ep: int, tp_stride: int, cp_stride: int, ep_stride: int, world: int | None = None) -> dict[str, float]:
    """Seconds of one microbatch on one GPU, per layer (`dense_*`, `moe_*`) and for the head:
    gemm_f / gemm_b (GEMMs forward / backward), gemm_w (the weight-gradient share of gemm_b), mem_f / mem_b (memory-bound ops), rc (what
    recomputation adds to backward), attn_f (the attention core's forward), tp / ep / cp
    (communication of the layer, forward + backward + recomputation; cp: what ring attention does
    not hide under the attention core), head_gemm / head_mem (output layer + loss, both passes).
    Strides place each group on a link (commcost.group_link); world: the job's GPUs (one node: intra)."""
    h, a, f, s, flash = spec.hidden, spec.heads, spec.ffn, spec.seq, spec.flash_attention
    out: dict[str, float] = {}
    pb = spec.param_bytes  # activations in the parameter dtype (GEMM operands, collectives, elementwise)
    act = spec.param_bytes * b * (s // cp) * h  # one b·s·h activation (the tp collectives' buffer)
    one_tp = 0.0
    if t > 1:
        link = commcost.group_link(cluster, t, tp_stride, world_size=world)
        # one all-reduce, or sp's all-gather + reduce-scatter pair that replaces it (the same traffic)
        one_tp = (_coll("all_gather", act, t, link, cluster) + _coll("reduce_scatter", act, t, link, cluster)
                  if sp else _coll("all_reduce", act, t, link, cluster))
    n_fwd_coll = 4 if recompute != "full" else 6  # 2 forward, 2 backward, and the forward's 2 again in recompute
    for kind, top_k in (("dense", 0), ("moe", spec.top_k if spec.moe else 0)):
        if kind == "moe" and not spec.moe:
            out.update({k.replace("dense_", "moe_"): v for k, v in list(out.items())})
            continue
        shapes = layer_gemms(b, s, h, a, f, t, cp, top_k)
        gf, g_dgrad, gw = gemm_pass_parts({k: v for k, v in shapes.items() if k not in ATTN_CORE}, cluster, pb)
        af, ab = gemm_pass_times({k: shapes[k] for k in ATTN_CORE}, cluster, pb)  # no weights: all "B"
        gf, gb = gf + af, g_dgrad + gw + ab
        core_f = af
        mb = layer_memory_bound_bytes(b, s, h, a, f, t, cp, sp, top_k, spec.param_bytes, flash)
        mf = memory_bound_time_s(mb["attn_core"] + mb["other"], cluster)
        if flash:
            # FlashAttention's backward recomputes QK^T inside: 5 core matmuls for the forward's 2,
            # 2.5x the forward's FLOPs (Dao 2023, "FlashAttention-2"), 0.5x more than the usual 2x
            gb += 0.5 * core_f
            rc = gf + mf if recompute == "full" else 0.0  # selective: nothing stored to recompute
        else:
            rc = {"full": gf + mf,
                  "selective": core_f + memory_bound_time_s(mb["attn_core"], cluster)}.get(recompute, 0.0)
        # tp: 2 all-reduces of b·s·h forward, 2 backward (sp: all-gather + reduce-scatter pairs, the
        # same traffic); full recomputation repeats the forward's 2. Not overlapped (Megatron default).
        n_tp = one_tp * n_fwd_coll
        # ep: dispatch + combine all-to-alls of the k·T routed tokens, forward and backward.
        n_ep = 0.0
        if top_k and ep > 1:
            link = commcost.group_link(cluster, ep, ep_stride, world_size=world)
            n_ep = _coll("all_to_all", act * top_k, ep, link, cluster) * n_fwd_coll
        # cp: ring attention passes K and V (2·T·h/t bytes) cp-1 times forward, K, V, dK, dV
        # backward (3 forward-sized passes in all), each step under the attention core it feeds.
        n_cp = 0.0
        if cp > 1:
            link = commcost.group_link(cluster, cp, cp_stride, world_size=world, p2p=True)  # ring: to a neighbour
            n_cp = max(0.0, 3 * ((cp - 1) * _coll("send_recv", 2 * act / t, cp, link, cluster) - core_f))
        for key, val in (("gemm_f", gf), ("gemm_b", gb), ("mem_f", mf), ("mem_b", BWD_MEM_FACTOR * mf), ("rc", rc),
                         ("attn_f", core_f), ("gemm_w", gw), ("tp", n_tp), ("ep", n_ep), ("cp", n_cp)):
            out[f"{kind}_{key}"] = val
    hg_f, hg_d, hg_w = gemm_pass_parts(head_gemms(b, s, h, spec.vocab, t, cp), cluster, pb)
    hm = memory_bound_time_s(head_memory_bound_bytes(b, s, h, spec.vocab, t, cp, sp, spec.param_bytes), cluster)
    out["head_gemm"], out["head_mem"], out["head_w"] = hg_f + hg_d + hg_w, hm * (1 + BWD_MEM_FACTOR), hg_w
    return out


@lru_cache(maxsize=4096)
def _check_spec(spec: ModelSpec) -> None:
    spec.check()


@lru_cache(maxsize=4096)
def _spec_consts(spec: ModelSpec) -> tuple[float, float]:
    """(model FLOPs per sequence without recomputation, share of MoE layers)."""
    fl = model_flops_per_sequence(spec.layers, spec.seq, spec.hidden, spec.heads, spec.ffn, spec.vocab,
                                  spec.top_k if spec.moe else 0, spec.moe_layers)
    return fl, spec.moe_share


@lru_cache(maxsize=65536)
def _stage_param_counts(spec: ModelSpec, tp: int, pp: int, ep: int) -> tuple[float, float, float]:
    """(dense, expert, one layer's) parameters on a GPU of the most loaded stage (first or last);
    they depend on tp, pp and ep only, so the cache is keyed on those, not the whole Layout."""
    lay = Layout(dp=ep, tp=tp, pp=pp, ep=ep)
    return max((stage_params(spec, lay, st) for st in {0, pp - 1}), key=lambda x: x[0] + x[1])


@lru_cache(maxsize=16384)
def _p2p_s(spec: ModelSpec, cluster: Cluster, b: int, cp: int, t: int, p: int, stride: int, world: int) -> float:
    """One pipeline send of a microbatch's b·s·h/t activation (Megatron's scatter/gather of the
    tp-split activation, or sp's shard) between neighbouring stages."""
    link = commcost.group_link(cluster, p, stride, world_size=world, p2p=True)
    return _coll("send_recv", spec.param_bytes * b * (spec.seq // cp) * spec.hidden / t, 2, link, cluster)


@lru_cache(maxsize=16384)
def _dp_s(spec: ModelSpec, cluster: Cluster, params: float, layer: float, n_dp: int, t: int, world: int,
          zero: int) -> tuple[float, float, float, float]:
    """Data-parallel collectives over the n_dp = dp·cp replicas (stride t) of one GPU's `params`:
    (gradient all-reduce (ZeRO-0, tree latency where shorter) or reduce-scatter (ZeRO-1/2), the
    all-gather of the updated weights after the step (ZeRO-1/2), ZeRO-3's all-gather and
    reduce-scatter of one `layer`). Expert gradients reduce over dp·cp/ep replicas: priced over
    all n_dp, a slight over-estimate."""
    link = commcost.group_link(cluster, n_dp, t, world_size=world)
    gb, pb = spec.grad_bytes, spec.param_bytes
    if zero >= 3:
        return 0.0, 0.0, _coll("all_gather", layer * pb, n_dp, link, cluster), \
            _coll("reduce_scatter", layer * gb, n_dp, link, cluster)
    if zero == 0:
        return _coll("all_reduce", params * gb, n_dp, link, cluster, "auto"), 0.0, 0.0, 0.0
    return (_coll("reduce_scatter", params * gb, n_dp, link, cluster),
            _coll("all_gather", params * pb, n_dp, link, cluster), 0.0, 0.0)


def _layout_terms(spec: ModelSpec, lay: Layout) -> tuple:
    """What the assembly needs of the layout alone (shared by the dominant-assumption variants)."""
    _, moe = _spec_consts(spec)
    n = spec.layers / lay.pp  # layers of this GPU (all its interleaved chunks)
    dense, expert, layer = _stage_param_counts(spec, lay.tp, lay.pp, lay.ep)
    strides = (1, group_stride(lay, "cp"), group_stride(lay, "ep"), group_stride(lay, "pp"))
    return n, n * (1 - moe), n * moe, dense, expert, layer, strides


def _assemble(spec: ModelSpec, lay: Layout, cluster: Cluster, compute_scale: float,
              terms: tuple | None = None) -> dict[str, float]:
    """breakdown_s (BREAKDOWN_KEYS) of one step; their sum is the step."""
    n, nd, nm, dense, expert, layer, (tp_st, cp_st, ep_st, pp_st) = terms or _layout_terms(spec, lay)
    t, p, m, cp, ep, world = lay.tp, lay.pp, lay.microbatches, lay.cp, lay.ep, lay.gpus
    c = _microbatch_costs(spec, cluster, lay.microbatch, t, cp, lay.sp, lay.recompute, ep, tp_st, cp_st, ep_st, world)
    fwd = nd * (c["dense_gemm_f"] + c["dense_mem_f"]) + nm * (c["moe_gemm_f"] + c["moe_mem_f"])
    bwd = nd * (c["dense_gemm_b"] + c["dense_mem_b"]) + nm * (c["moe_gemm_b"] + c["moe_mem_b"])
    head = c["head_gemm"] + c["head_mem"]  # on the last stage, which sets the pipeline's pace
    comp = (fwd + bwd + head) * compute_scale
    rc = (nd * c["dense_rc"] + nm * c["moe_rc"]) * compute_scale
    tp = nd * c["dense_tp"] + nm * c["moe_tp"]
    cpc = nd * c["dense_cp"] + nm * c["moe_cp"]
    epc = nm * c["moe_ep"]
    # pp: each microbatch sends its b·s·h/t activation (Megatron's scatter/gather of the tp-split
    # activation, or sp's shard) forward and its gradient back, once per chunk (v interleaved).
    pp = 2 * lay.stages_per_rank * _p2p_s(spec, cluster, lay.microbatch, cp, t, p, pp_st, world) if p > 1 else 0.0
    # data parallel (over dp·cp replicas; experts over dp·cp/ep)
    n_dp = lay.dp * cp
    z3 = dp_exposed = 0.0
    gb, pb = spec.grad_bytes, spec.param_bytes
    bwd_mb = bwd * compute_scale + rc
    if n_dp > 1:
        grad_bytes = (dense + expert) * gb
        red, after, ag, rs = _dp_s(spec, cluster, dense + expert, layer, n_dp, t, world, lay.zero)
        if lay.zero >= 3:
            # FSDP: per layer per microbatch, all-gather the layer forward and again backward (the
            # next one prefetched under the current one), reduce-scatter its gradients backward.
            lf, lb = (fwd * compute_scale / n, bwd_mb / n) if n else (0.0, 0.0)
            z3 = n * (max(0.0, ag - lf) + max(0.0, ag + rs - lb)) + ag
        elif grad_bytes > 0:
            # buckets under the last microbatch's backward: hidden but for the last bucket's share
            first = min(1.0, DDP_BUCKET_BYTES / grad_bytes)
            dp_exposed = max(red * first, red - bwd_mb * (1 - first)) + after
            if lay.zero == 2 and m > 1:
                # ZeRO-2 keeps only its shard of the gradients, so it cannot accumulate whole ones:
                # every microbatch's gradients are reduce-scattered (DeepSpeed's ZeRO-2 reduces in
                # each backward), each under its own microbatch's backward, the last one as above
                dp_exposed += (m - 1) * max(0.0, red - bwd_mb)
    t_mb = comp + rc + tp + cpc + epc + pp + z3
    if p == 1:
        bubble = 0.0
    elif lay.schedule == "zero-bubble":
        # ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism"): weight gradients (W) fill the
        # bubble; with 1F1B's memory it is (p - 1)(F + B - W) instead of (p - 1)(F + B + W)
        w = (nd * c["dense_gemm_w"] + nm * c["moe_gemm_w"] + c["head_w"]) * compute_scale
        bubble = (p - 1) * max(0.0, t_mb - 2 * w)
    else:
        bubble = (p - 1) / lay.stages_per_rank * t_mb
    shard = n_dp if lay.zero >= 1 else 1
    local = dense / shard + expert / max(1, shard // ep)
    opt = memory_bound_time_s(local * (2 * spec.optimizer_bytes_per_param + gb + pb), cluster)
    return {"compute": m * comp, "recompute": m * rc, "comm_exposed:tp": m * tp, "comm_exposed:cp": m * cpc,
            "comm_exposed:ep": m * epc, "comm_exposed:pp": m * pp, "comm_exposed:dp": dp_exposed + m * z3,
            "bubble": bubble, "optimizer": opt}


@lru_cache(maxsize=64)
def _perturbed(cluster: Cluster) -> dict[str, tuple[Cluster, Cluster]]:
    """The cluster with each assumed efficiency moved by ∓PERTURB (capped at 1)."""
    out = {}
    for key in ("gemm_efficiency", "hbm_efficiency", "link_efficiency"):
        e = getattr(cluster, key)
        out[key] = (replace(cluster, **{key: e * (1 - PERTURB)}), replace(cluster, **{key: min(1.0, e * (1 + PERTURB))}))
    return out


def _dominant(spec, layout, cluster, compute_scale, step: float, terms: tuple) -> str:
    best = None
    for key, (lo, hi) in _perturbed(cluster).items():
        s_lo = sum(_assemble(spec, layout, lo, compute_scale, terms).values())
        s_hi = sum(_assemble(spec, layout, hi, compute_scale, terms).values())
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
        f"hbm_efficiency {cluster.hbm_efficiency:.2f}; "
        + ("fused (flash) attention priced as GEMMs at gemm_efficiency (optimistic: FlashAttention-2 reports "
           "50-73 % of A100 peak)" if spec.flash_attention else
           "attention unfused, scores in HBM (Korthikanti et al. 2022 accounting)"),
        f"collectives at link_efficiency {cluster.link_efficiency:.2f} of {cluster.intra.name} "
        f"{cluster.intra.bw_gbps:g} GB/s / {cluster.inter.name} {cluster.inter.bw_gbps:g} GB/s, ring (tree latency for dp all-reduce); a group across nodes with k "
        f"members per node drives k NICs, min(intra, k x inter)"
        + (f"; inside a node a group of n gets (n-1) x {cluster.intra.peer_gbps:g} GB/s peer links, a send one"
           if cluster.intra.peer_gbps else ""),
        "tp / ep communication not overlapped with compute (Megatron default); pp sends on the critical path",
        "overlapped communication does not slow compute (optimistic: NCCL kernels take SMs and HBM bandwidth "
        "from the GEMMs they overlap)",
    ]
    if layout.dp * layout.cp > 1:
        out.append(("dp gradient reduce-scatter in 25 MB buckets under every microbatch's backward (ZeRO-2 keeps "
                    "gradients sharded)" if layout.zero == 2 and layout.microbatches > 1 else
                    "dp gradient reduction in 25 MB buckets under the last microbatch's backward") if layout.zero < 3
                   else "FSDP: each layer's all-gather prefetched under the previous layer's compute")
    if layout.pp > 1:
        out.append("pipeline bubble (p-1)/v of a microbatch's time, uniform stages paced by the last (head) stage"
                   if layout.schedule != "zero-bubble" else
                   "zero-bubble (ZB-H1): bubble (p-1)(F+B-W), weight gradients fill the rest (Qi et al. 2023)")
    out.append("compute efficiency assumed (no trace informs it)" if compute_scale is None
               else f"compute scaled by {compute_scale:.3g} (measured / predicted on the source run)")
    return out


def estimate(spec: ModelSpec, layout: Layout, cluster: Cluster, *, compute_scale: float | None = None,
             detail: bool = True) -> Estimate:
    """Predicted step of `layout` for `spec` on `cluster`. compute_scale: a measured correction of
    the analytical compute time (project: measured/predicted on the source); None: assumed
    efficiencies only (said in the assumptions). detail=False skips the assumptions and the
    dominant-assumption search (6 more assemblies): for ranking many layouts. LayoutError for a
    spec or layout that cannot be (layout.check), ValueError for a compute_scale <= 0 or not finite."""
    _check_spec(spec)
    layout.check(spec)  # LayoutError naming what does not divide: never a number for an impossible layout
    scale = 1.0 if compute_scale is None else float(compute_scale)
    if not (scale > 0 and scale < float("inf")):
        raise ValueError(f"compute_scale {compute_scale!r}: a finite number > 0 is needed")
    terms = _layout_terms(spec, layout)
    breakdown = _assemble(spec, layout, cluster, scale, terms)
    step = sum(breakdown.values())
    # a number is right or refused: extreme cluster numbers (a 1e-320 GB/s link, a 1e300 TFLOP/s
    # peak) can make inf, NaN or 0 here, and _dominant divides by the step
    if not (0 < step < float("inf")) or any(not (0 <= v < float("inf")) for v in breakdown.values()):
        raise NoStepError(f"cluster {cluster.name}: the cost model gives no usable step for {layout.short()} "
                          f"({step!r} s): check the cluster's numbers")
    flops_seq, _ = _spec_consts(spec)
    peak = layout.gpus * cluster.peak_tflops * 1e12
    mfu = 100.0 * flops_seq * spec.global_batch / (step * peak) if step > 0 else None
    mem = memory_per_gpu(spec, layout)
    usable = cluster.usable_hbm_bytes
    return Estimate(layout=layout, step_s=step, breakdown_s=breakdown, mfu_pct=mfu, memory_bytes=mem,
                    hbm_bytes=cluster.hbm_bytes, usable_hbm_bytes=usable, fits=mem["total"] <= usable,
                    assumptions=_assumptions(spec, layout, cluster, compute_scale) if detail else [],
                    dominant=_dominant(spec, layout, cluster, scale, step, terms) if detail else None)
