"""What every runner shares: process group, seeding, synthetic data, the profiled training loop,
phase annotations, memory accounting, and the run manifest.

A runner module supplies one function, `apply_<x>(model, ctx) -> Parallel`, and ends with
`harness.main(apply_<x>)`. Everything a rank writes goes to `<out>/.<run-id>.tmp/`; the launcher
(`runners.cli`) publishes that folder under its final name only when every rank succeeded. See
docs/run-layout.md for the files and their fields.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime as dt
import gc
import json
import os
import platform
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.profiler import ProfilerActivity, record_function

from runners.memory_probe import MemoryProbe, local_params, numel_by_dtype
from runners.model import GPT, RECOMPUTE_SPAN, GPTConfig, count_params, lm_loss
from runners.options import RunOptions, options_from_namespace, worker_parser

RUN_SCHEMA = "ptprof.run/1"

# Phase annotations the profiler relies on (docs/run-layout.md). Defined once, here.
PHASE_FORWARD = "ptprof/forward"
PHASE_BACKWARD = "ptprof/backward"
PHASE_OPTIMIZER = "ptprof/optimizer"
PHASES = {"forward": PHASE_FORWARD, "backward": PHASE_BACKWARD, "optimizer": PHASE_OPTIMIZER}
# With --recompute, each block's forward run again inside backward (activation checkpointing) is
# a span of its own, nested in the backward phase (or in a pipeline's B / I action).
PHASE_RECOMPUTE = RECOMPUTE_SPAN
# Pipeline runs (runners/pipeline.py) annotate each stage's compute per microbatch instead of
# forward/backward: kind F (forward), B (full backward), I (input-grad backward), W (weight-grad
# backward) or L (the loss, on the last stage), e.g. "ptprof/pp/F s1 mb3". Compute only: the
# schedule's sends and receive waits fall outside these spans.
PP_ACTION = "ptprof/pp/{kind} s{stage} mb{microbatch}"

# Test hook: PTPROF_FAULT="raise@1:2" makes rank 1 raise at step 2 ("hang@R:S" sleeps forever,
# "exit@R:S" exits with status 3). Lets the tests prove failure handling without flaky timing.
# "slow@R:MS" makes rank R a straggler: it sleeps MS milliseconds before every step's forward.
FAULT_ENV = "PTPROF_FAULT"


def tmp_run_dir(opts: RunOptions) -> Path:
    """Where the ranks write; renamed to <out>/<run-id> by the launcher on success."""
    return Path(opts.out) / f".{opts.run_id}.tmp"


@dataclass(frozen=True)
class Context:
    """What a rank knows about the job it is part of."""

    opts: RunOptions
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str  # "gloo" or "nccl"


@dataclass
class Parallel:
    """What a runner's apply function returns: the parallelized model and how to train it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    mesh: dict[str, int]  # parallel degrees by dimension name, e.g. {"dp": 4}
    dp_rank: int  # which slice of the global batch this rank trains on
    dp_size: int  # how many slices the global batch is cut into
    # One training step without the optimizer: forward + backward, annotated, returning this rank's
    # loss (None where the rank computes none, e.g. early pipeline stages).
    train_step: Callable[["Parallel", torch.Tensor, torch.Tensor, "MemoryProbe"], torch.Tensor | None] | None = None
    reports_loss: bool = True  # does this rank's loss count toward the global loss?
    extra: dict = field(default_factory=dict)  # paradigm-specific run.json blocks (e.g. "pipeline")
    # The step-phase annotations the runner records (run.json "phases"): pipelines record only the
    # optimizer's, their forward/backward being per-microbatch spans.
    phases: dict[str, str] = field(default_factory=lambda: dict(PHASES))
    # Called on every rank after the profiled steps, before run.json: the place for collectives
    # that summarize the run (they stay out of the traces).
    after_training: Callable[[], None] | None = None
    # How many shards each sequence is cut into (ulysses, ring: the ranks); a rank's loss covers
    # seq_len / seq_shards tokens of each of its rows.
    seq_shards: int = 1
    # CUDA GPUs this process drives, from its own (cuda:local_rank) on: 1, or dp's N. Each one's
    # peak is reset before training and recorded (run.json ranks[].memory).
    gpus: int = 1


# ---------------------------------------------------------------------------------------------
# Set-up


def init_distributed(opts: RunOptions) -> Context:
    """Join the process group torchrun prepared (env://), one thread per rank, device chosen once."""
    _die_with_parent()
    torch.set_num_threads(1)  # N ranks share the node's cores; one intra-op thread each
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = opts.device == "cuda" or (opts.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = dt.timedelta(seconds=opts.timeout_s)
    kwargs = {"device_id": device} if use_cuda else {}
    dist.init_process_group(backend, timeout=timeout, **kwargs)
    return Context(opts, rank, world, local_rank, device, backend)


def _die_with_parent() -> None:
    # If the launcher itself is killed (SIGKILL cannot be handled), take the rank down too rather
    # than leave an orphan spinning in a collective. Linux only; elsewhere torchrun's own
    # shutdown is all we have.
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def model_config(opts: RunOptions, **overrides) -> GPTConfig:
    return GPTConfig.from_preset(opts.model, seq_len=opts.sequence_length, **overrides)


def build_model(opts: RunOptions, **overrides) -> GPT:
    """The full model, identically initialised on every rank (same seed), on the CPU."""
    torch.manual_seed(opts.seed)
    model = GPT(model_config(opts, **overrides))
    model.set_recompute(opts.recompute)
    return model


def optimizer_kwargs(opts: RunOptions) -> dict:
    # foreach=False: the plain per-parameter loop is what the single-process reference uses too,
    # so losses agree to rounding; fused kernels are not the point of a reference runner.
    return {"lr": opts.lr, "weight_decay": 0.0, "foreach": False}


def make_optimizer(params, opts: RunOptions) -> torch.optim.Optimizer:
    """AdamW, the optimizer of every runner (ZeRO-1 wraps the same class and arguments)."""
    return torch.optim.AdamW(params, **optimizer_kwargs(opts))


def synthetic_batch(step: int, *, seed: int, batch_size: int, seq_len: int, vocab_size: int):
    """The global batch of `step`: (inputs, targets), each [batch_size, seq_len] int64.

    Each row is an arithmetic progression mod vocab_size with a random start and stride, so the
    next token is predictable from context and the loss falls. Generated on the CPU from
    (seed, step) alone, so every rank and the single-process reference see the same batch.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab_size, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    tokens = (start + stride * torch.arange(seq_len + 1)) % vocab_size
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def local_batch(step: int, ctx: Context, par: Parallel):
    """This rank's rows of the global batch, on its device."""
    opts = ctx.opts
    cfg_vocab = opts.preset[0]
    inputs, targets = synthetic_batch(
        step, seed=opts.seed, batch_size=opts.global_batch_size, seq_len=opts.sequence_length, vocab_size=cfg_vocab
    )
    rows = opts.global_batch_size // par.dp_size
    sl = slice(par.dp_rank * rows, (par.dp_rank + 1) * rows)
    return inputs[sl].to(ctx.device), targets[sl].to(ctx.device)


# ---------------------------------------------------------------------------------------------
# Training


def data_parallel_step(par: Parallel, inputs, targets, probe: MemoryProbe) -> torch.Tensor:
    """Forward + loss, then backward, each under its phase annotation."""
    with record_function(PHASE_FORWARD):
        loss = lm_loss(par.model(inputs), targets)
    probe.after_forward(par.model, par.optimizer)
    with record_function(PHASE_BACKWARD):
        loss.backward()
    probe.after_backward(par.model)
    return loss


def sequence_shard_step(model: nn.Module, optimizer: torch.optim.Optimizer, positions: torch.Tensor):
    """The train_step of a sequence/context-parallel rank (ulysses, ring): the harness hands every
    rank the whole global batch (dp_size 1); this rank trains on the tokens at `positions` of every
    row, with their true positions, so its loss is the mean over its own tokens."""

    def train_step(par: Parallel, inputs, targets, probe: MemoryProbe) -> torch.Tensor:
        with record_function(PHASE_FORWARD):
            loss = lm_loss(model(inputs[:, positions], positions=positions), targets[:, positions])
        probe.after_forward(model, optimizer)
        with record_function(PHASE_BACKWARD):
            loss.backward()
        probe.after_backward(model)
        return loss

    return train_step


def _maybe_inject_fault(rank: int, step: int) -> None:
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    kind, _, where = spec.partition("@")
    fault_rank, _, fault_step = where.partition(":")
    if kind == "slow" and int(fault_rank) == rank:
        time.sleep(int(fault_step) / 1000)  # here the number after ":" is milliseconds, every step
        return
    if int(fault_rank) != rank or int(fault_step) != step:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault on rank {rank} at step {step} ({FAULT_ENV}={spec})")
    if kind == "hang":
        while True:
            time.sleep(1)
    if kind == "exit":
        os._exit(3)


def train(ctx: Context, par: Parallel) -> dict:
    """Run every step under torch.profiler; return this rank's results for run.json."""
    opts, out_dir = ctx.opts, tmp_run_dir(ctx.opts)
    step_fn = par.train_step or data_parallel_step
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    trace_path = out_dir / f"rank{ctx.rank}.json.gz"
    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=opts.wait, warmup=opts.warmup, active=opts.active, repeat=1),
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(trace_path)),
        record_shapes=True,  # gloo records no collective args: sizes come from the ops' Input Dims
        profile_memory=opts.profile_memory,
        with_stack=opts.with_stack,
    )
    progress_rank = _first_loss_rank(par)
    probe = MemoryProbe()
    gpus = [ctx.device.index + i for i in range(par.gpus)] if ctx.device.type == "cuda" else []
    for gpu in gpus:  # every GPU's peak of training, not of building the model (dp: its replicas' too)
        torch.cuda.reset_peak_memory_stats(gpu)
    losses: list[float | None] = []
    step_times: list[float] = []
    with profiler:
        for step in range(opts.steps):
            inputs, targets = local_batch(step, ctx, par)
            _synchronize(ctx)
            t0 = time.perf_counter()
            _maybe_inject_fault(ctx.rank, step)
            loss = step_fn(par, inputs, targets, probe)
            # Annotated where the runner lists the phase (pipedream updates per microbatch instead:
            # its step() does nothing, and an empty span would read as a free optimizer step).
            with record_function(PHASE_OPTIMIZER) if "optimizer" in par.phases else contextlib.nullcontext():
                par.optimizer.step()
                par.optimizer.zero_grad(set_to_none=True)
            _synchronize(ctx)
            step_times.append(time.perf_counter() - t0)
            probe.after_step(par.model, par.optimizer)
            profiler.step()
            losses.append(None if loss is None else float(loss.detach()))
            if ctx.rank == progress_rank:
                # Steps are numbered from 0, as torch numbers them (ProfilerStep#<step> in the
                # traces, `ptprof analyze --step`, run.json's profiled_steps), never from 1.
                phase = "  [profiled]" if step in opts.profiled_steps else ""
                if not phase and step >= opts.wait:
                    phase = "  [profiler warmup]"
                print(
                    f"step {step}  loss {losses[-1]:.4f} (rank {ctx.rank})  "
                    f"{step_times[-1] * 1e3:8.1f} ms{phase}",
                    flush=True,
                )
    # Free the finished profiler now, for every runner: it is left in reference cycles (the
    # torch.profiler.profile and its autograd profile), and a later automatic collection that
    # frees it while autograd runs graphs recorded under it (pipedream's drain in after_training)
    # segfaults or corrupts the heap (torch 2.13, seen at 2 and 4 ranks).
    del profiler
    gc.collect()
    if gpus:
        probe.numbers["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(ctx.device)
        probe.numbers["max_memory_allocated_by_gpu_bytes"] = [torch.cuda.max_memory_allocated(g) for g in gpus]
    return {
        "rank": ctx.rank,
        "host": socket.gethostname(),
        "trace": trace_path.name,
        "losses": losses if par.reports_loss else [None] * len(losses),
        "loss_tokens": (
            (opts.global_batch_size // par.dp_size) * (opts.sequence_length // par.seq_shards) if par.reports_loss else 0
        ),
        "step_time_s": step_times,
        "memory": probe.numbers,
    }


def _first_loss_rank(par: Parallel) -> int:
    flags: list = [None] * dist.get_world_size()
    dist.all_gather_object(flags, par.reports_loss)
    return flags.index(True) if True in flags else 0


def _synchronize(ctx: Context) -> None:
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)


# ---------------------------------------------------------------------------------------------
# Manifest


def global_losses(ranks: list[dict]) -> list[float | None]:
    """Token-weighted mean of the reporting ranks' losses: the loss a single process would see."""
    reporting = [r for r in ranks if r["loss_tokens"]]
    n_steps = len(ranks[0]["losses"])
    total = sum(r["loss_tokens"] for r in reporting)
    if not total:
        return [None] * n_steps
    return [sum(r["losses"][i] * r["loss_tokens"] for r in reporting) / total for i in range(n_steps)]


def write_manifest(ctx: Context, par: Parallel, n_params: int, ranks: list[dict], param_dtypes: dict[str, int]) -> Path:
    """Write run.json (atomically) into the run's temporary folder. Rank 0 only.

    param_dtypes: parameter elements of the whole model by dtype name (e.g. {"float32": 133760}).
    """
    opts = ctx.opts
    cfg = model_config(opts)
    try:
        from importlib.metadata import version

        ptprof_version = version("ptprof")
    except Exception:  # not installed (running from a checkout): still record something honest
        ptprof_version = "unknown"
    manifest = {
        "schema": RUN_SCHEMA,
        "run_id": opts.run_id,
        "paradigm": opts.paradigm,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "options": dataclasses.asdict(opts),
        "world_size": ctx.world_size,
        "nnodes": opts.nnodes,
        "mesh": par.mesh,
        "backend": ctx.backend,
        "device": ctx.device.type,
        # GPUs each process drives: 1 under NCCL (0 on CPU); dp (DataParallel) N.
        "gpus_per_process": par.gpus if ctx.device.type == "cuda" else 0,
        "device_name": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else platform.processor() or "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "ptprof": ptprof_version},
        "hosts": sorted({r["host"] for r in ranks}),
        "model": {
            "preset": opts.model,
            "n_params": n_params,
            "vocab_size": cfg.vocab_size,
            "d_model": cfg.d_model,
            "n_layers": cfg.n_layers,
            "n_heads": cfg.n_heads,
            "seq_len": cfg.seq_len,
            "mlp_ratio": cfg.mlp_ratio,
            "param_dtypes": param_dtypes,
        },
        "global_batch_size": opts.global_batch_size,
        "tokens_per_step": opts.global_batch_size * opts.sequence_length,
        "local_batch_size": opts.global_batch_size // par.dp_size,
        "profiler": {
            "wait": opts.wait,
            "warmup": opts.warmup,
            "active": opts.active,
            "profiled_steps": list(opts.profiled_steps),
            "profile_memory": opts.profile_memory,
            "with_stack": opts.with_stack,
            "record_shapes": True,
        },
        "phases": par.phases | ({"recompute": PHASE_RECOMPUTE} if opts.recompute else {}),
        # Activation checkpointing (--recompute): what is recomputed and the span that marks it.
        "recompute": {"granularity": "block", "span": PHASE_RECOMPUTE} if opts.recompute else None,
        # fsdp --offload: where the sharded state (ranks[].memory's params, grads, optimizer) lives.
        "offload": {"policy": "CPUOffloadPolicy", "state_device": "cpu", "pin_memory": True} if opts.offload else None,
        "losses": global_losses(ranks),
        "ranks": ranks,
        "pipeline": None,
    }
    manifest.update(par.extra)
    path = tmp_run_dir(opts) / "run.json"
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(manifest, indent=2))
    os.replace(partial, path)
    return path


def moe_overrides(opts: RunOptions) -> dict:
    """GPTConfig fields of the MoE variant, from the run options."""
    return {"n_experts": opts.experts, "top_k": opts.top_k, "capacity_factor": opts.capacity_factor}


def run_worker(opts: RunOptions, apply_fn: Callable[[nn.Module, Context], Parallel], *, moe: bool = False) -> None:
    """Train one rank and leave the process; never returns.

    Nothing is torn down: once every rank has passed the final barrier the process exits at once.
    Tearing down on gloo is unsafe: freeing DDP's reducer (or the process group) while gloo's
    worker thread still drops its last work object deadlocks on the GIL (seen with py-spy: main
    thread joining the gloo thread inside ~ProcessGroupGloo, that thread waiting for the GIL in
    ~AsyncAllgatherWork), and destroying it during interpreter finalization sometimes aborts
    ("terminate called without an active exception"). Either would fail a finished run.
    """
    ctx = init_distributed(opts)
    model = build_model(opts, **(moe_overrides(opts) if moe else {}))
    n_params = count_params(model)
    param_dtypes = numel_by_dtype(model.parameters())
    par = apply_fn(model.to(ctx.device), ctx)
    held = local_params(par.optimizer)  # before training: what this rank's optimizer steps
    del model  # pipeline runners train copies of its stages: the whole model must not stay on the device
    results = train(ctx, par) | {"params": held}
    if par.after_training:
        par.after_training()
    # Gathered after profiling ended, so this collective is not in the traces.
    ranks: list = [None] * ctx.world_size
    dist.all_gather_object(ranks, results)
    if ctx.rank == 0:
        write_manifest(ctx, par, n_params, ranks, param_dtypes)
    dist.barrier()
    _exit_now(0)


def _exit_now(status: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def main(apply_fn: Callable[[nn.Module, Context], Parallel], *, moe: bool = False) -> None:
    """Entry point of a runner module on each rank: parse the flags `ptprof run` passed, train.

    moe=True builds the MoE variant of the model (experts, top-k, capacity from the options).
    """

    @record  # writes this rank's exception to torchrun's error file, for the launcher's report
    def _main() -> None:
        opts = options_from_namespace(worker_parser().parse_args())
        run_worker(opts, apply_fn, moe=moe)

    try:
        _main()
    except BaseException:  # noqa: BLE001 - reported, then the same no-teardown exit as success
        traceback.print_exc()  # to this rank's stderr log
        _exit_now(1)
