"""Theory beside measurement: the communication each paradigm does per step and rank, predicted from
run.json alone (docs/theory.md has every formula), and the table that sets it beside what the
traces measured (`comm_check`).

Theory never reads traces and measurement never reads theory: `predict_comm` takes run.json
manifests, `profiler.collectives` the events, and `comm_check` joins the two.
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


def comm_check(runs: dict[str, dict | None], comm: pl.DataFrame, collectives: pl.DataFrame) -> pl.DataFrame:
    """CHECK_COLUMNS for communication: bytes per step by collective kind, volume in Φ, and for
    data-parallel runs the volume against DDP's 2Φ; measured = the in-step collectives' size_bytes.

    Per rank and profiled step the prediction is the rows for every step plus that step's own;
    both sides are averaged over the rank's measured steps, and "match" needs every step equal
    (bytes are deterministic). A step whose measurement differs from another's is named in `note`.
    """
    colls = collectives.filter(pl.col("step").is_not_null()).with_columns(pl.col("run").cast(pl.String))
    out: list[dict] = []
    for (run, rank), meas in colls.partition_by("run", "rank", as_dict=True).items():
        manifest = runs.get(run)
        steps = sorted(set(meas["step"]))
        if not isinstance(manifest, dict):
            why = "no run.json (a foreign trace): theory needs the model and the layout"
            for kind, per_step in _measured(meas, steps).items():
                out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(per_step), "no theory", why))
            continue
        pred = comm.filter((pl.col("run") == run) & (pl.col("rank") == rank))
        out += _rank_check(manifest, run, rank, pred, meas, steps)
    seen = set(colls.select("run", "rank").unique().iter_rows())
    for (run, rank), pred in comm.partition_by("run", "rank", as_dict=True).items() if comm.height else []:
        if (run, rank) not in seen:
            for kind in sorted(set(pred["collective"])):
                out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, None, "no measurement",
                                  "no collective of this rank in the profiled steps loaded"))
    return pl.DataFrame(out, schema=CHECK_COLUMNS, orient="row") if out else pl.DataFrame(schema=CHECK_COLUMNS)


def _measured(meas: pl.DataFrame, steps: list[int]) -> dict[str, list[int | None]]:
    """collective kind -> measured size_bytes per step (0 where the step has none; None where a
    collective of that kind has no size)."""
    per = meas.group_by("collective", "step").agg(b=pl.col("size_bytes").sum(), unknown=pl.col("size_bytes").is_null().any())
    out: dict[str, list] = {}
    for kind in sorted(set(per["collective"].drop_nulls())):
        rows = {s: (None if u else b) for _, s, b, u in per.filter(pl.col("collective") == kind).iter_rows()}
        out[kind] = [rows.get(s, 0) for s in steps]
    return out


def _mean(values: list) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values) / len(values)


def _check(run, rank, quantity, unit, predicted, measured, verdict, note=None) -> dict:
    ratio = measured / predicted if predicted and measured is not None else None
    return {"run": run, "rank": rank, "quantity": quantity, "unit": unit, "predicted": predicted,
            "measured": measured, "ratio": ratio, "verdict": verdict, "note": note}


def _rank_check(manifest: dict, run: str, rank: int, pred: pl.DataFrame, meas: pl.DataFrame,
                steps: list[int]) -> list[dict]:
    """The check rows of one (run, rank) with a run.json."""
    facts = predict_run(manifest)[1]
    if pred.is_empty():
        why = facts["why"] or f"no communication theory for paradigm {manifest.get('paradigm')!r}"
        return [_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(v), "no theory", why)
                for kind, v in _measured(meas, steps).items()]
    measured = _measured(meas, steps)
    out, volume_pred, volume_meas, left_out = [], [0.0] * len(steps), [0.0] * len(steps), []
    for kind in sorted(set(pred["collective"]) | set(measured)):
        rows = pred.filter(pl.col("collective") == kind)
        per_pred = [_predicted_bytes(rows, s) for s in steps]
        per_meas = measured.get(kind, [0] * len(steps))
        weight = 2.0 if kind == "all_reduce" else 1.0
        notes = [n for n in rows["note"].drop_nulls().unique().sort()] if rows.height else []
        dims = sorted(set(rows["dim"].drop_nulls())) if rows.height else []
        if len(dims) > 1:
            notes.insert(0, "dims " + ", ".join(
                f"{d} {int(rows.filter(pl.col('dim') == d)['bytes'].sum()):,} B" for d in dims))
        if (kind in POINT_TO_POINT and not rows.height) or any(p is None for p in per_pred) or any(
                v is None for v in per_meas):
            left_out.append(kind)
        if kind in POINT_TO_POINT and not rows.height:
            out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(per_meas), "no theory",
                              "no pipeline send/recv theory (profiler.theory_pipeline gave no rows)"))
            continue
        if any(p is None for p in per_pred):
            out.append(_check(run, rank, f"{kind} bytes/step", "bytes", None, _mean(per_meas), "no theory",
                              "; ".join(notes) or "sizes unknown"))
            continue
        if any(v is None for v in per_meas):
            out.append(_check(run, rank, f"{kind} bytes/step", "bytes", _mean(per_pred), None, "no measurement",
                              "the trace gives some of these collectives no size"))
            continue
        for i in range(len(steps)):
            volume_pred[i] += weight * per_pred[i]
            volume_meas[i] += weight * per_meas[i]
        if len(set(per_meas)) > 1:
            notes.append("steps differ: " + ", ".join(f"{s}: {v:,}" for s, v in zip(steps, per_meas)))
        if len(dims) == 1 and manifest.get("paradigm") == "hybrid":
            notes.insert(0, f"dim {dims[0]}")
        out.append(_check(run, rank, f"{kind} bytes/step", "bytes", _mean(per_pred), _mean(per_meas),
                          _verdict(per_pred, per_meas), "; ".join(notes) or None))
        if len(dims) > 1:
            out += _dim_split(run, rank, kind, rows, meas.filter(pl.col("collective") == kind), steps)
    phi = facts["phi_bytes"]
    if phi:
        out.append(_check(run, rank, "volume/step", "Φ", _mean(volume_pred) / phi, _mean(volume_meas) / phi,
                          _verdict(volume_pred, volume_meas),
                          f"Φ = {phi:,} B; all-reduce counted twice (reduce-scatter + all-gather)"
                          + (f"; without {', '.join(left_out)} (one side unknown)" if left_out else "")))
        textbook, named = DATA_PARALLEL.get(manifest.get("paradigm"), (None, None))
        steady = [i for i, s in enumerate(steps) if pred.filter(pl.col("step") == s).is_empty()]
        if textbook is not None and steady:
            p = sum(volume_pred[i] for i in steady) / len(steady) / (2 * phi)
            mv = sum(volume_meas[i] for i in steady) / len(steady) / (2 * phi)
            out.append(_check(run, rank, "volume / DDP's 2Φ", "×", p, mv,
                              _verdict([volume_pred[i] for i in steady], [volume_meas[i] for i in steady]),
                              f"steps {', '.join(str(steps[i]) for i in steady)} (those without one-time "
                              f"collectives); textbook {textbook:g}× ({named})"))
    return out


def _dim_split(run: str, rank: int, kind: str, rows: pl.DataFrame, meas: pl.DataFrame, steps: list[int]) -> list[dict]:
    """`<kind> bytes/step (<dim>)` rows for a kind several dims share (hybrid: FSDP's all-gathers
    beside tp's). The trace does not name a collective's group, so measured calls are told apart by
    message size: every row of a non-dp dim sends one size (bytes / calls), dp (FSDP, one size per
    unit) takes the rest. Nothing where two dims predict the same size, or dp is not among them."""
    sizes: dict[int, str] = {}
    for dim, calls, nbytes in rows.filter(pl.col("dim") != "dp").select("dim", "calls", "bytes").iter_rows():
        size = nbytes // calls if calls else None
        if size is None or sizes.get(size, dim) != dim:
            return []
        sizes[size] = dim
    dims = sorted(set(rows["dim"]))
    if "dp" not in dims:
        return []
    named = meas.with_columns(dim=pl.col("size_bytes").replace_strict(sizes, default="dp", return_dtype=pl.String))
    out = []
    for dim in dims:
        here = named.filter(pl.col("dim") == dim)
        per_meas = [int(here.filter(pl.col("step") == s)["size_bytes"].sum()) for s in steps]
        per_pred = [_predicted_bytes(rows.filter(pl.col("dim") == dim), s) for s in steps]
        if any(p is None for p in per_pred):
            continue
        shown = ", ".join(f"{b:,} B" for b, d in sorted(sizes.items()) if d != "dp")
        out.append(_check(run, rank, f"{kind} bytes/step ({dim})", "bytes", _mean(per_pred), _mean(per_meas),
                          _verdict(per_pred, per_meas),
                          f"split by message size (the trace names no group): {shown} are tp's, the rest dp's"))
    return out


def _predicted_bytes(rows: pl.DataFrame, step: int) -> int | None:
    """Bytes of `rows` in training step `step`: the every-step rows plus that step's own."""
    here = rows.filter(pl.col("step").is_null() | (pl.col("step") == step))
    if here["bytes"].null_count():
        return None
    return int(here["bytes"].sum())


def _verdict(predicted: list[float], measured: list[float]) -> str:
    # Bytes are deterministic: equal in every step, or not (a relative 1e-12 absorbs float sums of Φ).
    if all(abs(p - m) <= 1e-12 * max(abs(p), 1.0) for p, m in zip(predicted, measured)):
        return "match"
    return "above" if sum(measured) > sum(predicted) else "below"


def theory_check(runs: dict[str, dict | None], comm: pl.DataFrame, collectives: pl.DataFrame,
                 memory: pl.DataFrame, persistent: pl.DataFrame) -> pl.DataFrame:
    """CHECK_COLUMNS: each predicted quantity beside its measurement (communication, then memory)."""
    from profiler.theory_memory import memory_check  # theory_memory reads COMM/CHECK schemas from here

    parts = [comm_check(runs, comm, collectives), memory_check(memory, persistent)]
    return pl.concat([p.select(list(CHECK_COLUMNS)).cast(CHECK_COLUMNS) for p in parts])
