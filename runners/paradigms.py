"""The runners `ptprof run` knows: name -> worker module and a one-line description.

Kept free of torch so `ptprof --help` and argument errors answer instantly. A runner module is
started on every rank as `python -m <module> --paradigm <name> ...`; modules that serve several
paradigms (ddp/zero1, zero2/fsdp) branch on `--paradigm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from runners.options import RunOptions


def _all_ranks(opts: RunOptions) -> int:
    return opts.world_size


@dataclass(frozen=True)
class Paradigm:
    module: str  # worker module run on every rank
    summary: str  # one line for `ptprof run --help`
    # How many ranks split the global batch (all of them for the data-parallel family).
    data_parallel: Callable[[RunOptions], int] = _all_ranks
    # Paradigm-specific checks run before any process starts: a one-line problem, or None.
    check: Callable[[RunOptions], str | None] = lambda opts: None


def _check_tp(opts: RunOptions) -> str | None:
    vocab, d_model, _layers, n_heads, _seq, _batch = opts.preset
    t = opts.world_size
    for what, size in (("attention heads", n_heads), ("d_model", d_model), ("vocab_size", vocab)):
        if size % t:
            return f"tp over {t} ranks needs {what} ({size}, model {opts.model!r}) divisible by {t}"
    if opts.sp and opts.sequence_length % t:
        return f"--sp over {t} ranks needs --seq-len ({opts.sequence_length}) divisible by {t}"
    return None


def _check_ep(opts: RunOptions) -> str | None:
    if opts.experts % opts.world_size:
        return f"--experts {opts.experts} must be divisible by the {opts.world_size} ranks (experts per rank)"
    if opts.top_k > opts.experts:
        return f"--top-k {opts.top_k} exceeds --experts {opts.experts}"
    if opts.capacity_factor <= 0:
        return f"--capacity-factor must be positive, got {opts.capacity_factor}"
    return None


@dataclass(frozen=True)
class PipelineSchedule:
    """A pipeline schedule of runners/pipeline.py and the constraints torch 2.13 puts on it."""

    torch_class: str  # the torch.distributed.pipelining class that runs it
    summary: str
    stages_per_rank: int  # default stages per rank (V)
    fixed_stages: bool  # True: the schedule takes only that V
    placement: str  # "loop": stage s on rank s % P; "v": down the ranks and back (rank 0 holds first and last)


PIPELINE_SCHEDULES: dict[str, PipelineSchedule] = {
    "gpipe": PipelineSchedule("ScheduleGPipe", "pipeline, GPipe: all forwards, then all backwards", 1, True, "loop"),
    "1f1b": PipelineSchedule("Schedule1F1B", "pipeline, 1F1B: one forward, one backward in steady state", 1, True, "loop"),
    "interleaved-1f1b": PipelineSchedule(
        "ScheduleInterleaved1F1B", "pipeline, interleaved 1F1B: V looped stages per rank (default 2)", 2, False, "loop"
    ),
    "zero-bubble": PipelineSchedule(
        "ScheduleInterleavedZeroBubble",
        "pipeline, zero bubble: backward split into input (I) and weight (W) grads; V=1 is ZB-H1",
        1,
        False,
        "loop",
    ),
    "zbv": PipelineSchedule("ScheduleZBVZeroBubble", "pipeline, ZB-V: zero bubble on 2 V-shaped stages per rank", 2, True, "v"),
    "dualpipev": PipelineSchedule(
        "ScheduleDualPipeV", "pipeline, DualPipeV: V-shaped stages, a forward overlapped with a backward", 2, True, "v"
    ),
}


def pipeline_shape(opts: RunOptions) -> tuple[int, int]:
    """(microbatches, stages per rank) of a pipeline run, the defaults filled in."""
    schedule = PIPELINE_SCHEDULES[opts.paradigm]
    microbatches = opts.microbatches if opts.microbatches is not None else 2 * opts.world_size
    return microbatches, opts.stages_per_rank or schedule.stages_per_rank


def _check_pipeline(opts: RunOptions) -> str | None:
    # The schedules' own checks in torch 2.13 (schedules.py), made before any process starts,
    # plus ours: every stage owns a block, and the batch splits into equal microbatches (so the
    # mean of the microbatch losses is the global mean loss).
    name, schedule = opts.paradigm, PIPELINE_SCHEDULES[opts.paradigm]
    p = opts.world_size
    m, v = pipeline_shape(opts)
    n_layers, batch = opts.preset[2], opts.global_batch_size
    if p < 2:
        return f"{name} needs at least 2 ranks (pipeline stages on different ranks), got {p}"
    if schedule.fixed_stages and v != schedule.stages_per_rank:
        other = " (use interleaved-1f1b or zero-bubble for more)" if schedule.stages_per_rank == 1 else ""
        return f"{name} runs exactly {schedule.stages_per_rank} stage(s) per rank, got --stages-per-rank {v}{other}"
    stages = p * v
    if stages > n_layers:
        return (
            f"{name} over {p} ranks x {v} stage(s) per rank needs {stages} layers, but model {opts.model!r} "
            f"has {n_layers}; use a deeper --model (tiny8 has 8)"
        )
    if m > batch or batch % m:
        return f"--batch-size {batch} does not split into {m} equal microbatches; use --microbatches dividing {batch}"
    if name == "1f1b" and m < stages:
        return f"1f1b needs at least as many microbatches as stages ({stages}), got --microbatches {m}"
    if name == "dualpipev" and m < stages:
        return f"dualpipev needs at least as many microbatches as stages ({stages}), got --microbatches {m}"
    if name in ("interleaved-1f1b", "zero-bubble"):
        rounds = max(1, m // p)  # torch runs the microbatches in rounds of about P
        if m % rounds:
            return f"{name} needs --microbatches divisible by its {rounds} rounds (max(1, M // {p} ranks)), got {m}"
    return None


PARADIGMS: dict[str, Paradigm] = {
    "ddp": Paradigm("runners.ddp", "DistributedDataParallel: replicated model, gradients all-reduced"),
    "zero1": Paradigm("runners.ddp", "DDP + ZeroRedundancyOptimizer: optimizer state sharded (ZeRO-1)"),
    "zero2": Paradigm(
        "runners.fsdp",
        "FSDP2 fully_shard, reshard_after_forward=False: gradients + optimizer sharded (ZeRO-2)",
    ),
    "fsdp": Paradigm("runners.fsdp", "FSDP2 fully_shard: parameters, gradients, optimizer sharded (ZeRO-3)"),
    "tp": Paradigm(
        "runners.tp_sp",
        "tensor parallel (Megatron: column/row-parallel attention and MLP); --sp adds sequence parallel",
        data_parallel=lambda opts: 1,
        check=_check_tp,
    ),
    "ep": Paradigm(
        "runners.expert_parallel",
        "expert parallel MoE: experts spread over ranks, tokens moved by all-to-all, rest data-parallel",
        check=_check_ep,
    ),
    **{
        name: Paradigm("runners.pipeline", schedule.summary, data_parallel=lambda opts: 1, check=_check_pipeline)
        for name, schedule in PIPELINE_SCHEDULES.items()
    },
}

