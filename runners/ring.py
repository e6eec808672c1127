"""Ring attention (context parallelism): each rank holds s/P of every sequence; K and V travel the ring.

    ptprof run ring --gpus 2
    ptprof run ring --gpus 4 --recompute

Every rank sees the whole global batch but only its share of each sequence. Everything outside
attention works token by token, so it runs on the local tokens unchanged (with their true
positions). Attention needs every earlier key: each rank computes its queries against its own
K/V block, then passes the block it holds to the next rank and receives the previous rank's, P−1
times (isend/irecv pairs posted together, so no rank waits on a send before its receive), until
every block has visited every rank (Liu et al. 2023, Ring Attention). The partial attentions are
combined by the online-softmax rule: each carries its log-sum-exp, and the running output is
rescaled by exp(lse_old − lse_new) (Milakov & Gimelshein 2018; FlashAttention).

Load balance (Megatron-CP, llama3 context parallel, Brandon et al. 2023 "striped"/zigzag): with a
causal mask, plain contiguous shards give the last rank P times the work of the first. The
sequence is cut into 2P chunks and rank r holds chunks r and 2P−1−r (one early, one late), so at
every step of the ring each rank computes exactly half a block pair and skips the masked half:
a visitor from an earlier rank j < r is seen whole by neither of our chunks but its early chunk
is seen by both; a visitor from a later rank j > r is seen (both chunks) by our late chunk only.

Backward is autograd through the ring: `_PassOn` is differentiable, and its backward sends the
gradient of the block it received back to the rank it came from (and receives the gradient of
the block it sent), so a K/V block's gradient travels the ring backwards, summing every rank's
contribution, P−1 messages of dK and dV per layer. While each forward step computes on one block,
the next block is already in flight (the exchange is posted first, waited for after). The
weights are replicated: DDP averages their gradients over the ranks, and since each rank's loss
is the mean over an equal share of the tokens, that average is the gradient of the global loss.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from runners import harness


def zigzag_positions(seq_len: int, rank: int, world: int) -> torch.Tensor:
    """Positions of the tokens rank `rank` holds: chunks rank and 2P−1−rank of 2P chunks."""
    c = seq_len // (2 * world)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


def _partial(q, k, v, mask=None):
    """Softmax attention of (pre-scaled) q against one block: (output, log-sum-exp per query)."""
    scores = q @ k.transpose(-2, -1)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = scores.logsumexp(-1)
    return (scores - lse.unsqueeze(-1)).exp() @ v, lse


def _merge(out, lse, block_out, block_lse):
    """Online softmax: two partial attentions over disjoint keys -> the attention over both."""
    new = torch.logaddexp(lse, block_lse)
    return ((lse - new).exp().unsqueeze(-1) * out + (block_lse - new).exp().unsqueeze(-1) * block_out), new


def zigzag_ring_attention(q, k, v, rank: int, world: int, start_pass, positions: torch.Tensor):
    """Causal attention of this rank's zigzag shard [b, heads, 2c, head_dim] over the whole sequence.

    start_pass(k, v) posts the ring step and returns a function that waits for it and gives the
    previous rank's block (k, v); the block seen at step i comes from rank (rank − i) mod P.
    """
    c = q.shape[2] // 2  # one chunk: [:c] is chunk `rank`, [c:] chunk 2P−1−rank
    q = q / math.sqrt(q.shape[-1])  # the softmax scale, once for every block
    for step in range(world):
        wait = start_pass(k, v) if step < world - 1 else None  # the next block travels while we compute
        src = (rank - step) % world
        if step == 0:  # our own block: causal by true positions (chunk `rank` never sees our late chunk)
            out, lse = _partial(q, k, v, positions.unsqueeze(1) >= positions.unsqueeze(0))
        elif src < rank:  # its early chunk precedes both of ours, its late chunk follows both
            out, lse = _merge(out, lse, *_partial(q, k[:, :, :c], v[:, :, :c]))
        else:  # src > rank: both its chunks fall between our early and our late chunk
            late, late_lse = _merge(out[:, :, c:], lse[:, :, c:], *_partial(q[:, :, c:], k, v))
            out, lse = torch.cat([out[:, :, :c], late], 2), torch.cat([lse[:, :, :c], late_lse], 2)
        if wait:
            k, v = wait()
    return out


class _PassOn(torch.autograd.Function):
    """One ring step: send (k, v) to the next rank, receive the previous rank's into fresh buffers.

    Forward only posts the transfer (the caller waits before reading the buffers, so compute can
    run meanwhile); backward sends the buffers' gradients back to the previous rank and receives
    from the next the gradients of what we sent, and waits for them.
    """

    @staticmethod
    def forward(ctx, k, v, requests: list):
        rank, world = dist.get_rank(), dist.get_world_size()
        ctx.next, ctx.prev = (rank + 1) % world, (rank - 1) % world
        k, v = k.contiguous(), v.contiguous()  # heads-first views of the projections: send needs one block
        k_in, v_in = torch.empty_like(k), torch.empty_like(v)
        # The requests (each holds its tensor until done) go back to the caller, who waits on them.
        requests.extend(dist.batch_isend_irecv(_exchange((k, v), ctx.next, (k_in, v_in), ctx.prev)))
        return k_in, v_in

    @staticmethod
    def backward(ctx, dk_in, dv_in):
        dk_in, dv_in = dk_in.contiguous(), dv_in.contiguous()
        dk, dv = torch.empty_like(dk_in), torch.empty_like(dv_in)
        for work in dist.batch_isend_irecv(_exchange((dk_in, dv_in), ctx.prev, (dk, dv), ctx.next)):
            work.wait()
        return dk, dv, None


def _exchange(send, to, recv, frm) -> list:
    # Sends and receives posted together (batch_isend_irecv): every rank sends before it waits to
    # receive, so the ring cannot deadlock however the ranks' steps interleave.
    return [dist.P2POp(dist.isend, t, to) for t in send] + [dist.P2POp(dist.irecv, t, frm) for t in recv]


def start_ring_pass(k, v):
    """Post one ring step of (k, v); returns wait(), which gives the previous rank's (k, v)."""
    requests: list = []
    k_in, v_in = _PassOn.apply(k, v, requests)

    def wait():
        for request in requests:
            request.wait()
        return k_in, v_in

    return wait


def apply_ring(model, ctx: harness.Context) -> harness.Parallel:
    p, seq = ctx.world_size, ctx.opts.sequence_length
    positions = zigzag_positions(seq, ctx.rank, p).to(ctx.device)
    for block in model.blocks.values():
        block.attn.core = lambda q, k, v: zigzag_ring_attention(q, k, v, ctx.rank, p, start_ring_pass, positions)
    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, gradient_as_bucket_view=True)
    optimizer = harness.make_optimizer(ddp.parameters(), ctx.opts)

    # Every rank gets the whole batch and trains on its own tokens of each row (harness.sequence_shard_step).
    step = harness.sequence_shard_step(ddp, optimizer, positions)
    par = harness.Parallel(ddp, optimizer, mesh={"cp": p}, dp_rank=0, dp_size=1, train_step=step, seq_shards=p)
    # run.json: how the sequence was cut (docs/run-layout.md); rank_chunks[r] = the chunks rank r holds.
    par.extra = {"sequence_parallel": {"kind": "ring", "shards": p, "layout": "zigzag", "chunks_per_rank": 2,
                                       "chunk_len": seq // (2 * p), "rank_chunks": [[r, 2 * p - 1 - r] for r in range(p)]}}
    return par


if __name__ == "__main__":
    harness.main(apply_ring)
