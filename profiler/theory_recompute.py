"""Theory of activation checkpointing (`ptprof run ... --recompute`, runners/model.py): what the
recomputation adds to communication and compute, and what it saves in activation memory.
docs/theory.md "Recomputation" has the formulas.

- Communication: each block's forward runs again inside backward (span `ptprof/recompute`), so the
  forward collectives inside blocks repeat with phase "recompute" (tp's 2 all-reduces per layer, or
  sp's all-gathers and reduce-scatters; ep's all-to-alls and routing all-reduces). FSDP's all-gather
  is a hook on the block module, outside the checkpointed body; DDP's collectives are outside blocks.
- Compute: full recomputation adds one forward of the blocks (Chen et al. 2016; Korthikanti et al.
  2022: ~33 % of a step's model FLOPs, the step being forward + 2× forward for backward).
- Memory: a block keeps only its input (b·s·h·eb) instead of its saved activations A_block, and
  holds one block's activations again during that block's backward.
"""

from __future__ import annotations

RECOMPUTE_NOTE = "--recompute: each block's forward runs again inside backward (span ptprof/recompute)"
MAX_DIM = 1 << 40  # a run.json dimension beyond this is damaged, not a model (and keeps products exact)


def _dict(x) -> dict:
    return x if isinstance(x, dict) else {}


def _dims(*values) -> bool:
    """Are these run.json values usable dimensions: positive whole numbers of sane size? (a damaged
    run.json may hold strings, bools, floats or 1e300; "ab" * n would even build a string)"""
    return all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_DIM for v in values)


def recompute_on(m: dict) -> bool:
    """Did this run recompute activations? (run.json `recompute` block, or options.recompute)"""
    m = _dict(m)
    # Only what the runners write: a dict block, or options.recompute true (a damaged "no" is not on).
    return isinstance(m.get("recompute"), dict) or _dict(m.get("options")).get("recompute") is True


def recompute_comm_rows(m: dict, rows: list[dict]) -> list[dict]:
    """The block-forward rows (theory._row's block=True) again with phase "recompute", when the run
    recomputed; [] otherwise."""
    if not recompute_on(m):
        return []
    return [r | {"phase": "recompute", "formula": f"the forward's again: {r['formula']}", "block": False,
                 "note": "; ".join(x for x in (RECOMPUTE_NOTE, r.get("note")) if x)}
            for r in rows if r.get("block") and r.get("phase") == "forward"]


def flops_per_token(model: dict) -> dict[str, float] | None:
    """Forward FLOPs per token of the reference GPT (2 per multiply-add): `blocks` (L layers: the
    q, k, v, o projections 8h², the MLP 4·mlp_ratio·h², attention scores and weighted sum 4·s·h)
    and `head` (2·h·V); None without the dims."""
    model = _dict(model)
    h, s, v, n = (model.get(k) for k in ("d_model", "seq_len", "vocab_size", "n_layers"))
    r = model.get("mlp_ratio", 4)
    if not _dims(h, s, v, n, r):
        return None
    return {"blocks": float(n * (8 * h * h + 4 * r * h * h + 4 * s * h)), "head": float(2 * h * v)}


def recompute_compute(m: dict) -> dict | None:
    """Predicted recomputation cost: `recompute_over_forward` (blocks' forward FLOPs / the whole
    forward's: the embedding lookup is free, the head is not recomputed) and `recompute_over_step`
    (/ forward + backward at 2× forward). None without model dims."""
    f = flops_per_token(_dict(m).get("model"))
    if not f or f["blocks"] + f["head"] <= 0:
        return None
    fwd = f["blocks"] + f["head"]
    return {"recompute_over_forward": f["blocks"] / fwd, "recompute_over_step": f["blocks"] / (3 * fwd)}


def block_activation_bytes(b: int, s: int, h: int, heads: int, eb: int, mlp_ratio: int = 4) -> int:
    """Bytes autograd saves for one block of runners/model.py (fp32, CPU SDPA), counted with saved-
    tensor hooks: the block input and ln2's input (2h), the two LayerNorm outputs (2h), q, k, v and
    the attention output (4h), the MLP hidden before and after GELU (2·mlp_ratio·h), per token, plus
    LayerNorm mean and rstd (4) and the attention's log-sum-exp (heads): b·s·(16h + heads + 4)·eb."""
    return b * s * ((8 + 2 * mlp_ratio) * h + heads + 4) * eb


def activation_drop(m: dict, eb: int = 4) -> dict | None:
    """Predicted saved activations per rank with and without recompute, for the data-parallel family
    (whole blocks on each rank, b = local batch): without, L·A_block; with, L·b·s·h·eb (the block
    inputs) + (A_block − b·s·h·eb) (the block being back-propagated, its input counted already).
    None where the layout is not a whole model per rank (tp, pipelines, ep, hybrid: not predicted)."""
    m = _dict(m)
    if m.get("paradigm") not in ("ddp", "zero1", "zero2", "fsdp"):
        return None
    model = _dict(m.get("model"))
    b, s, h, heads, n = m.get("local_batch_size"), *(model.get(k) for k in ("seq_len", "d_model", "n_heads", "n_layers"))
    ratio = model.get("mlp_ratio", 4)
    if not _dims(b, s, h, heads, n, ratio):
        return None
    a = block_activation_bytes(b, s, h, heads, eb, ratio)
    inp = b * s * h * eb
    without, with_ = n * a, n * inp + (a - inp)
    return {"block_bytes": a, "input_bytes": inp, "without_bytes": without, "with_bytes": with_,
            "drop_bytes": without - with_,
            "formula": f"(L−1)·(A_block − b·s·h·{eb}), A_block = b·s·({8 + 2 * ratio}h + heads + 4)·{eb} = {a:,} B"}
