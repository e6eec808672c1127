"""Memory accounting of a rank: the persistent memory it actually holds (parameters, gradients,
optimizer state), sampled by `MemoryProbe` during the first step, and what its optimizer steps.
Numbers for run.json's ranks[].memory and ranks[].params (docs/run-layout.md).
"""

from __future__ import annotations

import torch
from torch import nn

def _storage_bytes(tensors) -> int:
    """Bytes of distinct storages behind `tensors` (DTensors counted by their local shard).

    Deduplicating by storage counts a flat buffer once however many views share it (DDP's
    gradient buckets, FSDP2's all-gather output).
    """
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def numel_by_dtype(params) -> dict[str, int]:
    """Parameter elements by dtype name ("float32", "bfloat16"), local shards for DTensors."""
    out: dict[str, int] = {}
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        name = str(local.dtype).removeprefix("torch.")
        out[name] = out.get(name, 0) + local.numel()
    return out


def local_params(optimizer: torch.optim.Optimizer) -> dict:
    """run.json `ranks[].params`: the parameters this rank's optimizer holds (local shards):
    tensors, elements and bytes, and elements by dtype."""
    params = _optimizer_params(optimizer)
    locals_ = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    return {"tensors": len(params), "count": sum(t.numel() for t in locals_),
            "bytes": sum(t.numel() * t.element_size() for t in locals_), "by_dtype": numel_by_dtype(params)}


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _optimizer_state_tensors(optimizer: torch.optim.Optimizer):
    # ZeroRedundancyOptimizer keeps this rank's shard of the state in its wrapped local optimizer.
    local = getattr(optimizer, "optim", optimizer)
    for state in local.state.values():
        for value in state.values():
            if torch.is_tensor(value):
                yield value


class MemoryProbe:
    """Persistent memory actually held on this rank, sampled at three points of the first step that
    runs a backward (the first step, except on an early pipedream stage with few microbatches)."""

    def __init__(self) -> None:
        self.sampling = True
        self.numbers: dict[str, int | None] = {
            "params_bytes": None,
            "params_at_rest_bytes": None,
            "grads_bytes": None,
            "optimizer_bytes": None,
            "max_memory_allocated_bytes": None,
            "max_memory_allocated_by_gpu_bytes": None,
            # Weight copies a runner keeps besides its parameters (pipedream's weight stashing: the
            # most held at once over the run, set by the runner); None where nothing is stashed.
            "stashed_params_bytes": None,
        }

    def after_forward(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # The module's registered parameters now are whatever FSDP left unsharded after forward;
        # the optimizer's are the shards. Both are held, so both count.
        if self.sampling:
            tensors = list(model.parameters()) + _optimizer_params(optimizer)
            self.numbers["params_bytes"] = _storage_bytes(tensors)

    def after_backward(self, model: nn.Module) -> None:
        if self.sampling:
            self.numbers["grads_bytes"] = _storage_bytes(p.grad for p in model.parameters())

    def after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.sampling:
            self.numbers["params_at_rest_bytes"] = _storage_bytes(model.parameters())
            self.numbers["optimizer_bytes"] = _storage_bytes(_optimizer_state_tensors(optimizer))
            # Done once a step has run a backward: a pipedream stage may only run forwards in step 0
            # (its first backward comes after P-1-s forwards), leaving no gradients or optimizer state yet.
            self.sampling = self.numbers["grads_bytes"] is None
