"""Fully sharded data parallelism with FSDP2 (`fully_shard`): ZeRO-2 and ZeRO-3.

    ptprof run fsdp --gpus 2     # ZeRO-3: parameters, gradients and optimizer state sharded
    ptprof run zero2 --gpus 2    # ZeRO-2: reshard_after_forward=False
    ptprof run fsdp --gpus 2 --offload   # + CPUOffloadPolicy: sharded state in CPU memory (CUDA only)

Every parameter is a DTensor sharded on dim 0 over the data-parallel mesh. Before a unit runs,
FSDP all-gathers its parameters; after backward it reduce-scatters the gradients, so each rank
keeps and steps only its shard. `fsdp` frees the gathered parameters after each unit's forward and
gathers them again for backward; `zero2` keeps them from forward until backward (no second
all-gather, full parameters held through the step, as ZeRO-2).

With --offload (FSDP2's CPUOffloadPolicy, the heterogeneous case of ZeRO-Offload) the sharded
parameters, their gradients and so the optimizer state live in pinned CPU memory: each unit's
shards are copied to the GPU (H2D) before its all-gather, each reduce-scattered gradient shard
is copied back (D2H), and AdamW steps on the CPU. GPU memory then holds only what a unit
gathers and the activations, for PCIe traffic and a CPU optimizer step. On gloo CPU ranks the
state is in CPU memory already: `ptprof run` refuses --offload without a GPU.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from runners import harness
from runners.model import GPT


def apply_fsdp_units(model: GPT, mesh: DeviceMesh, *, reshard_after_forward: bool, offload: bool = False) -> None:
    """fully_shard `model` over the 1-D data-parallel `mesh`: one unit per block, the embeddings
    and the output layers (where this model, perhaps a pipeline stage, has them), then the root.

    Giving the embeddings and the output layers units of their own leaves the root no parameters:
    otherwise FSDP never reshards the root after forward and ZeRO-3 would hold the embeddings and
    head unsharded through the step. Parameters that are already DTensors (tensor parallel) are
    sharded again on dim 0 of their local shard, a 2-D (dp, tp) layout. `offload`: every unit
    keeps its shards in pinned CPU memory (the policy must be the same on every unit).
    """
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard_after_forward,
              "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
    if model.tok_emb is not None:
        fully_shard([model.tok_emb, model.pos_emb], **kwargs)
    for block in model.blocks.values():
        fully_shard(block, **kwargs)
    if model.head is not None:
        fully_shard([model.norm, model.head], **kwargs)
    fully_shard(model, **kwargs)


def apply_fsdp(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("dp",))
    apply_fsdp_units(model, mesh, reshard_after_forward=ctx.opts.paradigm == "fsdp", offload=ctx.opts.offload)
    optimizer = harness.make_optimizer(model.parameters(), ctx.opts)  # with offload: CPU tensors, a CPU step
    return harness.Parallel(model, optimizer, mesh={"dp": ctx.world_size}, dp_rank=ctx.rank, dp_size=ctx.world_size)


if __name__ == "__main__":
    harness.main(apply_fsdp)
