"""The runners `ptprof run` knows: name -> worker module and a one-line description.

Kept free of torch so `ptprof --help` and argument errors answer instantly. A runner module is
started on every rank as `python -m <module> --paradigm <name> ...`; modules that serve several
paradigms (ddp/zero1, zero2/fsdp) branch on `--paradigm`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from runners.options import MODEL_PRESETS, RunOptions, flag_of, validate


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
    # Why the paradigm cannot run on gloo CPU ranks, or None: refused (exit 2) when no GPU is in use.
    needs_gpu: str | None = None
    # Processes per node torchrun starts (all but `dp`, one process driving every GPU: --gpus).
    processes_per_node: Callable[[RunOptions], int] = lambda opts: opts.gpus
    # What the global batch is split over, for the error when it does not divide (dp: its GPUs).
    split_over: str = "data-parallel ranks"


def _check_tp(opts: RunOptions) -> str | None:
    return _check_tp_degree(opts, opts.world_size, f"tp over {opts.world_size} ranks")


def _check_tp_degree(opts: RunOptions, t: int, who: str) -> str | None:
    # Megatron's plan splits heads, d_model (row-parallel inputs) and the vocabulary (the head) by t.
    vocab, d_model, _layers, n_heads, _seq, _batch = opts.preset
    for what, size in (("attention heads", n_heads), ("d_model", d_model), ("vocab_size", vocab)):
        if size % t:
            return f"{who} needs {what} ({size}, model {opts.model!r}) divisible by {t}"
    if opts.sp and opts.sequence_length % t:
        return f"--sp over {t} ranks needs --seq-len ({opts.sequence_length}) divisible by {t}"
    return None


def _check_sequence_parallel(opts: RunOptions) -> str | None:
    # Ulysses swaps sequence shards for head shards (heads % P); ring attention cuts the sequence
    # into 2P chunks, two per rank, for a balanced causal mask (seq % 2P).
    p, n_heads, seq = opts.world_size, opts.preset[3], opts.sequence_length
    if opts.paradigm == "ulysses" and n_heads % p:
        return (f"ulysses over {p} ranks needs attention heads ({n_heads}, model {opts.model!r}) divisible by {p} "
                f"(each rank attends with heads/{p} of them){_ulysses_fits(opts)}")
    chunks = 2 * p if opts.paradigm == "ring" else p
    if seq % chunks:
        return f"{opts.paradigm} over {p} ranks needs --seq-len ({seq}) divisible by {chunks}"
    return None


def _ulysses_fits(opts: RunOptions) -> str:
    """': use --gpus 2 or 4, or --model medium (12 heads) with a --seq-len divisible by 3', or ''."""
    p, n_heads, seq = opts.world_size, opts.preset[3], opts.sequence_length
    ways = []
    n = opts.nnodes  # ranks = --gpus x --nnodes
    if gpus := [str(d // n) for d in range(2, n_heads + 1) if n_heads % d == 0 and seq % d == 0 and d % n == 0]:
        ways.append(f"--gpus {' or '.join(gpus)}")
    # The smallest preset whose heads divide by P; its sequence (--seq-len, or its own) must too.
    for name, (_v, _d, _l, heads, preset_seq, _b) in MODEL_PRESETS.items():
        if heads % p == 0:
            own = opts.seq_len if opts.seq_len is not None else preset_seq
            ways.append(f"--model {name} ({heads} heads)" + (f" with a --seq-len divisible by {p}" if own % p else ""))
            break
    return f": use {', or '.join(ways)}" if ways else f": no preset has heads divisible by {p}"


def _check_pipedream(opts: RunOptions) -> str | None:
    p, n_layers, batch = opts.world_size, opts.preset[2], opts.global_batch_size
    m = opts.microbatches if opts.microbatches is not None else 2 * p
    if p < 2:
        return f"pipedream needs at least 2 ranks (pipeline stages on different ranks), got {p}"
    if p > n_layers:
        return f"pipedream over {p} ranks needs {p} layers, but model {opts.model!r} has {n_layers}; use --model tiny8"
    if (counts := opts.stage_layer_counts) is not None and (len(counts) != p or sum(counts) != n_layers):
        return (f"--stage-layers {opts.stage_layers} gives {len(counts)} stage(s) of {sum(counts)} blocks; pipedream "
                f"over {p} ranks needs {p} counts summing to the {n_layers} layers of model {opts.model!r}")
    if m > batch or batch % m:
        return f"--batch-size {batch} does not split into {m} equal microbatches; use --microbatches dividing {batch}"
    if m < p - 1:
        # Stage 0 runs P-1 forwards before its first backward: with fewer microbatches per step the
        # fill spills into the next step, which then is not the steady state the analysis assumes.
        return f"pipedream over {p} ranks needs at least {p - 1} microbatches per step (P-1 to fill the pipeline), got {m}"
    if opts.profiled_steps.start == 0:
        # Only step 0 fills the pipeline (the stream never flushes): profiled, its idle fill and
        # missing receives would be analysed as the steady state (false theory mismatch, advice).
        return (f"pipedream's step 0 fills the pipeline: profile from step 1 (--steps {opts.active + 1} or more "
                f"for --active {opts.active})")
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


# Schedules whose backward torch splits into input-grad (I) and weight-grad (W) actions. Activation
# checkpointing recomputes a block in every autograd pass that needs its activations: once in I,
# then once per parameter group in W (torch's stage_backward_weight), 9 forwards instead of one.
SPLIT_BACKWARD = frozenset({"zero-bubble", "zbv", "dualpipev"})


def hybrid_degrees(opts: RunOptions) -> tuple[int, int, int]:
    """(dp, pp, tp) of a hybrid run: --pp and --tp default to 1, --dp to the ranks left over."""
    pp, tp = opts.pp or 1, opts.tp or 1
    dp = opts.dp if opts.dp is not None else max(1, opts.world_size // (pp * tp))
    return dp, pp, tp


def pipeline_schedule(opts: RunOptions) -> tuple[str, int]:
    """(schedule name, pipeline ranks P) of a pipeline run, or of the pp dimension of a hybrid run."""
    if opts.paradigm == "hybrid":
        return opts.schedule, hybrid_degrees(opts)[1]
    return opts.paradigm, opts.world_size


def pipeline_shape(opts: RunOptions) -> tuple[int, int]:
    """(microbatches, stages per rank) of a pipeline run, the defaults filled in."""
    name, p = pipeline_schedule(opts)
    microbatches = opts.microbatches if opts.microbatches is not None else 2 * p
    return microbatches, opts.stages_per_rank or PIPELINE_SCHEDULES[name].stages_per_rank


def _check_pipeline(opts: RunOptions, *, replicas: int = 1) -> str | None:
    # The schedules' own checks in torch 2.13 (schedules.py), made before any process starts,
    # plus ours: every stage owns a block, and each data-parallel replica's rows split into equal
    # microbatches (so the mean of the microbatch losses is the replica's mean loss).
    name, p = pipeline_schedule(opts)
    schedule = PIPELINE_SCHEDULES[name]
    m, v = pipeline_shape(opts)
    n_layers, batch = opts.preset[2], opts.global_batch_size // replicas
    ranks = f"{p} ranks" if opts.paradigm == name else f"pp {p}"
    if p < 2:
        return f"{name} needs at least 2 ranks (pipeline stages on different ranks), got {p}"
    if opts.recompute and name in SPLIT_BACKWARD:
        return (f"--recompute does not fit {name}: torch splits its backward into I and W (W as one autograd.grad per "
                f"parameter group), so each block's forward would run again in I and up to 8 times more in W; "
                f"use gpipe, 1f1b or interleaved-1f1b")
    if schedule.fixed_stages and v != schedule.stages_per_rank:
        other = " (use interleaved-1f1b or zero-bubble for more)" if schedule.stages_per_rank == 1 else ""
        return f"{name} runs exactly {schedule.stages_per_rank} stage(s) per rank, got --stages-per-rank {v}{other}"
    stages = p * v
    if stages > n_layers:
        return (
            f"{name} over {ranks} x {v} stage(s) per rank needs {stages} layers, but model {opts.model!r} "
            f"has {n_layers}; use a deeper --model (tiny8 has 8)"
        )
    if (counts := opts.stage_layer_counts) is not None and (len(counts) != stages or sum(counts) != n_layers):
        return (
            f"--stage-layers {opts.stage_layers} gives {len(counts)} stage(s) of {sum(counts)} blocks; {name} over "
            f"{ranks} x {v} stage(s) per rank needs {stages} counts summing to the {n_layers} layers of model {opts.model!r}"
        )
    if m > batch or batch % m:
        rows = f"--batch-size {batch}"
        if replicas > 1:
            rows = f"a dp replica's batch of {batch} (--batch-size {opts.global_batch_size} / dp {replicas})"
        return f"{rows} does not split into {m} equal microbatches; use --microbatches dividing {batch}"
    if name in ("1f1b", "dualpipev") and m < stages:
        return f"{name} needs at least as many microbatches as stages ({stages}), got --microbatches {m}"
    if name in ("interleaved-1f1b", "zero-bubble"):
        rounds = max(1, m // p)  # torch runs the microbatches in rounds of about P
        if m % rounds:
            return f"{name} needs --microbatches divisible by its {rounds} rounds (max(1, M // {p} ranks)), got {m}"
    return None


def _check_hybrid(opts: RunOptions) -> str | None:
    # Degrees first (torchtitan's dp * pp * tp == world_size), each named, then each dimension's
    # own constraints with its degree in place of the rank count.
    dp, pp, tp = hybrid_degrees(opts)
    world = opts.world_size
    if dp * pp * tp != world:
        nodes = f" x --nnodes {opts.nnodes}" if opts.nnodes > 1 else ""
        return f"dp {dp} x pp {pp} x tp {tp} = {dp * pp * tp}, but --gpus {opts.gpus}{nodes} gives {world} ranks"
    if opts.schedule not in PIPELINE_SCHEDULES:
        return f"unknown --schedule {opts.schedule!r}; choose one of: {', '.join(PIPELINE_SCHEDULES)}"
    if opts.sp and tp == 1:
        return "--sp shards activations over the tensor-parallel ranks: it needs --tp 2 or more"
    if tp > 1 and (problem := _check_tp_degree(opts, tp, f"tp {tp}")):
        return problem
    if opts.global_batch_size % dp:
        return f"--batch-size {opts.global_batch_size} is not divisible by dp {dp}; use a multiple of {dp}"
    if pp > 1:
        return _check_pipeline(opts, replicas=dp)
    if opts.microbatches is not None or opts.stages_per_rank is not None:
        return "--microbatches and --stages-per-rank need pipeline stages: use --pp 2 or more"
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
    "ulysses": Paradigm(
        "runners.ulysses",
        "DeepSpeed-Ulysses sequence parallel: sequence shards, all-to-all to head shards around attention",
        data_parallel=lambda opts: 1,
        check=_check_sequence_parallel,
    ),
    "ring": Paradigm(
        "runners.ring",
        "ring attention (context parallel): K/V blocks passed round the ring by send/recv, online softmax",
        data_parallel=lambda opts: 1,
        check=_check_sequence_parallel,
    ),
    "pipedream": Paradigm(
        "runners.pipedream",
        "PipeDream async 1F1B: weights updated after every microbatch, no flush, weight stashing",
        data_parallel=lambda opts: 1,
        check=_check_pipedream,
    ),
    "dp": Paradigm(
        "runners.dp",
        "torch.nn.DataParallel: one process drives --gpus GPUs, model replicated every step (GPU only)",
        needs_gpu="dp (torch.nn.DataParallel) drives several GPUs from one process and needs CUDA; use ddp for gloo ranks on CPU",
        processes_per_node=lambda opts: 1,
        split_over="GPUs (an equal chunk of the batch on each)",
        check=lambda opts: (f"dp is one process on one node (torch.nn.DataParallel); --nnodes {opts.nnodes} needs ddp"
                            if opts.nnodes > 1 else None),
    ),
    "hybrid": Paradigm(
        "runners.hybrid",
        "3D: FSDP2 over --dp, pipeline --schedule over --pp, tensor parallel over --tp (product = ranks)",
        data_parallel=lambda opts: 1,  # the dp degree's batch split is checked after the degrees
        check=_check_hybrid,
    ),
}


# Options only some paradigms read -> those paradigms. Given to any other paradigm they would
# be silently ignored, and the run would not be the one asked for.
_PIPELINES = frozenset(PIPELINE_SCHEDULES)
PARADIGM_FLAGS: dict[str, frozenset[str]] = {
    "microbatches": _PIPELINES | {"hybrid", "pipedream"},
    "stages_per_rank": _PIPELINES | {"hybrid"},
    "stage_layers": _PIPELINES | {"pipedream"},
    "schedule": frozenset({"hybrid"}),
    "sp": frozenset({"tp", "hybrid"}),
    "experts": frozenset({"ep"}),
    "top_k": frozenset({"ep"}),
    "capacity_factor": frozenset({"ep"}),
    "dp": frozenset({"hybrid"}),
    "pp": frozenset({"hybrid"}),
    "tp": frozenset({"hybrid"}),
    "loss_parallel": frozenset({"tp"}),
    "offload": frozenset({"fsdp"}),
}


def gpu_only_reason(opts: RunOptions) -> str | None:
    """Why `opts` cannot run on gloo CPU ranks (a one-line error when no GPU is in use), or None."""
    if PARADIGMS[opts.paradigm].needs_gpu:
        return PARADIGMS[opts.paradigm].needs_gpu
    if opts.offload:
        return ("fsdp --offload (FSDP2 CPUOffloadPolicy) moves sharded state between GPU and CPU memory and "
                "needs CUDA; without a GPU the state is in CPU memory already: run fsdp")
    return None


def given_fields(argv: list[str]) -> set[str]:
    """The PARADIGM_FLAGS fields whose flag is on the command line (`--top-k 2`, `--top-k=2`, or an
    abbreviation argparse took, `--sched`): given, whatever the value, even the default."""
    exact = {flag_of(f.name) for f in dataclasses.fields(RunOptions)}
    tokens = [t.split("=", 1)[0] for t in argv if t.startswith("--") and len(t) > 2]
    return {f for f in PARADIGM_FLAGS
            if any(t == flag_of(f) or (t not in exact and flag_of(f).startswith(t)) for t in tokens)}


def check_flags(opts: RunOptions, given: set[str] | None = None) -> str | None:
    """A one-line problem when a flag is given that `opts.paradigm` does not use, else None.

    given: the fields whose flags the command line holds (given_fields); without it, a flag counts
    as given where its value is not the default (a flag given with its default value goes unseen)."""
    defaults = RunOptions(paradigm=opts.paradigm, gpus=opts.gpus, nnodes=opts.nnodes)
    for field, users in PARADIGM_FLAGS.items():
        said = field in given if given is not None else getattr(opts, field) != getattr(defaults, field)
        if opts.paradigm not in users and said:
            return f"{flag_of(field)} does not apply to {opts.paradigm}: it is for {', '.join(sorted(users))}"
    return None


def problem_with(opts: RunOptions) -> str | None:
    """Every check of a request that needs no process: flags, batch split, the paradigm's own."""
    paradigm = PARADIGMS[opts.paradigm]
    return check_flags(opts) or validate(opts, paradigm.data_parallel(opts), paradigm.split_over) or paradigm.check(opts)


# Presets `ptprof run` may choose when --model is not given, smallest first. medium and large are
# never chosen for the user: on CPU ranks they would take hours and many GB per rank.
DEFAULT_MODEL_CANDIDATES = ("tiny", "tiny8", "tiny16", "small")


def default_model(opts: RunOptions) -> str | None:
    """The smallest candidate preset with which `opts` passes every check, or None if none does.

    Pipelines need one block per stage (P x V layers) and a batch that splits into their default
    2 x P microbatches; tensor parallelism needs heads, d_model and vocabulary divisible by the ranks.
    """
    for name in DEFAULT_MODEL_CANDIDATES:
        if problem_with(dataclasses.replace(opts, model=name)) is None:
            return name
    return None
