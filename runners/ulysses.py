"""DeepSpeed-Ulysses sequence parallelism: sequence shards, swapped for head shards around attention.

    ptprof run ulysses --gpus 2              # each rank holds 16 of tiny's 32 tokens per sequence
    ptprof run ulysses --gpus 2 --recompute  # + activation checkpointing (the all-to-alls rerun too)

Every rank trains on the whole global batch but holds only its contiguous s/P slice of every
sequence (tokens [r·s/P, (r+1)·s/P), embedded at their true positions). Everything but attention
works token by token, so it runs on the slice as it is. Attention needs every position: before it,
an all-to-all turns this rank's sequence slice of q, k and v (all heads) into the full sequence of
H/P heads; causal attention runs on those heads; a fourth all-to-all turns the output back into
sequence slices (Jacobs et al. 2023, arXiv:2309.14509). Backward mirrors them: 4 more all-to-alls.

The weights are replicated; DDP averages their gradients over the ranks. That average is the
single-process gradient: each rank's loss is the mean over its b·s/P tokens (equal counts), and
the all-to-alls' backward carries every rank's loss back to the activations it came from.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from runners import harness
from runners.model import GPT, causal_attention


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over equal chunks of dim 0, whose backward is the mirror all-to-all (the
    gradient of chunk j received from rank j goes back to rank j)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return _all_to_all(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return _all_to_all(grad)


def _all_to_all(x: torch.Tensor) -> torch.Tensor:
    # Contiguous buffers (empty_like would copy a permuted input's strides); the trace records the
    # input's shape, so its size is the nccl-tests all-to-all size: b·(s/P)·h elements.
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x)
    return out


def seq_to_heads(x: torch.Tensor, p: int) -> torch.Tensor:
    """[b, H, s/P, hd] (all heads, this rank's slice) -> [b, H/P, s, hd] (this rank's heads, all tokens)."""
    b, heads, t, hd = x.shape
    # Chunk j of dim 0 (heads j·H/P ...) goes to rank j; chunk i received is rank i's slice, and
    # the slices are contiguous in rank order, so stacking them in order is the sequence order.
    send = x.reshape(b, p, heads // p, t, hd).transpose(0, 1)
    recv = _AllToAll.apply(send)  # [P (source rank = sequence slice), b, H/P, s/P, hd]
    return recv.permute(1, 2, 0, 3, 4).reshape(b, heads // p, p * t, hd)


def heads_to_seq(y: torch.Tensor, p: int) -> torch.Tensor:
    """[b, H/P, s, hd] -> [b, H, s/P, hd]: the inverse of `seq_to_heads`."""
    b, local, s, hd = y.shape
    send = y.reshape(b, local, p, s // p, hd).permute(2, 0, 1, 3, 4)  # chunk j: sequence slice j
    recv = _AllToAll.apply(send)  # [P (source rank = head group), b, H/P, s/P, hd]
    return recv.transpose(0, 1).reshape(b, p * local, s // p, hd)


def ulysses_core(p: int):
    """The attention core of runners/model.py (q, k, v -> y, causal) for sequence shards over p ranks."""

    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # Separate all-to-alls for q, k and v, as DeepSpeed's DistributedAttention does: 4 per layer.
        y = causal_attention(seq_to_heads(q, p), seq_to_heads(k, p), seq_to_heads(v, p))
        return heads_to_seq(y, p)

    return core


def apply_ulysses(model: GPT, ctx: harness.Context) -> harness.Parallel:
    p, r = ctx.world_size, ctx.rank
    for block in model.blocks.values():
        block.attn.core = ulysses_core(p)
    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    # DDP averages the replicated weights' gradients over the ranks (the sequence shards).
    ddp = DDP(model, device_ids=device_ids, gradient_as_bucket_view=True)
    optimizer = harness.make_optimizer(ddp.parameters(), ctx.opts)
    s = ctx.opts.sequence_length
    t = s // p  # tokens per rank of every sequence (paradigms.py checks s % P and H % P)
    positions = torch.arange(r * t, (r + 1) * t, device=ctx.device)

    # Every rank gets the whole batch and trains on its own tokens of each row (harness.sequence_shard_step).
    step = harness.sequence_shard_step(ddp, optimizer, positions)
    par = harness.Parallel(ddp, optimizer, mesh={"sp": p}, dp_rank=0, dp_size=1, train_step=step, seq_shards=p)
    par.extra = {"sequence_parallel": {"kind": "ulysses", "shards": p, "tokens_per_rank": t,
                                       "heads_per_rank": model.cfg.n_heads // p, "split": "contiguous"}}
    return par


if __name__ == "__main__":
    harness.main(apply_ulysses)
