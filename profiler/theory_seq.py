"""Communication theory of sequence / context parallelism: DeepSpeed-Ulysses and ring attention.

(skeleton: being written for issue 14)
"""

from __future__ import annotations


# Rows are dicts of profiler.theory._row's keys: dim, phase, collective, group_size, calls, bytes,
# formula, note, step (one rank, one step; theory.predict_comm adds run, rank, traffic and phi).

ULYSSES_NOTE = ("Jacobs et al. 2023 (DeepSpeed-Ulysses): a rank's all-to-all buffer is b·s·h/P, constant "
                "when s and P grow together; Megatron SP's all-gathers move b·s·h, growing with s")


def ulysses_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    """DeepSpeed-Ulysses (runners/ulysses.py) over P ranks, each holding s/P tokens of all b sequences.

    Per layer, forward: 4 all-to-alls (q, k, v to head shards, the output back to sequence shards),
    each of the local buffer b·(s/P)·h × dtype bytes (nccl-tests' all-to-all size); backward: their
    4 mirror all-to-alls; with --recompute, the forward's 4 again inside backward. The replicated
    weights' gradients: DDP's all-reduce of Φ in buckets (theory._ddp: P ranks average them).
    """
    from profiler.theory import ACT_NOTE, _ddp, _row  # theory imports this module: import on use

    model, eb, p = m["model"], facts["eb"], m["world_size"]
    s, h, layers, heads = model["seq_len"], model["d_model"], model["n_layers"], model.get("n_heads")
    b = m.get("local_batch_size") or m.get("global_batch_size")
    calls = 4 * layers
    phases = ["forward", "backward"] + (["recompute"] if (m.get("options") or {}).get("recompute") else [])
    why = None
    if s % p or (isinstance(heads, int) and heads % p):  # the runner refuses these: a damaged run.json
        why = f"seq_len {s} and heads {heads} must divide over {p} ranks: all-to-all sizes unknown"
    elif not isinstance(b, int) or b <= 0:
        why = f"run.json batch size {b!r}: all-to-all sizes unknown"
    size = None if why else b * (s // p) * h * eb
    formula = f"4 per layer of b·(s/P)·h·{eb} = {b}·{s}/{p}·{h}·{eb} B: q, k, v to head shards, the output back"
    texts = {"forward": (formula, f"{ACT_NOTE}; {ULYSSES_NOTE}"),
             "backward": ("their 4 mirror all-to-alls per layer: the gradients back, same sizes", None),
             "recompute": ("the forward's 4 per layer again: --recompute reruns each block, all-to-alls "
                           "included, inside backward", "measured inside the backward phase (span ptprof/recompute)")}
    rows = [_row("sp", ph, "all_to_all", p, calls, None if why else calls * size, texts[ph][0], why or texts[ph][1])
            for ph in phases]
    # The weights are replicated over the sequence shards: DDP averages their gradients, as ddp does.
    return rows + [r | {"dim": "sp"} for r in _ddp(m, facts, zero1=False)]


def ring_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    return []
