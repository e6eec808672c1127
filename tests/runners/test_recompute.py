"""--recompute (activation checkpointing per block) at 2 gloo ranks: losses equal the same paradigm
without it, one `ptprof/recompute` span per block per (micro)batch inside backward (or inside the
pipeline B action), the recomputed forward's collectives, the memory it saves, and the schedules
that refuse it."""

from __future__ import annotations

import collections
import gzip
import json

import polars as pl
import pytest
import torch

from profiler import load_traces
from profiler.collectives import collectives
from profiler.report import analyze
from profiler.theory_recompute import block_activation_bytes
from runners.model import GPT, GPTConfig
from tests.conftest import ptprof
from tests.runners.test_ep import NO_DROP

pytestmark = pytest.mark.multirank

PIPE = ("--model", "tiny8", "--microbatches", "4")  # the pipeline tests' 1f1b run (tests/runners/test_pipeline.py)
# (paradigm, flags of the run without --recompute: an existing fixture key, blocks per rank, passes per step)
CASES = {
    "ddp": ("ddp", ("--profile-memory",), 2, 1),
    "fsdp": ("fsdp", ("--profile-memory",), 2, 1),
    "tp": ("tp", (), 2, 1),
    "1f1b": ("1f1b", PIPE, 4, 4),  # 4 of tiny8's 8 blocks per stage, 4 microbatches
    "ep": ("ep", NO_DROP, 2, 1),
    # one block per stage (tiny), 4 microbatches a step; the recompute must see the stashed weights
    "pipedream": ("pipedream", (), 1, 4),
}
OUTER = ("ptprof/backward", "ptprof/pp/B ")


def manifest(run) -> dict:
    return json.loads((run / "run.json").read_text())


def trace_spans(run, rank: int) -> list[dict]:
    with gzip.open(run / f"rank{rank}.json.gz", "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.mark.parametrize("case", CASES)
def test_losses_equal_the_run_without_recompute(runs, case):
    paradigm, flags, _, _ = CASES[case]
    plain, again = manifest(runs(paradigm, 2, *flags)), manifest(runs(paradigm, 2, *flags, "--recompute"))
    diff = max(abs(a - b) for a, b in zip(plain["losses"], again["losses"], strict=True))
    assert diff < 1e-6, (plain["losses"], again["losses"])
    assert plain["recompute"] is None and "recompute" not in plain["phases"]
    assert again["recompute"] == {"granularity": "block", "span": "ptprof/recompute"}
    assert again["phases"]["recompute"] == "ptprof/recompute" and again["options"]["recompute"] is True


@pytest.mark.parametrize("case", CASES)
def test_one_recompute_span_per_block_and_pass_inside_backward(runs, case):
    paradigm, flags, blocks, passes = CASES[case]
    run = runs(paradigm, 2, *flags, "--recompute")
    for rank in (0, 1):
        spans = trace_spans(run, rank)
        steps = [e for e in spans if e["name"].startswith("ProfilerStep#")]
        recompute = [e for e in spans if e["name"] == "ptprof/recompute"]
        outer = [e for e in spans if e["name"].startswith(OUTER)]
        per_step = collections.Counter(
            next(s["name"] for s in steps if s["ts"] <= r["ts"] <= s["ts"] + s["dur"]) for r in recompute)
        assert sorted(per_step.values()) == [blocks * passes] * 2, per_step  # 2 profiled steps
        for r in recompute:  # each nested in a backward span (or a B action) of its thread
            assert any(o["tid"] == r["tid"] and o["ts"] <= r["ts"] and r["ts"] + r["dur"] <= o["ts"] + o["dur"]
                       for o in outer), r


def test_the_recomputed_forward_reruns_its_collectives(runs):
    # tp: the 2 all-reduces per layer of the forward again, phase "recompute"; fsdp: nothing (its
    # all-gather is a hook on the block, outside the checkpointed body).
    def by_phase(run):
        t = load_traces(run)
        c = collectives(t.events, t.ranks).filter(pl.col("step").is_not_null())
        return {(k, p): (n, b) for k, p, n, b in c.group_by("collective", "phase")
                .agg(pl.len(), pl.col("size_bytes").sum()).iter_rows()}

    tp, tp_rc = by_phase(runs("tp", 2)), by_phase(runs("tp", 2, "--recompute"))
    assert tp_rc[("all_reduce", "recompute")] == tp[("all_reduce", "forward")]  # same calls, same bytes
    assert tp_rc[("all_reduce", "recompute")][0] == 2 * 2 * 2 * 2  # 2 per layer x 2 layers x 2 steps x 2 ranks
    assert {k: v for k, v in tp_rc.items() if k[1] != "recompute"} == tp
    fsdp_rc = by_phase(runs("fsdp", 2, "--profile-memory", "--recompute"))
    assert not [k for k in fsdp_rc if k[1] == "recompute"]
    assert fsdp_rc == by_phase(runs("fsdp", 2, "--profile-memory"))


def test_recompute_lowers_the_activation_peak_and_times_the_recomputation(runs):
    # ddp: activations dominate tiny's peak, and its CPU allocation counter is the same run after run.
    plain = analyze(load_traces(runs("ddp", 2, "--profile-memory")))
    again = analyze(load_traces(runs("ddp", 2, "--profile-memory", "--recompute")))
    before = dict(plain.activation.select("rank", "activation_bytes").iter_rows())
    after = dict(again.activation.select("rank", "activation_bytes").iter_rows())
    # tiny: b = 4 rows per rank, s = 32, h = 64, 4 heads. Theory: one block's saved activations less
    # its input (the other block's are recomputed, its input kept), 528,384 - 32,768 B. The peak
    # also drops the temporaries that block's backward held, so the drop is at least that.
    saved = block_activation_bytes(4, 32, 64, 4, 4) - 4 * 32 * 64 * 4
    assert saved == 495_616
    for rank in (0, 1):
        assert saved <= before[rank] - after[rank] < 2 * saved, (before, after)
    rc = again.recompute
    assert plain.recompute.is_empty()
    assert sorted(rc["rank"].to_list()) == [0, 0, 1, 1] and (rc["recompute_spans"] == 2).all()
    assert (rc["recompute_us"] > 0).all() and (rc["forward_us"] > 0).all()
    # predicted: the blocks' share of tiny's forward FLOPs, L(24h² + 4sh) / (L(24h² + 4sh) + 2hV)
    blocks = 2 * (24 * 64 * 64 + 4 * 32 * 64)
    assert rc["predicted_over_forward"].to_list() == [pytest.approx(blocks / (blocks + 2 * 64 * 256))] * 4


def test_block_activation_formula_is_what_autograd_saves():
    # The theory's A_block = b·s·(16h + heads + 4)·4 against the tensors autograd saves for a block.
    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 64, 2, 4, 32))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.blocks["0"](torch.randn(4, 32, 64, requires_grad=True))
    assert sum(saved.values()) == block_activation_bytes(4, 32, 64, 4, 4)


@pytest.mark.parametrize("args", [
    ("zero-bubble", "--gpus", "2", "--model", "tiny8"),
    ("zbv", "--gpus", "2", "--model", "tiny8"),
    ("dualpipev", "--gpus", "2", "--model", "tiny8"),
    ("hybrid", "--gpus", "4", "--pp", "2", "--tp", "2", "--schedule", "zero-bubble", "--model", "tiny8"),
])
def test_split_backward_schedules_refuse_recompute(tmp_path, args):
    res = ptprof("run", *args, "--recompute", "--out", str(tmp_path))
    assert res.returncode == 2 and not list(tmp_path.iterdir())
    line = res.stderr.strip()
    assert "\n" not in line and "--recompute does not fit" in line and "I and W" in line, res.stderr
