"""The parameter table of the reference model (runners/model.py), rebuilt from run.json's dims, and
the rules that turn it into communication sizes: FSDP2's dim-0 padding, DDP's buckets, the
Megatron tensor-parallel plan of runners/tp_sp.py.

Pure functions of plain values (no torch, no runners import): the theory of docs/theory.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from profiler.collectives import DTYPE_BYTES as COLLECTIVE_DTYPE_BYTES

# Bytes per element of a dtype name, as run.json and traces spell them (torch names without
# "torch.", C++ names from trace args, short names).
DTYPE_BYTES = COLLECTIVE_DTYPE_BYTES | {"fp32": 4, "fp16": 2, "fp64": 8, "fp8": 1}
FP32_NOTE = "run.json names no dtype: fp32 assumed (every ptprof runner trains in fp32)"


@dataclass(frozen=True)
class Dtypes:
    """Bytes per element of each kind of persistent state (activations have the parameters' dtype:
    the runners use no autocast)."""

    param: int = 4
    grad: int = 4
    state: int = 4  # AdamW's exp_avg and exp_avg_sq each
    master: int = 0  # an fp32 master copy of the parameters (mixed precision); 0 without one

    @property
    def optimizer_per_param(self) -> int:
        return 2 * self.state + self.master  # ZeRO's K (12 for mixed-precision Adam)

    @property
    def per_param(self) -> int:
        return self.param + self.grad + self.optimizer_per_param


def dtype_bytes(name) -> int | None:
    """Bytes per element of a dtype name ("torch.bfloat16", "float", "bf16"), None if unknown."""
    return DTYPE_BYTES.get(str(name).removeprefix("torch.").lower()) if isinstance(name, str) and name else None


def run_dtypes(manifest: dict) -> tuple[Dtypes, str | None, str | None]:
    """(dtypes, note, why) of a run, the one rule every theory module uses.

    Sources, first found: `model.param_dtypes` (what `ptprof run` writes: parameter elements by
    dtype; one dtype means parameters, gradients and AdamW state in it), `dtypes` {param, grad,
    optimizer, master}, one `dtype` at the top, in `model` or in `options`; else fp32 with a
    note. `why` (no theory) where run.json names dtypes the rule cannot use: several parameter
    dtypes without a `dtypes` block, or a name of unknown size.
    """
    model = manifest.get("model") if isinstance(manifest.get("model"), dict) else {}
    by_dtype = model.get("param_dtypes")
    if isinstance(by_dtype, dict) and by_dtype:
        if len(by_dtype) == 1 and (b := dtype_bytes(next(iter(by_dtype)))):
            return Dtypes(b, b, b, 0), None, None
        if not isinstance(manifest.get("dtypes"), dict):
            return Dtypes(), None, f"parameter dtypes {sorted(by_dtype)}: one dtype of known size, or a dtypes block, needed"
    spec = manifest.get("dtypes")
    if isinstance(spec, dict):
        p = dtype_bytes(spec.get("param") or spec.get("params"))
        if not p:
            return Dtypes(), None, f"run.json dtypes {spec}: no parameter dtype of known size"
        g = dtype_bytes(spec.get("grad") or spec.get("grads")) or p
        st = dtype_bytes(spec.get("optimizer") or spec.get("optimizer_state")) or p
        return Dtypes(p, g, st, dtype_bytes(spec.get("master")) or 0), None, None
    for where in (manifest, model, manifest.get("options")):
        name = where.get("dtype") if isinstance(where, dict) else None
        if name is not None:
            b = dtype_bytes(name)
            return (Dtypes(b, b, b, 0), None, None) if b else (Dtypes(), None, f"dtype {name!r} of unknown size")
    return Dtypes(), FP32_NOTE, None


# DDP's bucket caps (torch.nn.parallel.DistributedDataParallel defaults): the first bucket holds
# 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES), the others bucket_cap_mb = 25 MiB.
DDP_FIRST_BUCKET_BYTES = 1024 * 1024
DDP_BUCKET_BYTES = 25 * 1024 * 1024
COLWISE, ROWWISE = 0, 1  # tensor-parallel placements: Shard(0) (column-parallel), Shard(1) (row-parallel)


@dataclass(frozen=True)
class Param:
    """One parameter tensor of the model: its name, full shape, FSDP unit and tensor-parallel split."""

    name: str
    shape: tuple[int, ...]
    unit: str  # the fully_shard unit of runners/fsdp.py: "emb", "blocks.<i>" or "head"
    tp: int | None  # COLWISE / ROWWISE under Megatron TP (runners/tp_sp.py), None: replicated
    layer: int | None  # block index, None outside the blocks
    expert: int | None = None  # MoE expert index (expert-parallel: lives on one rank)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def model_params(model: dict, moe: dict | None = None) -> list[Param]:
    """Every parameter of runners/model.py's GPT in `model.parameters()` order, from run.json's
    `model` block (vocab_size, d_model, n_layers, seq_len, mlp_ratio) and, for the MoE variant,
    its `moe` block (experts, moe_layers)."""
    v, h, n_layers, s = model["vocab_size"], model["d_model"], model["n_layers"], model["seq_len"]
    f = model.get("mlp_ratio", 4) * h
    moe_layers = set(moe.get("moe_layers") or []) if moe else set()
    n_experts = moe.get("experts") or 0 if moe else 0
    out = [Param("tok_emb.weight", (v, h), "emb", None, None), Param("pos_emb.weight", (s, h), "emb", None, None)]
    for i in range(n_layers):
        u = f"blocks.{i}"
        out += [Param(f"{u}.ln1.weight", (h,), u, None, i), Param(f"{u}.ln1.bias", (h,), u, None, i)]
        out += [Param(f"{u}.attn.w{x}", (h, h), u, COLWISE, i) for x in "qkv"]
        out += [Param(f"{u}.attn.wo", (h, h), u, ROWWISE, i)]
        out += [Param(f"{u}.ln2.weight", (h,), u, None, i), Param(f"{u}.ln2.bias", (h,), u, None, i)]
        if i in moe_layers:
            out.append(Param(f"{u}.ffn.router", (n_experts, h), u, None, i))
            for e in range(n_experts):
                out += [Param(f"{u}.ffn.experts.{e}.up", (f, h), u, None, i, e),
                        Param(f"{u}.ffn.experts.{e}.down", (h, f), u, None, i, e)]
        else:
            out += [Param(f"{u}.ffn.up", (f, h), u, COLWISE, i), Param(f"{u}.ffn.down", (h, f), u, ROWWISE, i)]
    out += [Param("norm.weight", (h,), "head", None, None), Param("norm.bias", (h,), "head", None, None),
            Param("head.weight", (v, h), "head", COLWISE, None)]
    return out


def mesh_coords(rank: int, *, pp: int = 1, tp: int = 1, ep: int = 1) -> dict[str, int]:
    """A global rank's coordinates on the runners' mesh: rank = ((dp_i·pp + pp_i)·tp + tp_i)·ep + ep_i
    (runners/hybrid.py's (dp, pp, tp) order, tp innermost; an ep run's ranks are its ep coordinate)."""
    ep_i, rest = rank % ep, rank // ep
    tp_i, rest = rest % tp, rest // tp
    return {"dp": rest // pp, "pp": rest % pp, "tp": tp_i, "ep": ep_i}


def chunk_size(n: int, parts: int, index: int) -> int:
    """Length of chunk `index` of torch.chunk(n elements, parts): ceil(n/parts) each, the last
    ones shorter or empty (DTensor's Shard and FSDP2 both split this way)."""
    step = -(-n // parts)
    return max(0, min(step, n - index * step))


def tp_local_shape(p: Param, tp: int, tp_rank: int) -> tuple[int, ...]:
    """Shape of `p` held by tensor-parallel rank `tp_rank` of `tp` (Shard(0), Shard(1) or whole)."""
    if tp <= 1 or p.tp is None:
        return p.shape
    shape = list(p.shape)
    shape[p.tp] = chunk_size(shape[p.tp], tp, tp_rank)
    return tuple(shape)


def fsdp_padded_numel(shape: tuple[int, ...], n: int) -> int:
    """Elements FSDP2 all-gathers (output) and reduce-scatters (input) for one parameter over `n` ranks.

    torch 2.13 `_fully_shard/_fsdp_param.py` chunks dim 0 with torch.chunk and pads every shard to
    chunk 0's size; `_fsdp_collectives.foreach_reduce` pads gradients with `_get_dim0_padded_size`:
    both give ceil(dim0 / n) * n rows of the other dims' size.
    """
    if not shape:
        return n  # a 0-d parameter is sharded as one row
    return -(-shape[0] // n) * n * math.prod(shape[1:])


def ddp_buckets(sizes_bytes: list[int]) -> int:
    """Number of DDP gradient buckets for parameters of these sizes, in bucket order.

    reducer.cpp compute_bucket_assignment_by_size: a bucket closes once it holds at least its cap
    (1 MiB for the first, 25 MiB after). The order is that gradients became ready in the first
    backward, which we take as reverse parameter order; the count may differ by one where that
    order differs, the bytes (every gradient once) never do.
    """
    buckets, filled, cap = 0, 0, DDP_FIRST_BUCKET_BYTES
    for size in sizes_bytes:
        filled += size
        if filled >= cap:
            buckets, filled, cap = buckets + 1, 0, DDP_BUCKET_BYTES
    return buckets + (filled > 0)
