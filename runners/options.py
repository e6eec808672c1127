"""Run options: one frozen dataclass, one argparse definition shared by `ptprof run` and the workers.

The CLI validates the options, writes nothing itself, and hands the same flags to every rank
(`python -m runners.<paradigm> --steps ...`), so a worker started by hand with torchrun parses
exactly what `ptprof run` would have passed. This module must not import torch: `ptprof --help`
and argument errors should answer instantly.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass

# Model presets: name -> (vocab_size, d_model, n_layers, n_heads, seq_len, global_batch_size).
# `tiny` is for tests and CPU ranks; the larger ones are sized for real GPUs.
MODEL_PRESETS: dict[str, tuple[int, int, int, int, int, int]] = {
    "tiny": (256, 64, 2, 4, 32, 8),
    "tiny8": (256, 64, 8, 4, 32, 8),  # tiny with 8 layers: enough stages for pipelines at 4 ranks x 2
    "tiny16": (256, 64, 16, 4, 32, 16),  # 16 layers, batch 16: pipelines at 8 ranks (x 2 stages, 16 microbatches)
    "small": (4096, 256, 4, 8, 128, 16),
    "medium": (32768, 768, 12, 12, 1024, 32),  # GPT-2 small-like
    "large": (32768, 1536, 24, 16, 2048, 32),
}


@dataclass(frozen=True)
class RunOptions:
    """Everything a run depends on; stored verbatim in run.json["options"]."""

    paradigm: str  # runner name, e.g. "ddp", "fsdp" (see runners.paradigms.PARADIGMS)
    gpus: int  # ranks per node: one GPU each under NCCL, one CPU process each under gloo; dp: GPUs of its one process
    nnodes: int = 1  # nodes taking part (torchrun --nnodes)
    steps: int = 5  # training steps, all of them run; the profiler records the last `active`
    model: str = "tiny"  # size preset, a key of MODEL_PRESETS (`ptprof run` picks the smallest that fits)
    batch_size: int | None = None  # global batch in sequences (all ranks together); None = preset's
    seq_len: int | None = None  # tokens per sequence; None = preset's
    seed: int = 0  # seeds model init and the synthetic data, identical on every rank
    lr: float = 1e-3  # AdamW learning rate
    warmup: int | None = None  # profiler warmup steps (traced, discarded) before the active ones; None = from steps
    active: int | None = None  # profiled steps at the end of the run, exported; None = from steps
    profile_memory: bool = False  # record [memory] events (allocations after profiling starts)
    with_stack: bool = False  # record Python stacks on operators (larger traces)
    device: str = "auto"  # "auto": cuda+NCCL when a GPU is visible, else cpu+gloo
    timeout_s: float = 300.0  # collective / rendezvous timeout: a hung rank fails the run after this
    out: str = "traces"  # runs are written to <out>/<run-id>/
    name: str | None = None  # run id; default <paradigm>-<world>r-<timestamp>
    # Pipeline (runners/pipeline.py, and the pp part of hybrid)
    microbatches: int | None = None  # microbatches per step; None = the runner's (pipeline: 2 x ranks)
    stages_per_rank: int | None = None  # stages per rank (interleaved / V schedules); None = schedule's
    schedule: str = "1f1b"  # hybrid: the pipeline schedule over the pp ranks (a pipeline paradigm's name)
    # Blocks per stage, "N0,N1,..", one count per stage, summing to the model's layers; None = as
    # even as possible. An uneven split unbalances the stages without changing the model.
    stage_layers: str | None = None
    # Tensor / sequence / expert parallel (runners/tp_sp.py, runners/expert_parallel.py)
    sp: bool = False  # sequence parallelism on the LayerNorm/dropout regions (with tp)
    experts: int | None = None  # experts per MoE layer (ep); None = default_experts(world size) for ep
    top_k: int = 2  # experts per token (ep)
    capacity_factor: float = 1.25  # expert capacity = factor * tokens * top_k / experts (ep)
    # Hybrid degrees (runners/hybrid.py); dp * pp * tp must equal the world size
    dp: int | None = None  # FSDP2 data-parallel degree; None = the ranks left after pp x tp
    pp: int | None = None  # pipeline degree (stages over `schedule`); None = 1, no pipeline
    tp: int | None = None  # tensor-parallel degree inside each stage; None = 1, no tensor parallelism
    # Memory/compute trade-offs (every paradigm) and GPU-only variants
    recompute: bool = False  # activation checkpointing per transformer block (non-reentrant)
    loss_parallel: bool = False  # tp: vocabulary-parallel cross-entropy, logits stay sharded
    offload: bool = False  # fsdp: FSDP2 CPUOffloadPolicy, sharded state held in CPU memory (GPU only)
    run_id: str = ""  # filled in by the launcher; the workers write into <out>/.<run_id>.tmp/

    def __post_init__(self) -> None:
        # Fill the profiler window from --steps where not given, so run.json records what ran.
        warmup, active = profile_window(self.steps, self.warmup, self.active)
        object.__setattr__(self, "warmup", warmup)
        object.__setattr__(self, "active", active)
        if self.experts is None and self.paradigm == "ep":  # `ep --gpus 8` needs 8 experts: one per rank
            object.__setattr__(self, "experts", default_experts(self.world_size))

    @property
    def preset(self) -> tuple[int, int, int, int, int, int]:
        return MODEL_PRESETS[self.model]

    @property
    def stage_layer_counts(self) -> list[int] | None:
        """--stage-layers as a list of block counts, stage 0 first; None when not given."""
        return None if self.stage_layers is None else [int(n) for n in self.stage_layers.split(",")]

    @property
    def global_batch_size(self) -> int:
        return self.batch_size if self.batch_size is not None else self.preset[5]

    @property
    def sequence_length(self) -> int:
        return self.seq_len if self.seq_len is not None else self.preset[4]

    @property
    def world_size(self) -> int:
        return self.gpus * self.nnodes

    @property
    def wait(self) -> int:
        """Profiler `wait` steps: everything before warmup + active."""
        return self.steps - self.warmup - self.active

    @property
    def profiled_steps(self) -> range:
        """The steps the profiler records (the last `active`), numbered from 0 as ProfilerStep#k."""
        return range(self.steps - self.active, self.steps)


def default_experts(world_size: int) -> int:
    """Experts per MoE layer when --experts is not given: 4, or the smallest multiple of the ranks
    above it (every rank owns the same number of experts)."""
    return -(-4 // world_size) * world_size


DEFAULT_WARMUP = 1  # profiler warmup steps when --warmup is not given (fewer if --steps leaves no room)
DEFAULT_ACTIVE = 3  # profiled steps when --active is not given (fewer if --steps leaves no room)
MAX_TIMEOUT_S = 7 * 86400.0  # beyond this a "timeout" is a typo (and 1e300 s overflows timedelta in the ranks)


def profile_window(steps: int, warmup: int | None, active: int | None) -> tuple[int, int]:
    """(warmup, active) of the profiler: given values kept, missing ones derived from `steps`.

    The defaults (1 warmup, 3 active) shrink to fit: --steps 3 profiles the last 2 after 1 warmup,
    --steps 2 the last 1, --steps 1 that one step without warmup. Explicit values are kept as given,
    so an impossible pair is still refused by `validate`.
    """
    if warmup is None:
        room = steps - (active if active is not None else 1)  # leave at least one active step
        warmup = max(0, min(DEFAULT_WARMUP, room))
    if active is None:
        active = max(1, min(DEFAULT_ACTIVE, steps - warmup))
    return warmup, active


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _timeout_seconds(text: str) -> float:
    value = float(text)  # ValueError -> argparse's "invalid _timeout_seconds value"
    if not math.isfinite(value) or value <= 0 or value > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}], got {text}")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def _layer_counts(text: str) -> str:
    """'1, 7' -> '1,7': comma-separated block counts, each at least 1 (a stage needs a block)."""
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be block counts per stage separated by commas, e.g. 1,7; got {text!r}")
    if any(n < 1 for n in counts):
        raise argparse.ArgumentTypeError(f"every stage needs at least 1 block, got {text!r}")
    return ",".join(map(str, counts))


_timeout_seconds.__name__ = "seconds"  # argparse names the type in "invalid <name> value"
_finite_float.__name__ = "number"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `ptprof run` that reach the workers (launcher-only flags are added by the CLI)."""
    g = parser.add_argument_group("training")
    g.add_argument(
        "--steps", type=_positive_int, default=5, help="training steps, numbered from 0 as in the traces (default 5)"
    )
    g.add_argument(
        "--model",
        choices=list(MODEL_PRESETS),
        default=None,
        help="model size preset: tiny (tests, CPU), tiny8 / tiny16 (tiny with 8 / 16 layers, for pipeline "
        "stages), small (CPU demos), medium/large (GPUs); default: the smallest of tiny, tiny8, tiny16 and "
        "small that fits the paradigm and the ranks",
    )
    g.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="global batch in sequences, split across data-parallel ranks (dp: its GPUs; default: the preset's)",
    )
    g.add_argument("--seq-len", type=_positive_int, default=None, help="sequence length (default: the preset's)")
    g.add_argument("--seed", type=int, default=0, help="seed for model init and synthetic data (default 0)")
    g.add_argument("--lr", type=_finite_float, default=1e-3, help="AdamW learning rate (default 1e-3)")

    p = parser.add_argument_group("profiler")
    p.add_argument(
        "--warmup",
        type=_non_negative_int,
        default=None,
        help="profiler warmup steps, traced then discarded (default 1, 0 when --steps leaves no room)",
    )
    p.add_argument(
        "--active",
        type=_positive_int,
        default=None,
        help="profiled steps at the end of the run, exported to the traces (default 3, or what --steps "
        "leaves after warmup: --steps 3 profiles 2)",
    )
    p.add_argument("--profile-memory", action="store_true", help="record allocator [memory] events")
    p.add_argument("--with-stack", action="store_true", help="record Python stacks (bigger traces)")

    m = parser.add_argument_group("memory trade-offs (--recompute: every paradigm but zero-bubble, zbv, dualpipev and "
                                  "hybrid --schedule zbv, whose split I/W backward refuses it; --offload: fsdp, GPU only)")
    m.add_argument(
        "--recompute",
        action="store_true",
        help="activation checkpointing: every transformer block keeps only its input and recomputes its "
        "forward inside backward (about one more forward of compute, far fewer activations held); the "
        "recomputation is its own span in the traces",
    )
    m.add_argument(
        "--offload",
        action="store_true",
        help="fsdp: FSDP2 CPUOffloadPolicy, parameters, gradients and optimizer state held in CPU memory, "
        "copied to the GPU for each unit (GPU only)",
    )

    pp = parser.add_argument_group("pipeline (gpipe, 1f1b, interleaved-1f1b, zero-bubble, zbv, dualpipev, hybrid, "
                                   "pipedream; pipedream takes --microbatches and --stage-layers only)")
    pp.add_argument(
        "--microbatches",
        type=_positive_int,
        default=None,
        help="microbatches per step (hybrid: per dp replica); default 2 x pipeline ranks",
    )
    pp.add_argument(
        "--stages-per-rank", type=_positive_int, default=None, help="virtual stages per rank: interleaved-1f1b (default 2) and zero-bubble (default 1) take any; zbv and dualpipev run 2, gpipe and 1f1b 1"
    )
    pp.add_argument(
        "--stage-layers",
        type=_layer_counts,
        default=None,
        metavar="N0,N1,..",
        help="pipelines: transformer blocks per stage, one count per stage summing to the model's layers "
        "(default: as even as possible); e.g. 1f1b --gpus 2 --model tiny8 --stage-layers 2,6 makes the last "
        "stage 3x the work of the first, same model and losses",
    )
    pp.add_argument(
        "--schedule",
        default="1f1b",
        help="hybrid: pipeline schedule over the pp ranks, one of gpipe, 1f1b, interleaved-1f1b, zero-bubble, "
        "zbv, dualpipev (default 1f1b)",
    )

    tp = parser.add_argument_group("tensor / sequence / expert parallel (tp, ep, hybrid)")
    tp.add_argument("--sp", action="store_true", help="tp, hybrid: also shard LayerNorm regions on the sequence dim")
    tp.add_argument(
        "--loss-parallel",
        action="store_true",
        help="tp: vocabulary-parallel cross-entropy (Megatron; torch's loss_parallel): the logits stay "
        "sharded over the vocabulary instead of being all-gathered for the loss",
    )
    tp.add_argument("--experts", type=_positive_int, default=None,
                    help="ep: experts per MoE layer (default: 4, or the smallest multiple of the ranks above 4)")
    tp.add_argument("--top-k", type=_positive_int, default=2, help="ep: experts per token (default 2)")
    tp.add_argument(
        "--capacity-factor", type=_finite_float, default=1.25, help="ep: capacity = factor * tokens * top_k / experts (default 1.25)"
    )

    h = parser.add_argument_group("hybrid 3D (dp x pp x tp must equal the ranks; a degree of 1 drops that dimension)")
    h.add_argument("--dp", type=_positive_int, default=None, help="FSDP2 degree (default: ranks left after pp x tp)")
    h.add_argument("--pp", type=_positive_int, default=None, help="pipeline degree, stages by --schedule (default 1)")
    h.add_argument("--tp", type=_positive_int, default=None, help="tensor-parallel degree in each stage (default 1)")

    r = parser.add_argument_group("run")
    r.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto (default): one GPU per rank with NCCL when GPUs are visible, else gloo ranks on CPU",
    )
    r.add_argument(
        "--timeout",
        dest="timeout_s",
        type=_timeout_seconds,
        default=300.0,
        help="seconds a rank may wait in a collective before the run is failed (default 300)",
    )
    r.add_argument("--out", default="traces", help="folder that receives <run-id>/ (default traces/)")
    r.add_argument("--name", default=None, help="run id (default <paradigm>-<N>r-<timestamp>)")


def options_from_namespace(ns: argparse.Namespace, **extra) -> RunOptions:
    """Build RunOptions from parsed flags, ignoring launcher-only ones (an unset --model: tiny)."""
    fields = {f.name for f in dataclasses.fields(RunOptions)}
    values = {k: v for k, v in vars(ns).items() if k in fields and not (k == "model" and v is None)}
    values.update(extra)
    return RunOptions(**values)


def flag_of(field: str) -> str:
    """The command-line flag of a RunOptions field (`stages_per_rank` -> `--stages-per-rank`)."""
    return "--timeout" if field == "timeout_s" else "--" + field.replace("_", "-")


def options_to_argv(opts: RunOptions) -> list[str]:
    """The worker command line that reproduces `opts` (inverse of the worker's parser)."""
    argv = ["--paradigm", opts.paradigm, "--gpus", str(opts.gpus), "--nnodes", str(opts.nnodes)]
    argv += ["--run-id", opts.run_id]
    for f in dataclasses.fields(RunOptions):
        if f.name in ("paradigm", "gpus", "nnodes", "run_id"):
            continue
        value = getattr(opts, f.name)
        flag = flag_of(f.name)
        if isinstance(value, bool):
            if value:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return argv


def worker_parser() -> argparse.ArgumentParser:
    """Parser used inside each rank (`python -m runners.<paradigm> ...`)."""
    parser = argparse.ArgumentParser(description="ptprof worker (normally started by `ptprof run`)")
    parser.add_argument("--paradigm", required=True)
    parser.add_argument("--gpus", type=_positive_int, required=True)
    parser.add_argument("--nnodes", type=_positive_int, default=1)
    parser.add_argument("--run-id", required=True)
    add_run_arguments(parser)
    return parser


def validate(opts: RunOptions, data_parallel: int, split_over: str = "data-parallel ranks") -> str | None:
    """Return a one-line problem with these options, or None. Checked before any process starts.

    `split_over` names the `data_parallel` parts the global batch is cut into (dp: "GPUs").
    """
    if opts.warmup + opts.active > opts.steps:
        return (
            f"--warmup {opts.warmup} + --active {opts.active} exceeds --steps {opts.steps}; "
            f"use --steps {opts.warmup + opts.active} or more"
        )
    if opts.global_batch_size % data_parallel:
        return (
            f"--batch-size {opts.global_batch_size} is not divisible by the {data_parallel} "
            f"{split_over}; use a multiple of {data_parallel}"
        )
    if not (math.isfinite(opts.timeout_s) and 0 < opts.timeout_s <= MAX_TIMEOUT_S):
        return f"--timeout must be a number of seconds in (0, {MAX_TIMEOUT_S:.0f}], got {opts.timeout_s}"
    return None
