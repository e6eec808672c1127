"""Theory beside measurement: the communication each paradigm does per step and rank, predicted from
run.json alone (docs/theory.md has every formula), and the table that sets it beside what the
traces measured (profiler.theory_check).

Theory never reads traces and measurement never reads theory: `predict_comm` takes run.json
manifests, `profiler.collectives` the events, and `profiler.theory_check` joins the two.
"""

from __future__ import annotations

import polars as pl

from profiler.theory_params import ddp_buckets, fsdp_padded_numel, mesh_coords, model_params, run_dtypes, tp_local_shape
from profiler import theory_seq
from profiler.theory_recompute import recompute_comm_rows
from profiler.theory_pipeline import PIPELINE_PARADIGMS, pipeline_p2p_rows

# One row per (run, rank, dim, phase, collective, group_size): what one rank does per step.
# bytes: nccl-tests "size" convention (all-reduce buffer, all-gather output, reduce-scatter input,
# all-to-all buffer, p2p message), the same as profiler.collectives' size_bytes, summed over calls.
# traffic_bytes: what the rank sends over a ring (bytes x the busbw factor). phi: the textbook
# volume in units of the run's parameter bytes Φ (all-reduce counts 2x, the others 1x).
# step: null for every step; else the one training step the row belongs to (DDP's one-time bucket
# rebuild, an expert-parallel step's routing-dependent all-to-alls).
COMM_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "dim": pl.String, "phase": pl.String, "collective": pl.String,
    "group_size": pl.Int64, "calls": pl.Int64, "bytes": pl.Int64, "traffic_bytes": pl.Float64, "phi": pl.Float64,
    "formula": pl.String, "note": pl.String, "step": pl.Int64,
}
# One row per (run, rank, quantity): predicted beside measured. verdict: "match", "above",
# "below" (measured vs predicted, outside the quantity's tolerance), "no theory", "no measurement".
CHECK_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "quantity": pl.String, "unit": pl.String, "predicted": pl.Float64,
    "measured": pl.Float64, "ratio": pl.Float64, "verdict": pl.String, "note": pl.String,
}
# nccl-tests bus-bandwidth factor by kind (n = group size): the share of `bytes` a rank sends on a ring.
RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n}
# Textbook volume / DDP's 2Φ of the data-parallel paradigms, named (ZeRO, Rajbhandari et al. 2020).
DATA_PARALLEL = {"ddp": (1.0, "data parallel 2Φ"), "zero1": (1.0, "DeepSpeed ZeRO-1 2Φ; torch's ZeroRedundancyOptimizer 1.5×"),
                 "zero2": (1.0, "ZeRO-2 2Φ"), "fsdp": (1.5, "ZeRO-3/FSDP 3Φ")}
POINT_TO_POINT = {"send", "recv", "send_recv"}
MAX_COUNT = 4096  # layers, experts: beyond this a run.json count is damaged, not a model we predict
MAX_BYTES = 1 << 53  # bytes or calls beyond this (an exact float64 integer) come from a damaged run.json
ACT_NOTE = "activations in the parameter dtype (the runners use no autocast)"


def _row(dim, phase, collective, group, calls, nbytes, formula, note=None, step=None, block=False) -> dict:
    # block: a forward collective inside a transformer block, run again under --recompute.
    return {"dim": dim, "phase": phase, "collective": collective, "group_size": group, "calls": calls,
            "bytes": nbytes, "formula": formula, "note": note, "step": step, "block": block}


def predict_comm(runs: dict[str, dict | None]) -> pl.DataFrame:
    """Per run with a run.json: COMM_COLUMNS, the communication each rank does per step."""
    base = {k: v for k, v in COMM_COLUMNS.items() if k not in ("traffic_bytes", "phi")}
    given = {"_given": pl.Boolean, "_traffic": pl.Float64, "_phi": pl.Float64}
    rows, phi = [], []
    for run, manifest in runs.items():
        if not isinstance(manifest, dict):
            continue  # a foreign trace: no model, no layout, nothing to predict
        run_rows, facts = predict_run(manifest)
        # Rows that bring their own traffic and phi (theory_pipeline: a receive sends nothing) keep them.
        rows += [{k: r.get(k) for k in base} | {"run": run, "_given": "traffic_bytes" in r,
                                                 "_traffic": r.get("traffic_bytes"), "_phi": r.get("phi")}
                 for r in run_rows]
        phi.append({"run": run, "_phi_bytes": facts.get("phi_bytes")})
    schema = base | given
    out = pl.DataFrame(rows, schema=schema, orient="row") if rows else pl.DataFrame(schema=schema)
    n = pl.col("group_size").cast(pl.Float64)
    factor = pl.lit(1.0)  # broadcast, send, recv: the message once
    for kind, f in RING_FACTOR.items():
        factor = pl.when(pl.col("collective") == kind).then(f(n)).otherwise(factor)
    weight = pl.when(pl.col("collective") == "all_reduce").then(2.0).otherwise(1.0)
    # A group of one rank sends nothing (a world-1 run's DDP still calls its all-reduce): no
    # traffic, no share of the textbook's volume, whatever the collective.
    alone = pl.col("group_size") == 1
    factor, weight = pl.when(alone).then(0.0).otherwise(factor), pl.when(alone).then(0.0).otherwise(weight)
    mine = pl.col("_given").not_()
    return (out.join(pl.DataFrame(phi, schema={"run": pl.String, "_phi_bytes": pl.Int64}), on="run", how="left")
            .with_columns(traffic_bytes=pl.when(mine).then(pl.col("bytes") * factor).otherwise(pl.col("_traffic")),
                          phi=pl.when(mine & (pl.col("_phi_bytes") > 0)).then(pl.col("bytes") * weight / pl.col("_phi_bytes"))
                          .otherwise(pl.col("_phi")))
            .select(list(COMM_COLUMNS)).cast(COMM_COLUMNS))


def predict_run(manifest: dict) -> tuple[list[dict], dict]:
    """(rows with a `rank` key, facts) of one run.json; facts["why"] says why there are no rows.

    A run.json whose fields have odd types or values gives no rows and the reason, never a
    traceback (discover.py checks run.json's shape, not every field theory reads).
    """
    try:
        facts = _facts(manifest)
        world, listed = manifest.get("world_size"), manifest.get("ranks")
        if not _count(world) or (len(listed) != world if isinstance(listed, list) else world > MAX_COUNT):
            return [], facts | {"why": f"run.json world_size {world!r} is not the count of its ranks"}
        if manifest.get("paradigm") in PIPELINE_PARADIGMS:  # stage-boundary p2p only: no parameter table needed
            rows = [{"rank": rank, **r} for rank in range(world) for r in pipeline_p2p_rows(manifest, rank)]
            return rows, facts | ({"why": "run.json lacks a fact pipeline theory needs"} if not rows else {})
        if facts["why"]:
            return [], facts
        rows = [{"rank": rank, **r} for rank in range(world) for r in _rank_rows(manifest, facts, rank)]
        if any(not 0 <= (r["bytes"] or 0) <= MAX_BYTES or not 0 <= (r["calls"] or 0) <= MAX_BYTES for r in rows) \
                or (facts["phi_bytes"] or 0) > MAX_BYTES:
            return [], facts | {"why": "run.json numbers give byte counts beyond 2^53: damaged, not predicted"}
        return rows, facts
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
        return [], {"params": None, "phi_bytes": None, "why": f"run.json fields theory reads are malformed ({e!r})"}


def _facts(m: dict) -> dict:
    """What the formulas need from run.json: the parameter table, element size, Φ, and why not."""
    model, moe = m.get("model") or {}, m.get("moe")
    need = ("vocab_size", "d_model", "n_layers", "seq_len")
    if not all(_count(model.get(k)) for k in need) or not _count(model.get("mlp_ratio", 4)):
        return {"params": None, "phi_bytes": None, "why": "run.json has no model dims (positive integers)"}
    # The table has a few tensors per layer and expert: a damaged count must not build billions.
    experts = (moe.get("experts") or 0) if isinstance(moe, dict) else 0
    if model["n_layers"] > MAX_COUNT or not isinstance(experts, int) or not 0 <= experts <= MAX_COUNT:
        return {"params": None, "phi_bytes": None, "why": f"run.json n_layers or experts beyond {MAX_COUNT:,}"}
    dt, note, why = run_dtypes(m)
    if why:
        return {"params": None, "phi_bytes": None, "why": why}
    params = model_params(model, moe if isinstance(moe, dict) else None)
    numel = sum(p.numel for p in params)
    if numel != model.get("n_params"):
        return {"params": None, "phi_bytes": None,
                "why": f"the model's parameter table ({numel:,}) does not match run.json n_params ({model.get('n_params')})"}
    eb = dt.param
    return {"params": params, "eb": eb, "phi_bytes": numel * eb, "why": None, "note": note}


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _rank_rows(m: dict, facts: dict, rank: int) -> list[dict]:
    paradigm = m.get("paradigm")
    if facts["params"] is None:
        return []
    rows = []
    if paradigm in ("ddp", "zero1"):
        rows = _ddp(m, facts, paradigm == "zero1")
    elif paradigm in ("fsdp", "zero2"):
        rows = _fsdp(facts, facts["params"], m["world_size"], rank=0, tp=1, reshard=paradigm == "fsdp", dim="dp")
    elif paradigm == "tp":
        b = m.get("local_batch_size") or m.get("global_batch_size")
        opts = m.get("options") or {}
        rows = _tp(m, facts, facts["params"], m["world_size"], b=b, microbatches=1, first=True, last=True,
                   sp=bool(opts.get("sp")), loss_parallel=bool(opts.get("loss_parallel")))
    elif paradigm == "ep":
        rows = _ep(m, facts, rank)
    elif paradigm == "hybrid":
        rows = _hybrid(m, facts, rank)
    elif paradigm == "ulysses":
        rows = theory_seq.ulysses_rows(m, facts, rank)
    elif paradigm == "ring":
        rows = theory_seq.ring_rows(m, facts, rank)
    rows += recompute_comm_rows(m, rows)
    if facts.get("note"):
        rows = [r | {"note": "; ".join(x for x in (r.get("note"), facts["note"]) if x)} for r in rows]
    return rows


def _ddp(m: dict, facts: dict, zero1: bool) -> list[dict]:
    """DDP: all-reduce of every gradient (Φ) in buckets during backward; ZeRO-1 adds a broadcast."""
    params, eb, phi, n = facts["params"], facts["eb"], facts["phi_bytes"], m["world_size"]
    buckets = ddp_buckets([p.numel * eb for p in reversed(params)])
    rows = [_row("dp", "backward", "all_reduce", n, buckets, phi,
                 "Φ, every gradient once in DDP buckets (textbook data parallel: 2Φ of ring traffic)")]
    # Reducer::sync_bucket_indices, once, in the forward of step 1 (DDP rebuilds its buckets in the
    # order gradients became ready in step 0): the bucket indices + their count, then the sizes.
    rows += [_row("dp", "forward", "broadcast", n, 1, 4 * (len(params) + 1),
                  "int32 × (parameter tensors + 1): DDP's rebuilt bucket indices", "once, in step 1", step=1),
             _row("dp", "forward", "broadcast", n, 1, 4 * buckets, "int32 × buckets: DDP's rebuilt bucket sizes",
                  "once, in step 1", step=1)]
    if zero1:
        rows.append(_row("dp", "optimizer", "broadcast", n, len(params), phi,
                         "Φ: torch ZeroRedundancyOptimizer broadcasts every parameter from its owner after the step",
                         "textbook ZeRO-1 (DeepSpeed): reduce-scatter Φ + all-gather Φ = 2Φ, as DDP; "
                         "torch keeps DDP's all-reduce (2Φ) and adds this broadcast: 3Φ, 1.5× DDP"))
    return rows


def _fsdp(facts: dict, params, n: int, *, rank: int, tp: int, reshard: bool, dim: str,
          pipelined: bool = False) -> list[dict]:
    """FSDP2 over `n` ranks: per unit, all-gather in forward (and again in backward when it reshards
    after forward: ZeRO-3), reduce-scatter of the gradients in backward; dim 0 padded to n."""
    units: dict[str, int] = {}
    for p in params:
        units[p.unit] = units.get(p.unit, 0) + fsdp_padded_numel(tp_local_shape(p, tp, rank), n) * facts["eb"]
    total, k = sum(units.values()), len(units)
    pad = "Σ ceil(dim0/N)·N·rest × dtype bytes over the unit's parameters" + (" (tp-local shards)" if tp > 1 else "")
    rows = [_row(dim, "forward", "all_gather", n, k, total, f"Φ padded: {pad}",
                 "pipelined: gathered at the first microbatch, held to the step's end" if pipelined else None)]
    if reshard:
        rows.append(_row(dim, "backward", "all_gather", n, k, total, f"Φ padded again: ZeRO-3 regathers in backward"))
    rows.append(_row(dim, "backward", "reduce_scatter", n, k, total, f"Φ padded: every gradient once",
                     ("textbook ZeRO-3/FSDP: 3Φ, 1.5× DDP" if reshard else "textbook ZeRO-2: 2Φ, as DDP")
                     + ("; issued after the last microbatch, outside the action spans" if pipelined else "")))
    return rows


def _tp(m: dict, facts: dict, params, t: int, *, b: int, microbatches: int, first: bool, last: bool,
        sp: bool, dim: str = "tp", fsdp: bool = False, loss_parallel: bool = False) -> list[dict]:
    """Megatron TP (runners/tp_sp.py) of the blocks in `params` (and the head when `last`), over t
    ranks, for `microbatches` passes of b sequences; `loss_parallel`: the vocabulary-parallel
    cross-entropy instead of the logits' all-gather."""
    model, eb = m["model"], facts["eb"]
    s, h, v = model["seq_len"], model["d_model"], model["vocab_size"]
    layers = len({p.layer for p in params if p.layer is not None})
    act, logits, mb = b * s * h * eb, b * s * v * eb, microbatches
    bsh = f"b·s·h·{eb} = {b}·{s}·{h}·{eb} B"
    rows = []
    if not sp:
        rows += [_row(dim, "forward", "all_reduce", t, 2 * layers * mb, 2 * layers * mb * act,
                      f"2 per layer of {bsh} (row-parallel wo, down outputs)", ACT_NOTE, block=True),
                 _row(dim, "backward", "all_reduce", t, 4 * layers * mb, 4 * layers * mb * act,
                      f"4 per layer of {bsh}: column-parallel input gradients of wq, wk, wv, up",
                      "textbook Megatron: 2 per layer (Q, K, V fused into one column-parallel GEMM)")]
    else:
        rows += [_row(dim, "forward", "all_gather", t, 2 * layers * mb, 2 * layers * mb * act,
                      f"2 per layer of {bsh}: attention and MLP inputs from sequence shards", ACT_NOTE, block=True),
                 _row(dim, "forward", "reduce_scatter", t, 2 * layers * mb, 2 * layers * mb * act,
                      f"2 per layer of {bsh}: wo and down outputs to sequence shards", block=True),
                 _row(dim, "backward", "all_gather", t, (2 * layers + first) * mb, (2 * layers + first) * mb * act,
                      f"2 per layer of {bsh} (gradients of the reduce-scatters)"
                      + (" + 1: the first block's input slice" if first else "")),
                 _row(dim, "backward", "reduce_scatter", t, 2 * layers * mb, 2 * layers * mb * act,
                      f"2 per layer of {bsh} (gradients of the all-gathers)")]
        n_ln = 4 * layers + 2 * last  # SequenceParallel LayerNorms: ln1, ln2 (weight, bias), the final norm
        if fsdp:  # FSDP2 makes each Partial gradient Replicate once, before its reduce-scatter
            rows.append(_row(dim, "backward", "all_reduce", t, n_ln, n_ln * h * eb,
                             f"{n_ln} LayerNorm parameters × h·{eb} B: their gradients, once per step, as Megatron"))
        else:
            rows.append(_row(dim, "optimizer", "all_reduce", t, 3 * n_ln, 3 * n_ln * h * eb,
                             f"3 × {n_ln} LayerNorm parameters × h·{eb} B",
                             "sequence-parallel LayerNorm gradients stay Partial DTensors: AdamW (foreach=False) "
                             "all-reduces each on each of its 3 uses; textbook Megatron: one all-reduce of them per step"))
    if last:
        if sp:
            rows += [_row(dim, "forward", "all_gather", t, mb, mb * act, f"the head's input from sequence shards: {bsh}"),
                     _row(dim, "backward", "reduce_scatter", t, mb, mb * act, f"the head's input gradient: {bsh}")]
        else:
            rows.append(_row(dim, "backward", "all_reduce", t, mb, mb * act,
                             f"the vocabulary-parallel head's input gradient: {bsh}"))
        if loss_parallel:
            rows.append(_tp_loss_parallel_row(dim, t, b * s, mb))
        else:
            rows.append(_row(dim, "forward", "all_gather", t, mb, mb * logits, f"logits for the loss: b·s·V·{eb} B",
                             "Megatron instead runs a vocabulary-parallel cross-entropy (all-reduces of b·s): "
                             "--loss-parallel"))
    return rows


def _tp_loss_parallel_row(dim: str, t: int, tokens: int, mb: int) -> dict:
    """torch's loss_parallel (torch/distributed/tensor/parallel/loss.py, 2.13): the forward
    all-reduces three fp32 numbers per token over the vocabulary shards (Megatron's
    vocabulary-parallel cross-entropy); its fused backward communicates nothing."""
    return _row(dim, "forward", "all_reduce", t, 3 * mb, 3 * mb * tokens * 4,
                f"3 of b·s·4 = {tokens}·4 B: the row max, the sum of exponentials, the target's logit",
                "vocabulary-parallel cross-entropy in fp32 (lm_loss casts); replaces the logits' all-gather "
                "of b·s·V; the loss's backward needs none")


def _ep(m: dict, facts: dict, rank: int) -> list[dict]:
    """Expert parallel (runners/expert_parallel.py): per MoE layer, the routing statistics, the
    token counts, dispatch and combine all-to-alls in forward and backward, then one all-reduce
    of the replicated parameters' gradients."""
    moe, n, eb, h = m.get("moe") or {}, m["world_size"], facts["eb"], m["model"]["d_model"]
    experts, layers = moe.get("experts") or 0, moe.get("moe_layers") or []
    shared = sum(p.numel for p in facts["params"] if p.expert is None) * eb
    rows = [_row("ep", "backward", "all_reduce", n, 1, shared,
                 "Φ of the replicated (non-expert) parameters, one flat all-reduce",
                 "experts' gradients need none: the all-to-all's backward brought them home")]
    k = len(layers)
    rows += [_row("ep", "forward", "all_reduce", n, k, k * experts * 8, "int64 × experts: first-choice counts", block=True),
             _row("ep", "forward", "all_reduce", n, k, k * experts * eb, "experts × dtype: router probability sums",
                  block=True),
             _row("ep", "backward", "all_reduce", n, k, k * experts * eb, "their gradient"),
             _row("ep", "forward", "all_to_all", n, k, k * n * 8, "int64 × ranks: split sizes", block=True)]
    by_rank = moe.get("routing_by_rank") or []
    if experts and n and experts % n:  # the runner refuses this; a run.json saying it is damaged
        return rows + [_row("ep", ph, "all_to_all", n, 2 * k, None, "experts spread evenly over ranks",
                            f"{experts} experts do not divide over {n} ranks: all-to-all sizes unknown",
                            block=ph == "forward")
                       for ph in ("forward", "backward")]
    local = experts // n if n else 0
    b = m.get("local_batch_size") or (m.get("global_batch_size") or 0) // max(n, 1)
    tokens = b * m["model"]["seq_len"]
    cap = max(1, int((moe.get("capacity_factor") or 0) * tokens * (moe.get("top_k") or 0) / experts)) if experts else 0
    textbook = f"textbook (GShard, capacity-padded): experts·C·h·{eb} = {experts}·{cap}·{h}·{eb} B each, ×4 per layer"
    if len(by_rank) != n or not local:
        note = "per-rank routing counts not in run.json (older run): all-to-all sizes unknown"
        return rows + [_row("ep", ph, "all_to_all", n, 2 * k, None, textbook, note, block=ph == "forward")
                       for ph in ("forward", "backward")]
    for step in range(len(by_rank[rank])):
        # sent: this rank's kept (token, expert) pairs; received: every rank's pairs for its experts.
        sent = [sum(layer["tokens_per_expert"]) for layer in by_rank[rank][step]]
        recv = [sum(by_rank[r][step][i]["tokens_per_expert"][e] for r in range(n) for e in range(rank * local, (rank + 1) * local))
                for i in range(k)]
        fwd = sum(sent) * (h + 1) * eb + sum(recv) * h * eb
        bwd = sum(sent) * h * eb + sum(recv) * (h + 1) * eb
        rows += [_row("ep", "forward", "all_to_all", n, 2 * k, fwd,
                      f"dispatch sent·(h+1)·{eb} (the expert index travels with each row) + combine received·h·{eb}; "
                      + textbook, f"routing of step {step}: {sum(sent)} pairs sent, {sum(recv)} received", step=step,
                      block=True),
                 _row("ep", "backward", "all_to_all", n, 2 * k, bwd,
                      f"the gradients back: sent·h·{eb} + received·(h+1)·{eb}", None, step=step)]
    return rows


def _hybrid(m: dict, facts: dict, rank: int) -> list[dict]:
    """Hybrid (runners/hybrid.py): FSDP2 over dp of each stage's tp shards, Megatron TP inside the
    stage per microbatch, pipeline sends between stages (profiler.theory_pipeline)."""
    dp, pp, tp = (m.get("mesh") or {}).get("dp", 1), (m.get("mesh") or {}).get("pp", 1), (m.get("mesh") or {}).get("tp", 1)
    at = mesh_coords(rank, pp=pp, tp=tp)
    tp_i, pp_i = at["tp"], at["pp"]
    sp = bool((m.get("hybrid") or {}).get("sp"))
    pipe = m.get("pipeline")
    params = facts["params"]
    if pp > 1 and pipe:
        stages = [s for s, r in enumerate(pipe["stage_to_rank"]) if r == pp_i]
        mb, b = pipe["microbatches"], pipe["microbatch_size"]
        last_stage = pipe.get("loss_stage", pipe["num_stages"] - 1)
    else:
        stages, mb, b, last_stage = [0], 1, (m.get("global_batch_size") or 0) // dp, 0
    rows = []
    for s in stages:
        if pp > 1 and pipe:
            lo, hi = pipe["stage_layers"][s]
            layers = set(range(lo, hi))
            first, last = lo == 0, s == last_stage
            part = [p for p in params if (p.layer in layers) or (p.unit == "emb" and first) or (p.unit == "head" and last)]
        else:
            first, last, part = True, True, params
        if tp > 1:
            rows += _tp(m, facts, part, tp, b=b, microbatches=mb, first=first, last=last, sp=sp, fsdp=dp > 1)
        if dp > 1:
            rows += _fsdp(facts, part, dp, rank=tp_i, tp=tp, reshard=pp == 1, dim="dp", pipelined=pp > 1)
    if pp > 1:
        rows += pipeline_p2p_rows(m, rank)
    return rows
