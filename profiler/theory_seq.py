"""Communication theory of sequence / context parallelism: DeepSpeed-Ulysses and ring attention.

Ring attention (runners/ring.py; Liu et al. 2023): each of the P ranks holds s/P tokens of every
sequence (zigzag: chunks r and 2P−1−r of 2P). In every layer's forward the K and V blocks travel
the ring in P−1 steps: each step a rank sends the K and V block it holds to the next rank and
receives the previous rank's, one message each of b·(s/P)·h elements (the block's heads × head_dim
= h) in the activation dtype. Backward is autograd through the ring: each step's backward sends
the gradients of the K and V blocks it received back to the rank they came from and receives the
gradients of those it sent: the same messages, reversed. With --recompute every block's forward
runs again inside backward, ring included: its forward messages again, in the backward phase.
The replicated weights' gradients are averaged by DDP: profiler.theory's DDP rows.

On gloo each message is a `gloo:send` / `gloo:recv` span on the main thread with its tensor's
`Input Dims` (profiler.collectives), so measured bytes equal these exactly. traffic_bytes is what
the rank sends (receives 0); phi is null: activations are not parameter bytes.
"""

from __future__ import annotations


# Rows are dicts of profiler.theory._row's keys: dim, phase, collective, group_size, calls, bytes,
# formula, note, step (one rank, one step; theory.predict_comm adds run, rank, traffic and phi).


def ulysses_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    return []


def ring_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    """Ring attention over the world (dim "cp"): per layer 2(P−1) K/V messages sent and received in
    forward, their gradients in backward, the forward ones again under --recompute; plus DDP."""
    from profiler.theory import _ddp  # theory imports this module: import at call time

    model, eb, p = m["model"], facts["eb"], m["world_size"]
    s, h, layers = model["seq_len"], model["d_model"], model["n_layers"]
    b = m.get("local_batch_size") or m.get("global_batch_size")
    recompute = bool((m.get("options") or {}).get("recompute"))
    rows = _ddp(m, facts, zero1=False)
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
        passes.append(("backward", "--recompute: the forward's ring again, inside backward"))
    rows = list(rows)
    for phase, note in passes:
        rows += [_ring_row(phase, kind, p, calls, calls * block, formula, note) for kind in ("send", "recv")]
    return rows


def _ring_row(phase: str, kind: str, p: int, calls: int, nbytes: int | None, formula: str, note: str) -> dict:
    sent = None if nbytes is None else (float(nbytes) if kind == "send" else 0.0)
    return {"dim": "cp", "phase": phase, "collective": kind, "group_size": p, "calls": calls, "bytes": nbytes,
            "traffic_bytes": sent, "phi": None, "formula": formula, "note": note, "step": None}
