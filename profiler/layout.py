"""The shared language of `ptprof project` and `ptprof plan`: a transformer (`ModelSpec`) and a
parallel layout (`Layout`) of it on G GPUs, and the parser of `--layout dp=8,tp=8,pp=4`.

Plain values only (no polars): the planner builds hundreds of thousands of these.
Rank order, as Megatron-LM and runners/hybrid.py: tp innermost, then cp, then dp (ep inside dp),
pp outermost -- so a tp group holds consecutive ranks (one node when tp <= GPUs per node) and a
pipeline's stages sit a node (or more) apart. docs/whatif.md.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace

SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zero-bubble")
RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)  # 0: DDP; 1: optimizer state sharded; 2: + gradients; 3: + parameters (FSDP)


class LayoutError(ValueError):
    """A model or layout that cannot be: the message names the field and what would fit."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer (GPT): the dims `ptprof plan` takes, or those of a run's run.json.

    `ffn` is the MLP's hidden size (4·hidden in GPT); `experts`/`top_k` > 0 make every
    `moe_every`-th block's MLP a mixture of experts. Bytes per element: `param_bytes` for weights
    and activations (2: bf16/fp16 mixed precision), `grad_bytes`, and `optimizer_bytes_per_param`
    for Adam's state (12 = fp32 master + two fp32 moments: the 16 B/param of mixed-precision Adam).
    `flash_attention`: fused attention (costmodel and plan_memory price it; docs/whatif.md).
    """

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq: int
    global_batch: int  # sequences per optimizer step
    experts: int = 0
    top_k: int = 0
    moe_every: int = 1
    param_bytes: int = 2
    grad_bytes: int = 2
    optimizer_bytes_per_param: int = 12
    params: int | None = None  # as given (`--params`); None: count_params() of the dims
    # FlashAttention-style fused attention: the s×s scores are never stored (no 5as²b of
    # activations, no softmax/dropout HBM traffic) and backward recomputes them (2.5x the core's
    # forward FLOPs instead of 2x). False: Megatron's unfused attention, as Korthikanti et al. 2022.
    flash_attention: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Blocks whose MLP is a mixture of experts: every moe_every-th, L // moe_every of them."""
        return self.layers // self.moe_every if self.moe else 0

    @property
    def moe_share(self) -> float:
        """Share of the blocks that are MoE: (L // moe_every) / L (the same in FLOPs, memory, params)."""
        return self.moe_layers / self.layers

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.seq

    def count_params(self) -> int:
        """Parameters of the GPT of runners/model.py with these dims: embeddings V·h + s·h, per
        block 4h² + 4h (attention; biases-free projections as runners/model.py) + 2·h·ffn (MLP;
        E of them in a MoE block plus an E·h router) + 4h (two LayerNorms), final norm 2h, and an
        untied head V·h."""
        h, f = self.hidden, self.ffn
        dense_mlp = 2 * h * f
        moe_blocks = self.moe_layers
        per_block = 4 * h * h + 4 * h
        mlp = (self.layers - moe_blocks) * dense_mlp + moe_blocks * (self.experts * dense_mlp + self.experts * h)
        return self.vocab * h + self.seq * h + self.layers * per_block + mlp + 2 * h + self.vocab * h

    def check(self) -> None:
        """LayoutError naming the first impossible field."""
        for f in ("layers", "hidden", "heads", "ffn", "vocab", "seq", "global_batch"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LayoutError(f"--{f.replace('_', '-')} {v!r}: a whole number >= 1 is needed")
        if self.hidden % self.heads:
            raise LayoutError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}")
        for f in ("experts", "top_k", "moe_every"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < (1 if f == "moe_every" else 0):
                raise LayoutError(f"{f} {v!r}: a whole number >= {1 if f == 'moe_every' else 0} is needed")
        if self.experts < 0 or self.top_k < 0 or (self.experts and not 1 <= self.top_k <= self.experts):
            raise LayoutError(f"--moe {self.experts},{self.top_k}: E >= 1 experts and 1 <= k <= E are needed")
        if self.top_k and not self.experts:
            raise LayoutError(f"top_k {self.top_k} without experts: a dense model routes no tokens (--moe E,k)")
        if self.moe and self.moe_every > self.layers:
            raise LayoutError(f"moe_every {self.moe_every} > layers {self.layers}: no block would be a MoE block")
        # bytes per element: weights and activations >= 1 (fp8 .. fp32), gradients >= 1, Adam's
        # state >= 0 (0: a stateless optimizer); anything else is a negative or zero memory
        for f, low in (("param_bytes", 1), ("grad_bytes", 1), ("optimizer_bytes_per_param", 0)):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < low or v > 64:
                raise LayoutError(f"{f} {v!r}: bytes per element, a number in [{low}, 64] is needed")

    def vocab_per_rank(self, tp: int) -> int:
        """Vocabulary rows of the embedding / head on one of `tp` ranks: ceil(V/tp). Megatron-LM pads
        the vocabulary to a multiple of make_vocab_size_divisible_by (128) x tp
        (megatron/training/tokenizer/tokenizer.py, _vocab_size_with_padding); we pad only to tp, never
        truncate (V // tp would drop rows, and a zero-width head GEMM for V < tp)."""
        return -(-self.vocab // tp)


@dataclass(frozen=True)
class Layout:
    """How a step of a ModelSpec is spread over dp·cp·tp·pp GPUs (ep divides dp: experts are
    spread over ep of the dp replicas, Megatron-style).

    microbatch: sequences per microbatch; microbatches: per dp replica per step, so
    global_batch = dp · microbatch · microbatches. zero: 0 (DDP), 1, 2, 3 (FSDP).
    stages_per_rank: interleaved-1f1b's virtual stages v. recompute: none | selective (attention
    core only, Korthikanti et al. 2022) | full (every block). sp: Megatron sequence parallel on
    the tp group. cp: context parallel (ring attention) degree.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    zero: int = 0
    microbatch: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    stages_per_rank: int = 1
    recompute: str = "none"
    sp: bool = False

    @property
    def gpus(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def short(self) -> str:
        """One line, e.g. `dp=8 tp=8 pp=4 zero=1 mb=1x64 1f1b rc=full sp`."""
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        parts += [f"ep={self.ep}"] * (self.ep > 1) + [f"cp={self.cp}"] * (self.cp > 1)
        parts += [f"zero={self.zero}", f"mb={self.microbatch}x{self.microbatches}"]
        if self.pp > 1:
            parts.append(self.schedule + (f" v={self.stages_per_rank}" if self.stages_per_rank > 1 else ""))
        if self.recompute != "none":
            parts.append(f"rc={self.recompute}")
        if self.sp:
            parts.append("sp")
        return " ".join(parts)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def check(self, spec: ModelSpec | None = None, gpus: int | None = None) -> None:
        """LayoutError naming the first thing that does not divide or does not exist."""
        for f in ("dp", "tp", "pp", "ep", "cp", "microbatch", "microbatches", "stages_per_rank"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LayoutError(f"{f}={v!r}: a whole number >= 1 is needed")
        if self.zero not in ZERO_STAGES:
            raise LayoutError(f"zero={self.zero!r}: one of 0 (DDP), 1, 2, 3 (FSDP)")
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"schedule={self.schedule!r}: one of {', '.join(SCHEDULES)}")
        if self.recompute not in RECOMPUTE:
            raise LayoutError(f"recompute={self.recompute!r}: one of {', '.join(RECOMPUTE)}")
        if spec is not None and self.ep > 1 and not spec.moe:  # said before any divisibility of ep
            raise LayoutError(no_experts(self.ep))
        if self.dp % self.ep:
            raise LayoutError(f"ep={self.ep} does not divide dp={self.dp} (experts are spread over data-parallel ranks)")
        if self.stages_per_rank > 1 and self.schedule != "interleaved-1f1b":
            raise LayoutError(f"v={self.stages_per_rank} needs schedule=interleaved-1f1b")
        # stages that mean nothing: ZeRO shards over dp·cp replicas, sp splits over the tp group
        if self.zero > 0 and self.dp * self.cp == 1:
            raise LayoutError(f"zero={self.zero} with dp·cp = 1: nothing to shard over (zero=0)")
        if self.sp and self.tp == 1:
            raise LayoutError("sp with tp=1: sequence parallelism splits over the tp group (sp=0)")
        if gpus is not None and self.gpus != gpus:
            raise LayoutError(f"dp·cp·tp·pp = {self.dp}·{self.cp}·{self.tp}·{self.pp} = {self.gpus}, not the {gpus} GPUs")
        if spec is None:
            return
        if spec.heads % self.tp:
            raise LayoutError(f"tp={self.tp} does not divide the {spec.heads} heads")
        if spec.ffn % self.tp:
            raise LayoutError(f"tp={self.tp} does not divide the MLP's ffn {spec.ffn} (column-parallel MLP-up)")
        if spec.layers % (self.pp * self.stages_per_rank):
            raise LayoutError(f"pp·v = {self.pp}·{self.stages_per_rank} does not divide the {spec.layers} layers")
        if spec.seq % self.cp:
            raise LayoutError(f"cp={self.cp} does not divide the sequence length {spec.seq}")
        if self.dp * self.microbatch * self.microbatches != spec.global_batch:
            raise LayoutError(f"dp·microbatch·microbatches = {self.dp}·{self.microbatch}·{self.microbatches} is not "
                              f"the global batch {spec.global_batch}")
        if self.pp > 1 and self.microbatches < self.pp:
            # fewer microbatches than stages leave stages idle: the bubble formulas ((p-1)/v of a
            # microbatch, ZB-H1's (p-1)(F+B-W)) assume every stage has work in the steady state
            raise LayoutError(f"microbatches={self.microbatches} < pp={self.pp}: a pipeline needs at least pp "
                              "microbatches per step")
        if self.ep > 1 and (not spec.moe or spec.experts % self.ep):
            raise LayoutError(f"ep={self.ep} needs a MoE model whose expert count divides by it")


# --layout keys: their Layout field and how to read the value
_KEYS = {"dp": "dp", "tp": "tp", "pp": "pp", "ep": "ep", "cp": "cp", "zero": "zero", "mb": "microbatch",
         "microbatch": "microbatch", "m": "microbatches", "microbatches": "microbatches", "schedule": "schedule",
         "v": "stages_per_rank", "recompute": "recompute", "rc": "recompute", "sp": "sp"}
# the short forms Layout.short() and plan's table (plan_report.compact) print, read back
_SCHEDULE_NAMES = {**{s: s for s in SCHEDULES}, "i1f1b": "interleaved-1f1b", "interleaved": "interleaved-1f1b",
                   "zb": "zero-bubble", "zb-h1": "zero-bubble"}
_RECOMPUTE_NAMES = {"none": "none", "off": "none", "sel": "selective", "selective": "selective", "full": "full"}
_FORMS = ("KEY=VALUE with KEY one of {keys}; mb=BxM (microbatch x microbatches); bare z0..z3 (zero), sp, "
          "or a schedule ({schedules}, i1f1b, zb); rc=none|sel|selective|full")


def _layout_items(text: str) -> list[tuple[str, str, str]]:
    """(item as written, key, value) of `dp=8,tp=2 z1 mb=1x4 i1f1b v=2 rc=sel sp`: items split on
    commas and/or spaces (`dp = 8` is one item); a bare token becomes its key and value."""
    out = []
    for item in re.sub(r"\s*=\s*", "=", text.strip()).replace(",", " ").split():
        key, sep, value = item.partition("=")
        key = key.lower()
        if sep:
            out.append((item, key, value))
        elif re.fullmatch(r"z\d+", key):
            out.append((item, "zero", key[1:]))
        elif key == "sp":
            out.append((item, "sp", "1"))
        elif key in _SCHEDULE_NAMES:
            out.append((item, "schedule", key))
        else:
            out.append((item, "", ""))
    return out


def no_experts(ep: int) -> str:
    return f"ep={ep}: the model has no experts (expert parallelism spreads a mixture of experts' experts over ranks; ep=1)"


def parse_layout(text: str, base: Layout | None = None, spec: ModelSpec | None = None) -> tuple[Layout, set[str]]:
    """`dp=8,tp=8,pp=4[,zero=1,mb=1,m=64,schedule=1f1b,v=2,recompute=full,sp=1]` on top of `base`:
    (the layout, the fields given). Also reads back what Layout.short() and plan's table print
    (`dp=32 tp=2 pp=16 z1 mb=1x48 i1f1b v=6 rc=sel sp`). LayoutError naming the bad item."""
    out, given = base or Layout(), set()
    forms = _FORMS.format(keys=", ".join(sorted(set(_KEYS))), schedules=", ".join(SCHEDULES))
    if not (text or "").strip(" ,"):  # an empty --layout is a mistake, not "one GPU"
        raise LayoutError(f"--layout {text!r}: empty; give KEY=VALUE items (e.g. dp=8,tp=2)")
    for item, key, value in _layout_items(text):
        if key not in _KEYS:
            raise LayoutError(f"--layout item {item!r}: expected {forms}")
        name = _KEYS[key]
        if name == "microbatch" and "x" in value.lower():  # mb=1x64: microbatch 1, 64 microbatches
            b, _, m = value.lower().partition("x")
            values = {"microbatch": b.strip(), "microbatches": m.strip()}
        else:
            values = {name: value}
        for name, value in values.items():
            if name in given:  # dp=2,dp=4 (or mb= and microbatch=): which one was meant?
                raise LayoutError(f"--layout {item}: {name} is given twice")
            if name == "schedule":
                if value.lower() not in _SCHEDULE_NAMES:
                    raise LayoutError(f"--layout {item!r}: schedule one of {', '.join(SCHEDULES)} (or i1f1b, zb)")
                v = _SCHEDULE_NAMES[value.lower()]
            elif name == "recompute":
                if value.lower() not in _RECOMPUTE_NAMES:
                    raise LayoutError(f"--layout {item!r}: recompute one of none, sel (selective), full")
                v = _RECOMPUTE_NAMES[value.lower()]
            elif name == "sp":
                if value.lower() not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
                    raise LayoutError(f"--layout sp={value!r}: 0 or 1")
                v = value.lower() in ("1", "true", "yes", "on")
            else:
                try:
                    v = int(value)
                except ValueError:
                    raise LayoutError(f"--layout {item!r}: a whole number is needed for {name}") from None
            out, _ = replace(out, **{name: v}), given.add(name)
    if not given:
        raise LayoutError(f"--layout {text!r}: empty; give KEY=VALUE items, e.g. dp=8,tp=8,pp=4")
    if out.schedule == "interleaved-1f1b" and out.stages_per_rank == 1:
        raise LayoutError("--layout schedule=interleaved-1f1b needs v >= 2 stages per rank (v=1 is 1f1b)")
    if spec is not None and out.ep > 1 and not spec.moe:  # before what ep fails to divide: the first thing wrong
        raise LayoutError(no_experts(out.ep))
    if "ep" in given and "dp" not in given and out.dp % out.ep:  # `ep=2` alone: a dp of 1 the user never typed
        raise LayoutError(f"ep={out.ep} does not divide dp={out.dp} (experts are spread over data-parallel ranks); dp is "
                          f"{out.dp} unless --layout gives it (e.g. dp={out.ep},ep={out.ep})")
    out.check()
    return out, given


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def group_stride(layout: Layout, dim: str) -> int:
    """Distance in global ranks between neighbours of a `dim` group under the rank order above
    (tp innermost, then cp, then dp, pp outermost): 1 for tp, tp for cp, cp·tp for dp/ep, dp·cp·tp for pp."""
    order = [("tp", layout.tp), ("cp", layout.cp), ("dp", layout.dp), ("pp", layout.pp)]
    stride = 1
    for name, size in order:
        if name == dim or (dim == "ep" and name == "dp"):
            return stride
        stride *= size
    raise LayoutError(f"no dimension {dim!r}")


@dataclass(frozen=True)
class Estimate:
    """A predicted step of one layout on one cluster (costmodel.estimate / project.project_run).

    breakdown_s: where the step goes, summing to step_s: "compute", "comm_exposed:<dim>" per
    dimension, "bubble", "optimizer", ... (docs/whatif.md names every key). memory_bytes: per GPU,
    "params", "grads", "optimizer", "activations", "total"; fits: total <= the cluster's usable HBM
    (HBM less its hbm_reserve_gib).
    assumptions: every input that is assumed rather than measured, one line each; dominant: the
    assumption whose error would move step_s the most, with how much.
    """

    layout: Layout
    step_s: float
    breakdown_s: dict[str, float]
    mfu_pct: float | None
    memory_bytes: dict[str, int]
    hbm_bytes: int
    fits: bool
    assumptions: list[str] = field(default_factory=list)
    dominant: str | None = None
    usable_hbm_bytes: int | None = None  # HBM less the cluster's reserve: what `fits` compares with

    def as_dict(self) -> dict:
        return {"layout": self.layout.as_dict(), "layout_text": self.layout.short(), "step_s": self.step_s,
                "breakdown_s": dict(self.breakdown_s), "mfu_pct": self.mfu_pct, "memory_bytes": dict(self.memory_bytes),
                "hbm_bytes": self.hbm_bytes, "usable_hbm_bytes": self.usable_hbm_bytes, "fits": self.fits, "assumptions": list(self.assumptions),
                "dominant": self.dominant}
