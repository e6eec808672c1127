"""Ulysses communication theory: hand-computed all-to-all bytes from tiny's dims, and real runs whose
measured bytes equal them exactly."""

from __future__ import annotations

import polars as pl
import pytest

from profiler import analyze, load_traces
from profiler.theory import predict_comm
from tests.profiler.test_theory import PHI, TENSORS, assert_golden, manifest as ddp_manifest
from runners.options import MODEL_PRESETS

V, H, L, HEADS, S, B = MODEL_PRESETS["tiny"]  # 256, 64, 2, 4, 32, 8
assert (V, H, L, HEADS, S, B) == (256, 64, 2, 4, 32, 8)
A2A = {2: 8 * 16 * 64 * 4, 4: 8 * 8 * 64 * 4}  # one all-to-all buffer b·(s/P)·h·4 B: 32 KiB and 16 KiB
REBUILD = 4 * (TENSORS + 1) + 4  # DDP's bucket rebuild broadcasts in step 1 (as ddp)


def manifest(p: int, **options) -> dict:
    return ddp_manifest(paradigm="ulysses", world_size=p, mesh={"sp": p}, local_batch_size=B,
                        options={"sp": False, "recompute": False} | options)


def rows(m: dict, rank: int = 0) -> pl.DataFrame:
    return predict_comm({"r": m}).filter(pl.col("rank") == rank)


@pytest.mark.parametrize("p", [2, 4])
def test_four_all_to_alls_per_layer_each_way(p):
    c = rows(manifest(p))
    a2a = c.filter(pl.col("collective") == "all_to_all").sort("phase")
    assert a2a["phase"].to_list() == ["backward", "forward"]
    assert a2a["calls"].to_list() == [4 * L, 4 * L]
    assert a2a["bytes"].to_list() == [4 * L * A2A[p]] * 2  # 2: 262,144 B each way; 4: 131,072 B
    assert a2a["group_size"].to_list() == [p, p] and set(a2a["dim"]) == {"sp"}
    assert a2a["traffic_bytes"].to_list() == [4 * L * A2A[p] * (p - 1) / p] * 2
    assert "Jacobs et al. 2023" in a2a.filter(pl.col("phase") == "forward")["note"][0]
    # The replicated weights: DDP's all-reduce of Φ in backward, as a ddp run.
    ar = c.filter(pl.col("collective") == "all_reduce")
    assert ar["bytes"].to_list() == [PHI] and ar["phase"].to_list() == ["backward"]
    assert sorted(c.filter(pl.col("collective") == "broadcast")["bytes"].to_list()) == [4, 4 * (TENSORS + 1)]


def test_recompute_repeats_the_forward_all_to_alls():
    a2a = rows(manifest(2, recompute=True)).filter(pl.col("collective") == "all_to_all")
    assert dict(a2a.select("phase", "bytes").iter_rows()) == {"forward": 8 * A2A[2], "backward": 8 * A2A[2],
                                                              "recompute": 8 * A2A[2]}


def test_per_rank_bytes_stay_constant_when_s_and_p_grow_together():
    # The Ulysses property: s/P fixed, each rank's all-to-all buffer stays b·(s/P)·h.
    small = rows(manifest(2)).filter(pl.col("collective") == "all_to_all")["bytes"].sum()
    big = manifest(4)
    big["model"] = big["model"] | {"seq_len": 2 * S, "n_params": PHI // 4 + S * H}  # pos_emb grows with s
    assert rows(big).filter(pl.col("collective") == "all_to_all")["bytes"].sum() == small


def test_a_damaged_run_json_gets_no_sizes():
    m = manifest(4)
    m["model"] = m["model"] | {"n_heads": 6}  # 6 heads cannot split over 4 ranks: the runner refuses it
    a2a = rows(m).filter(pl.col("collective") == "all_to_all")
    assert a2a["bytes"].null_count() == 2 and "sizes unknown" in a2a["note"][0]


@pytest.mark.multirank
@pytest.mark.parametrize("ranks", [2, 4])
def test_ulysses_bytes_match_theory(runs, ranks):
    assert_golden(runs("ulysses", ranks), lambda rank, step: {
        "all_to_all": 16 * A2A[ranks], "all_reduce": PHI} | ({"broadcast": REBUILD} if step == 1 else {}))


@pytest.mark.multirank
def test_ulysses_recompute_bytes_calls_and_phases(runs):
    run_dir = runs("ulysses", 2, "--recompute")
    assert_golden(run_dir, lambda rank, step: {
        "all_to_all": 24 * A2A[2], "all_reduce": PHI} | ({"broadcast": REBUILD} if step == 1 else {}))
    a = analyze(load_traces(run_dir))
    # Replicated weights: the persistent memory of a ddp rank (mesh {"sp": 2} holds the whole model).
    memory = a.theory_check.filter(pl.col("quantity").str.starts_with("memory."))
    assert memory.height == 4 * 2 and set(memory["verdict"]) == {"match"}, memory
    a2a = a.collectives.filter(pl.col("collective") == "all_to_all")
    assert set(a2a["size_bytes"]) == {A2A[2]} and set(a2a["group_size"]) == {2}
    # Per rank and step: 8 in forward; backward holds its own 8 and the 8 recomputed (measured as
    # backward, or as recompute where profiler.collectives tells the recompute span apart).
    for (rank, step), calls in a2a.partition_by("rank", "step", as_dict=True).items():
        n = dict(calls.group_by("phase").len().iter_rows())
        assert n.pop("forward") == 8 and n.get("recompute", 8) == 8, (rank, step, n)
        assert sum(n.values()) == 16 and set(n) <= {"backward", "recompute"}, (rank, step, n)
