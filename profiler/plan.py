"""`ptprof plan`: enumerate the parallel layouts of a model on G GPUs of a cluster, keep those
that divide and fit memory, rank them by predicted step time, and say where the rule-of-thumb
layout ranks. docs/whatif.md, "Plan".

The search, in the order that keeps it fast (G = 16,384 in seconds) and honest (every layout not
ranked is counted under the reason it was dropped, `PlanResult.refused`):

1. splits dp·tp·pp (·ep inside dp for MoE) = G that divide: tp | heads, pp | layers, dp | global batch,
   ep | dp and ep | experts;
2. per split, every microbatch size mb | global_batch/dp up to 64, powers of two beyond
   (microbatch_sizes; microbatches m = global_batch/(dp·mb), m >= pp; global batch <= 2^24), ZeRO
   stage (1-3 only where dp > 1; 2-3 only where pp = 1), pipeline schedule (pp > 1: 1f1b, gpipe,
   zero-bubble, interleaved-1f1b with v | layers/pp), recompute and sequence parallelism (tp > 1);
3. memory first (cheap): a layout whose memory_per_gpu exceeds HBM is refused. Two bounds spare
   the calls: where the model state (params, grads, optimizer: split and ZeRO stage only) alone
   exceeds HBM, every variant does; and memory never falls as the microbatch grows with the rest
   fixed (activations held = microbatch x microbatches in flight, and the in-flight count, fixed
   by the schedule once m >= pp, falls no faster than the microbatch grows -- gpipe holds all m:
   constant), so once a microbatch is over HBM the larger ones are refused unasked;
4. dominance: of the recompute levels that fit, only the smallest is estimated (recomputing more
   only adds compute for the same layout); where a probe per split finds sp on no slower than sp
   off, sp off is not estimated (it only adds activation memory);
5. rank by estimate().step_s, then check the pruning: every dropped neighbour of the top layouts
   (more recompute, sp off) is estimated, and any that is faster joins the ranking (counted).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable

from profiler import costmodel
from profiler.cluster import Cluster
from profiler.costmodel import NoStepError
from profiler.layout import RECOMPUTE, Estimate, Layout, ModelSpec, divisors
from profiler.plan_memory import memory_per_gpu

EstimateFn = Callable[[ModelSpec, Layout, Cluster], Estimate]
MemoryFn = Callable[[ModelSpec, Layout], dict]

PIPELINE_SCHEDULES = ("1f1b", "interleaved-1f1b", "zero-bubble", "gpipe")
MAX_DENSE_MB = 64  # every microbatch size up to this is searched, beyond it powers of two only
MAX_GLOBAL_BATCH = 1 << 24  # sequences per step: 16.8 M (GPT-3 used 3.2 M tokens = 1,536 sequences)
CHECK_TOP = 10  # the top layouts whose pruned neighbours are estimated (step 5)
STATE_KEYS = ("params", "grads", "optimizer")  # memory_per_gpu's model state (the ZeRO table)
# Near-ties: layouts within NEAR_TIE_PCT of the fastest step are not told apart by the model, whose
# step error on the validation rows (README "How good" (a)) spread 5-12 %: among them the layout
# that is not tight on HBM, then the lower ZeRO stage, then the fewer pipeline stages comes first
# (simpler, more headroom), then step time. Only the fastest's band is reordered.
NEAR_TIE_PCT = 2.0
TIGHT_HBM_FRAC = 0.9  # a layout needing more than this share of usable HBM is "tight"

# refused reasons (PlanResult.refused keys); the unit is in the key
R_TP_HEADS = "splits where tp does not divide the heads"
R_TP_FFN = "splits where tp does not divide the ffn"
R_PP_LAYERS = "splits where pp does not divide the layers"
R_DP_BATCH = "splits where dp does not divide the global batch"
R_FEW_MB = "layouts with fewer microbatches than pipeline stages"
R_ZERO_PP = "layouts with ZeRO-2/3 and a pipeline (DeepSpeed refuses them; Megatron's is ZeRO-1)"
R_HBM = "layouts over HBM"
R_RECOMPUTE = "layouts pruned: more recompute than needed to fit"
R_SP_OFF = "layouts pruned: sp off (a probe found sp on no slower)"
R_NOT_FINITE = "layouts the cost model gave no finite step"


@dataclass(frozen=True)
class RuleOfThumb:
    """The teaching rule's layout (None: the rule gives none that divides and fits) and why."""

    layout: Layout | None
    why: str


@dataclass
class PlanResult:
    ranked: list[Estimate]  # fitting layouts, fastest first
    considered: int  # layouts enumerated (those of dividing splits)
    refused: dict[str, int]  # why the others were dropped (R_* keys: splits or layouts, as named)
    rule_of_thumb: Estimate | None
    rule_of_thumb_rank: int | None  # 1-based rank among `ranked`, None if it does not fit
    assumptions: list[str]
    rule: RuleOfThumb | None = None
    evaluated: int = 0  # estimate() calls
    min_memory_bytes: int | None = None  # the smallest memory need of any dividing layout
    pruning_check: str = ""  # what step 5 found
    seconds: float = 0.0
    splits: int = 0  # dp·tp·pp(·ep) splits that divide


def _real_estimate(spec: ModelSpec, layout: Layout, cluster: Cluster) -> Estimate:
    return costmodel.estimate(spec, layout, cluster, detail=False)  # the top's details: _detailed


def _detailed(spec: ModelSpec, est: Estimate, cluster: Cluster) -> Estimate:
    return costmodel.estimate(spec, est.layout, cluster)


class PlanTooLong(ValueError):
    """The search passed plan()'s deadline (the viewer bounds a search inside a web request)."""


def _until(deadline: float, fn):
    # fn, refusing to run past `deadline` (perf_counter seconds): the memory function runs once per
    # layout considered, so a search stops within one layout's time.
    def bounded(*args):
        if time.perf_counter() > deadline:
            raise PlanTooLong(f"the search passed its {deadline:.0f} s deadline")
        return fn(*args)
    return bounded


def _real_memory(spec: ModelSpec, layout: Layout) -> dict:
    return memory_per_gpu(spec, layout)


def splits(spec: ModelSpec, gpus: int, refused: Counter | None = None) -> list[tuple[int, int, int, int]]:
    """(dp, tp, pp, ep) with dp·tp·pp = gpus that divide the model (step 1); the others are
    counted in `refused` by their first failing reason."""
    refused = refused if refused is not None else Counter()
    out = []
    for tp in divisors(gpus):
        for pp in divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if spec.heads % tp:
                refused[R_TP_HEADS] += 1
            elif spec.ffn % tp:
                refused[R_TP_FFN] += 1
            elif spec.layers % pp:
                refused[R_PP_LAYERS] += 1
            elif spec.global_batch % dp:
                refused[R_DP_BATCH] += 1
            else:
                eps = [e for e in divisors(dp) if spec.experts % e == 0] if spec.moe else [1]
                out += [(dp, tp, pp, ep) for ep in eps]
    return out


def microbatch_sizes(per_dp: int) -> list[int]:
    """The microbatch sizes searched for `per_dp` sequences per replica: its divisors up to
    MAX_DENSE_MB, and beyond only the powers of two (a microbatch that large has long saturated the
    GEMMs: only memory and the bubble still move, which powers of two sample). Keeps the search
    small for any global batch: at most MAX_DENSE_MB + log2(per_dp) sizes."""
    if per_dp > MAX_GLOBAL_BATCH:
        raise ValueError(f"{per_dp:,} sequences per replica: over the {MAX_GLOBAL_BATCH:,} searched")
    small = [d for d in range(1, min(per_dp, MAX_DENSE_MB) + 1) if per_dp % d == 0]
    big, p = [], 1 << MAX_DENSE_MB.bit_length()
    while p <= per_dp:
        if per_dp % p == 0:
            big.append(p)
        p <<= 1
    return small + big


def _schedules(spec: ModelSpec, pp: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    out = [("1f1b", 1), ("zero-bubble", 1), ("gpipe", 1)]
    return out + [("interleaved-1f1b", v) for v in divisors(spec.layers // pp) if v > 1]


def variants(spec: ModelSpec, split: tuple[int, int, int, int], refused: Counter | None = None):
    """Every layout of one split (step 2), grouped: yields lists of layouts that differ only in
    recompute, in RECOMPUTE order (none, selective, full)."""
    refused = refused if refused is not None else Counter()
    dp, tp, pp, ep = split
    scheds = _schedules(spec, pp)
    # ZeRO-2/3 with a pipeline: not searched. DeepSpeed refuses ZeRO-2/3 with its pipeline engine
    # (gradients sharded while microbatches accumulate), Megatron-LM's distributed optimizer
    # (--use-distributed-optimizer) shards the optimizer state only, ZeRO-1's memory.
    zeros = ((0, 1, 2, 3) if pp == 1 else (0, 1)) if dp > 1 else (0,)
    sps = (True, False) if tp > 1 else (False,)
    per_mb = len(scheds) * len(zeros) * len(sps) * len(RECOMPUTE)
    per_dp = spec.global_batch // dp
    for mb in microbatch_sizes(per_dp):
        m = per_dp // mb
        if m < pp:
            refused[R_FEW_MB] += per_mb
            continue
        if dp > 1 and pp > 1:
            refused[R_ZERO_PP] += 2 * per_mb // len(zeros)
        for zero in zeros:
            for schedule, v in scheds:
                for sp in sps:
                    yield [Layout(dp=dp, tp=tp, pp=pp, ep=ep, zero=zero, microbatch=mb, microbatches=m,
                                  schedule=schedule, stages_per_rank=v, sp=sp, recompute=rc) for rc in RECOMPUTE]


def _finite(est: Estimate) -> bool:
    return isinstance(est.step_s, (int, float)) and math.isfinite(est.step_s) and est.step_s > 0


def _rank_key(est: Estimate):
    return (est.step_s, est.memory_bytes.get("total", 0), est.layout.short())


def is_tight(est: Estimate, usable_hbm_bytes: float) -> bool:
    """Over TIGHT_HBM_FRAC of usable HBM: fragmentation or a longer sequence may not fit."""
    return est.memory_bytes.get("total", 0) > TIGHT_HBM_FRAC * usable_hbm_bytes


def prefer_in_band(ranked: list[Estimate], usable_hbm_bytes: float, band_pct: float = NEAR_TIE_PCT) -> list[Estimate]:
    """`ranked` (fastest first) with the layouts within band_pct of the fastest reordered: not
    tight first, then lower ZeRO stage, fewer pipeline stages, then step (module constants' note)."""
    if not ranked:
        return ranked
    limit = ranked[0].step_s * (1 + band_pct / 100)
    band = [e for e in ranked if e.step_s <= limit]
    rest = [e for e in ranked if e.step_s > limit]
    band.sort(key=lambda e: (is_tight(e, usable_hbm_bytes), e.layout.zero, e.layout.pp) + _rank_key(e))
    return band + rest


def plan(spec: ModelSpec, gpus: int, cluster: Cluster, *, estimate_fn: EstimateFn | None = None,
         memory_fn: MemoryFn | None = None, prune: bool = True, check_top: int = CHECK_TOP,
         detail_top: int = 10, time_limit_s: float | None = None) -> PlanResult:
    """Every layout of `spec` on `gpus` GPUs of `cluster`, ranked (see the module docstring).
    prune=False estimates every layout that fits (the reference the pruning is tested against).
    The real cost model ranks without its assumptions and dominant-assumption search; the top
    `detail_top` (and the rule of thumb) are estimated again with them. time_limit_s: PlanTooLong
    once the search has run that long (None: no limit, as the CLI)."""
    t0 = time.perf_counter()
    spec.check()
    if spec.global_batch > MAX_GLOBAL_BATCH:
        raise ValueError(f"--global-batch {spec.global_batch:,}: over the {MAX_GLOBAL_BATCH:,} sequences a plan "
                         f"searches (the largest published runs use a few thousand)")
    real = estimate_fn is None  # the cost model: the top layouts get its details after ranking
    estimate_fn = estimate_fn or _real_estimate
    memory_fn = memory_fn or _real_memory
    if time_limit_s is not None:
        estimate_fn, memory_fn = (_until(t0 + time_limit_s, f) for f in (estimate_fn, memory_fn))
    hbm = cluster.usable_hbm_bytes  # HBM less the reserve (context, NCCL, fragmentation)
    refused: Counter = Counter()
    considered, min_mem = 0, None
    kept: list[Layout] = []
    # kept layout -> its dropped neighbours and why (step 5 estimates those of the top)
    pruned: dict[Layout, list[tuple[Layout, str]]] = {}
    calls = 0
    estimates: dict[Layout, Estimate] = {}

    def estimate(layout: Layout) -> Estimate | None:
        nonlocal calls
        if layout not in estimates:
            calls += 1
            try:
                estimates[layout] = estimate_fn(spec, layout, cluster)
            except NoStepError:  # counted under R_NOT_FINITE
                estimates[layout] = None
        est = estimates[layout]
        return est if est is not None and _finite(est) else None

    all_splits = splits(spec, gpus, refused)
    skipped = 0
    for split in all_splits:
        sp_on: dict[tuple, Layout] = {}  # (zero, mb, schedule, v) -> the kept sp-on layout
        sp_off: list[Layout] = []
        state_over: dict[int, bool] = {}  # zero -> does the model state alone exceed HBM?
        # (zero, schedule, v, sp, recompute) over HBM at a smaller microbatch (variants() goes up)
        over: set[tuple] = set()
        for group in variants(spec, split, refused):
            considered += len(group)
            zero = group[0].zero
            if state_over.get(zero):
                # parameters, gradients and optimizer state depend on the split and the ZeRO
                # stage only, and activations are >= 0: every variant is over HBM
                refused[R_HBM] += len(group)
                skipped += len(group)
                continue
            fit = []
            for layout in group:
                key = (zero, layout.schedule, layout.stages_per_rank, layout.sp, layout.recompute)
                if key in over:
                    # memory never falls as the microbatch grows (module docstring): over HBM too
                    refused[R_HBM] += 1
                    skipped += 1
                    continue
                mem = memory_fn(spec, layout)
                total = mem["total"]
                min_mem = total if min_mem is None else min(min_mem, total)
                if zero not in state_over:
                    state_over[zero] = sum(mem.get(k, 0) for k in STATE_KEYS) > hbm
                if total <= hbm:
                    fit.append(layout)
                else:
                    refused[R_HBM] += 1
                    over.add(key)
            if not fit:
                continue
            if not prune:
                kept.extend(fit)
                continue
            first = fit[0]
            refused[R_RECOMPUTE] += len(fit) - 1
            pruned[first] = [(other, R_RECOMPUTE) for other in fit[1:]]
            if first.tp > 1 and first.sp:
                sp_on[_sp_key(first)] = first
            elif first.tp > 1:
                sp_off.append(first)
                continue
            kept.append(first)
        # sp off: estimated unless a probe on this split finds sp on no slower (sp on needs no
        # more recompute than sp off: it only removes activation memory)
        if sp_off and _sp_dominates(sp_on, sp_off, estimate):
            for layout in sp_off:
                twin = sp_on.get(_sp_key(layout))
                if twin is None:
                    kept.append(layout)
                    continue
                refused[R_SP_OFF] += 1 + len(pruned[layout])
                refused[R_RECOMPUTE] -= len(pruned[layout])
                pruned[twin] += [(layout, R_SP_OFF)] + [(o, R_SP_OFF) for o, _ in pruned.pop(layout)]
        else:
            kept.extend(sp_off)

    if not kept and skipped:  # nothing fits: the smallest need is over every layout, skipped ones too
        min_mem = min(memory_fn(spec, l)["total"] for sp in all_splits for g in variants(spec, sp) for l in g)
    ranked = []
    for layout in kept:
        est = estimate(layout)
        if est is None:
            refused[R_NOT_FINITE] += 1
        elif not est.fits:
            refused[R_HBM] += 1
        else:
            ranked.append(est)
    ranked.sort(key=_rank_key)
    check = ""
    if prune and ranked:
        ranked, check = _check_pruning(ranked, pruned, estimate, check_top, refused)
    ranked = prefer_in_band(ranked, hbm)

    rule = rule_of_thumb(spec, gpus, cluster, memory_fn=memory_fn)
    rule_est, rule_rank = None, None
    if real:
        ranked[:detail_top] = [_detailed(spec, e, cluster) for e in ranked[:detail_top]]
    if rule.layout is not None:
        rule_est = estimate(rule.layout)
        if rule_est is not None and real:
            rule_est = _detailed(spec, rule_est, cluster)
        if rule_est is not None and rule_est.fits:
            # its place in `ranked` where it was ranked; else where it would go (pruned ones uncounted)
            where = [i for i, e in enumerate(ranked) if e.layout == rule.layout]
            rule_rank = (where[0] if where else sum(1 for e in ranked if _rank_key(e) < _rank_key(rule_est))) + 1
        else:
            rule_est = None
    assumptions = [
        "compute efficiency is assumed (no trace informs a pure plan): the cost model's roofline "
        "efficiencies for this cluster, not a measurement",
        "rank order tp innermost, then dp (ep inside dp), pp outermost: a tp group whose size divides "
        "the GPUs per node sits in one node",
        "not searched: context parallelism (cp = 1), HSDP (ZeRO-3 shards over all dp ranks), "
        "tp not dividing the heads",
        # The memory column's bytes (a trial: nothing said what they assume).
        f"memory: mixed precision as ZeRO counts it, {spec.param_bytes} B parameters + {spec.grad_bytes} B gradients "
        f"+ {spec.optimizer_bytes_per_param} B of Adam state (fp32 master weights, m, v) = "
        f"{spec.param_bytes + spec.grad_bytes + spec.optimizer_bytes_per_param} B per parameter before sharding "
        f"(ZeRO-1 shards the optimizer's {spec.optimizer_bytes_per_param} B, ZeRO-2 the gradients too, ZeRO-3 all), "
        f"activations in {spec.param_bytes}-byte elements",
    ]
    if ranked:  # the cost model's own, but its "compute efficiency assumed" line said above
        assumptions += [a for a in ranked[0].assumptions
                        if a not in assumptions and not a.startswith("compute efficiency assumed")]
    return PlanResult(ranked=ranked, considered=considered, refused=dict(refused), rule_of_thumb=rule_est,
                      rule_of_thumb_rank=rule_rank, assumptions=assumptions, rule=rule, evaluated=calls,
                      min_memory_bytes=min_mem, pruning_check=check, seconds=time.perf_counter() - t0,
                      splits=len(all_splits))


def _sp_key(layout: Layout) -> tuple:
    return (layout.zero, layout.microbatch, layout.schedule, layout.stages_per_rank)


def _sp_dominates(sp_on: dict[tuple, Layout], sp_off: list[Layout], estimate) -> bool:
    """One probe per split: the first sp-off layout whose sp-on twin fits. True when sp on is no
    slower there (and the cost model gave both), so sp off is not estimated for this split."""
    for off in sp_off:
        on = sp_on.get(_sp_key(off))
        if on is None:
            continue
        e_on, e_off = estimate(on), estimate(replace(off, recompute=on.recompute))
        return e_on is not None and e_off is not None and e_on.step_s <= e_off.step_s
    return False


def _check_pruning(ranked: list[Estimate], pruned: dict, estimate, check_top: int, refused: Counter):
    """Step 5: estimate the pruned neighbours of the top `check_top`; rank the fitting ones that
    beat their kept neighbour (and say how many there were)."""
    checked, faster = 0, []
    for est in ranked[:check_top]:
        for other, reason in pruned.get(est.layout, []):
            e = estimate(other)
            checked += 1
            if e is not None and e.fits and e.step_s < est.step_s:
                faster.append(e)
                refused[reason] -= 1
    if faster:
        ranked = sorted(ranked + faster, key=_rank_key)
    text = (f"the {checked} pruned neighbours (more recompute, sp off) of the top {min(check_top, len(ranked))} "
            f"were estimated: {len(faster)} faster than the layout kept in their place"
            + (" (now ranked)" if faster else ""))
    return ranked, text


def _fitting(spec: ModelSpec, base: Layout, hbm: int, memory_fn: MemoryFn) -> Layout | None:
    """`base` (dp, tp, pp, zero set) with the least recompute that fits, then the microbatch the
    rule of thumb takes: the largest for pp = 1 (fewest accumulation steps), 1 for pp > 1 (most
    microbatches, smallest bubble)."""
    per_dp = spec.global_batch // base.dp
    mbs = [mb for mb in microbatch_sizes(per_dp) if per_dp // mb >= base.pp]
    if base.pp == 1:
        mbs = mbs[::-1]
    for rc in RECOMPUTE:
        for mb in mbs:
            layout = replace(base, microbatch=mb, microbatches=per_dp // mb, recompute=rc)
            if memory_fn(spec, layout)["total"] <= hbm:
                return layout
    return None


def rule_of_thumb(spec: ModelSpec, gpus: int, cluster: Cluster, *, memory_fn: MemoryFn | None = None) -> RuleOfThumb:
    """The teaching rule: one GPU fits -> DDP (or ZeRO-1); one node fits -> FSDP; otherwise TP
    inside a node, then PP across nodes (the fewest stages that fit), then DP outermost.
    docs/whatif.md, "Plan", says how each 'fits' is tested."""
    memory_fn = memory_fn or _real_memory
    hbm = cluster.usable_hbm_bytes
    gb = spec.global_batch
    note = ""
    if gb % gpus:
        note = f" (DDP and FSDP over all {gpus} do not divide the global batch {gb})"
    else:
        for zero, name in ((0, "DDP"), (1, "ZeRO-1"))[:1 if gpus == 1 else 2]:  # ZeRO over 1 GPU: nothing
            layout = _fitting(spec, Layout(dp=gpus, zero=zero), hbm, memory_fn)
            if layout is not None:
                return RuleOfThumb(layout, f"one GPU holds the model: {name} over all {gpus}")
        node = min(cluster.gpus_per_node, gpus)
        # "one node fits": ZeRO-3 sharded over one node's GPUs, each with its share of the batch
        node_spec = replace(spec, global_batch=node * (gb // gpus))
        if gpus > 1 and node > 1 and _fitting(node_spec, Layout(dp=node, zero=3), hbm, memory_fn) is not None:
            layout = _fitting(spec, Layout(dp=gpus, zero=3), hbm, memory_fn)
            if layout is not None:
                return RuleOfThumb(layout, f"one node ({node} GPUs) holds the model sharded: FSDP (ZeRO-3) over all "
                                           f"{gpus} (HSDP, sharding inside a node only, is not a layout here)")
    # the largest tp dividing the heads and a node (so its group stays on NVLink: tp=6 on 8-GPU
    # nodes would straddle two) and G
    tps = [t for t in divisors(spec.heads) if cluster.gpus_per_node % t == 0 and gpus % t == 0 and spec.ffn % t == 0]
    tp = tps[-1]
    failed: dict[str, set[int]] = {}  # why not -> the pp it stopped, for the message when none is left
    # the fewest stages first; at each pp ZeRO-0, then ZeRO-1 (the distributed optimizer, which
    # Megatron-LM runs with pipelines): a stage more is the rule's last resort, not ZeRO-1
    for pp in divisors(spec.layers):
        for zero in (0, 1):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if zero and dp == 1:  # ZeRO-1 over one replica shards nothing
                continue
            if gb % dp:
                failed.setdefault("dp does not divide the global batch", set()).add(pp)
                continue
            if gb // dp < pp:
                failed.setdefault("fewer microbatches than stages", set()).add(pp)
                continue
            layout = _fitting(spec, Layout(dp=dp, tp=tp, pp=pp, zero=zero, sp=tp > 1), hbm, memory_fn)
            if layout is None:
                failed.setdefault(f"over the {cluster.usable_hbm_bytes / 2**30:.1f} GiB usable of {cluster.hbm_gib:g} GiB HBM", set()).add(pp)
                continue
            lead = note[2:-1] + ": " if note else "no node holds the model: "
            how = ("ZeRO-1 (the distributed optimizer): ZeRO-0 does not fit there" if zero else
                   "ZeRO-0" + (", ZeRO-1 tried only where ZeRO-0 does not fit" if dp > 1 else ""))
            moe = ("; ep=1: the rule has no expert-parallel step (every GPU holds all experts of its stage)"
                   if spec.moe else "")
            return RuleOfThumb(layout, f"{lead}tp={tp} inside a node, the fewest stages that fit (pp={pp}, {how}) "
                                       f"across nodes, dp={layout.dp} outermost{moe}")
    whys = "; ".join(f"{why} at pp={','.join(map(str, sorted(pps)))}" for why, pps in failed.items())
    return RuleOfThumb(None, f"no layout of the rule divides and fits: DDP/FSDP do not fit or divide{note}; "
                             f"tp={tp} with ZeRO-0/1: {whys or 'no pp divides both the layers and G'}")
