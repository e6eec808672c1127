"""The runners `ptprof run` knows: name -> worker module and a one-line description.

Kept free of torch so `ptprof --help` and argument errors answer instantly. A runner module is
started on every rank as `python -m <module> --paradigm <name> ...`; modules that serve several
paradigms (ddp/zero1, zero2/fsdp) branch on `--paradigm`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Paradigm:
    module: str  # worker module run on every rank
    summary: str  # one line for `ptprof run --help`


PARADIGMS: dict[str, Paradigm] = {
    "ddp": Paradigm("runners.ddp", "DistributedDataParallel: replicated model, gradients all-reduced"),
    "zero1": Paradigm("runners.ddp", "DDP + ZeroRedundancyOptimizer: optimizer state sharded (ZeRO-1)"),
    "zero2": Paradigm(
        "runners.fsdp",
        "FSDP2 fully_shard, reshard_after_forward=False: gradients + optimizer sharded (ZeRO-2)",
    ),
    "fsdp": Paradigm("runners.fsdp", "FSDP2 fully_shard: parameters, gradients, optimizer sharded (ZeRO-3)"),
}


def data_parallel_degree(paradigm: str, world_size: int) -> int:
    """How many ranks split the global batch (all of them for the data-parallel family)."""
    return world_size
