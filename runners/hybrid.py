"""Hybrid 3D parallelism: FSDP2 over dp, a pipeline schedule over pp, tensor parallel over tp.

    ptprof run hybrid --gpus 8 --dp 2 --pp 2 --tp 2                      # 1F1B, 4 microbatches
    ptprof run hybrid --gpus 8 --dp 2 --pp 2 --tp 2 --model tiny8 --schedule interleaved-1f1b
    ptprof run hybrid --gpus 4 --dp 1 --pp 2 --tp 2 --sp                 # a degree of 1 drops that dimension

The ranks form a DeviceMesh of shape (dp, pp, tp) named ("dp", "pp", "tp"), tp innermost, so a
tensor-parallel group is consecutive ranks (one node, where its per-layer collectives are
cheapest) and rank = (dp_i * pp + pp_i) * tp + tp_i. Each dp replica trains on 1/dp of the
global batch through its own pipeline of pp stage groups; each stage is split over tp ranks.

- tp: the Megatron plan of runners/tp_sp.py on every block of the stage (and the head on the last
  stage). A stage's input and output are the full activation (with --sp: this tp rank's sequence
  shard), sent from tp rank i of one stage to tp rank i of the next.
- pp: the schedules of runners/pipeline.py over the pp group, with the same per-microbatch compute
  spans and run.json "pipeline" block (its ranks are pp coordinates).
- dp: FSDP2 `fully_shard` over the dp group. With pipelining the parameters stay gathered from a
  unit's first forward to the step's end (reshard_after_forward=False, as torchtitan does with pp):
  otherwise every microbatch would all-gather each unit twice. PipelineStage turns gradient sync
  off for each microbatch's backward and reduce-scatters once, after the last.

Gradients are those of the global batch: torch divides the microbatch losses' gradients by M
(each is a mean) and FSDP averages over dp. The step's loss is the token-weighted mean of the
last-stage ranks' losses (every tp rank there holds its replica's loss).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from runners import harness
from runners.fsdp import apply_fsdp_units
from runners.paradigms import hybrid_degrees
from runners.pipeline import build_schedule, pipelined, plan_stages, stage_modules
from runners.tp_sp import apply_tp_plan

DIMS = ("dp", "pp", "tp")  # mesh dimension names, outermost first


def mesh_groups(mesh: DeviceMesh) -> dict[str, list[list[int]]]:
    """For each dimension, the global ranks of each of its groups (a group varies that coordinate only)."""
    ranks = mesh.mesh
    return {
        name: ranks.movedim(d, -1).reshape(-1, ranks.shape[d]).tolist() for d, name in enumerate(mesh.mesh_dim_names)
    }


def apply_hybrid(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    opts = ctx.opts
    dp, pp, tp = hybrid_degrees(opts)
    mesh = init_device_mesh(ctx.device.type, (dp, pp, tp), mesh_dim_names=DIMS)
    pp_rank = mesh["pp"].get_local_rank()

    # This rank's parts of the model: its pipeline stages, or the whole model without pipelining.
    if pp > 1:
        plan = plan_stages(opts, model.cfg.n_layers)
        parts = stage_modules(plan, model, pp_rank)
    else:
        parts = {0: model}

    for part in parts.values():
        # TP first: parallelize_module turns parameters into DTensors sharded over tp, and
        # fully_shard reads those placements to shard each local TP shard again over dp, a 2-D
        # (dp, tp) layout. FSDP2 composes with TP in this order only (as in torchtitan).
        if tp > 1:
            apply_tp_plan(part, mesh["tp"], sp=opts.sp)
        # FSDP second, on the finished stage module, so that its root is the stage's submodule:
        # PipelineStage looks for exactly that (an FSDPModule) to manage the microbatch backward.
        if dp > 1:
            apply_fsdp_units(part, mesh["dp"], reshard_after_forward=pp == 1)

    hybrid = {"hybrid": {"dims": list(DIMS), "shape": [dp, pp, tp], "groups": mesh_groups(mesh), "sp": opts.sp}}
    fields = {"model": model}  # without pp: the harness's forward/backward step
    if pp > 1:
        # Pipeline last: PipelineStage wraps the parallelized module as it will run, and its
        # first step infers the shapes sent between stages from a real forward through it.
        schedule, stages = build_schedule(plan, parts, ctx.device, group=mesh["pp"].get_group())
        fields = pipelined(plan, schedule, stages, opts.global_batch_size // dp)  # one replica's batch
    fields["extra"] = fields.get("extra", {}) | hybrid
    return harness.Parallel(
        optimizer=harness.make_optimizer(fields["model"].parameters(), opts),
        mesh=dict(zip(DIMS, (dp, pp, tp))),
        dp_rank=mesh["dp"].get_local_rank(),
        dp_size=dp,
        **fields,
    )


if __name__ == "__main__":
    harness.main(apply_hybrid)
