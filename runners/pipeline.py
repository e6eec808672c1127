"""Pipeline parallelism with torch.distributed.pipelining: GPipe, 1F1B, interleaved 1F1B, zero
bubble (ZB-H1), ZB-V and DualPipeV, with every microbatch's compute annotated.

    ptprof run gpipe --gpus 2 --microbatches 4
    ptprof run 1f1b --gpus 4 --microbatches 8     # no --model: the smallest preset that fits (tiny8)
    ptprof run interleaved-1f1b --gpus 2 --stages-per-rank 2 --microbatches 4
    ptprof run zero-bubble --gpus 2 --microbatches 4        # one stage per rank: ZB-H1
    ptprof run zbv --gpus 2 --model tiny8 --microbatches 4  # two V-shaped stages per rank
    ptprof run dualpipev --gpus 2 --microbatches 4

The model is cut into S = P x V stages of contiguous blocks: embeddings on the first, final norm,
head and loss on the last. Looped schedules put stage s on rank s % P; the V-shaped ones (zbv,
dualpipev) go down the ranks and back up, so rank 0 holds the first and the last stage. There is
no data parallelism: the schedule cuts the global batch into M equal microbatches, the last stage
computes each one's mean loss and torch divides the accumulated gradients by M, so gradients and
the step's loss (the mean of the microbatch losses) are those of a single process.

torch's own spans (`PP:1F0` in the multi-stage schedules, `Forward 3` in GPipe, none in 1F1B)
include waiting for receives, so we wrap the stage's compute calls in `harness.PP_ACTION` spans:
forward, full backward (B) or input-grad backward (I) where the schedule splits backward, weight
backward (W), and the loss (L). The schedule posts sends and waits for receives outside those
calls, so these spans are compute only. run.json["pipeline"] records the stage placement and the
schedule's ideal action order per rank (docs/run-layout.md, "Pipeline").
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed.pipelining as pipelining
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import PipelineScheduleMulti
from torch.profiler import record_function

from runners import harness
from runners.model import GPT, lm_loss
from runners.options import RunOptions
from runners.paradigms import PIPELINE_SCHEDULES, pipeline_schedule, pipeline_shape


def stage_layers(n_layers: int, n_stages: int) -> list[range]:
    """Contiguous block indices of each stage, as even as possible (earlier stages get the extra)."""
    base, extra = divmod(n_layers, n_stages)
    bounds = [0]
    for s in range(n_stages):
        bounds.append(bounds[-1] + base + (s < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def stage_to_rank(placement: str, ranks: int, n_stages: int) -> list[int]:
    """Rank of each stage: looped (0, 1, .., P-1, 0, 1, ..) or V-shaped (0, .., P-1, P-1, .., 0)."""
    if placement == "loop":
        return [s % ranks for s in range(n_stages)]
    return [s % ranks if (s // ranks) % 2 == 0 else ranks - 1 - s % ranks for s in range(n_stages)]


def build_stage_module(model: GPT, layers: range, *, first: bool, last: bool) -> GPT:
    """A copy of the full model that keeps only this stage's blocks, embeddings and head.

    Copying the (identically seeded) full model keeps every kept weight equal to the single-process
    model's; the blocks stay keyed by their global layer index.
    """
    stage = copy.deepcopy(model)
    for name in list(stage.blocks):
        if int(name) not in layers:
            del stage.blocks[name]
    if not first:
        stage.tok_emb = stage.pos_emb = None
    if not last:
        stage.norm = stage.head = None
    return stage


class AnnotatedStage(PipelineStage):
    """A PipelineStage whose compute calls run under `harness.PP_ACTION` spans.

    The schedules receive before and send after these calls (schedules.py: `get_fwd_recv_ops` and
    its wait precede `forward_one_chunk`), so the spans hold compute only.
    """

    pending_loss: int | None = None  # microbatch whose loss the schedule computes next (last stage)
    after_forward: Callable[[], None] | None = None  # called after each forward, outside its span

    def _span(self, kind: str, microbatch: int) -> record_function:
        return record_function(harness.PP_ACTION.format(kind=kind, stage=self.stage_index, microbatch=microbatch))

    def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
        with self._span("F", fwd_chunk_id):
            output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
        if self.after_forward is not None:
            self.after_forward()
        if self.is_last:
            self.pending_loss = fwd_chunk_id  # the schedule computes its loss right after
        return output

    def backward_one_chunk(self, bwd_chunk_id, loss=None, full_backward=True, last_backward=False):
        # full_backward=False: the schedule split backward; this is the input-gradient half.
        with self._span("B" if full_backward else "I", bwd_chunk_id):
            return super().backward_one_chunk(
                bwd_chunk_id, loss=loss, full_backward=full_backward, last_backward=last_backward
            )

    def backward_weight_one_chunk(self, bwd_chunk_id, last_backward=False):
        with self._span("W", bwd_chunk_id):
            return super().backward_weight_one_chunk(bwd_chunk_id, last_backward=last_backward)


def annotated_loss(stage: AnnotatedStage | None):
    """The schedule's loss function: mean cross-entropy of one microbatch, in an L span."""
    if stage is None:  # no last stage here: the schedule only needs to know that there is a loss
        return lm_loss

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        microbatch, stage.pending_loss = stage.pending_loss, None
        if microbatch is None:  # shape inference on the first step: not an action of the schedule
            return lm_loss(logits, targets)
        with stage._span("L", microbatch):
            return lm_loss(logits, targets)

    return loss_fn


def textbook_order(name: str, ranks: int, microbatches: int) -> list[list[tuple[str, int, int]]]:
    """GPipe's and 1F1B's action order on each rank (stage = rank), from their definitions.

    GPipe: every forward, then every backward. 1F1B: rank r runs P-1-r warmup forwards, then
    alternates one forward and one backward, then drains the remaining backwards. (torch 2.13's
    `pipeline_order` table for Schedule1F1B starts the last rank's forwards at microbatch 1; its
    runtime is right, so we write the order down ourselves.)
    """
    orders = []
    for r in range(ranks):
        f = [("F", r, i) for i in range(microbatches)]
        b = [("B", r, i) for i in range(microbatches)]
        if name == "gpipe":
            orders.append(f + b)
            continue
        warmup = min(ranks - 1 - r, microbatches)
        steady = [action for i in range(microbatches - warmup) for action in (f[warmup + i], b[i])]
        orders.append(f[:warmup] + steady + b[microbatches - warmup :])
    return orders


def torch_order(schedule: PipelineScheduleMulti, ranks: int) -> list[list[tuple[str, int, int]]]:
    """The compute actions of torch's `pipeline_order` per rank: idle slots dropped, DualPipeV's
    overlapped forward+backward pairs expanded in the order the runtime runs them."""
    orders = []
    for r in range(ranks):
        leaves = [leaf for a in schedule.pipeline_order[r] if a is not None for leaf in (a.sub_actions or (a,))]
        orders.append([(a.computation_type.value, a.stage_index, a.microbatch_index) for a in leaves])
    return orders


@dataclass(frozen=True)
class StagePlan:
    """How a run cuts the model into stages and places them on the P pipeline ranks."""

    schedule: str  # a key of PIPELINE_SCHEDULES
    ranks: int  # P: pipeline ranks (the world here; the pp degree of a hybrid run)
    microbatches: int  # M per step
    stages_per_rank: int  # V
    stage_to_rank: list[int]  # pipeline rank (0..P-1) of each stage
    layers: list[range]  # each stage's blocks

    @property
    def n_stages(self) -> int:
        return self.ranks * self.stages_per_rank

    def stages_of(self, pp_rank: int) -> list[int]:
        return [s for s, r in enumerate(self.stage_to_rank) if r == pp_rank]


def plan_stages(opts: RunOptions, n_layers: int) -> StagePlan:
    """The stages of a pipeline run, or of a hybrid run's pp dimension, from its options."""
    name, p = pipeline_schedule(opts)
    m, v = pipeline_shape(opts)
    placement = stage_to_rank(PIPELINE_SCHEDULES[name].placement, p, p * v)
    counts = opts.stage_layer_counts  # --stage-layers: an uneven split, checked against n_layers already
    layers = stage_layers(n_layers, p * v) if counts is None else split_layers(counts)
    return StagePlan(name, p, m, v, placement, layers)


def split_layers(counts: list[int]) -> list[range]:
    """Contiguous block indices of each stage from its block count (--stage-layers)."""
    bounds = [0]
    for n in counts:
        bounds.append(bounds[-1] + n)
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


def build_schedule(plan: StagePlan, modules: dict[int, nn.Module], device, group=None):
    """Wrap this rank's stage modules (stage index -> module) in AnnotatedStages and build the
    schedule over them. `group`: the pipeline ranks' process group (default: the world).

    Returns (schedule, stages). PipelineStage must wrap the finished module: with FSDP it turns the
    module's gradient sync off for every microbatch's backward and runs the reduce-scatter once,
    after the last (stage.py, `backward_maybe_with_nosync` and `perform_reduce_grad`).
    """
    stages = [
        AnnotatedStage(module, stage_index=s, num_stages=plan.n_stages, device=device, group=group)
        for s, module in modules.items()
    ]
    last = next((st for st in stages if st.is_last), None)
    schedule_cls = getattr(pipelining, PIPELINE_SCHEDULES[plan.schedule].torch_class)
    multi = issubclass(schedule_cls, PipelineScheduleMulti)  # GPipe and 1F1B take one stage
    schedule = schedule_cls(stages if multi else stages[0], plan.microbatches, loss_fn=annotated_loss(last))
    if multi and schedule.stage_index_to_group_rank != dict(enumerate(plan.stage_to_rank)):
        raise RuntimeError(
            f"{plan.schedule}: torch places stages {schedule.stage_index_to_group_rank}, we built {plan.stage_to_rank}"
        )
    return schedule, stages


def pipeline_step(schedule, stages: list[AnnotatedStage]):
    """The harness's train_step for a pipeline: one schedule step, returning the mean microbatch loss
    on the rank holding the last stage (None elsewhere)."""
    holds_first = any(st.is_first for st in stages)
    holds_last = any(st.is_last for st in stages)

    def train_step(par: harness.Parallel, inputs, targets, probe: harness.MemoryProbe):
        # The first stage takes the inputs, the last the targets; the schedule splits both into M.
        losses: list[torch.Tensor] = []
        args = (inputs,) if holds_first else ()
        kwargs = {"target": targets, "losses": losses} if holds_last else {}
        # Parameters held "after forward": sampled after each forward of the sampled (first) step,
        # so its last forward counts, when FSDP (hybrid runs) holds every unit of its stages
        # gathered. Later steps run without the hook.
        hook = (lambda: probe.after_forward(par.model, par.optimizer)) if probe.sampling else None
        for stage in stages:
            stage.after_forward = hook
        schedule.step(*args, return_outputs=False, **kwargs)
        probe.after_backward(par.model)
        return torch.stack([loss.detach() for loss in losses]).mean() if holds_last else None

    return train_step


def stage_modules(plan: StagePlan, model: GPT, pp_rank: int) -> dict[int, nn.Module]:
    """Stage index -> this pipeline rank's copy of that stage of `model`."""
    return {
        s: build_stage_module(model, plan.layers[s], first=s == 0, last=s == plan.n_stages - 1)
        for s in plan.stages_of(pp_rank)
    }


def pipelined(plan: StagePlan, schedule, stages: list[AnnotatedStage], rows: int) -> dict:
    """The harness.Parallel fields of a pipeline rank (model, train_step, reports_loss, phases) and
    its run.json block (`extra`); `rows`: sequences per step through one pipeline."""
    return {
        "model": nn.ModuleList(st.submod for st in stages),
        "train_step": pipeline_step(schedule, stages),
        "reports_loss": any(st.is_last for st in stages),
        "phases": PIPELINE_PHASES,
        "extra": {"pipeline": pipeline_manifest(plan, schedule, rows)},
    }


def pipeline_manifest(plan: StagePlan, schedule, rows: int) -> dict:
    """run.json's "pipeline" block (docs/run-layout.md); `rows`: sequences per step through one pipeline."""
    textbook = plan.schedule in ("gpipe", "1f1b")
    return {
        "schedule": plan.schedule,
        "torch_schedule": PIPELINE_SCHEDULES[plan.schedule].torch_class,
        "ranks": plan.ranks,
        "microbatches": plan.microbatches,
        "microbatch_size": rows // plan.microbatches,
        "stages_per_rank": plan.stages_per_rank,
        "num_stages": plan.n_stages,
        "stage_to_rank": plan.stage_to_rank,
        "stage_layers": [[r.start, r.stop] for r in plan.layers],
        "loss_stage": plan.n_stages - 1,
        "span_format": harness.PP_ACTION,
        "order_source": "textbook" if textbook else "torch pipeline_order",
        "ideal_order": (
            textbook_order(plan.schedule, plan.ranks, plan.microbatches)
            if textbook
            else torch_order(schedule, plan.ranks)
        ),
    }


# Pipeline runs have no per-step forward/backward phases: their compute is in the per-microbatch
# spans, so run.json lists only the phase they do annotate.
PIPELINE_PHASES = {"optimizer": harness.PHASE_OPTIMIZER}


def apply_pipeline(model: nn.Module, ctx: harness.Context) -> harness.Parallel:
    plan = plan_stages(ctx.opts, model.cfg.n_layers)
    schedule, stages = build_schedule(plan, stage_modules(plan, model, ctx.rank), ctx.device)
    parts = pipelined(plan, schedule, stages, ctx.opts.global_batch_size)
    optimizer = harness.make_optimizer(parts["model"].parameters(), ctx.opts)
    return harness.Parallel(optimizer=optimizer, mesh={"pp": plan.ranks}, dp_rank=0, dp_size=1, **parts)


if __name__ == "__main__":
    harness.main(apply_pipeline)
