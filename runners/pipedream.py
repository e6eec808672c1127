"""PipeDream: asynchronous 1F1B with weight stashing (Narayanan et al. 2019, "PipeDream:
Generalized Pipeline Parallelism for DNN Training", SOSP), one stage per rank, on gloo.

    ptprof run pipedream --gpus 2 --microbatches 4
    ptprof run pipedream --gpus 4 --model tiny8      # M defaults to 2P = 8

torch.distributed.pipelining has only flushing schedules, so this file is a small explicit engine:
send/recv between neighbour stages and the 1F1B-RR order of the paper with one stage per rank.
Stage s runs w = P-1-s warmup forwards, then alternates one forward and one backward, and never
flushes: right after each microbatch's backward the stage takes an AdamW step on that
microbatch's gradient (its own mean loss, no 1/M: every microbatch is an update). Microbatches
stream across the harness's steps: step k feeds microbatches g = k*M .. k*M+M-1 (its global
batch cut into M) and runs, on stage s, F(k*M+i) then B(k*M+i-w) for i = 0..M-1, so the last w
backwards of step k run in step k+1. Only the run's first step fills the pipeline; the drain (the
last w backwards of each stage) runs after the last step, outside the traces (`after_training`).

Weight stashing: a forward runs on the stage's current weights as they are at that moment
(torch.func.functional_call on tensors sharing their storage), kept until that microbatch's
backward, so the backward differentiates the weights its forward used even though the stage has
updated since. Copies are made only where an update would otherwise overwrite a version still in
use: before each update, if an in-flight microbatch's forward used the live weights, the live
weights move to a fresh copy and the optimizer updates that, the old storage staying with the
microbatch until its backward. So the last stage (w = 0: no update between its forward and
backward) copies nothing, and stage s holds its P-s weight versions in flight as the live weights
plus w = P-1-s stashed copies (run.json ranks[].memory.stashed_params_bytes: the bytes of distinct
stashed storages measured, the most held at once). A microbatch's forward sees weights w updates
older than the update its gradient makes (staleness, run.json: measured from the versions).
Vertical sync (every stage using the same version for one microbatch) is not implemented.

Compute runs under `harness.PP_ACTION` spans: F, L (the loss, last stage), B, and U (the AdamW step
after each backward); microbatches are numbered globally (g above). No per-step phase is
recorded (run.json "phases": {}): the harness's optimizer is a view whose step() does nothing.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call
from torch.nn.utils.stateless import _reparametrize_module  # functional_call's own swap, as a context
from torch.profiler import record_function

from runners import harness
from runners.model import GPT, lm_loss
from runners.options import RunOptions
from runners.pipeline import build_stage_module, split_layers, stage_layers

SCHEDULE = "pipedream"


def pipedream_shape(opts: RunOptions, n_layers: int) -> tuple[int, int, list[range]]:
    """(P stages = ranks, M microbatches per step, each stage's blocks) of a pipedream run."""
    p = opts.world_size
    m = opts.microbatches if opts.microbatches is not None else 2 * p
    counts = opts.stage_layer_counts
    return p, m, stage_layers(n_layers, p) if counts is None else split_layers(counts)


def step_order(stage: int, ranks: int, microbatches: int) -> list[tuple[str, int, int]]:
    """Stage `stage`'s actions in one steady-state step, microbatches numbered from the step's
    first (negative: a previous step's): F(i), then B(i-w) and its update U(i-w), i = 0..M-1."""
    w = ranks - 1 - stage
    order = []
    for i in range(microbatches):
        order.append(("F", stage, i))
        order += [("B", stage, i - w), ("U", stage, i - w)]
    return order


class PerMicrobatchOptimizer:
    """What the harness steps once per step: a view of the stage's AdamW whose step() and
    zero_grad() do nothing, the real steps being taken after every microbatch's backward (U spans).
    `optim` and `param_groups` let the harness count the parameters and optimizer state held."""

    def __init__(self, optim: torch.optim.Optimizer) -> None:
        self.optim = optim
        self.param_groups = optim.param_groups
        self.state = optim.state

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass


class PipeDreamStage:
    """One stage's engine: forwards on stashed weights, backwards, per-microbatch updates, p2p."""

    def __init__(self, module: GPT, stage: int, ranks: int, microbatches: int, opts: RunOptions, device) -> None:
        self.module, self.stage, self.ranks, self.m = module, stage, ranks, microbatches
        self.first, self.last = stage == 0, stage == ranks - 1
        self.warmup = ranks - 1 - stage
        self.optim = harness.make_optimizer(module.parameters(), opts)
        self.names = [n for n, _ in module.named_parameters()]
        self.params = [p for _, p in module.named_parameters()]
        self.device = device
        rows = opts.global_batch_size // microbatches
        self.msg_shape = (rows, opts.sequence_length, module.cfg.d_model)  # one microbatch's residual stream
        self.total = opts.steps * microbatches  # microbatches in the run
        self.posted: dict[int, tuple] = {}  # peer -> the receive posted ahead (work, buffer)
        self.version = 0  # AdamW steps taken so far
        # g -> (input, output or loss, stashed weights, version its forward used)
        self.inflight: dict[int, tuple] = {}
        self.sends: list = []  # isend works not yet waited for (and their tensors, kept alive)
        # [[g, version], ...] of this step's forwards and backwards; per step in `versions`.
        self.versions: dict[int, dict] = {}
        self.fwd_versions: list[list[int]] = []
        self.bwd_versions: list[list[int]] = []
        self.max_stashed = 0  # most stashed copies (weight versions besides the live one) held at once
        self.max_stash_bytes = 0  # their bytes: distinct storages, measured
        self.staleness = 0  # most updates between a microbatch's forward and its own update

    def _span(self, kind: str, g: int) -> record_function:
        return record_function(harness.PP_ACTION.format(kind=kind, stage=self.stage, microbatch=g))

    def _recv(self, peer: int, ahead: bool) -> torch.Tensor:
        """The next tensor from a neighbour (an activation from s-1, a gradient from s+1).

        With `ahead`, the receive of the next one from that neighbour is posted at once (messages
        between two ranks arrive in microbatch order), so the neighbour's send completes as soon
        as its data is here instead of waiting for us to ask. Not across a step boundary, so that
        each step's trace holds its own M receives per neighbour (the p2p theory's count).

        The sends posted since our last receive are completed here, after the receive is posted,
        as torch's 1F1B fuses a send with the next receive: a gloo send completes once the peer
        has posted the matching receive, so waiting for it before posting ours could deadlock.
        All of it falls outside the compute spans.
        """
        work, buf = self.posted.pop(peer, None) or self._post(peer)
        if ahead:
            self.posted[peer] = self._post(peer)
        self._wait_sends()
        work.wait()
        return buf

    def _post(self, peer: int):
        buf = torch.empty(self.msg_shape, device=self.device)
        return dist.irecv(buf, src=peer), buf

    def _send(self, t: torch.Tensor, peer: int) -> None:
        # Asynchronous, completed at the next receive (or the drain). Activations go s -> s+1 and
        # gradients s+1 -> s, so each ordered pair of ranks carries one kind of message, matched
        # in order. The work (and its tensor) must live until wait(): dropping a gloo send before
        # it completes lets gloo's transport thread write to freed memory (heap corruption seen).
        t = t.detach().contiguous()
        self.sends.append((dist.isend(t, dst=peer), t))

    def _wait_sends(self) -> None:
        for work, _ in self.sends:
            work.wait()
        self.sends = []

    def forward(self, g: int, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """Forward of microbatch g on a stash of the current weights; the loss on the last stage."""
        # The next forward's activation is received ahead within this step (g's step is g // M).
        x = tokens if self.first else self._recv(self.stage - 1, ahead=(g + 1) % self.m != 0).requires_grad_()
        # The live weights themselves, as new leaves: `.data` shares the storage but not the version
        # counter, so each microbatch gets its own gradients and no copy is made here (`_stash_live`).
        stash = {n: p.data.requires_grad_() for n, p in zip(self.names, self.params)}
        with self._span("F", g):
            out = functional_call(self.module, stash, (x,))
        loss = None
        if self.last:
            with self._span("L", g):
                out = loss = lm_loss(out, targets)
        else:
            self._send(out, self.stage + 1)
        self.inflight[g] = (x, out, stash, self.version)
        self.fwd_versions.append([g, self.version])
        return loss

    def _stash_live(self) -> None:
        """Before an update: if an in-flight forward used the live weights, they move to a copy that
        the optimizer updates, the old storage staying with those microbatches (copy on update)."""
        if any(version == self.version for *_, version in self.inflight.values()):
            for p in self.params:
                p.data = p.data.clone()
        live = {p.untyped_storage().data_ptr() for p in self.params}
        held: dict[int, int] = {}  # distinct stashed storages, as runners/memory_probe.py counts
        versions = set()
        for *_, stash, version in self.inflight.values():
            for t in stash.values():
                if (ptr := t.untyped_storage().data_ptr()) not in live:
                    held[ptr] = t.untyped_storage().nbytes()
                    versions.add(version)
        self.max_stash_bytes = max(self.max_stash_bytes, sum(held.values()))
        self.max_stashed = max(self.max_stashed, len(versions))

    def backward(self, g: int, probe: harness.MemoryProbe | None = None, *, drain: bool = False) -> None:
        """Backward of microbatch g through the weights its forward used, then one AdamW step."""
        x, out, stash, version = self.inflight.pop(g)
        # B(g) runs in step (g + w) // M: receive the next gradient ahead within that step (or
        # during the drain, which is outside the steps).
        ahead = g + 1 < self.total and (drain or (g + 1 + self.warmup) % self.m != 0)
        grad = None if self.last else self._recv(self.stage + 1, ahead=ahead)
        # The stash stands in for the module's weights during backward too: with --recompute each
        # checkpointed block runs its forward again here, and must see the weights its forward used.
        with self._span("B", g), _reparametrize_module(self.module, stash):
            torch.autograd.backward(out, grad)
        if not self.first:
            self._send(x.grad, self.stage - 1)
        self.bwd_versions.append([g, version])
        self.staleness = max(self.staleness, self.version - version)  # this update is number self.version
        with self._span("U", g):
            for p, n in zip(self.params, self.names):
                p.grad = stash[n].grad
            del x, out, stash  # g's version is freed with its microbatch, before any copy is made
            self._stash_live()
            if probe is not None:
                probe.after_backward(self.module)
            self.optim.step()
            self.optim.zero_grad(set_to_none=True)
        self.version += 1

    def drain(self) -> None:
        """The run's end: the last w backwards and updates, then every send completed."""
        for g in sorted(self.inflight):
            self.backward(g, drain=True)
        self._wait_sends()
        assert not self.posted, f"stage {self.stage}: receives left posted after the drain"


def pipedream_step(engine: PipeDreamStage):
    """The harness's train_step: one step of the stream (module docstring); returns the mean of
    its M microbatch losses on the last stage (None elsewhere)."""
    step = [0]

    def train_step(par: harness.Parallel, inputs, targets, probe: harness.MemoryProbe):
        k, m = step[0], engine.m
        rows = inputs.shape[0] // m
        losses = []
        engine.fwd_versions, engine.bwd_versions = [], []
        for i in range(m):
            g = k * m + i
            sl = slice(i * rows, (i + 1) * rows)
            loss = engine.forward(g, inputs[sl], targets[sl])
            if loss is not None:
                losses.append(loss.detach())
            if probe.sampling:
                probe.after_forward(par.model, par.optimizer)
            if g - engine.warmup >= 0:
                engine.backward(g - engine.warmup, probe if probe.sampling else None)
        engine.versions[k] = {"forward": engine.fwd_versions, "backward": engine.bwd_versions}
        probe.numbers["stashed_params_bytes"] = engine.max_stash_bytes
        step[0] += 1
        return torch.stack(losses).mean() if engine.last else None

    return train_step


def pipedream_manifest(p: int, m: int, layers: list[range], rows: int) -> dict:
    """run.json's "pipeline" block (docs/run-layout.md): the shape of the other schedules', the
    ideal order of one steady-state step, and `stream` (microbatches numbered across steps)."""
    return {
        "schedule": SCHEDULE,
        "torch_schedule": None,
        "ranks": p,
        "microbatches": m,
        "microbatch_size": rows // m,
        "stages_per_rank": 1,
        "num_stages": p,
        "stage_to_rank": list(range(p)),
        "stage_layers": [[r.start, r.stop] for r in layers],
        "loss_stage": p - 1,
        "span_format": harness.PP_ACTION,
        "order_source": "pipedream 1F1B (async)",
        "stream": True,
        "ideal_order": [step_order(s, p, m) for s in range(p)],
    }


def apply_pipedream(model: GPT, ctx: harness.Context) -> harness.Parallel:
    p, m, layers = pipedream_shape(ctx.opts, model.cfg.n_layers)
    s = ctx.rank
    module = build_stage_module(model, layers[s], first=s == 0, last=s == p - 1)
    engine = PipeDreamStage(module, s, p, m, ctx.opts, ctx.device)
    gathered: list = [None] * p

    def after_training() -> None:
        engine.fwd_versions, engine.bwd_versions = [], []
        engine.drain()  # after harness.train freed the profiler (see there: a gc during it crashes)
        # Every stage's weight versions, for run.json (rank 0 writes it); after profiling, so this
        # collective is in no trace.
        mine = {"stage": s, "steps": [engine.versions[k] for k in sorted(engine.versions)],
                "drain": engine.bwd_versions,
                "staleness": engine.staleness, "max_stashed_versions": engine.max_stashed, "updates": engine.version}
        dist.all_gather_object(gathered, mine)
        extra["pipedream"] = {
            "weight_stashing": True,
            "vertical_sync": False,
            "version": "AdamW steps the stage had taken when the microbatch's forward ran",
            "stages": gathered,
        }

    extra = {"pipeline": pipedream_manifest(p, m, layers, ctx.opts.global_batch_size)}
    return harness.Parallel(
        model=module,
        optimizer=PerMicrobatchOptimizer(engine.optim),
        mesh={"pp": p},
        dp_rank=0,
        dp_size=1,
        train_step=pipedream_step(engine),
        reports_loss=engine.last,
        extra=extra,
        phases={},  # no per-step phase: the updates are the U spans (no empty ptprof/optimizer span)
        after_training=after_training,
    )


if __name__ == "__main__":
    harness.main(apply_pipedream)
