"""Theory of persistent memory: parameters, gradients and optimizer state per rank (the ZeRO
table), the 16 bytes/parameter rule, what each ZeRO stage would hold for the same model, and the
activation share of a memory peak.

The model is runners/model.py's GPT, rebuilt here from run.json's dims (never by importing it):
untied embeddings and head, LayerNorm weight + bias, linear layers without bias, MLP hidden
mlp_ratio*d (4), and in an MoE model (options.experts > 0) an MoE FFN (router + experts) in every
moe_every-th block (2), starting with the second. Each rank's tensors are then cut as the runners
cut them (pipeline stages, Megatron TP, expert parallelism) and laid out over the data-parallel
group as the paradigm does (replicated, ZeroRedundancyOptimizer, FSDP2). The numbers are what
run.json's `ranks[].memory` measures (docs/run-layout.md "Persistent memory: what is counted"):
storages, so FSDP2's padding counts. Formulas: docs/theory.md "Persistent memory".
"""

from __future__ import annotations

import math

import polars as pl

from profiler.discover import manifest_field
from profiler.theory_recompute import activation_drop, recompute_on
from profiler.theory_params import Dtypes, chunk_size, mesh_coords, model_params, run_dtypes, tp_local_shape

# Per (run, rank): the predicted persistent bytes of this run's layout. n_params: elements of the
# rank's parameters at rest (its shards, unpadded). params_bytes: held while training (FSDP2
# zero2: unsharded + shard); params_at_rest_bytes: after the optimizer step (shards only).
MEMORY_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "n_params": pl.Int64, "params_bytes": pl.Int64, "grads_bytes": pl.Int64,
    "optimizer_bytes": pl.Int64, "total_bytes": pl.Int64, "rule_bytes_per_param": pl.Float64, "formula": pl.String,
    "params_at_rest_bytes": pl.Int64, "layout": pl.String, "dp": pl.Int64, "note": pl.String,
    # pipedream's weight stashing: the most stashed weight copies held at once, (P - 1 - s) x the
    # stage's parameter bytes on stage s; null for every other paradigm (nothing stashed).
    "stashed_params_bytes": pl.Int64,
}
# Per (run, layout): what every rank would hold under each data-parallel layout at this run's N
# (the rank holding the most, `rank`).
WHATIF_COLUMNS = {
    "run": pl.String, "layout": pl.String, "dp": pl.Int64, "params_bytes": pl.Int64, "grads_bytes": pl.Int64,
    "optimizer_bytes": pl.Int64, "total_bytes": pl.Int64, "current": pl.Boolean,
    "rank": pl.Int32, "saved_bytes": pl.Int64, "note": pl.String,
}
# Per (run, rank, mem_device): the activation (transient) share of the allocated-memory peak.
ACTIVATION_COLUMNS = {
    "run": pl.String, "rank": pl.Int32, "mem_device": pl.String, "peak_allocated_bytes": pl.Int64,
    "persistent_bytes": pl.Int64, "other_bytes": pl.Int64, "footprint_bytes": pl.Int64, "activation_bytes": pl.Int64,
    "activation_pct": pl.Float64, "basis": pl.String, "note": pl.String,
}

LAYOUTS = ["ddp", "zero1", "zero2", "fsdp"]  # replicated, ZeRO-1, ZeRO-2, ZeRO-3 (ptprof's paradigm names)
STEP_BYTES = 4  # torch AdamW's per-parameter `step`: a float32 scalar tensor
CHECK_TOLERANCE = 0.01  # persistent memory "match": within 1 % of the theory
MLP_RATIO, MOE_EVERY = 4, 2  # runners/model.py GPTConfig defaults (run.json's model block may override)


def zero1_partition(numels: list[int], dp: int) -> list[list[int]]:
    """torch's ZeroRedundancyOptimizer partition: indices of the tensors each rank steps. Largest
    first (a stable sort), each to the rank with the fewest elements so far (the lowest on a tie)."""
    order = sorted(range(len(numels)), key=lambda i: numels[i], reverse=True)
    sizes, parts = [0] * dp, [[] for _ in range(dp)]
    for i in order:
        r = sizes.index(min(sizes))
        parts[r].append(i)
        sizes[r] += numels[i]
    return parts


def layout_bytes(shapes: list[tuple[int, ...]], layout: str, dp: int, dp_rank: int, dt: Dtypes) -> dict[str, int]:
    """Persistent bytes of one rank holding `shapes` (its local tensors before data parallelism)
    under `layout` over `dp` ranks, as run.json measures them.

    - ddp: everything replicated (Ψ each).
    - zero1 (ZeroRedundancyOptimizer): whole tensors partitioned for the optimizer state only.
    - zero2 / fsdp (FSDP2 fully_shard): each tensor's dim 0 cut by torch.chunk into dp chunks of
      c = ceil(d0/dp) rows; every rank stores a chunk padded to c rows, and an all-gather output of
      dp*c rows. Gradients are views of the reduce-scatter output (padded chunks); the optimizer
      state is zeros_like the unpadded chunk. zero2 (reshard_after_forward=False) holds the
      gathered parameters beside the shard while training; fsdp only the shard.
    Optimizer: 2 states (+ a master copy) per element and a 4-byte `step` per tensor stepped.
    """
    numel = [math.prod(s) for s in shapes]
    full = sum(numel)
    if layout in ("ddp", "zero1") or dp <= 1:
        stepped = list(range(len(shapes))) if layout != "zero1" or dp <= 1 else zero1_partition(numel, dp)[dp_rank]
        opt = sum(numel[i] * dt.optimizer_per_param + STEP_BYTES for i in stepped)
        return {"n_params": full, "params_bytes": full * dt.param, "params_at_rest_bytes": full * dt.param,
                "grads_bytes": full * dt.grad, "optimizer_bytes": opt}
    padded_shard = padded_full = own = 0
    for s, n in zip(shapes, numel):
        rest = n // s[0] if s[0] else 0
        c = -(-s[0] // dp)
        padded_shard += c * rest
        padded_full += c * dp * rest
        own += chunk_size(s[0], dp, dp_rank) * rest
    at_rest = padded_shard * dt.param
    training = at_rest + (padded_full * dt.param if layout == "zero2" else 0)
    return {"n_params": own, "params_bytes": training, "params_at_rest_bytes": at_rest,
            "grads_bytes": padded_shard * dt.grad,
            "optimizer_bytes": own * dt.optimizer_per_param + STEP_BYTES * len(shapes)}


def zero_table(n_params: float, dp: int, *, param_bytes: float = 2, grad_bytes: float = 2,
               optimizer_bytes: float = 12) -> dict[str, dict[str, float]]:
    """The textbook ZeRO table (Rajbhandari et al. 2020, Fig. 1): bytes per device of params,
    grads and optimizer state for Ψ = n_params on N = dp devices. ddp: (2+2+K)Ψ; zero1: 2Ψ + 2Ψ +
    KΨ/N; zero2: 2Ψ + (2+K)Ψ/N; fsdp (ZeRO-3): (2+2+K)Ψ/N. No padding, no step scalars."""
    p, g, o = n_params * param_bytes, n_params * grad_bytes, n_params * optimizer_bytes
    return {"ddp": {"params": p, "grads": g, "optimizer": o},
            "zero1": {"params": p, "grads": g, "optimizer": o / dp},
            "zero2": {"params": p, "grads": g / dp, "optimizer": o / dp},
            "fsdp": {"params": p / dp, "grads": g / dp, "optimizer": o / dp}}


def rule_formula(dt: Dtypes) -> str:
    """The bytes/parameter rule, its terms named."""
    if dt.master:
        return (f"mixed-precision Adam: {dt.param} (param) + {dt.grad} (grad) + {dt.optimizer_per_param} "
                f"(master {dt.master} + exp_avg {dt.state} + exp_avg_sq {dt.state}) = {dt.per_param} B/param")
    return (f"AdamW at {8 * dt.param}-bit: {dt.param} (param) + {dt.grad} (grad) + {dt.state} (exp_avg) "
            f"+ {dt.state} (exp_avg_sq) = {dt.per_param} B/param")


# Upper bounds on (vocab_size, d_model, n_layers, seq_len) and on world_size that every real model
# and job stays under, and that keep 16 B/param of any such model inside Int64.
PLAUSIBLE_DIMS = (2**24, 2**18, 2**14, 2**24)
MAX_WORLD = 2**20
MAX_EXPERTS = 2**14
MAX_TENSOR_GROUPS = 2**16  # layers x experts: the parameter table stays small enough to build


def _int(v, default: int | None = None) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else default


def rank_layouts(manifest: dict) -> tuple[list[dict], str | None]:
    """Per rank of a run: its local tensor shapes (after pp, tp, ep), its data-parallel layout,
    degree and rank. ([], why) when run.json lacks what the theory needs."""
    model = manifest_field(manifest, "model")
    model = model if isinstance(model, dict) else {}
    dims = [_int(model.get(k)) for k in ("vocab_size", "d_model", "n_layers", "seq_len")]
    if any(v is None or v <= 0 for v in dims):
        return [], "run.json has no model dims (vocab_size, d_model, n_layers, seq_len): no memory theory"
    vocab, d, n_layers, seq = dims
    # run.json is user data: dims past any real model would overflow the Int64 byte columns.
    if any(v > limit for v, limit in zip(dims, PLAUSIBLE_DIMS)):
        return [], f"run.json's model dims {dims} are beyond any real model: no memory theory"
    _, _, why = run_dtypes(manifest)
    if why:
        return [], f"{why}: no memory theory"
    opts = manifest.get("options") if isinstance(manifest.get("options"), dict) else {}
    paradigm = manifest.get("paradigm")
    world = _int(manifest.get("world_size"))
    mesh = manifest.get("mesh") if isinstance(manifest.get("mesh"), dict) else {}
    pipe = manifest.get("pipeline") if isinstance(manifest.get("pipeline"), dict) else None
    # Only ep builds the MoE model (run.json of older runs recorded --experts for every paradigm).
    experts = (_int(opts.get("experts"), 0) or 0) if paradigm == "ep" else 0
    if not 0 <= experts <= MAX_EXPERTS:
        return [], f"run.json's {experts} experts are beyond any real model: no memory theory"
    if not world or world > MAX_WORLD:
        return [], "run.json has no plausible world_size: no memory theory"
    if paradigm == "dp":  # DataParallel: one process holds the whole model on its first GPU, as ddp
        mesh = {}  # (its dp degree counts GPUs, not processes; the replicas live only inside a step)
    dp, pp, tp = (_int(mesh.get(k), 1) for k in ("dp", "pp", "tp"))
    ep = _int(mesh.get("ep"), 1)
    # Sequence / context parallel ranks (ulysses "sp", ring "cp") hold the whole model, as ddp.
    seq_par = _int(mesh.get("sp"), 1) * _int(mesh.get("cp"), 1)
    if dp * pp * tp * ep * seq_par != world:
        return [], f"mesh {mesh} does not multiply to world_size {world}: no memory theory"
    if paradigm in ("ddp", "zero1", "zero2", "fsdp"):
        layout = paradigm
    elif paradigm == "hybrid":
        layout = "ddp" if dp == 1 else ("zero2" if pp > 1 else "fsdp")  # pp>1: reshard_after_forward=False
    else:
        layout = "ddp"  # tp, ep, pipelines, ulysses and ring replicate (no data-parallel sharding)
    if pp > 1:
        if not pipe or not isinstance(pipe.get("stage_layers"), list) or not isinstance(pipe.get("stage_to_rank"), list):
            return [], "run.json's pipeline block has no stage_layers / stage_to_rank: no memory theory"
        stage_layers, stage_to_rank = pipe["stage_layers"], pipe["stage_to_rank"]
        pairs = all(isinstance(x, list) and len(x) == 2 and all(_int(v) is not None for v in x) for x in stage_layers)
        if not pairs or len(stage_layers) != len(stage_to_rank):
            return [], "run.json's pipeline stage_layers / stage_to_rank are not [first, end) pairs, one per stage: no memory theory"
    if experts and ep > 1 and experts % ep:
        return [], f"{experts} experts do not divide over {ep} expert-parallel ranks: no memory theory"
    mlp_ratio = model.get("mlp_ratio", MLP_RATIO)
    if _int(mlp_ratio) is None or mlp_ratio <= 0:
        return [], f"run.json's model.mlp_ratio {mlp_ratio!r} is not a positive integer: no memory theory"
    if n_layers * max(experts, 1) > MAX_TENSOR_GROUPS:
        return [], f"{n_layers} layers x {experts} experts is beyond any real model: no memory theory"
    # The one parameter table of the reference GPT (profiler.theory_params), MoE FFNs in every
    # moe_every-th block from the second (runners/model.py GPTConfig.is_moe_layer).
    moe_every = _int(model.get("moe_every"), MOE_EVERY)
    moe = {"experts": experts, "moe_layers": [i for i in range(n_layers) if i % moe_every == moe_every - 1]} if experts else None
    params = model_params({"vocab_size": vocab, "d_model": d, "n_layers": n_layers, "seq_len": seq,
                           "mlp_ratio": mlp_ratio}, moe)
    n_params = _int(model.get("n_params"))
    if n_params is not None and sum(p.numel for p in params) != n_params:
        return [], (f"the model's parameter table ({sum(p.numel for p in params):,}) does not match run.json "
                    f"n_params ({n_params:,}): no memory theory")
    out = []
    for rank in range(world):
        at = mesh_coords(rank, pp=pp, tp=tp, ep=ep)
        ep_i, tp_i, pp_i, dp_i = at["ep"], at["tp"], at["pp"], at["dp"]
        if pp > 1:
            # A stage keeps its blocks, the embeddings when first and the final norm and head when last.
            tensors = []
            last = len(stage_layers) - 1
            for s, (r, (lo, hi)) in enumerate(zip(stage_to_rank, stage_layers)):
                if r == pp_i:
                    tensors += [p for p in params if (p.layer is not None and lo <= p.layer < hi)
                                or (p.unit == "emb" and s == 0) or (p.unit == "head" and s == last)]
        else:
            tensors = params
        if experts and ep > 1:
            local = experts // ep  # expert e lives on rank e // (E / world)
            tensors = [t for t in tensors if t.expert is None or t.expert // local == ep_i]
        shapes = [tp_local_shape(t, tp, tp_i) for t in tensors]
        out.append({"rank": rank, "shapes": shapes, "layout": layout, "dp": dp, "dp_rank": dp_i})
    return out, None


def state_on_host(manifest: dict | None) -> bool:
    """True where the run kept its persistent state in host memory though it trained on a device
    (fsdp --offload: run.json `offload.state_device` "cpu"; older files: options.offload)."""
    where = manifest_field(manifest, "offload", "state_device")
    return where == "cpu" if where is not None else manifest_field(manifest, "options", "offload") is True


OFFLOAD_NOTE = ("fsdp --offload: the persistent parameters, gradients and optimizer state (run.json memory, "
                "theory) are in host memory; the GPU holds none of them between uses, only what a unit gathers")


def memory_notes(runs: dict[str, dict | None]) -> list[str]:
    """Why a run with a run.json has no memory theory, and where its persistent state is in host
    memory (one line per such run), for the warnings."""
    notes = []
    for run, manifest in runs.items():
        if isinstance(manifest, dict):
            _, why = rank_layouts(manifest)
            if why:
                notes.append(f"run {run}: {why}")
            if state_on_host(manifest):
                notes.append(f"run {run}: {OFFLOAD_NOTE}")
    return notes


def predict_memory(runs: dict[str, dict | None]) -> pl.DataFrame:
    """MEMORY_COLUMNS for every rank of every run with a run.json."""
    rows = []
    for run, manifest in runs.items():
        if not isinstance(manifest, dict):
            continue
        ranks, why = rank_layouts(manifest)
        dt, note, _ = run_dtypes(manifest)
        if state_on_host(manifest):
            note = "; ".join(filter(None, [note, "in host memory (fsdp --offload), not on the GPU"]))
        for r in ranks:
            b = layout_bytes(r["shapes"], r["layout"], r["dp"], r["dp_rank"], dt)
            if sum(b.values()) >= 2**63:  # e.g. absurd expert counts: no number that overflows the frame
                continue
            rows.append({"run": run, "rank": r["rank"], **b,
                         "stashed_params_bytes": stashed_params_bytes(manifest, r["rank"], b["params_bytes"]),
                         "total_bytes": b["params_bytes"] + b["grads_bytes"] + b["optimizer_bytes"],
                         "rule_bytes_per_param": float(dt.per_param), "formula": rule_formula(dt),
                         "layout": r["layout"], "dp": r["dp"], "note": note})
    return pl.DataFrame(rows, schema=MEMORY_COLUMNS)


def stashed_params_bytes(manifest: dict, rank: int, params_bytes: int) -> int | None:
    """PipeDream's stashed weights on stage s = rank (one stage per rank): (P - 1 - s) x the stage's
    parameter bytes. Its P - s in-flight microbatches (its w = P-1-s warmup forwards and the one in
    its forward-backward pair) used P - s weight versions (Narayanan et al. 2019, weight stashing),
    the newest of which is the live weights: w copies besides them. None for other paradigms."""
    if manifest.get("paradigm") != "pipedream":
        return None
    p = _int(manifest.get("world_size"))
    return (p - 1 - rank) * params_bytes if p and 0 <= rank < p else None


def memory_whatif(runs: dict[str, dict | None]) -> pl.DataFrame:
    """WHATIF_COLUMNS: ddp, zero1, zero2, zero3/fsdp for each run's model and data-parallel degree."""
    rows = []
    for run, manifest in runs.items():
        if not isinstance(manifest, dict):
            continue
        ranks, _ = rank_layouts(manifest)
        if not ranks:
            continue
        dt, _, _ = run_dtypes(manifest)
        dp = ranks[0]["dp"]
        current = ranks[0]["layout"]
        note = None if dp > 1 else "data-parallel degree 1: ZeRO stages shard nothing"
        per_layout = {}
        for layout in LAYOUTS:
            worst = None
            for r in ranks:
                b = layout_bytes(r["shapes"], layout, dp, r["dp_rank"], dt)
                total = b["params_bytes"] + b["grads_bytes"] + b["optimizer_bytes"]
                if worst is None or total > worst["total_bytes"]:
                    worst = {**b, "total_bytes": total, "rank": r["rank"]}
            per_layout[layout] = worst
        base = per_layout[current]["total_bytes"]
        for layout, w in per_layout.items():
            rows.append({"run": run, "layout": layout, "dp": dp, **{k: w[k] for k in
                         ("params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes", "rank")},
                         "current": layout == current, "saved_bytes": base - w["total_bytes"], "note": note})
    return pl.DataFrame(rows, schema=WHATIF_COLUMNS)


MEASURED = ["params_bytes", "params_at_rest_bytes", "grads_bytes", "optimizer_bytes", "stashed_params_bytes"]


def memory_check(memory: pl.DataFrame, persistent: pl.DataFrame) -> pl.DataFrame:
    """profiler.theory.CHECK_COLUMNS rows: predicted params/grads/optimizer bytes per rank beside
    run.json's measured ones (profiler.memory.persistent_memory)."""
    from profiler.theory import CHECK_COLUMNS

    if memory.is_empty():
        return pl.DataFrame(schema=CHECK_COLUMNS)
    keys = ["run", "rank"]
    pred = memory.select(*keys, *[c for c in MEASURED if c in memory.columns]).cast({"run": pl.String, "rank": pl.Int32}).unpivot(
        index=keys, variable_name="quantity", value_name="predicted")
    have = [c for c in MEASURED if c in persistent.columns]
    meas = (persistent.select(*keys, *have).cast({"run": pl.String, "rank": pl.Int32})
            .unpivot(index=keys, variable_name="quantity", value_name="measured")
            if have and persistent.height else pl.DataFrame(schema={"run": pl.String, "rank": pl.Int32,
                                                                  "quantity": pl.String, "measured": pl.Int64}))
    both = pred.join(meas.cast({"measured": pl.Int64}), on=[*keys, "quantity"], how="left")
    # Stashed weights are a row only where the theory has them (pipedream).
    both = both.filter((pl.col("quantity") != "stashed_params_bytes") | pl.col("predicted").is_not_null())
    ok = pl.col("predicted").is_not_null() & (pl.col("predicted") > 0) & pl.col("measured").is_not_null()
    ratio = pl.when(ok).then(pl.col("measured") / pl.col("predicted"))
    verdict = (pl.when(pl.col("predicted").is_null()).then(pl.lit("no theory"))
               .when(pl.col("measured").is_null()).then(pl.lit("no measurement"))
               .when(pl.col("predicted") == 0).then(pl.when(pl.col("measured") == 0).then(pl.lit("match")).otherwise(pl.lit("above")))
               .when((pl.col("ratio") - 1).abs() <= CHECK_TOLERANCE).then(pl.lit("match"))
               .when(pl.col("ratio") > 1).then(pl.lit("above")).otherwise(pl.lit("below")))
    return (both.with_columns(ratio=ratio).with_columns(verdict=verdict)
            .with_columns(unit=pl.lit("bytes"), note=pl.lit(None, pl.String),
                          predicted=pl.col("predicted").cast(pl.Float64), measured=pl.col("measured").cast(pl.Float64))
            .with_columns(quantity=pl.lit("memory.") + pl.col("quantity"))
            .select(list(CHECK_COLUMNS)).cast(CHECK_COLUMNS).sort("run", "rank", "quantity"))


# Paradigms whose gradients are views of DDP's buckets (gradient_as_bucket_view=True), allocated
# when the model is wrapped: never freed by zero_grad, so never in a CPU curve, and held at rest
# on a device (runners/ddp.py, ring.py, ulysses.py wrap their model in DDP so).
BUCKETED_GRADS = ("ddp", "zero1", "ring", "ulysses")


def activation_peak(memory_peaks: pl.DataFrame, memory: pl.DataFrame, runs: dict[str, dict | None]) -> pl.DataFrame:
    """ACTIVATION_COLUMNS: how much of each rank's allocated-memory peak is activations (transient).

    The rule depends on what the `[memory]` counter sees (profiler/memory.py):
    - a device (CUDA, ...): the caching allocator's counter includes everything, so
      activation = peak − persistent (params + grads + optimizer, predicted) − other, footprint = peak.
      `other` is what the device holds all through the steps besides the model's state: the floor
      (memory_peaks: the level every step comes back down to) less what is held at rest then
      (parameters at rest, optimizer state, DDP's gradient buckets): cuBLAS's workspaces (64 MiB
      on an H100), the batch, caches.
      Without it a small model's "activations" were mostly cuBLAS's workspace (an H100, the
      tiny model: 66.9 MiB of a 68.9 MiB peak, of which 64 MiB workspace);
    - CPU: the counter only sees allocations made while profiling ran. Parameters, optimizer state
      and DDP's gradient buckets were allocated before and are not in the curve; what each step
      allocates again is (gradients freed by zero_grad(set_to_none=True), FSDP2's gathered
      parameters). So activation = peak − those re-allocated bytes, and the footprint at the peak
      = peak + what was allocated before.
    With the state in host memory (fsdp --offload) a device holds no persistent bytes: activation
    = peak, which then includes the units' gathered parameters and gradients while they run.
    pipedream's stashed weight copies (predicted `stashed_params_bytes`, made by the updates while
    profiling ran) are not activations: persistent on a device, re-allocated on CPU.
    activation_pct = activation / footprint. A subtraction below 0 is clamped to 0 with a note;
    without a prediction (no run.json) the share is null. A GPU rank's host (cpu) curve is left out.
    """
    if memory_peaks.is_empty():
        return pl.DataFrame(schema=ACTIVATION_COLUMNS)
    floor = pl.col("floor_allocated_bytes") if "floor_allocated_bytes" in memory_peaks.columns else pl.lit(None)
    peaks = memory_peaks.select("run", "rank", "mem_device", "peak_allocated_bytes", floor.alias("floor_bytes")).cast(
        {"run": pl.String, "rank": pl.Int32, "peak_allocated_bytes": pl.Int64, "floor_bytes": pl.Int64})
    # A rank with a device curve: its cpu curve is host memory, not where the model lives.
    on_device = peaks.filter(pl.col("mem_device") != "cpu").select("run", "rank").unique()
    peaks = pl.concat([peaks.filter(pl.col("mem_device") != "cpu"),
                       peaks.filter(pl.col("mem_device") == "cpu").join(on_device, on=["run", "rank"], how="anti")])
    paradigm = {run: (m or {}).get("paradigm") if isinstance(m, dict) else None for run, m in runs.items()}
    on_host = {run for run, m in runs.items() if isinstance(m, dict) and state_on_host(m)}
    pred = {(r["run"], r["rank"]): r for r in memory.iter_rows(named=True)}
    rows = []
    for run, rank, device, peak, floor_bytes in peaks.sort("run", "rank", "mem_device").iter_rows():
        p = pred.get((run, rank))
        row = {"run": run, "rank": rank, "mem_device": device, "peak_allocated_bytes": peak, "persistent_bytes": None,
               "other_bytes": None, "footprint_bytes": None, "activation_bytes": None, "activation_pct": None, "basis": None, "note": None}
        if p is None or peak is None or peak <= 0:
            row["note"] = ("no persistent-memory theory for this rank (no run.json dims): no activation share"
                           if p is None else "no allocation peak")
            rows.append(row)
            continue
        stashed = p.get("stashed_params_bytes") or 0  # pipedream's weight stashing, else 0
        persistent = p["params_bytes"] + p["grads_bytes"] + p["optimizer_bytes"] + stashed
        with_stash = " + stashed weights" if stashed else ""
        bucketed = paradigm.get(run) in BUCKETED_GRADS
        offloaded = device != "cpu" and run in on_host  # fsdp --offload: none of the state is on the device
        if offloaded:
            persistent = 0
        if device != "cpu":
            # The model's state held at the floor (between steps); the rest of the floor is other. pipedream's
            # stashes count as held (its most at once): where fewer are, other is smaller and activations err high.
            at_rest = 0 if offloaded else (p["params_at_rest_bytes"] + p["optimizer_bytes"]
                                           + (p["grads_bytes"] if bucketed else 0) + stashed)
            other = max(floor_bytes - at_rest, 0) if floor_bytes is not None else None
            held = " − other (held all step: lowest level − model state at rest)" if other is not None else ""
            row["basis"] = (("device counter (includes everything); persistent state in host memory (--offload): "
                             f"activation = peak{held} (with the units' gathered parameters and gradients)") if offloaded
                            else ("device counter (includes everything): activation = peak − persistent "
                                  f"(params + grads + optimizer{with_stash}){held}"))
            transient, footprint = peak - persistent - (other or 0), peak
        else:
            other = None
            again = (0 if bucketed else p["grads_bytes"]) + (p["params_bytes"] - p["params_at_rest_bytes"]) + stashed
            before = persistent - again
            row["basis"] = ("cpu counter (allocations since profiling started): activation = peak − per-step "
                            f"re-allocations (grads, gathered params{with_stash}); footprint = peak + persistent "
                            "allocated before")
            transient, footprint = peak - again, peak + before
        if transient < 0:
            held_all_step = " and what it holds all step" if other else ""
            row["note"] = (f"peak below the persistent bytes{held_all_step} it should hold ({-transient} B short): "
                           "activation share 0")
            transient = 0
        row.update(persistent_bytes=persistent, other_bytes=other, footprint_bytes=footprint, activation_bytes=transient,
                   activation_pct=100.0 * transient / footprint if footprint > 0 else None)
        row["note"] = "; ".join(x for x in (row["note"], _recompute_note(runs.get(run))) if x) or None
        rows.append(row)
    return pl.DataFrame(rows, schema=ACTIVATION_COLUMNS)


def _recompute_note(manifest) -> str | None:
    """With --recompute, theory's saved activations per rank with and without it (theory_recompute)."""
    if not isinstance(manifest, dict) or not recompute_on(manifest):
        return None
    d = activation_drop(manifest, run_dtypes(manifest)[0].param)
    if d is None:
        return "--recompute: activations recomputed per block (no saved-activation prediction for this layout)"
    return (f"--recompute: predicted saved activations {d['with_bytes']:,} B per rank instead of "
            f"{d['without_bytes']:,} B (−{d['drop_bytes']:,} B: {d['formula']})")
