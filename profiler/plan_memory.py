"""Memory per GPU of a transformer layout: parameters, gradients and optimizer state under ZeRO
stages (issue 8's table), plus activations (Korthikanti et al. 2022: sbh(34 + 5as/h) per layer,
divided by tensor/sequence parallelism, cut by selective or full recomputation; pipelines keep
microbatches in flight). docs/whatif.md, "Memory".

Activation bytes per layer per microbatch (2-byte activations -- param_bytes/2 times that for
another dtype --, 1-byte dropout masks; s = the
local sequence s/cp, b = microbatch, a = heads, t = tp, f = ffn), derived term by term as the
paper's Section 4.1 and generalized to f != 4h:
- attention: LN output (QKV input) 2sbh, Q and K 4sbh, softmax output 2as²b, its dropout mask
  as²b, dropout output 2as²b, V 2sbh, out-projection input 2sbh, dropout mask sbh:
  11sbh + 5as²b;
- MLP: up-projection input 2sbh, GELU input 2sbf, GELU output 2sbf, dropout mask sbh:
  3sbh + 4sbf (= 19sbh at f = 4h);
- two layernorm inputs: 4sbh.
Total sbh(18 + 4f/h) + 5as²b (= sbh(34 + 5as/h) at f = 4h). Tensor parallel splits Q, K, V, the
out-projection input, the GELU tensors and the attention core: sbh(10 + (8 + 4f/h)/t) + 5as²b/t;
sequence parallel splits the rest too: (sbh(18 + 4f/h) + 5as²b)/t.
"""

from __future__ import annotations

from functools import lru_cache

from profiler.layout import Layout, ModelSpec


def layer_activation_bytes(b: int, s: int, h: int, heads: int, ffn: int, t: int = 1, sp: bool = False,
                           recompute: str = "none", top_k: int = 0, cp: int = 1, flash: bool = False,
                           act_bytes: float = 2) -> float:
    """Bytes one layer keeps for backward for one microbatch (the module docstring's terms).
    selective: the attention core (5as²b) is recomputed, not kept; full: only the layer input 2sbh
    (/t with sp) -- the layer being recomputed is counted separately (`recompute_working_bytes`).
    flash: the core is never stored either, only its fp32 log-sum-exp per row (4asb/t).
    A MoE MLP keeps its tensors for k experts per token (f -> k·f).
    act_bytes: bytes of an activation element (the spec's param_bytes: activations are in the
    parameter dtype); the docstring's 2-byte terms scale by act_bytes/2, the 1-byte dropout masks
    and the fp32 log-sum-exp do not."""
    sl = s // cp
    sbh = float(sl * b * h)
    r = act_bytes / 2
    if recompute == "full":
        return 2 * r * sbh / (t if sp else 1)
    f_eff = ffn * max(top_k, 1)
    split = (8 + 4 * f_eff / h) * r  # Q, K, V, out-projection input, GELU in/out: split by tp
    rest = 8 * r + 2  # LN outputs/inputs and MLP-up input (8sbh at 2 B), two 1-byte dropout masks: split only by sp
    # softmax output and dropout output (4as²b at 2 B) and the 1-byte dropout mask (as²b)
    core = 0.0 if recompute == "selective" else (4 * r + 1) * heads * sl * s * b
    if flash:
        core = 4.0 * heads * sl * b
    if sp:
        return (sbh * (rest + split) + core) / t
    return sbh * (rest + split / t) + core / t


def in_flight(layout: Layout, layers: int, stage: int) -> tuple[float, int]:
    """(layer-microbatches of activations held at the peak, microbatches in flight) on pipeline
    stage `stage` (0 = first, pp-1 = last):
    - no pipeline: one microbatch at a time (gradient accumulation): L layers;
    - 1f1b / zero-bubble (ZB-H1 keeps 1F1B's memory): stage r holds min(m, p - r) microbatches of
      its L/p layers -- stage 0: p·L/p = L layers' worth;
    - interleaved-1f1b (Megatron): rank r warms up 2(p - r - 1) + (v - 1)p chunk-microbatches, plus
      the one in flight, of L/(pv) layers each -- rank 0: L(1 + (p - 1)/(pv)) (Korthikanti et al.);
    - gpipe: all m microbatches of L/p layers."""
    p, m, v = layout.pp, layout.microbatches, layout.stages_per_rank
    if p == 1:
        return float(layers), 1
    per_stage = layers / p
    if layout.schedule == "gpipe":
        return m * per_stage, m
    if layout.schedule == "interleaved-1f1b":
        chunks = min(m * v, 2 * (p - stage - 1) + (v - 1) * p + 1)
        return chunks * layers / (p * v), min(m, p - stage)
    k = min(m, p - stage)
    return k * per_stage, k


def recompute_working_bytes(spec: ModelSpec, layout: Layout) -> float:
    """Full recomputation: the one layer being recomputed holds its full activations again during
    its backward (at the layout's sp, no recomputation)."""
    if layout.recompute != "full":
        return 0.0
    return layer_activation_bytes(layout.microbatch, spec.seq, spec.hidden, spec.heads, spec.ffn, layout.tp,
                                  layout.sp, "none", spec.top_k if spec.moe else 0, layout.cp, spec.flash_attention,
                                  spec.param_bytes)


def stage_params(spec: ModelSpec, layout: Layout, stage: int) -> tuple[float, float, float]:
    """(dense, expert, one layer's gathered) parameter counts on one GPU of pipeline `stage`:
    its L/p layers' weights over tp (LayerNorms replicated), experts over ep·tp; the embedding
    (V·h/t vocabulary-parallel, positions s·h) on the first stage, the final norm and the head
    (V·h/t) on the last."""
    h, f, t = spec.hidden, spec.ffn, layout.tp
    n_layers = spec.layers / layout.pp
    moe_frac = spec.moe_share  # (L // moe_every) / L, as the cost model and count_params
    attn = 4 * h * h / t + 4 * h
    dense_mlp = 2 * h * f / t
    expert_mlp = spec.experts * 2 * h * f / (t * layout.ep) if spec.moe else 0.0
    router = spec.experts * h if spec.moe else 0
    dense = n_layers * (attn + (1 - moe_frac) * dense_mlp + moe_frac * router)
    expert = n_layers * moe_frac * expert_mlp
    if stage == 0:
        dense += spec.vocab_per_rank(t) * h + spec.seq * h
    if stage == layout.pp - 1:
        dense += 2 * h + spec.vocab_per_rank(t) * h
    layer = attn + max(dense_mlp, expert_mlp)
    return dense, expert, layer


def _stage_memory(spec: ModelSpec, layout: Layout, stage: int) -> dict[str, float]:
    dense, expert, layer = stage_params(spec, layout, stage)
    n_dense = layout.dp * layout.cp  # replicas of a dense weight (ZeRO shards over them)
    n_exp = max(1, n_dense // layout.ep)
    pb, gb, ob = spec.param_bytes, spec.grad_bytes, spec.optimizer_bytes_per_param
    z = layout.zero
    params = (dense * pb / n_dense + expert * pb / n_exp + 2 * layer * pb) if z >= 3 else (dense + expert) * pb
    # ZeRO-3 / FSDP: the gathered weights of the layer computing and the one prefetched (2 layers)
    grads = (dense / n_dense + expert / n_exp) * gb if z >= 2 else (dense + expert) * gb
    optimizer = (dense / n_dense + expert / n_exp) * ob if z >= 1 else (dense + expert) * ob
    b, s, h, t = layout.microbatch, spec.seq, spec.hidden, layout.tp
    k_top = spec.top_k if spec.moe else 0
    held, mbs = in_flight(layout, spec.layers, stage)
    moe_frac = spec.moe_share
    fl = spec.flash_attention
    ab = spec.param_bytes
    per_dense = layer_activation_bytes(b, s, h, spec.heads, spec.ffn, t, layout.sp, layout.recompute, 0, layout.cp, fl,
                                       ab)
    per_moe = (layer_activation_bytes(b, s, h, spec.heads, spec.ffn, t, layout.sp, layout.recompute, k_top, layout.cp,
                                      fl, ab)
               if moe_frac else 0.0)
    acts = held * ((1 - moe_frac) * per_dense + moe_frac * per_moe) + recompute_working_bytes(spec, layout)
    sbh = b * (s // layout.cp) * h
    div = t if layout.sp else 1
    if stage == 0:
        acts += mbs * sbh / div  # the embedding dropout's 1-byte mask, per microbatch in flight
    if stage == layout.pp - 1:
        head_mbs = layout.microbatches if (layout.schedule == "gpipe" and layout.pp > 1) else 1
        # final LN input 2sbh, head input 2sbh (/t with sp), fp32 logits for the cross entropy 4sbV/t
        acts += head_mbs * (2 * ab * sbh / div + 4.0 * b * (s // layout.cp) * spec.vocab_per_rank(t))
    return {"params": params, "grads": grads, "optimizer": optimizer, "activations": acts}


def memory_per_gpu(spec: ModelSpec, layout: Layout) -> dict[str, int]:
    """Bytes on the most loaded GPU: params, grads, optimizer, activations, total. The first and
    the last pipeline stage are computed (the first holds the most microbatches, the last the
    head's logits) and the larger total is returned."""
    return dict(_memory(spec, layout))


@lru_cache(maxsize=65536)
def _memory(spec: ModelSpec, layout: Layout) -> dict[str, int]:
    best = None
    for stage in sorted({0, layout.pp - 1}):
        mem = _stage_memory(spec, layout, stage)
        mem["total"] = sum(mem.values())
        if best is None or mem["total"] > best["total"]:
            best = mem
    return {k: int(round(v)) for k, v in best.items()}
