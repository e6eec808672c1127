"""Tensor parallel (and sequence parallel) at 2 gloo ranks: loss parity and the implied collectives."""

from __future__ import annotations

import collections
import gzip
import json

import polars as pl
import pytest

from runners.options import MODEL_PRESETS
from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses

pytestmark = pytest.mark.multirank


def op_counts(run_dir, rank: int) -> collections.Counter:
    with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as f:
        return collections.Counter(e.get("name", "") for e in json.load(f)["traceEvents"])


@pytest.mark.parametrize("extra", [(), ("--sp",)])
def test_tp_losses_match_single_process(runs, extra):
    manifest = json.loads((runs("tp", 2, *extra) / "run.json").read_text())
    want = single_process_losses(steps=STEPS)
    for got, ref in zip(manifest["losses"], want, strict=True):
        assert abs(got - ref) / abs(ref) < 1e-4, (manifest["losses"], want)
    assert manifest["mesh"] == {"tp": 2}
    # No data parallelism: every rank trained on the whole global batch.
    assert all(r["loss_tokens"] == manifest["tokens_per_step"] for r in manifest["ranks"])


LOSS_PARALLEL = [("--loss-parallel",), ("--loss-parallel", "--sp", "--profile-memory")]


@pytest.mark.parametrize("extra", LOSS_PARALLEL, ids=["loss-parallel", "loss-parallel-sp"])
def test_tp_loss_parallel_losses_match_single_process(runs, extra):
    # Vocabulary-parallel cross-entropy: the same loss as gathering the logits, to rounding.
    losses = json.loads((runs("tp", 2, *extra) / "run.json").read_text())["losses"]
    gathered = json.loads((runs("tp", 2) / "run.json").read_text())["losses"]
    for got, ref, plain in zip(losses, single_process_losses(steps=STEPS), gathered, strict=True):
        assert abs(got - ref) / abs(ref) < 1e-4, (losses, ref)
        assert abs(got - plain) / abs(plain) < 1e-6, (losses, gathered)  # measured: 1.7e-7


def test_tp_loss_parallel_never_holds_the_whole_logits(runs):
    # With --profile-memory every allocation is a [memory] event. Gathered logits (plain tp) are
    # one b·s·V fp32 tensor, the largest of the step; vocabulary-parallel, a rank only ever holds
    # its b·s·V/T slice.
    from profiler import load_traces, memory_timeline

    vocab, _d, _layers, _heads, seq, batch = MODEL_PRESETS["tiny"]
    logits = batch * seq * vocab * 4
    allocs = memory_timeline(load_traces(runs("tp", 2, *LOSS_PARALLEL[1])).events).filter(pl.col("delta_bytes") > 0)
    for rank in range(2):
        mine = allocs.filter(pl.col("rank") == rank)["delta_bytes"]
        assert mine.max() == logits // 2, (rank, mine.max(), logits)
        assert (mine == logits // 2).sum() >= 2  # the logits shard and its gradient, each step


def test_tp_shards_heads_and_mlp(runs):
    # Column/row-parallel layers hold 1/T of each block matrix; embeddings and norms are replicated.
    mem = json.loads((runs("tp", 2) / "run.json").read_text())["ranks"][0]["memory"]
    from tests.runners.reference import param_bytes

    full = param_bytes()
    vocab, d = 256, 64
    replicated = 4 * (vocab * d + 32 * d + 2 * 2 * 2 * d + 2 * d)  # tok/pos emb, 2 blocks x 2 LN (w+b), final LN
    sharded = full - replicated
    assert mem["params_bytes"] == replicated + sharded // 2


def test_tp_collectives(runs):
    for rank in range(2):
        ops = op_counts(runs("tp", 2), rank)
        # Row-parallel outputs are all-reduced in forward (2 per block x 2 blocks x 2 steps at least).
        assert ops["c10d::allreduce_"] >= 8
        assert ops["c10d::reduce_scatter_tensor_coalesced_"] == 0
        sp = op_counts(runs("tp", 2, "--sp"), rank)
        # With SP the row-parallel outputs are reduce-scattered and column-parallel inputs gathered.
        assert sp["c10d::reduce_scatter_tensor_coalesced_"] >= 8
        assert sp["c10d::allgather_into_tensor_coalesced_"] >= 8


def test_tp_degree_must_divide_heads(tmp_path):
    res = ptprof("run", "tp", "--gpus", "3", "--out", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "ptprof run: error: tp over 3 ranks needs attention heads (4, model 'tiny') divisible by 3; "
        "no default preset (tiny, tiny8, tiny16, small) fits: give --model"
    )
