"""Communication theory of sequence / context parallelism: DeepSpeed-Ulysses and ring attention.

Ring attention (runners/ring.py; Liu et al. 2023): each of the P ranks holds s/P tokens of every
sequence (zigzag: chunks r and 2P−1−r of 2P). In every layer's forward the K and V blocks travel
the ring in P−1 steps: each step a rank sends the K and V block it holds to the next rank and
receives the previous rank's, one message each of b·(s/P)·h elements (the block's heads × head_dim
= h) in the activation dtype. Backward is autograd through the ring: each step's backward sends
the gradients of the K and V blocks it received back to the rank they came from and receives the
gradients of those it sent: the same messages, reversed. With --recompute every block's forward
runs again inside backward, ring included: its forward messages again (phase `recompute`, here
and measured: the ptprof/recompute span inside ptprof/backward holds them).
The replicated weights' gradients are averaged by DDP: profiler.theory's DDP rows.

On gloo each message is a `gloo:send` / `gloo:recv` span on the main thread with its tensor's
`Input Dims` (profiler.collectives), so measured bytes equal these exactly. traffic_bytes is what
the rank sends (receives 0); phi is null: activations are not parameter bytes.
"""

from __future__ import annotations

from profiler.theory_recompute import recompute_on


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
    phases = ["forward", "backward"] + (["recompute"] if recompute_on(m) else [])
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
                           "included, inside backward", "measured in phase recompute (span ptprof/recompute, inside backward)")}
    rows = [_row("sp", ph, "all_to_all", p, calls, None if why else calls * size, texts[ph][0], why or texts[ph][1])
            for ph in phases]
    # The weights are replicated over the sequence shards: DDP averages their gradients, as ddp does.
    return rows + [r | {"dim": "sp"} for r in _ddp(m, facts, zero1=False)]


def ring_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    """Ring attention over the world (dim "cp"): per layer 2(P−1) K/V messages sent and received in
    forward, their gradients in backward, the forward ones again under --recompute; plus DDP."""
    from profiler.theory import _ddp  # theory imports this module: import at call time

    model, eb, p = m["model"], facts["eb"], m["world_size"]
    s, h, layers = model["seq_len"], model["d_model"], model["n_layers"]
    b = m.get("local_batch_size") or m.get("global_batch_size")
    recompute = bool(recompute_on(m))
    # The replicated weights' all-reduce runs over the same P ranks: named by the run's mesh dim, as ulysses does.
    rows = [r | {"dim": "cp"} for r in _ddp(m, facts, zero1=False)]
    if p == 1:
        return rows  # the whole sequence on one rank: nothing travels
    calls = 2 * (p - 1) * layers  # K and V, P−1 ring steps, every layer
    if not isinstance(b, int) or b <= 0 or s % (2 * p):
        why = f"seq_len {s} not cut into 2P = {2 * p} chunks (the runner refuses it), or no batch size in run.json"
        return rows + [_ring_row(ph, kind, p, calls, None, "K/V blocks of b·(s/P)·h", why)
                       for ph in ("forward", "backward") for kind in ("send", "recv")]
    block = b * (s // p) * h * eb
    formula = f"2 (K, V) × (P−1) × L = 2·{p - 1}·{layers} = {calls} blocks of b·(s/P)·h·{eb} = {b}·{s // p}·{h}·{eb} B"
    passes = [("forward", "the K and V blocks passed to the next rank / from the previous"),
              ("backward", "their gradients, back to the rank each block came from (autograd through the ring)")]
    if recompute:
        passes.append(("recompute", "--recompute reruns each block, ring included: measured in phase recompute "
                                    "(span ptprof/recompute, inside backward)"))
    rows = list(rows)
    for phase, note in passes:
        rows += [_ring_row(phase, kind, p, calls, calls * block, formula, note) for kind in ("send", "recv")]
    return rows


def _ring_row(phase: str, kind: str, p: int, calls: int, nbytes: int | None, formula: str, note: str) -> dict:
    sent = None if nbytes is None else (float(nbytes) if kind == "send" else 0.0)
    return {"dim": "cp", "phase": phase, "collective": kind, "group_size": p, "calls": calls, "bytes": nbytes,
            "traffic_bytes": sent, "phi": None, "formula": formula, "note": note, "step": None}
