"""Expert parallel MoE at 2 gloo ranks: parity with a single process holding every expert, routing
counts in run.json, and all-to-all in the traces."""

from __future__ import annotations

import collections
import gzip
import json

import pytest

from tests.conftest import STEPS, ptprof
from tests.runners.reference import single_process_losses

pytestmark = pytest.mark.multirank

EXPERTS, TOP_K = 4, 2
NO_DROP = ("--experts", str(EXPERTS), "--top-k", str(TOP_K), "--capacity-factor", "4")  # capacity = all tokens
DROPPING = ("--experts", str(EXPERTS), "--top-k", str(TOP_K), "--capacity-factor", "0.5")


def manifest(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_ep_losses_match_single_process_moe(runs):
    m = manifest(runs("ep", 2, *NO_DROP))
    want = single_process_losses(
        steps=STEPS, moe={"n_experts": EXPERTS, "top_k": TOP_K, "capacity_factor": 4.0},
        aux_loss_weight=m["moe"]["aux_loss_weight"],
    )
    for got, ref in zip(m["losses"], want, strict=True):
        assert abs(got - ref) / abs(ref) < 1e-4, (m["losses"], want)
    assert all(layer["dropped"] == 0 for step in m["moe"]["routing"] for layer in step)


@pytest.mark.parametrize("flags", [NO_DROP, DROPPING], ids=["no-drop", "dropping"])
def test_routing_counts_sum_to_tokens_times_k_minus_drops(runs, flags):
    m = manifest(runs("ep", 2, *flags))
    assert len(m["moe"]["routing"]) == STEPS
    for step in m["moe"]["routing"]:
        assert [layer["layer"] for layer in step] == [1]  # tiny has 2 blocks: the second is MoE
        for layer in step:
            assert len(layer["tokens_per_expert"]) == EXPERTS
            assert sum(layer["tokens_per_expert"]) == m["tokens_per_step"] * TOP_K - layer["dropped"]
    if flags is DROPPING:
        # Capacity per rank = 0.5 * 128 tokens * 2 / 4 = 32 pairs per expert per rank: half the pairs drop.
        for step in m["moe"]["routing"]:
            assert all(n <= 2 * 32 for n in step[0]["tokens_per_expert"])
            assert step[0]["dropped"] >= m["tokens_per_step"] * TOP_K - EXPERTS * 2 * 32


def test_ep_traces_show_all_to_all(runs):
    run_dir = runs("ep", 2, *NO_DROP)
    for rank in range(2):
        with gzip.open(run_dir / f"rank{rank}.json.gz", "rt") as f:
            ops = collections.Counter(e.get("name", "") for e in json.load(f)["traceEvents"])
        # Per MoE layer and step: counts, dispatch and combine forward; their backward in reverse.
        assert ops["c10d::alltoall_base_"] >= 2 * 3
        assert ops["c10d::allreduce_"] >= 2  # replicated parameters' gradients


def test_experts_must_divide_over_ranks(tmp_path):
    res = ptprof("run", "ep", "--gpus", "2", "--experts", "3", "--out", str(tmp_path))
    assert res.returncode == 2
    assert res.stderr.strip() == "ptprof run: error: --experts 3 must be divisible by the 2 ranks (experts per rank)"
