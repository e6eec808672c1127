"""What `ptprof plan` prints and writes: the ranked table, why the best layouts win (from their
step breakdowns, against the next one and against the rule of thumb), and the JSON report
(schema ptprof.plan/1). Plain strings and dicts; profiler.cli_whatif does the I/O.
"""

from __future__ import annotations

import textwrap

from profiler.cluster import Cluster
from profiler.commcost import crosses_nodes, group_link
from profiler.layout import Estimate, Layout, ModelSpec, group_stride
from profiler.plan import NEAR_TIE_PCT, PlanResult, is_tight

SCHEMA = "ptprof.plan/1"
WIDTH = 100
WHY_TOP = 3  # layouts that get a "why" line
TIE_PCT = 0.5  # closer than this is called a tie: well inside the model's error
SCHEDULE_SHORT = {"1f1b": "1f1b", "gpipe": "gpipe", "zero-bubble": "zb", "interleaved-1f1b": "i1f1b"}
RC_SHORT = {"selective": "rc=sel", "full": "rc=full"}
# The model's error: on the validation rows (README "How good" (a): Korthikanti et al. 2022's
# Megatron runs on A100) every step was predicted 5-12 % too fast; a gap under this is no difference.
MODEL_ERROR_PCT = 10.0
OPTIMISM = ("validation: on the 8 Megatron-LM rows (Korthikanti et al. 2022, A100; README \"How good\" (a)) the "
            "model predicted every step 5-12 % faster than measured (mean 8.7 %): read steps as lower bounds, MFU "
            "as upper bounds")
# The best dense-training MFU published that we know of: Korthikanti et al. 2022 (Megatron-LM, sequence
# parallel + selective recompute) report up to 56.3 % on A100 (1T GPT). A prediction above it is suspect.
MFU_CEILING_PCT = 57.0
MFU_SOURCE = "the best published dense-training MFU, ~56 % (Korthikanti et al. 2022, Megatron-LM on A100)"


def compact(layout: Layout) -> str:
    """A table cell: `dp=16 tp=8 pp=8 z1 mb=1x96 i1f1b v=3 rc=sel sp` (the legend under the table)."""
    parts = [f"dp={layout.dp}", f"tp={layout.tp}", f"pp={layout.pp}"]
    parts += [f"ep={layout.ep}"] * (layout.ep > 1) + [f"z{layout.zero}", f"mb={layout.microbatch}x{layout.microbatches}"]
    if layout.pp > 1:
        parts.append(SCHEDULE_SHORT[layout.schedule] + (f" v={layout.stages_per_rank}" if layout.stages_per_rank > 1 else ""))
    parts += [RC_SHORT[layout.recompute]] if layout.recompute in RC_SHORT else []
    parts += ["sp"] * layout.sp
    return " ".join(parts)


def unvalidated(spec: ModelSpec, layout: Layout) -> list[str]:
    """The features a layout uses that no measurement validated (the validation rows are dense,
    unfused attention, ZeRO-0/1, 1f1b/interleaved pipelines)."""
    out = []
    if getattr(spec, "flash_attention", False):
        out.append("fused (flash) attention")
    if layout.zero >= 2:
        out.append("ZeRO-2/3 (FSDP) overlap")
    if layout.pp > 1 and layout.schedule == "zero-bubble":
        out.append("zero-bubble schedule")
    if spec.moe or layout.ep > 1:
        out.append("MoE / expert parallelism")
    return out


def mfu_warning(result: PlanResult) -> str | None:
    best = result.ranked[0] if result.ranked else None
    if best is None or best.mfu_pct is None or best.mfu_pct <= MFU_CEILING_PCT:
        return None
    return (f"warning: #1's predicted MFU {best.mfu_pct:.1f} % is above {MFU_CEILING_PCT:g} %, {MFU_SOURCE}: "
            "the cost model is optimistic here (efficiencies assumed, no launch gaps, overlapped communication "
            "assumed free); expect a slower step")


def caveats(spec: ModelSpec, result: PlanResult, top: int, cluster: Cluster) -> list[str]:
    """Said with the table (CLI and page): which unvalidated features the shown rows use, which are
    tight on HBM, the model's known optimism, and the MFU warning; one line each, unwrapped."""
    shown = result.ranked[:top]
    used = sorted({f for e in shown for f in unvalidated(spec, e.layout)})
    out = []
    if used:
        out.append("* uses what no measurement validated: " + ", ".join(used))
    if any(is_tight(e, cluster.usable_hbm_bytes) for e in shown):
        out.append("! tight: over 90 % of the usable HBM (fragmentation or a longer sequence may not fit)")
    if result.ranked:
        fastest = min(range(len(result.ranked)), key=lambda i: result.ranked[i].step_s)
        step = result.ranked[fastest].step_s
        band = sum(1 for e in result.ranked if e.step_s <= step * (1 + NEAR_TIE_PCT / 100))
        if band > 1:
            out.append(f"order: the {band:,} layouts within {NEAR_TIE_PCT:g} % of the fastest step ({step:.3g} s, rank "
                       f"{fastest + 1:,}) are near-ties the model cannot tell apart (its error is ±{MODEL_ERROR_PCT:g} %): "
                       "not tight on HBM first, then the lower ZeRO stage, the fewer pipeline stages, the faster")
    out.append(OPTIMISM)
    warn = mfu_warning(result)
    return out + ([warn] if warn else [])


def row_flags(spec: ModelSpec, est: Estimate, cluster: Cluster) -> list[str]:
    """A row's marks in words (the page's note column): tight, unvalidated features."""
    tight = ["tight on HBM"] if is_tight(est, cluster.usable_hbm_bytes) else []
    feats = unvalidated(spec, est.layout)
    return tight + (["* unvalidated: " + ", ".join(feats)] if feats else [])


def caveat_lines(spec: ModelSpec, result: PlanResult, top: int, cluster: Cluster) -> list[str]:
    """caveats(), wrapped for the terminal."""
    return [w for line in caveats(spec, result, top, cluster)
            for w in _wrap(line, "  ")]


def exposed_comm_s(est: Estimate) -> float:
    return sum(v for k, v in est.breakdown_s.items() if k.startswith("comm_exposed"))


def _placement(layout: Layout, dim: str, cluster: Cluster) -> str:
    size = {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "cp": layout.cp}.get(dim)
    if size is None:
        return ""
    if size == 1:
        return f"{dim}=1"
    link = group_link(cluster, size, group_stride(layout, dim))
    where = "across nodes" if crosses_nodes(cluster, size, group_stride(layout, dim)) else "inside a node"
    return f"{dim}={size} on {link.name} ({where})"


def _term(key: str, a: Estimate, b: Estimate, cluster: Cluster) -> str:
    """One breakdown term where `a` spends less than `b`, with the layout difference behind it."""
    va, vb = a.breakdown_s.get(key, 0.0), b.breakdown_s.get(key, 0.0)
    la, lb = a.layout, b.layout
    if key.startswith("comm_exposed"):
        dim = key.partition(":")[2]
        pa, pb = _placement(la, dim, cluster), _placement(lb, dim, cluster)
        where = pa if pa == pb else f"{pa} vs {pb}"
        if pa != pb and pa.partition(" on ")[2] == pb.partition(" on ")[2]:  # same link: say it once
            where = f"{pa.partition(' on ')[0]} vs {pb.partition(' on ')[0]}, both on {pa.partition(' on ')[2]}"
        extra = f"; zero={la.zero} vs {lb.zero}" if dim == "dp" and la.zero != lb.zero else ""
        if dim == "pp":  # m·2v sends of a microbatch's activation: v and mb move it, not only the link
            if la.stages_per_rank != lb.stages_per_rank:
                extra += f"; v={la.stages_per_rank} vs {lb.stages_per_rank}: a send per chunk"
            if (la.microbatch, la.microbatches) != (lb.microbatch, lb.microbatches):
                extra += f"; mb={la.microbatch}x{la.microbatches} vs {lb.microbatch}x{lb.microbatches}"
        return f"less exposed {dim or 'comm'} comm {va:.3g} vs {vb:.3g} s ({where}{extra})"
    if key == "bubble":
        def desc(l: Layout, e: Estimate) -> str:
            v = f" v={l.stages_per_rank}" if l.stages_per_rank > 1 else ""
            return f"{100 * e.breakdown_s.get('bubble', 0.0) / e.step_s:.1f} % ({l.schedule}{v}, pp={l.pp}, m={l.microbatches})"
        return f"bubble {desc(la, a)} vs {desc(lb, b)}"
    if key.startswith("compute") or key.startswith("recompute"):
        why = []
        if la.recompute != lb.recompute:
            why.append(f"recompute {la.recompute} vs {lb.recompute}")
        if la.microbatch != lb.microbatch:
            why.append(f"microbatch {la.microbatch} vs {lb.microbatch}")
        for dim in ("tp", "pp", "ep"):  # tp splits the GEMMs; pp and ep move the head and the experts
            if getattr(la, dim) != getattr(lb, dim):
                why.append(f"{dim}={getattr(la, dim)} vs {getattr(lb, dim)}")
        return f"{key} {va:.3g} vs {vb:.3g} s" + (f" ({', '.join(why)})" if why else "")
    return f"{key} {va:.3g} vs {vb:.3g} s"


def memory_pair(a_bytes: float, b_bytes: float) -> str:
    """'1.5 vs 2.0 GiB', or in MiB / KiB / B where the larger is under 1 GiB (a tiny model's
    '0.0 vs 0.0 GiB' told nothing)."""
    big = max(a_bytes, b_bytes)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if big >= size:
            return f"{a_bytes / size:.1f} vs {b_bytes / size:.1f} {unit}"
    return f"{a_bytes:.0f} vs {b_bytes:.0f} B"


def layout_diff(a: Layout, b: Layout) -> str:
    """The knobs in which two layouts differ, `schedule 1f1b vs gpipe, sp on vs off`."""
    out = []
    for name, label in (("dp", "dp"), ("tp", "tp"), ("pp", "pp"), ("ep", "ep"), ("cp", "cp"), ("zero", "zero"),
                        ("microbatch", "microbatch"), ("microbatches", "microbatches"), ("schedule", "schedule"),
                        ("stages_per_rank", "v"), ("recompute", "recompute"), ("sp", "sp")):
        va, vb = getattr(a, name), getattr(b, name)
        if va != vb:
            out.append(f"sp {'on' if va else 'off'} vs {'on' if vb else 'off'}" if name == "sp" else f"{label} {va} vs {vb}")
    return ", ".join(out)


def why(a: Estimate, b: Estimate, cluster: Cluster, label: str) -> str:
    """`a` against `b` in one phrase: how much faster, and the (at most two) terms that make it."""
    gap_pct = 100 * (b.step_s - a.step_s) / b.step_s
    keys = set(a.breakdown_s) | set(b.breakdown_s)
    gains = sorted(((b.breakdown_s.get(k, 0.0) - a.breakdown_s.get(k, 0.0), k) for k in keys), reverse=True)
    # the terms that make the gap: at most two, each at least a tenth of it (or of the step, in a tie)
    floor = 0.1 * max(b.step_s - a.step_s, TIE_PCT / 100 * b.step_s)
    terms = [_term(k, a, b, cluster) for d, k in gains[:2] if d > floor]
    if gap_pct < 0:  # ranked ahead of a faster one: plan.prefer_in_band
        hbm = cluster.usable_hbm_bytes
        reason = ("not tight on HBM" if is_tight(b, hbm) and not is_tight(a, hbm) else
                  f"lower ZeRO stage ({a.layout.zero} vs {b.layout.zero})" if a.layout.zero < b.layout.zero else
                  f"fewer pipeline stages ({a.layout.pp} vs {b.layout.pp})" if a.layout.pp < b.layout.pp else
                  "faster")
        return (f"{-gap_pct:.1f} % slower than {label} but preferred: {reason}, within the {NEAR_TIE_PCT:g} % "
                f"near-tie band (under the model's ±{MODEL_ERROR_PCT:g} % error, no real difference), memory "
                f"{memory_pair(a.memory_bytes.get('total', 0), b.memory_bytes.get('total', 0))}")
    if gap_pct < TIE_PCT:
        head = f"ties {label} ({gap_pct:.2f} % faster: inside the model's error)"
        ma, mb = a.memory_bytes.get("total", 0), b.memory_bytes.get("total", 0)
        if ma < mb:
            head += f", less memory {memory_pair(ma, mb)}"
        elif not terms:  # no term and no memory to tell them apart: say what differs
            head += f", differs in {layout_diff(a.layout, b.layout) or 'nothing'}"
        if gains and gains[-1][0] < 0 and terms:  # a trade: what it gains and what it pays
            lost = gains[-1][1]
            name = f"exposed {lost.partition(':')[2]} comm" if lost.startswith("comm_exposed:") else lost
            head += (f": {terms[0]}, but more {name} {a.breakdown_s.get(lost, 0.0):.3g} vs "
                     f"{b.breakdown_s.get(lost, 0.0):.3g} s")
        return head
    error = f" (under the model's ±{MODEL_ERROR_PCT:g} % error: no real difference)" if gap_pct < MODEL_ERROR_PCT else ""
    return f"{gap_pct:.1f} % faster than {label}{error}: " + "; ".join(terms or ["no single term"])


def why_lines(result: PlanResult, cluster: Cluster, top: int = WHY_TOP) -> list[str]:
    """'#1: ...' for the top layouts: against the next one and (for #1) the rule of thumb."""
    out, ranked, rule = [], result.ranked, result.rule_of_thumb
    for i, est in enumerate(ranked[:top]):
        parts = []
        if i + 1 < len(ranked):
            parts.append(why(est, ranked[i + 1], cluster, f"#{i + 2}"))
        if i == 0 and rule is not None and rule.layout != est.layout:
            parts.append(why(est, rule, cluster, "the rule of thumb"))
        if parts:
            out.append(f"#{i + 1}: " + "; ".join(parts))
    return out


def _gib(n: int | float) -> str:
    return f"{n / 2**30:.1f}"


def _wrap(line: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False) or [""]


def params_text(n: int) -> str:
    """A parameter count: billions to two decimals, as the field writes them ("175.23 B"), smaller
    ones in M or k to 3 significant digits ("350 M", "134 k"; a test model's 133,760 read "0.00 B").
    Without textfmt: it imports polars, which `ptprof plan` does not need."""
    if n < 999.5:
        return f"{int(round(n)):,}"
    for size, unit in ((1e3, "k"), (1e6, "M")):
        v = n / size
        if v < 999.5:
            return f"{v:,.0f} {unit}" if v >= 99.95 else f"{v:.{1 if v >= 9.995 else 2}f} {unit}"
    return f"{n / 1e9:,.2f} B"


def header_lines(spec: ModelSpec, gpus: int, cluster: Cluster, checked_params: str) -> list[str]:
    nodes = -(-gpus // cluster.gpus_per_node)
    moe = f", MoE {spec.experts} experts top-{spec.top_k}" if spec.moe else ""
    moe += ", flash attention" if getattr(spec, "flash_attention", False) else ""
    lines = [f"model: {params_text(spec.count_params())} params{checked_params}; {spec.layers} layers, hidden "
             f"{spec.hidden}, {spec.heads} heads, ffn {spec.ffn}, vocab {spec.vocab}, seq {spec.seq}{moe}",
             f"batch: {spec.global_batch:,} sequences = {spec.tokens_per_step:,} tokens/step",
             f"cluster: {cluster.name} ({cluster.peak_tflops:g} TFLOP/s, {cluster.hbm_gib:g} GiB HBM "
             f"({cluster.usable_hbm_bytes / 2**30:.2f} usable), "
             f"{cluster.gpus_per_node} GPUs/node; inside a node {cluster.intra.bw_gbps:g} GB/s ({cluster.intra.name}), "
             f"between nodes {cluster.inter.bw_gbps:g} GB/s per GPU ({cluster.inter.name})); "
             f"G = {gpus:,} GPU{'s' * (gpus != 1)} = {nodes:,} node{'s' * (nodes != 1)}",
             "attention: " + ("fused (FlashAttention), priced as GEMMs: not validated against a measurement"
                              if getattr(spec, "flash_attention", False) else
                              "unfused (scores written to HBM, as the Megatron papers count); --flash-attention "
                              "prices FlashAttention")
             + "; GQA/MQA not modelled (every head has its own K, V); a SwiGLU MLP: pass --ffn 1.5 x its width"]
    return [w for line in lines for w in _wrap(line)]


def table_lines(result: PlanResult, top: int, spec: ModelSpec | None = None,
                usable_hbm_bytes: float | None = None) -> list[str]:
    """The ranked rows; with `spec`, a `*` after the rank where a row uses an unvalidated feature, with
    `usable_hbm_bytes`, a `!` after the memory of a tight row (caveat_lines gives the legend)."""
    head = f"{'rank':>5} {'step s':>8} {'MFU %':>6} {'mem GiB':>8} {'comm s':>7} {'bubble':>6}  layout"
    out = [head]
    for i, est in enumerate(result.ranked[:top]):
        mfu = f"{est.mfu_pct:.1f}" if est.mfu_pct is not None else "-"
        bubble = 100 * est.breakdown_s.get("bubble", 0.0) / est.step_s
        star = "*" if spec is not None and unvalidated(spec, est.layout) else " "
        tight = "!" if usable_hbm_bytes is not None and is_tight(est, usable_hbm_bytes) else " "
        row = (f"{i + 1:>4}{star} {est.step_s:>8.3g} {mfu:>6} {_gib(est.memory_bytes.get('total', 0)):>7}{tight} "
               f"{exposed_comm_s(est):>7.3g} {bubble:>5.1f}%  ")
        text = compact(est.layout)
        # A long layout (MoE at thousands of GPUs) goes on its own line rather than past 100 columns.
        out += [row + text] if len(row) + len(text) <= 100 else [row.rstrip(), " " * 8 + text]
    return out


def refused_lines(result: PlanResult) -> list[str]:
    parts = [f"{n:,} {k}" for k, n in result.refused.items() if n]
    line = (f"searched {result.considered:,} layouts of {result.splits} dividing splits in {result.seconds:.1f} s: "
            f"{len(result.ranked):,} ranked ({result.evaluated:,} estimates); dropped: " + "; ".join(parts))
    out = _wrap(line)
    if result.pruning_check:
        out += _wrap("pruning check: " + result.pruning_check)
    return out


def rule_line(result: PlanResult) -> list[str]:
    rule = result.rule
    if rule is None:
        return []
    if rule.layout is None:
        return _wrap(f"rule of thumb: {rule.why}")
    if result.rule_of_thumb is None:
        return _wrap(f"rule of thumb: {compact(rule.layout)} -- the cost model finds it does not fit ({rule.why})")
    est, best = result.rule_of_thumb, result.ranked[0] if result.ranked else None
    slower = f", {100 * (est.step_s / best.step_s - 1):.1f} % slower than #1" if best else ""
    if best is not None and best.layout == est.layout:
        slower = ": the plan's #1 too"
    return _wrap(f"rule of thumb: {compact(rule.layout)}: {est.step_s:.3g} s, rank {result.rule_of_thumb_rank:,} "
                 f"of {len(result.ranked):,} ranked{slower} ({rule.why})")


def format_plan(spec: ModelSpec, gpus: int, cluster: Cluster, result: PlanResult, top: int,
                checked_params: str = "") -> str:
    lines = header_lines(spec, gpus, cluster, checked_params) + [""] + refused_lines(result) + [""]
    lines += table_lines(result, top, spec, cluster.usable_hbm_bytes)
    lines += _wrap(f"  HBM {cluster.hbm_gib:g} GiB per GPU, {cluster.usable_hbm_bytes / 2**30:.2f} usable (less "
                   f"{cluster.hbm_reserve_gib:g} GiB reserve); comm s: exposed communication; bubble: pipeline idle share "
                   "of the step; z: ZeRO stage (3 = FSDP); mb=BxM: microbatch B sequences, M per step; "
                   "i1f1b: interleaved-1f1b, zb: zero-bubble; rc: recompute", "  ")
    lines += caveat_lines(spec, result, top, cluster)
    lines += [""] + [w for line in why_lines(result, cluster) for w in _wrap(line)]
    lines += rule_line(result)
    if result.ranked and result.ranked[0].dominant:
        lines += _wrap(f"uncertainty: #1's step moves most with {result.ranked[0].dominant}")
    lines += ["", "assumptions:"]
    lines += [w for a in result.assumptions for w in _wrap("- " + a, "  ")]
    return "\n".join(lines)


def plan_json(spec: ModelSpec, gpus: int, cluster_dict: dict, result: PlanResult, top: int, cluster: Cluster) -> dict:
    """The ptprof.plan/1 report (docs/whatif.md, "Plan")."""
    inputs = {k: getattr(spec, k) for k in spec.__dataclass_fields__}
    inputs.update(params_counted=spec.count_params(), gpus=gpus, tokens_per_step=spec.tokens_per_step)
    rule = result.rule
    return {
        "schema": SCHEMA,
        "inputs": inputs,
        "cluster": cluster_dict,
        "ranked": [dict(e.as_dict(), rank=i + 1, unvalidated=unvalidated(spec, e.layout),
                        tight=is_tight(e, cluster.usable_hbm_bytes)) for i, e in enumerate(result.ranked[:top])],
        "caveats": {"optimism": OPTIMISM, "model_error_pct": MODEL_ERROR_PCT, "near_tie_pct": NEAR_TIE_PCT,
                    "mfu_ceiling_pct": MFU_CEILING_PCT, "mfu_ceiling_source": MFU_SOURCE,
                    "mfu_warning": mfu_warning(result)},
        "ranked_total": len(result.ranked),
        "considered": result.considered,
        "evaluated": result.evaluated,
        "refused": dict(result.refused),
        "pruning_check": result.pruning_check,
        "why": why_lines(result, cluster),
        "rule_of_thumb": {
            "layout": rule.layout.as_dict() if rule and rule.layout else None,
            "layout_text": rule.layout.short() if rule and rule.layout else None,
            "why": rule.why if rule else None,
            "rank": result.rule_of_thumb_rank,
            "estimate": result.rule_of_thumb.as_dict() if result.rule_of_thumb else None,
        },
        "assumptions": list(result.assumptions),
        "seconds": result.seconds,
    }
