"""The model and parallel layout of a profiled run, as `ptprof project` reads them from its
run.json (ModelSpec, Layout), and `--layout` filled to the run's global batch. Every refusal
names the run.json field (docs/whatif.md, "Project": the run's own layout)."""

from __future__ import annotations

import dataclasses
import math
import re

from profiler.layout import Layout, LayoutError, ModelSpec, parse_layout
from profiler.theory_params import run_dtypes
from profiler.theory_recompute import recompute_on

SCHEDULE_OF = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved-1f1b": "interleaved-1f1b", "zero-bubble": "zero-bubble",
               "zbv": "zero-bubble", "dualpipev": "zero-bubble"}
ZERO_OF = {"ddp": 0, "dp": 0, "zero1": 1, "zero2": 2, "fsdp": 3}


# plan's flag names in ModelSpec.check's messages -> the run.json fields they came from
RUN_FIELDS = {"--layers": "model.n_layers", "--hidden": "model.d_model", "--heads": "model.n_heads",
              "--vocab": "model.vocab_size", "--seq": "model.seq_len", "--global-batch": "global_batch_size",
              "--ffn": "model.mlp_ratio x d_model", "--moe": "moe.experts,top_k"}
PARAMS_TOLERANCE_PCT = 1.0  # run.json's model.n_params further than this from the dims' count is refused


def run_fields(msg: str) -> str:
    """A ModelSpec/Layout check's message with plan's flags named as run.json's fields."""
    for flag, field in RUN_FIELDS.items():
        msg = re.sub(re.escape(flag) + r"\b(?!-)", field, msg)
    return msg


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def run_spec(manifest: dict, where: str = "run.json") -> ModelSpec:
    """The ModelSpec of a run.json's `model` block; ValueError naming the run.json field that is
    missing, not a number (NaN, a string) or inconsistent (n_params against the dims' count)."""
    model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    need = {"n_layers": "layers", "d_model": "hidden", "n_heads": "heads", "vocab_size": "vocab", "seq_len": "seq"}
    vals = {}
    for key, field in need.items():
        v = model.get(key)
        if not _whole(v):
            raise ValueError(f"{where}: model.{key} is {v!r}: a whole number >= 1 is needed")
        vals[field] = v
    gb = manifest.get("global_batch_size")
    if not _whole(gb):
        raise ValueError(f"{where}: global_batch_size is {gb!r}: a whole number >= 1 is needed")
    ratio = model.get("mlp_ratio", 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0 \
            or not float(ratio * vals["hidden"]).is_integer():
        raise ValueError(f"{where}: model.mlp_ratio is {ratio!r}: need a number > 0, ratio x d_model whole")
    dtypes, _, why = run_dtypes(manifest)
    if why:
        raise ValueError(f"{where}: {why}")
    moe = manifest.get("moe") if isinstance(manifest.get("moe"), dict) else {}
    experts, top_k, moe_layers = moe.get("experts", 0), moe.get("top_k", 2 if moe.get("experts") else 0), moe.get("moe_layers")
    for key, v in (("experts", experts), ("top_k", top_k)):
        if not (_whole(v) or v == 0) or isinstance(v, bool):
            raise ValueError(f"{where}: moe.{key} is {v!r}: a whole number >= 0 is needed")
    if moe_layers is not None and not (isinstance(moe_layers, list) and moe_layers
                                       and all(_whole(x) or x == 0 for x in moe_layers)):
        raise ValueError(f"{where}: moe.moe_layers is {moe_layers!r}: a list of layer indices is needed"[:200])
    every = vals["layers"] // len(moe_layers) if moe_layers else 1
    try:
        spec = ModelSpec(ffn=int(ratio * vals["hidden"]), global_batch=gb, experts=experts, top_k=min(top_k, experts),
                         moe_every=max(every, 1), param_bytes=dtypes.param, grad_bytes=dtypes.grad,
                         optimizer_bytes_per_param=dtypes.optimizer_per_param, **vals)
        spec.check()
    except LayoutError as e:
        raise ValueError(f"{where}: {run_fields(str(e))}") from None
    n = model.get("n_params")
    if n is not None:
        counted = spec.count_params()
        if not _whole(n) or abs(n - counted) > PARAMS_TOLERANCE_PCT / 100 * counted:
            raise ValueError(f"{where}: model.n_params {n!r} is not the {counted:,} its dims give "
                             f"(> {PARAMS_TOLERANCE_PCT:g} % off)")
    return spec


def run_layout(manifest: dict, spec: ModelSpec, where: str = "run.json") -> Layout:
    """The run's own Layout from its paradigm and mesh; ValueError for a paradigm project cannot map."""
    paradigm = manifest.get("paradigm")
    mesh = manifest.get("mesh") if isinstance(manifest.get("mesh"), dict) else {}
    world = manifest.get("world_size")
    if not _whole(world):
        raise ValueError(f"{where}: world_size is {world!r}: a whole number >= 1 is needed")
    bad = next(((k, v) for k, v in mesh.items() if not _whole(v)), None)
    if bad:
        raise ValueError(f"{where}: mesh.{bad[0]} is {bad[1]!r}: a whole number >= 1 is needed")
    deg = dict(mesh)
    pipe = manifest.get("pipeline") if isinstance(manifest.get("pipeline"), dict) else {}
    opts = manifest.get("options") if isinstance(manifest.get("options"), dict) else {}
    if paradigm in ZERO_OF:
        dp = deg.get("dp", world)
        lay = Layout(dp=dp, zero=ZERO_OF[paradigm] if dp > 1 else 0)  # ZeRO at one rank shards nothing: DDP
    elif paradigm == "tp":
        tp = deg.get("tp", world)
        lay = Layout(tp=tp, sp=bool(opts.get("sp")) and tp > 1)  # sp at tp=1 splits nothing
    elif paradigm in ("ulysses", "ring"):
        lay = Layout(cp=deg.get("cp", world))
    elif paradigm == "ep":
        ep = deg.get("ep", world)
        lay = Layout(dp=deg.get("dp", ep), ep=ep)
    elif paradigm in SCHEDULE_OF or paradigm == "hybrid":
        v = pipe.get("stages_per_rank") if isinstance(pipe.get("stages_per_rank"), int) else 1
        sched = SCHEDULE_OF.get(pipe.get("schedule") if paradigm == "hybrid" else paradigm, "1f1b")
        if v > 1 and sched == "1f1b":
            sched = "interleaved-1f1b"
        lay = Layout(dp=deg.get("dp", 1), tp=deg.get("tp", 1), pp=deg.get("pp", 1 if paradigm == "hybrid" else world),
                     # hybrid's dp is fully_shard, resharding after forward only without a pipeline
                     # (runners/hybrid.py, as torchtitan): ZeRO-3, else ZeRO-2 (theory_memory.rank_layouts)
                     zero=(3 if deg.get("pp", 1) == 1 else 2) if paradigm == "hybrid" and deg.get("dp", 1) > 1 else 0,
                     schedule=sched,
                     stages_per_rank=v if sched == "interleaved-1f1b" else 1,
                     sp=bool(opts.get("sp")) and deg.get("tp", 1) > 1)
    else:
        raise ValueError(f"{where}: paradigm {paradigm!r}: no layout mapped (docs/whatif.md)")
    m = pipe.get("microbatches") if isinstance(pipe.get("microbatches"), int) else 1
    per_replica = spec.global_batch // max(lay.dp, 1)
    mb = per_replica // m if m and per_replica % m == 0 else 1
    lay = dataclasses.replace(lay, microbatch=max(mb, 1), microbatches=m if per_replica % m == 0 else per_replica,
                              recompute="full" if recompute_on(manifest) else "none")  # the runners checkpoint whole blocks
    if lay.gpus != world:
        raise ValueError(f"{where}: mesh {mesh} ({paradigm}) gives {lay.gpus} GPUs, not world_size {world}")
    try:
        lay.check(spec)
    except LayoutError as e:
        raise ValueError(f"{where}: its layout: {run_fields(str(e))}") from None
    return lay


def fill_layout(text: str, spec: ModelSpec, own: Layout) -> Layout:
    """--layout text on top of a fresh Layout, microbatch/microbatches filled to the global batch
    where not given; LayoutError naming what does not fit."""
    lay, given = parse_layout(text, spec=spec)  # spec: ep on a model without experts is said as that
    if "microbatch" not in given or "microbatches" not in given:
        per = spec.global_batch // lay.dp if spec.global_batch % lay.dp == 0 else None
        if per is None:
            raise LayoutError(f"--layout dp={lay.dp} does not divide the run's global batch {spec.global_batch}")
        if "microbatches" in given:
            m = lay.microbatches
        elif "microbatch" in given:
            m = per // lay.microbatch if per % lay.microbatch == 0 else 0
        else:
            m = max(own.microbatches, lay.pp) if lay.pp > 1 else 1
            while per % m:
                m -= 1
        if m < 1 or per % m:
            raise LayoutError(f"--layout: {per} sequences per replica do not split into microbatches of {lay.microbatch}")
        lay = dataclasses.replace(lay, microbatches=m, microbatch=per // m)
    lay.check(spec)
    return lay
