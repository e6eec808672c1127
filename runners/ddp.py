"""Data parallelism with a replicated model: DDP, and DDP + ZeRO-1.

    ptprof run ddp --gpus 2      # DistributedDataParallel
    ptprof run zero1 --gpus 2    # + ZeroRedundancyOptimizer: each rank keeps 1/N of the AdamW state

Every rank holds the whole model and trains on its 1/N of the global batch. DDP all-reduces the
gradients in buckets during backward (overlapping the remaining backward compute), so every rank
applies the same averaged gradient. ZeRO-1 then lets each rank step only its own partition of the
parameters and broadcasts the updated values, inside the optimizer phase.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from runners import harness


def apply_ddp(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    # Gradients as views into DDP's buckets: one copy of the gradients, not two.
    ddp = DDP(model, device_ids=device_ids, gradient_as_bucket_view=True)
    if ctx.opts.paradigm == "zero1":
        optimizer = ZeroRedundancyOptimizer(
            ddp.parameters(), optimizer_class=torch.optim.AdamW, **harness.optimizer_kwargs(ctx.opts)
        )
    else:
        optimizer = harness.make_optimizer(ddp.parameters(), ctx.opts)
    return harness.Parallel(ddp, optimizer, mesh={"dp": ctx.world_size}, dp_rank=ctx.rank, dp_size=ctx.world_size)


if __name__ == "__main__":
    harness.main(apply_ddp)
