"""Tensor parallel (and sequence parallel) at 2 gloo ranks: loss parity and the implied collectives."""

from __future__ import annotations

import collections
import gzip
import json

import pytest

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
