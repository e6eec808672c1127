"""The runners `ptprof run` knows: name -> worker module and a one-line description.

Kept free of torch so `ptprof --help` and argument errors answer instantly. A runner module is
started on every rank as `python -m <module> --paradigm <name> ...`; modules that serve several
paradigms (ddp/zero1, zero2/fsdp) branch on `--paradigm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from runners.options import RunOptions


def _all_ranks(opts: RunOptions) -> int:
    return opts.world_size


@dataclass(frozen=True)
class Paradigm:
    module: str  # worker module run on every rank
    summary: str  # one line for `ptprof run --help`
    # How many ranks split the global batch (all of them for the data-parallel family).
    data_parallel: Callable[[RunOptions], int] = _all_ranks
    # Paradigm-specific checks run before any process starts: a one-line problem, or None.
    check: Callable[[RunOptions], str | None] = lambda opts: None


def _check_tp(opts: RunOptions) -> str | None:
    vocab, d_model, _layers, n_heads, _seq, _batch = opts.preset
    t = opts.world_size
    for what, size in (("attention heads", n_heads), ("d_model", d_model), ("vocab_size", vocab)):
        if size % t:
            return f"tp over {t} ranks needs {what} ({size}, model {opts.model!r}) divisible by {t}"
    if opts.sp and opts.sequence_length % t:
        return f"--sp over {t} ranks needs --seq-len ({opts.sequence_length}) divisible by {t}"
    return None


def _check_ep(opts: RunOptions) -> str | None:
    if opts.experts % opts.world_size:
        return f"--experts {opts.experts} must be divisible by the {opts.world_size} ranks (experts per rank)"
    if opts.top_k > opts.experts:
        return f"--top-k {opts.top_k} exceeds --experts {opts.experts}"
    if opts.capacity_factor <= 0:
        return f"--capacity-factor must be positive, got {opts.capacity_factor}"
    return None


PARADIGMS: dict[str, Paradigm] = {
    "ddp": Paradigm("runners.ddp", "DistributedDataParallel: replicated model, gradients all-reduced"),
    "zero1": Paradigm("runners.ddp", "DDP + ZeroRedundancyOptimizer: optimizer state sharded (ZeRO-1)"),
    "zero2": Paradigm(
        "runners.fsdp",
        "FSDP2 fully_shard, reshard_after_forward=False: gradients + optimizer sharded (ZeRO-2)",
    ),
    "fsdp": Paradigm("runners.fsdp", "FSDP2 fully_shard: parameters, gradients, optimizer sharded (ZeRO-3)"),
    "tp": Paradigm(
        "runners.tp_sp",
        "tensor parallel (Megatron: column/row-parallel attention and MLP); --sp adds sequence parallel",
        data_parallel=lambda opts: 1,
        check=_check_tp,
    ),
    "ep": Paradigm(
        "runners.expert_parallel",
        "expert parallel MoE: experts spread over ranks, tokens moved by all-to-all, rest data-parallel",
        check=_check_ep,
    ),
}

