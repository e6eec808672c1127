"""Megatron-style tensor parallelism, optionally with sequence parallelism, via `parallelize_module`.

    ptprof run tp --gpus 2          # heads and MLP hidden split across 2 ranks
    ptprof run tp --gpus 2 --sp     # + LayerNorm regions sharded on the sequence dimension
    ptprof run tp --gpus 2 --loss-parallel   # + vocabulary-parallel cross-entropy (either way)

Every rank sees the whole global batch (there is no data parallelism here). In each block,
Q/K/V are column-parallel (each rank owns n_heads/T heads) and the output projection is
row-parallel, so attention needs one all-reduce in forward; the MLP likewise (up column-parallel,
down row-parallel). The LM head is vocabulary-parallel, its logits all-gathered for the loss.

With --loss-parallel the logits are never gathered: each rank keeps its b·s·V/T slice and the
cross-entropy runs on the slices under torch's `loss_parallel()` (Megatron's vocabulary-parallel
cross-entropy): all-reduces of b·s numbers (the row max, the sum of exponentials, the target's
logit) replace the all-gather of b·s·V logits, and the loss's backward needs no communication.

With --sp the residual stream between those regions is sharded on the sequence dimension: the
all-reduce after each row-parallel layer becomes a reduce-scatter (to sequence shards) and the
input of each column-parallel region an all-gather, so LayerNorm runs on 1/T of the tokens and
activations there take 1/T of the memory, for the same bytes on the wire.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)
from torch.profiler import record_function

from runners import harness
from runners.model import GPT, lm_loss


def block_plan(sp: bool) -> dict:
    """The plan of one transformer block, by submodule name."""
    if not sp:
        return {
            "attn.wq": ColwiseParallel(),
            "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(),
            "attn.wo": RowwiseParallel(),
            "ffn.up": ColwiseParallel(),
            "ffn.down": RowwiseParallel(),
        }
    return {
        "ln1": SequenceParallel(),
        # Gather the sequence shards before attention, which needs every position.
        "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "attn.wq": ColwiseParallel(),
        "attn.wk": ColwiseParallel(),
        "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(output_layouts=Shard(1)),  # reduce-scatter back to sequence shards
        "ln2": SequenceParallel(),
        "ffn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "ffn.up": ColwiseParallel(),
        "ffn.down": RowwiseParallel(output_layouts=Shard(1)),
    }


def apply_tp_plan(model: GPT, mesh: DeviceMesh, *, sp: bool, vocab_sharded_logits: bool = False) -> None:
    """Shard `model`'s blocks, and its head where it has one, over the 1-D tensor-parallel `mesh`.

    `model` may be a pipeline stage (runners/hybrid.py): embeddings only on the first, norm and head
    only on the last. Blocks take and return plain tensors, so a stage's input and output are the
    full activation, or with `sp` this rank's sequence shard of it (what the next stage's first
    block expects). With `vocab_sharded_logits` the head returns its logits as a DTensor sharded
    on the vocabulary (for `loss_parallel`) instead of all-gathering them.
    """
    for block in model.blocks.values():
        parallelize_module(block, mesh, block_plan(sp))
    top_plan = {}
    if model.head is not None:
        # Vocabulary-parallel head: each rank computes its slice of the logits, gathered for the loss
        # unless the loss itself is vocabulary-parallel (then they stay a Shard(-1) DTensor).
        inputs = Shard(1) if sp else Replicate()
        if vocab_sharded_logits:
            top_plan["head"] = ColwiseParallel(input_layouts=inputs, output_layouts=Shard(-1), use_local_output=False)
        else:
            top_plan["head"] = ColwiseParallel(input_layouts=inputs, output_layouts=Replicate())
    if sp and model.tok_emb is not None:
        # Embeddings stay replicated (small, and pos_emb is added to tok_emb's output): the first
        # block takes this rank's sequence slice of them, a local slice with no traffic.
        first = next(iter(model.blocks))
        top_plan[f"blocks.{first}"] = PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
        )
    if sp and model.norm is not None:
        top_plan["norm"] = SequenceParallel()
    if top_plan:
        parallelize_module(model, mesh, top_plan)


def apply_tp(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("tp",))
    apply_tp_plan(model, mesh, sp=ctx.opts.sp, vocab_sharded_logits=ctx.opts.loss_parallel)
    optimizer = harness.make_optimizer(model.parameters(), ctx.opts)
    # Every rank computes the same loss on the whole batch: each reports it (the mean is the same).
    return harness.Parallel(model, optimizer, mesh={"tp": ctx.world_size}, dp_rank=0, dp_size=1,
                            train_step=loss_parallel_step if ctx.opts.loss_parallel else None)


def loss_parallel_step(par: harness.Parallel, inputs, targets, probe: harness.MemoryProbe):
    """harness.data_parallel_step with the cross-entropy on vocabulary-sharded logits.

    Both the loss and its backward must run under `loss_parallel()`: it swaps DTensor's log_softmax
    and nll_loss (and their backward) for versions that all-reduce per-token numbers instead of
    gathering the logits; outside it they would be gathered after all.
    """
    with loss_parallel():
        with record_function(harness.PHASE_FORWARD):
            loss = lm_loss(par.model(inputs), targets)  # a replicated scalar DTensor
        probe.after_forward(par.model, par.optimizer)
        with record_function(harness.PHASE_BACKWARD):
            loss.backward()
        probe.after_backward(par.model)
    return loss.to_local()


if __name__ == "__main__":
    harness.main(apply_tp)
