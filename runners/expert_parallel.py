"""Expert parallelism: the MoE GPT with its experts spread over the ranks, tokens moved by all-to-all.

    ptprof run ep --gpus 2 --experts 4 --top-k 2 --capacity-factor 1.25

Each rank trains on 1/E of the global batch (data parallel for everything but the experts) and
owns experts/E experts of every MoE layer. In an MoE layer each rank routes its own tokens
(top-k gating with capacity, the same `MoE.route` as the single-process model), sends every kept
(token, expert) pair to the expert's owner with `all_to_all_single` (uneven splits: as many as were
routed there), the owner runs its experts, and a second all-to-all brings the outputs back to be
combined with the gate weights. Dropped pairs (over capacity) contribute nothing; the residual
connection passes those tokens through.

Gradients: non-expert parameters are averaged over ranks (DDP semantics, one all-reduce each after
backward). An expert's gradient already sums every rank's contribution (the all-to-all's backward
carried them home), so it is divided by E to match. The load-balancing loss uses the global token
statistics (all-reduced), so training equals the single-process model on the same global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_nn
from torch import nn
from torch.profiler import record_function

from runners import harness
from runners.model import MoE, lm_loss

AUX_LOSS_WEIGHT = 0.01  # weight of the load-balancing loss in the training objective


class ExpertParallelMoE(nn.Module):
    """Wraps a MoE layer: keeps the router and this rank's experts, moves tokens by all-to-all."""

    def __init__(self, moe: MoE, rank: int, world: int):
        super().__init__()
        self.inner, self.rank, self.world = moe, rank, world
        self.local = moe.n_experts // world  # experts per rank; expert e lives on rank e // local
        first = rank * self.local
        # Keep only this rank's experts (same seeded weights as the single-process model).
        moe.experts = nn.ModuleList(moe.experts[first : first + self.local])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        moe = self.inner
        flat = x.reshape(-1, d)
        # Capacity applies per rank (a GShard group); with no drops this routes every token exactly
        # as the single-process layer does.
        expert, gate, keep = moe.route(flat)
        # The load-balancing loss from global statistics: the same value the single process sees.
        # all_reduce from torch.distributed.nn is differentiable: every rank's router gets its share.
        moe.aux_loss = moe.load_balancing_loss(
            _sum_over_ranks(moe.first_choice_counts),
            dist_nn.all_reduce(moe.prob_sums),
            flat.shape[0] * self.world,
        )
        token, choice = torch.nonzero(keep, as_tuple=True)
        dest_expert = expert[token, choice]
        order = torch.argsort(dest_expert, stable=True)  # group the pairs by expert (hence by owner)
        token, choice, dest_expert = token[order], choice[order], dest_expert[order]
        send_counts = torch.bincount(dest_expert // self.local, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        send, recv = send_counts.tolist(), recv_counts.tolist()
        # Which local expert each received row goes to travels with it.
        sent_expert = (dest_expert % self.local).float().unsqueeze(1)
        payload = torch.cat([flat[token], sent_expert], dim=1)
        received = dist_nn.all_to_all_single(payload.new_empty(sum(recv), d + 1), payload, recv, send)
        rows, local_expert = received[:, :d], received[:, d].long()
        out_rows = torch.zeros_like(rows)
        for e, mlp in enumerate(moe.experts):
            idx = torch.nonzero(local_expert == e, as_tuple=True)[0]
            if idx.numel():
                out_rows = out_rows.index_add(0, idx, mlp(rows[idx]))
        back = dist_nn.all_to_all_single(out_rows.new_empty(sum(send), d), out_rows, send, recv)
        out = torch.zeros_like(flat).index_add(0, token, back * gate[token, choice].unsqueeze(-1))
        return out.view(b, t, d)


def apply_ep(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    for block in model.blocks.values():
        if isinstance(block.ffn, MoE):
            block.ffn = ExpertParallelMoE(block.ffn, ctx.rank, ctx.world_size)
    expert_params = {id(p) for m in model.modules() if isinstance(m, ExpertParallelMoE) for p in m.inner.experts.parameters()}
    shared = [p for p in model.parameters() if id(p) not in expert_params]
    experts = [p for p in model.parameters() if id(p) in expert_params]
    optimizer = harness.make_optimizer(model.parameters(), ctx.opts)
    world = ctx.world_size

    moe_layers = {int(name): block.ffn.inner for name, block in model.blocks.items() if isinstance(block.ffn, ExpertParallelMoE)}
    routing_local: list[torch.Tensor] = []  # per step: [layers, experts + 1] kept pairs, then drops

    def train_step(par: harness.Parallel, inputs, targets, probe: harness.MemoryProbe):
        with record_function(harness.PHASE_FORWARD):
            lm = lm_loss(model(inputs), targets)
            loss = lm + AUX_LOSS_WEIGHT * model.aux_loss()
        probe.after_forward(model, optimizer)
        with record_function(harness.PHASE_BACKWARD):
            loss.backward()
            # Data-parallel average of the replicated parameters' gradients, one flat all-reduce.
            flat = torch.cat([p.grad.reshape(-1) for p in shared])
            dist.all_reduce(flat)
            flat /= world
            offset = 0
            for p in shared:
                p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad))
                offset += p.numel()
            for p in experts:  # already summed over every rank's tokens by the all-to-all's backward
                p.grad.div_(world)
        probe.after_backward(model)
        routing_local.append(torch.stack([
            torch.cat([m.tokens_per_expert, m.tokens_per_expert.new_tensor([m.dropped_tokens])])  # same device
            for m in moe_layers.values()
        ]))
        return lm

    def after_training() -> None:
        # One all-reduce for the whole run, outside the profiled steps.
        local = torch.stack(routing_local).to(torch.long)  # [steps, layers, experts + 1]
        by_rank = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(by_rank, local)  # each rank's kept pairs per expert: its all-to-all split sizes
        totals = torch.stack(by_rank).sum(0)
        par.extra["moe"]["routing_by_rank"] = [
            [[{"layer": layer, "tokens_per_expert": row[:-1].tolist(), "dropped": int(row[-1])}
              for layer, row in zip(moe_layers, step)] for step in theirs]
            for theirs in by_rank
        ]
        par.extra["moe"]["routing"] = [
            [{"layer": layer, "tokens_per_expert": row[:-1].tolist(), "dropped": int(row[-1])}
             for layer, row in zip(moe_layers, step)]
            for step in totals
        ]

    par = harness.Parallel(
        model, optimizer, mesh={"ep": world}, dp_rank=ctx.rank, dp_size=world,
        train_step=train_step, after_training=after_training,
    )
    par.extra = {"moe": {"experts": ctx.opts.experts, "top_k": ctx.opts.top_k,
                         "capacity_factor": ctx.opts.capacity_factor, "aux_loss_weight": AUX_LOSS_WEIGHT,
                         "moe_layers": list(moe_layers), "routing": [], "routing_by_rank": []}}
    return par


def _sum_over_ranks(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t)
    return t


if __name__ == "__main__":
    harness.main(apply_ep, moe=True)
