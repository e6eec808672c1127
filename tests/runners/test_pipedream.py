"""PipeDream (asynchronous 1F1B with weight stashing) at 2 gloo ranks: losses equal a
single-process emulation of exactly the asynchronous rule (and differ from synchronous training),
the weight versions and staleness in run.json, the stashed copies in memory, and spans that follow
the steady-state order.

The emulation shares only the model and the data with the runner. Its rule, from the 1F1B-RR
order with one stage per rank (stage s: w = P-1-s warmup forwards, then one forward, one backward,
no flush): stage s's forward of microbatch g (counted over the whole run) comes after g - w of its
backwards, so it runs on the stage's weights after max(0, g - w) updates; its backward
differentiates those same (stashed) weights, and the update it makes is an AdamW step of the
stage's live weights, the g-th. Every parameter belongs to one stage and AdamW is per parameter,
so one AdamW over the whole model, stepped once per microbatch, is the per-stage optimizers.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
import torch
from torch.func import functional_call

from runners.harness import synthetic_batch
from runners.model import GPT, GPTConfig, lm_loss
from runners.options import MODEL_PRESETS
from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses

pytestmark = pytest.mark.multirank

PREFIX = "ptprof/pp/"
ACTIVE = 2  # conftest's runs profile the last 2 of 3 steps


def pipedream_losses(*, model: str, ranks: int, microbatches: int, steps: int = STEPS, seed: int = 0,
                     lr: float = 1e-3) -> list[float]:
    """Per-step loss (mean of its M microbatch losses) of PipeDream's rule, in one process."""
    vocab, d_model, n_layers, n_heads, seq_len, batch = MODEL_PRESETS[model]
    torch.manual_seed(seed)
    net = GPT(GPTConfig(vocab, d_model, n_layers, n_heads, seq_len))
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0, foreach=False)
    per_stage, extra = divmod(n_layers, ranks)  # contiguous blocks, earlier stages get the extra
    bounds = [0]
    for s in range(ranks):
        bounds.append(bounds[-1] + per_stage + (s < extra))

    def stage_of(name: str) -> int:
        if name.startswith(("tok_emb", "pos_emb")):
            return 0
        if name.startswith(("norm", "head")):
            return ranks - 1
        layer = int(name.split(".")[1])  # blocks.<i>.
        return next(s for s in range(ranks) if bounds[s] <= layer < bounds[s + 1])

    stages = {n: stage_of(n) for n, _ in net.named_parameters()}
    history: list[dict[str, torch.Tensor]] = []  # history[u]: every weight after u updates
    losses = []
    rows = batch // microbatches
    for step in range(steps):
        inputs, targets = synthetic_batch(step, seed=seed, batch_size=batch, seq_len=seq_len, vocab_size=vocab)
        step_losses = []
        for i in range(microbatches):
            g = step * microbatches + i
            history.append({n: p.detach().clone() for n, p in net.named_parameters()})
            # Stage s's forward of g: after max(0, g - w) updates, w = P-1-s.
            used = {n: history[max(0, g - (ranks - 1 - s))][n].clone().requires_grad_() for n, s in stages.items()}
            sl = slice(i * rows, (i + 1) * rows)
            loss = lm_loss(functional_call(net, used, (inputs[sl],)), targets[sl])
            loss.backward()
            for n, p in net.named_parameters():
                p.grad = used[n].grad
            opt.step()
            opt.zero_grad()
            step_losses.append(loss.item())
        losses.append(sum(step_losses) / microbatches)
    return losses


def manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def compute_spans(run_dir: Path, rank: int) -> list[tuple[str, int, int]]:
    """(kind, stage, microbatch) of one rank's per-microbatch spans in time order, L left out."""
    with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e["name"].startswith(PREFIX)]
    out = []
    for e in sorted(events, key=lambda e: e["ts"]):
        kind, stage, mb = e["name"].removeprefix(PREFIX).split(" ")
        if kind != "L":
            out.append((kind, int(stage[1:]), int(mb[2:])))
    return out


@pytest.fixture(scope="module")
def pd2(runs) -> Path:
    return runs("pipedream", 2)  # tiny (2 layers), M = 2P = 4


def test_losses_follow_the_asynchronous_rule(pd2):
    m = manifest(pd2)
    want = pipedream_losses(model="tiny", ranks=2, microbatches=4)
    errors = [abs(got - ref) / abs(ref) for got, ref in zip(m["losses"], want)]
    assert len(m["losses"]) == STEPS and max(errors) < 1e-5, (m["losses"], want, errors)
    # ... and not synchronous training, so the comparison can fail: the same data and model
    # trained with one update per step give other losses from the first step on.
    sync = single_process_losses(model="tiny", steps=STEPS)
    assert all(abs(a - b) > 1e-3 for a, b in zip(m["losses"], sync)), (m["losses"], sync)


def test_versions_staleness_and_stashed_memory(pd2):
    m = manifest(pd2)
    p, mb = 2, 4
    pp = m["pipeline"]
    assert (pp["schedule"], pp["ranks"], pp["microbatches"], pp["stage_to_rank"]) == ("pipedream", p, mb, [0, 1])
    assert pp["order_source"] == "pipedream 1F1B (async)" and pp["stream"] is True
    assert m["mesh"] == {"pp": p}
    # No per-step phase: the updates are the U spans, so no empty ptprof/optimizer span either.
    assert m["phases"] == {}
    for rank in range(p):
        with gzip.open(pd2 / f"rank{rank}.json.gz", "rt") as f:
            assert not any(e.get("name") == "ptprof/optimizer" for e in json.load(f)["traceEvents"])
    for st in m["pipedream"]["stages"]:
        s, w = st["stage"], p - 1 - st["stage"]
        # w updates between a microbatch's forward and its own; P - s versions in flight, the newest
        # the live weights: w stashed copies, none on the last stage (no update in between).
        assert st["staleness"] == w and st["max_stashed_versions"] == w
        assert st["updates"] == STEPS * mb  # every microbatch updated every stage, the drain included
        for k, step in enumerate(st["steps"]):
            fwd = [[g, max(0, g - w)] for g in range(k * mb, (k + 1) * mb)]
            assert step["forward"] == fwd, (s, k)
            # Its backwards are the forwards w microbatches back, on the version they used (stashed).
            assert step["backward"] == [[g, max(0, g - w)] for g in range(k * mb - w, (k + 1) * mb - w) if g >= 0]
        assert [g for g, _ in st["drain"]] == list(range(STEPS * mb - w, STEPS * mb))
    for r in m["ranks"]:
        mem, s = r["memory"], r["rank"]
        # Stage s holds up to P - 1 - s stashed copies of its weights besides the live ones (measured).
        assert mem["stashed_params_bytes"] == (p - 1 - s) * mem["params_bytes"] == (p - 1 - s) * r["params"]["bytes"]
    # Only the last stage has a loss, for the whole global batch.
    assert [r["loss_tokens"] > 0 for r in m["ranks"]] == [False, True]


def test_spans_run_the_steady_state_order(pd2):
    pp = manifest(pd2)["pipeline"]
    mb = pp["microbatches"]
    for rank in range(2):
        ran = compute_spans(pd2, rank)
        # Profiled steps 1 and 2 of the stream: the ideal order with microbatches counted from the
        # step's first (run.json) shifted to the run's numbering, no fill and no drain.
        want = [(k, s, i + step * mb) for step in (1, 2) for k, s, i in pp["ideal_order"][rank]]
        assert ran == want, (rank, ran[:12], want[:12])


def test_analysis_shows_no_flush_bubble(pd2):
    # The pipeline analysis of the real run: the order as planned, a textbook bubble and a
    # schedule share of 0 (a stream), the p2p bytes and the stashed memory as the theory says.
    from profiler import load_traces, pipeline_actions, pipeline_summary
    from profiler.steps import profiler_steps
    from profiler.theory_memory import memory_check, predict_memory
    from profiler.memory import persistent_memory

    traces = load_traces(pd2)
    actions = pipeline_actions(traces.events, runs=traces.runs)
    s = pipeline_summary(actions, traces.runs, steps=profiler_steps(traces.events))
    assert s["schedule"].unique().to_list() == ["pipedream"] and s.height == 2 * ACTIVE
    assert s["order_matches"].all(), s.select("rank", "step", "order_matches")
    assert (s["theory_pct"] == 0).all()
    # The uniform-stage replay's period is exactly its work, up to float rounding.
    assert (s["schedule_bubble_pct"].abs() < 1e-6).all(), s.select("rank", "step", "schedule_bubble_pct")
    assert s["ideal_pct"].is_not_null().all() and (s["bubble_pct"] < 100).all()
    check = memory_check(predict_memory(traces.runs), persistent_memory(traces.runs))
    stashed = check.filter(pl.col("quantity") == "memory.stashed_params_bytes")
    assert stashed.height == 2 and (stashed["verdict"] == "match").all()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gpus", "2", "--microbatches", "3"],
         "--batch-size 8 does not split into 3 equal microbatches; use --microbatches dividing 8"),
        (["--gpus", "4", "--model", "tiny"], "pipedream over 4 ranks needs 4 layers, but model 'tiny' has 2; use --model tiny8"),
        (["--gpus", "4", "--model", "tiny8", "--microbatches", "2"],  # stage 0's 3 warmup forwards > 2 per step
         "pipedream over 4 ranks needs at least 3 microbatches per step (P-1 to fill the pipeline), got 2"),
        (["--gpus", "2", "--model", "tiny8", "--stage-layers", "2,5"],
         "--stage-layers 2,5 gives 2 stage(s) of 7 blocks; pipedream over 2 ranks needs 2 counts summing to the 8 layers "
         "of model 'tiny8'"),
        # Profiling step 0 (the fill) as steady state: every step profiled, the defaults at --steps 1.
        (["--gpus", "2", "--steps", "2", "--warmup", "0", "--active", "2"],
         "pipedream's step 0 fills the pipeline: profile from step 1 (--steps 3 or more for --active 2)"),
        (["--gpus", "2", "--steps", "1"],
         "pipedream's step 0 fills the pipeline: profile from step 1 (--steps 2 or more for --active 1)"),
    ],
)
def test_impossible_requests_are_one_line_errors(tmp_path, args, message):
    res = ptprof("run", "pipedream", *args, "--out", str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == f"ptprof run: error: {message}"
    assert not list(tmp_path.iterdir())
