"""Ring attention's communication theory (profiler.theory_seq.ring_rows): the K/V block messages
hand-computed from the tiny preset's dims, and on a real 2-rank run the measured bytes of every
kind equal to them (and theory.check says "match")."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import analyze, load_traces
from profiler.theory import predict_comm
from runners.options import MODEL_PRESETS
from tests.runners.reference import param_bytes

V, H, L, HEADS, S, B = MODEL_PRESETS["tiny"]  # 256, 64, 2, 4, 32, 8
PHI = param_bytes("tiny")  # 535,040 B
TENSORS = 2 + 10 * L + 3  # DDP's bucket rebuild broadcasts (tensors + 1) int32 indices, then 1 bucket size
REBUILD = 4 * (TENSORS + 1) + 4


def manifest(ranks: int, recompute: bool = False) -> dict:
    """run.json of a tiny ring run, as runners/ring.py writes it (only the fields theory reads)."""
    return {"paradigm": "ring", "world_size": ranks, "ranks": [{}] * ranks, "mesh": {"cp": ranks},
            "global_batch_size": B, "local_batch_size": B,
            "model": {"preset": "tiny", "n_params": PHI // 4, "vocab_size": V, "d_model": H, "n_layers": L,
                      "n_heads": HEADS, "seq_len": S, "mlp_ratio": 4, "param_dtypes": {"float32": PHI // 4}},
            "options": {"recompute": recompute},
            "sequence_parallel": {"kind": "ring", "shards": ranks, "layout": "zigzag", "chunks_per_rank": 2}}


def ring_bytes(ranks: int, recompute: bool = False) -> dict[tuple[str, str], tuple[int, int, float]]:
    c = predict_comm({"r": manifest(ranks, recompute)}).filter(
        (pl.col("rank") == 0) & (pl.col("dim") == "cp") & pl.col("collective").is_in(["send", "recv"]))
    out: dict = {}
    for phase, kind, calls, nbytes, traffic in c.select("phase", "collective", "calls", "bytes", "traffic_bytes").iter_rows():
        was = out.get((phase, kind), (0, 0, 0.0))
        out[(phase, kind)] = (was[0] + calls, was[1] + nbytes, was[2] + traffic)
    return out


@pytest.mark.parametrize("ranks, block, calls", [
    (2, 8 * 16 * 64 * 4, 2 * 1 * 2),  # b·(s/P)·h·4 = 32,768 B; K and V × (P−1 = 1) × 2 layers
    (4, 8 * 8 * 64 * 4, 2 * 3 * 2),   # 16,384 B; K and V × 3 steps × 2 layers
])
def test_ring_sends_and_receives_k_v_blocks_every_layer(ranks, block, calls):
    want = {(ph, kind): (calls, calls * block, float(calls * block) if kind == "send" else 0.0)
            for ph in ("forward", "backward") for kind in ("send", "recv")}
    assert ring_bytes(ranks) == want
    # --recompute: the forward's ring once more, inside backward (theory phase "recompute").
    again = ring_bytes(ranks, recompute=True)
    assert again == want | {("recompute", "send"): want[("forward", "send")], ("recompute", "recv"): want[("forward", "recv")]}


def test_ring_adds_ddp_over_the_replicated_weights():
    c = predict_comm({"r": manifest(2)}).filter(pl.col("rank") == 1)
    dp = c.filter(pl.col("dim") == "cp", pl.col("collective").is_in(["all_reduce", "broadcast"]))
    assert dp.filter(pl.col("collective") == "all_reduce")["bytes"].to_list() == [PHI]
    assert sorted(dp.filter(pl.col("collective") == "broadcast")["bytes"].to_list()) == [4, 4 * (TENSORS + 1)]
    assert c.filter(pl.col("dim") == "cp", pl.col("collective").is_in(["send", "recv"]))["phi"].null_count() == 4  # activations are not parameter bytes


def test_one_rank_sends_nothing():
    c = predict_comm({"r": manifest(1)})
    assert set(c["collective"]) == {"all_reduce", "broadcast"}


@pytest.mark.multirank
@pytest.mark.parametrize("flags", [(), ("--recompute",)], ids=["plain", "recompute"])
def test_measured_ring_bytes_equal_the_theory(runs, flags):
    a = analyze(load_traces(runs("ring", 2, *flags)))
    colls = a.collectives.filter(pl.col("step").is_not_null())
    block, n = 8 * 16 * 64 * 4, 4 * (3 if flags else 2)  # per step: 4 forward + 4 backward (+ 4 recomputed)
    for rank, step in colls.select("rank", "step").unique().iter_rows():
        mine = colls.filter((pl.col("rank") == rank) & (pl.col("step") == step))
        got = dict(mine.group_by("collective").agg(pl.col("size_bytes").sum()).iter_rows())
        assert got == {"send": n * block, "recv": n * block, "all_reduce": PHI} | ({"broadcast": REBUILD} if step == 1 else {})
        p2p = mine.filter(pl.col("collective").is_in(["send", "recv"]))
        assert set(p2p["size_bytes"]) == {block} and set(p2p["group_size"]) == {2}
        # the recomputed ring's messages sit in ptprof/recompute spans: phase "recompute" (innermost span)
        assert set(p2p["phase"]) == {"forward", "backward"} | ({"recompute"} if flags else set())
    check = a.theory_check
    assert {"send bytes/step", "recv bytes/step", "all_reduce bytes/step", "memory.params_bytes"} <= set(check["quantity"])
    assert set(check["verdict"]) == {"match"}, check  # memory too: the model replicated over the cp ranks


def test_exposed_ring_messages_get_ring_advice_not_pipeline_advice():
    from profiler.findings_text import RING_P2P_CHANGE, collective_change

    assert collective_change("recv", "forward", "ring") == RING_P2P_CHANGE
    assert collective_change("send", "backward", "ring") == RING_P2P_CHANGE
    assert "microbatches" in collective_change("send", None, "1f1b")
