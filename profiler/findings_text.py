"""The words of findings: numbers in human units (3 significant digits) and what to change, by
collective, phase and memory layout (docs/findings.md gives the textbook reason for each)."""

from __future__ import annotations

import math

from profiler.collectives import POINT_TO_POINT


def num(x: float) -> str:
    """x to 3 significant digits, without exponent: 0.0123, 1.23, 12.3, 123, 1235."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:.{digits}f}"


def pct(x: float) -> str:
    """A percentage: `14.9 %`."""
    return f"{num(x)} %"


def ms(us: float) -> str:
    """A duration given in µs, in µs, ms or s."""
    a = abs(us)
    if a >= 1e6:
        return f"{num(us / 1e6)} s"
    if a >= 1e3:
        return f"{num(us / 1e3)} ms"
    return f"{num(us)} µs"


def bytes_text(b: float) -> str:
    """Bytes in B, KiB, MiB or GiB."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= size:
            return f"{num(b / size)} {unit}"
    return f"{int(b)} B"


def steps_text(steps: list) -> str:
    """`step 3`, `steps 1, 2`, `steps 1009–1014` (a run of consecutive steps as a range)."""
    steps = sorted({s for s in steps if s is not None})
    if not steps or steps == [-1]:  # steps.NO_STEP: a trace without ProfilerStep spans is one window
        return "the profiled window (no ProfilerStep)" if steps else "the profiled window"
    if len(steps) == 1:
        return f"step {steps[0]}"
    if len(steps) > 2 and steps[-1] - steps[0] == len(steps) - 1:
        return f"steps {steps[0]}–{steps[-1]}"
    return f"steps {', '.join(map(str, steps))}"


def phase_text(phase: str | None, kind: str | None = None, pipeline: bool = False) -> str:
    """`in forward`, or where the collective's phase is not known: for a send or receive of a
    pipeline run (its transfers sit between the action spans, none holds them) `between pipeline
    actions`, else `(phase unknown)`."""
    if phase:
        return f"in {phase}"
    return "between pipeline actions" if pipeline and kind in POINT_TO_POINT else "(phase unknown)"


# What to try, by (collective, phase); phase None matches any phase.
COLLECTIVE_CHANGES: dict[tuple[str, str | None], str] = {
    ("all_gather", "forward"): "prefetch the next unit's all-gather while this one computes (FSDP2 "
                               "set_modules_to_forward_prefetch, FSDP1 forward_prefetch=True), or wrap fewer, larger units",
    ("all_gather", "backward"): "keep parameters gathered between forward and backward (FSDP reshard_after_forward=False, "
                                "ZeRO-2's trade: more memory, one all-gather less) or prefetch in backward "
                                "(BackwardPrefetch.BACKWARD_PRE)",
    ("all_gather", None): "prefetch all-gathers ahead of the layer that needs them (FSDP forward/backward prefetch), "
                          "or wrap fewer, larger units",
    ("reduce_scatter", None): "let gradient reduce-scatters overlap backward (per-layer FSDP units start them early), "
                              "and accumulate gradients over microbatches to reduce once per step",
    ("all_reduce", "forward"): "tensor-parallel all-reduces sit on the critical path: sequence parallelism (all-gather + "
                               "reduce-scatter), async TP, or keep the TP group on the fastest link",
    ("all_reduce", None): "let the gradient all-reduce overlap backward (DDP buckets: a smaller bucket_cap_mb starts the "
                          "first one earlier), or all-reduce less often (gradient accumulation with no_sync)",
    ("all_to_all", None): "overlap the all-to-all with compute (split the batch and pipeline it: MoE dispatch/combine, "
                          "embedding or sequence exchanges alike), or send less per call",
    ("send", None): "pipeline transfers: more microbatches, and sends/receives posted early (isend/irecv, "
                    "batch_isend_irecv) so they overlap the next microbatch's compute",
    ("broadcast", "optimizer"): "ZeroRedundancyOptimizer broadcasts each rank's updated shard after every step: fewer, "
                                "larger broadcasts (parameters_as_bucket_view=True), or overlap them with DDP's backward "
                                "(overlap_with_ddp=True with its DDP comm hook)",
    ("broadcast", None): "a broadcast in every profiled step: turn off what issues it where it is not needed (DDP "
                         "broadcast_buffers=False without changing buffers; ZeroRedundancyOptimizer's parameter broadcast "
                         "is the price of ZeRO-1 in torch)",
}
# An all-to-all of an expert-parallel run (run.json paradigm ep) is the MoE dispatch and combine.
MOE_ALL_TO_ALL_CHANGE = ("overlap the expert dispatch and combine with compute (split the batch and pipeline the "
                         "all-to-all, or run a shared expert meanwhile); a lower capacity factor sends less")
# A send or receive between a pipeline's actions: the rank waiting for its neighbouring stage, which
# is mostly the pipeline's bubble (torch.distributed.pipelining already posts them early).
PIPELINE_P2P_CHANGE = ("a receive between pipeline actions waits for the neighbouring stage, so most of this is the "
                       "pipeline's bubble (the pipeline-bubble finding splits it into the schedule's own, stage imbalance "
                       "and communication): {cut}; torch's pipelining schedules already post sends and receives early "
                       "(batch_isend_irecv)")
# Schedules that fill their bubble with weight-gradient work: no zero-bubble schedule to advise them.
ZERO_BUBBLE_SCHEDULES = frozenset({"zero-bubble", "zbv", "dualpipev"})


def pipeline_p2p_change(paradigm: str | None) -> str:
    cut = (f"more microbatches cut it ({paradigm} is a zero-bubble schedule already)" if paradigm in ZERO_BUBBLE_SCHEDULES
           else "more microbatches or a zero-bubble schedule cut it")
    return PIPELINE_P2P_CHANGE.format(cut=cut)
# A send or receive of a ring-attention run (paradigm ring) is a K/V block travelling the ring.
RING_P2P_CHANGE = ("a ring-attention K/V block's transfer hides under the attention on the block before only when a rank's shard "
                   "s/P ≥ F·dtype/β (device FLOP/s F, link bytes/s β: docs/theory.md): longer sequences per rank or "
                   "fewer ring ranks; the runner already computes on each block while the next one travels")
# An all-to-all of a ulysses run turns sequence shards into head shards around every attention.
ULYSSES_ALL_TO_ALL_CHANGE = ("the Ulysses all-to-alls sit between every layer's projections and its attention: keep "
                             "the sequence-parallel group on the fastest links (within a node), send q, k and v in one "
                             "all-to-all, or use ring attention, whose K/V exchanges overlap the block computation")
GENERIC_CHANGE = "overlap it with compute (issue it asynchronously, wait later) or send fewer, larger messages"
# Phase "recompute": the forward's collectives run again by activation checkpointing (--recompute).
RECOMPUTE_CHANGE = ("these are the recomputed forward's collectives (--recompute reruns each block, its collectives "
                    "included, inside backward): recompute selectively (only the attention core, or fewer blocks), "
                    "or drop --recompute where activation memory allows")


def one_time_change(kind: str, phase: str | None, pipeline: bool = False) -> str:
    """The change for exposed communication seen in only some profiled steps: a one-time cost."""
    return (f"this {kind} {phase_text(phase, kind, pipeline)} is no per-step cost: it ran in some profiled steps only (DDP rebuilds its "
            "buckets and broadcasts their order once, in step 1: docs/theory.md); it fades in a long run, so profile "
            "later steps (ptprof run --warmup 2 or more) to see the steady state before acting on it")


# A call this small takes α (latency, tens of µs) plus the wait for the slowest rank: its bytes
# are no cost (n/β ≪ α below ~64 KiB on NVLink or InfiniBand, far below on gloo's TCP), so no
# advice about bandwidth or overlap of large transfers fits it.
SMALL_MESSAGE_BYTES = 64 << 10
SMALL_MESSAGE_CHANGE = ("each call moves only {size} (median), so its time is latency and the wait for the slowest "
                        "rank, not bytes: {fuse}, and see Stragglers for the rank the others wait on")
SMALL_FUSE_GRADIENTS = "fuse these small tensors into fewer collectives (one flat buffer a step)"
SMALL_FUSE_VALUES = "make fewer such calls (several values in one tensor, or computed without a collective)"
# An all-reduce of a tensor-parallel run (paradigm tp): the row/column-parallel layers' partial
# sums (forward and backward), or with --sp the replicated LayerNorm weights' gradients.
TP_ALL_REDUCE_CHANGE = ("tensor-parallel all-reduces sit on the critical path of every layer: sequence parallelism "
                        "(all-gather + reduce-scatter), async TP, or keep the TP group on the fastest link (within a node)")
# A tp run's all-reduces in the optimizer phase (theory.py's tp rows): with --sp the LayerNorm
# weights' gradients stay Partial DTensors, and AdamW (foreach=False, runners/harness.py) all-reduces
# each on each of its 3 uses; Megatron all-reduces them once per step, together.
TP_SP_OPTIMIZER_ALL_REDUCE_CHANGE = ("these are the sequence-parallel LayerNorm gradients, left Partial after backward: AdamW "
                                     "(foreach=False) all-reduces each one on each of its 3 uses in the step (docs/theory.md); "
                                     "make them Replicate once after backward, one all-reduce of them all per step as in "
                                     "Megatron, and these calls become one a step")
# ptprof's ep runner all-reduces the shared (non-expert) parameters' gradients in one flat call
# after backward (runners/expert_parallel.py): no DDP, so no bucket to tune; DDP would overlap it.
EP_GRAD_ALL_REDUCE_CHANGE = ("the shared (non-expert) parameters' gradients are all-reduced in one call after backward: "
                            "wrap them in DDP (bucketed all-reduces that start during backward) or FSDP so that the "
                            "all-reduce overlaps the backward of earlier layers")
# run.json paradigms that sync gradients by reduce-scatter, not by DDP's all-reduce: an all-reduce
# there is no gradient bucket to tune (ddp, zero1, ep, ulysses, ring, hybrid's dp do all-reduce
# their gradients; foreign traces are most often DDP too).
SHARDED_GRADIENTS = frozenset({"fsdp", "zero2"})


def collective_change(kind: str | None, phase: str | None, paradigm: str | None = None, pipeline: bool = False,
                      schedule: str | None = None, size_bytes: float | None = None, sp: bool = False) -> str:
    """The change to try for exposed communication of this collective kind in this phase (of a run
    of this run.json paradigm, None for foreign traces; `pipeline`: a run with pipeline actions,
    `schedule` the one they ran, where known; `size_bytes`: the calls' median message size; `sp`:
    run.json's options say --sp)."""
    kind = "send" if kind in ("recv", "send_recv") else kind
    if kind is None:
        return GENERIC_CHANGE
    if phase == "recompute":
        return RECOMPUTE_CHANGE
    # The paradigm's own collectives first: what they carry decides what to try, whatever their size.
    if kind == "send" and pipeline and phase is None:
        return pipeline_p2p_change(schedule or paradigm)
    if kind == "all_to_all" and paradigm == "ep":
        return MOE_ALL_TO_ALL_CHANGE
    if kind == "send" and paradigm == "ring":
        return RING_P2P_CHANGE
    if kind == "all_to_all" and paradigm == "ulysses":
        return ULYSSES_ALL_TO_ALL_CHANGE
    if kind == "all_reduce" and paradigm == "tp" and sp and phase == "optimizer":
        return TP_SP_OPTIMIZER_ALL_REDUCE_CHANGE
    if size_bytes is not None and 0 < size_bytes < SMALL_MESSAGE_BYTES:
        # Gradients (backward, the optimizer) can wait for one flat buffer; a forward's values are
        # needed as soon as computed (a router's counts, a loss statistic): fewer calls, not one.
        fuse = (SMALL_FUSE_GRADIENTS if phase in ("backward", "optimizer") else SMALL_FUSE_VALUES)
        return SMALL_MESSAGE_CHANGE.format(size=bytes_text(size_bytes), fuse=fuse)
    if kind == "all_reduce" and paradigm == "tp":
        return TP_ALL_REDUCE_CHANGE
    if kind == "all_reduce" and paradigm == "ep" and phase in ("backward", "optimizer"):
        return EP_GRAD_ALL_REDUCE_CHANGE
    if kind == "all_reduce" and phase != "forward" and paradigm in SHARDED_GRADIENTS:
        return GENERIC_CHANGE  # no DDP bucket here to tune
    return COLLECTIVE_CHANGES.get((kind, phase)) or COLLECTIVE_CHANGES.get((kind, None)) or GENERIC_CHANGE


# What switching to a memory layout means (memory_whatif's layout names, matched by substring).
LAYOUT_CHANGES = [
    ("zero1", "shard optimizer state over the data-parallel ranks (ZeRO-1: torch ZeroRedundancyOptimizer, DeepSpeed "
              "stage 1); communication stays 2Φ per step in DeepSpeed's design (reduce-scatter + all-gather), while "
              "torch's ZeroRedundancyOptimizer keeps DDP's all-reduce and broadcasts the updated parameters: 3Φ, 1.5× DDP"),
    ("zero2", "shard gradients too (ZeRO-2: DeepSpeed stage 2, FSDP SHARD_GRAD_OP); communication stays 2Φ "
              "(reduce-scatter + all-gather)"),
    ("zero3", "shard parameters too (ZeRO-3 / FSDP fully_shard): parameters are all-gathered when used, 3Φ of "
              "communication per step instead of DDP's 2Φ"),
    ("fsdp", "shard parameters too (FSDP fully_shard / ZeRO-3): parameters are all-gathered when used, 3Φ of "
             "communication per step instead of DDP's 2Φ"),
]


# From torch's ZeRO-2 (fully_shard with reshard_after_forward=False, as ptprof's zero2 and a hybrid
# run's dp beside a pipeline) to ZeRO-3 is one flag, not a new wrapper.
ZERO2_TO_FSDP_CHANGE = ("switch to fsdp: fully_shard(reshard_after_forward=True) frees the gathered parameters after "
                        "forward and gathers them again for backward (ZeRO-3, 3Φ of communication instead of 2Φ; "
                        "beside a pipeline, once per microbatch)")


def switch_change(layout: str, current: str | None = None) -> str:
    """The change that moves a run to `layout` (from `current`, where known)."""
    if current is not None and "zero2" in str(current).lower() and "fsdp" in str(layout).lower():
        return ZERO2_TO_FSDP_CHANGE
    low = str(layout).lower().replace("-", "").replace("_", "")
    for key, text in LAYOUT_CHANGES:
        if key in low:
            return f"switch to {layout}: {text}"
    return f"switch to {layout}"
